"""The bounds of every detector parameter, as one declared table checked when a detector is built.

A detector's constructor checks each parameter's type and lower bound; this table adds the upper bounds (and
restates the lower ones) so that no spec can ask for a rule that never decides, such as ``k-decline`` with
``k=10**18`` or ``trend`` with a window of a billion evaluations. :func:`~platform_sim.core.detectors.registry.make_detector`
checks it, so the callback, the simulator and the service refuse the same specs, each with a ``ValueError`` naming
the parameter (the service answers it with 422). docs/reference/detectors.md lists the table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

#: Parameters counted in evaluations (consecutive evidence, windows, warm-up): at most this many. A job evaluated
#: more often than this before it could stop would never be stopped in practice.
MAX_EVALS = 1_000
#: Warm-up in evaluations: a long warm-up is legitimate (decide only late in a run), but not unbounded.
MAX_WARMUP = 100_000
#: Thresholds and noise levels in the eval score's own units: scores may be on any scale, so the cap is wide.
MAX_SCORE_UNITS = 1e9

_K = (1, MAX_EVALS)
_WARMUP = (0, MAX_WARMUP)
_SCORE = (0.0, MAX_SCORE_UNITS)
_PROB = (0.0, 1.0)

#: ``{detector name: {parameter: (lowest, highest)}}``, both ends allowed (a constructor may refuse an end, e.g.
#: ``alpha`` 0, with its own message). Parameters not listed are bounded by the detector itself: ``test`` (a choice
#: of names) and ``shape``'s ``min_tau`` (at most the largest decay time of its grid, ``shape.TAUS``).
PARAM_BOUNDS: dict[str, dict[str, tuple[float, float]]] = {
    "k-decline": {"k": _K, "min_delta": _SCORE, "warmup": _WARMUP},
    "k-decline-se": {"k": _K, "z": (0.0, 100.0), "min_delta": _SCORE, "se": _SCORE, "warmup": _WARMUP},
    "cusum": {"slack": (0.0, 1e6), "threshold": (0.0, 1e6), "min_delta": _SCORE, "se": _SCORE, "warmup": _WARMUP},
    "trend": {
        "window": (3, MAX_EVALS),
        "alpha": _PROB,
        "k": _K,
        "min_drop": _SCORE,
        "se": _SCORE,
        "short_window": (3, MAX_EVALS),
        "level_alpha": _PROB,
        "warmup": _WARMUP,
        "spread_window": (3, MAX_EVALS),
        "spread_alpha": _PROB,
        "run_alpha": _PROB,
        "frac": _PROB,
        "rel_drop": (0.0, 1e6),
        "evidence_run_alpha": _PROB,
        "evidence_rel_drop": (0.0, 1e6),
        "spend_power": (0.0, 10.0),
    },
    "shape": {
        "threshold": _PROB,
        "k": _K,
        "min_evals": (3, MAX_EVALS),
        "future": (1.0, 1_000.0),
        "se": _SCORE,
        "warmup": _WARMUP,
        "behind": (0, 1),
    },
    "paired-test": {"alpha": _PROB, "min_effect": _SCORE, "k": _K, "warmup": _WARMUP},
}


def check_param_bounds(name: str, params: Mapping[str, Any]) -> None:
    """Refuse a number above its :data:`PARAM_BOUNDS` for detector ``name`` (the detector checks the lower bound).

    Args:
        name: The detector's registered name (one not in the table has no declared bounds).
        params: The parameters given; non-numbers and ``None`` are left to the detector's own checks.

    Raises:
        ValueError: A parameter is out of its bounds; the message names the detector, the parameter and the bounds.
    """
    bounds = PARAM_BOUNDS.get(name, {})
    for param, value in params.items():
        if param not in bounds or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        low, high = bounds[param]
        # Only the top end here: the constructor refuses what is below (or not finite) with its own message.
        if math.isfinite(value) and value > high:
            raise ValueError(f"detector {name!r} parameter {param} must be in [{low:g}, {high:g}], got {value!r}")
