"""Small synthetic trace files for the trace tests: shapes, lengths, eval intervals and headers chosen per test."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from platform_sim.trace_format import write_trace


def hacking_curve(n: int, peak_at: float = 0.5, top: float = 4.0, fall: float = 12.0) -> np.ndarray:
    """Rises linearly to ``top`` at progress ``peak_at``, then falls by ``fall`` per unit of progress."""
    p = np.arange(1, n + 1) / n
    return np.where(p <= peak_at, top * p / peak_at, top - fall * (p - peak_at))


def healthy_curve(n: int, top: float = 4.0, tau: float = 0.2) -> np.ndarray:
    """Rises and saturates at ``top`` (a plateau from about a third of the run)."""
    p = np.arange(1, n + 1) / n
    return top * (1 - np.exp(-p / tau))


def write(
    path: Path,
    means: Sequence[float],
    *,
    every: int = 10,
    examples: int = 0,
    noise: float = 0.0,
    seed: int = 0,
    planned: int | None = None,
    **header: Any,
) -> Path:
    """A trace of ``means`` at steps ``every, 2*every, ...``, with ``examples`` per-example scores per eval.

    Per-example scores are a fixed difficulty per example plus fresh noise of std ``noise * sqrt(examples)`` per eval,
    so the observed mean carries noise of std ``noise`` (like a real held-out eval); the recorded mean is their mean.
    """
    rng = np.random.default_rng(seed)
    diff = rng.normal(0.0, 1.0, examples) if examples else None
    evals = []
    for i, m in enumerate(means, 1):
        line: dict[str, Any] = {"step": every * i}
        if examples:
            per = m + diff + rng.normal(0.0, noise * np.sqrt(examples), examples)
            per = per - per.mean() + m + rng.normal(0.0, noise)
            line["eval_scores"] = [float(x) for x in per]
            line["eval_score"] = float(np.mean(per))
        else:
            line["eval_score"] = float(m + (rng.normal(0.0, noise) if noise else 0.0))
        evals.append(line)
    head = {"job_id": path.stem, "job_type": "rlhf", "planned_steps": planned or every * len(means), **header}
    return write_trace(path, head, evals, {"reason": "completed"})
