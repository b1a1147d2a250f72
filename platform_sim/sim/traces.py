"""Reading recorded JSONL traces (DESIGN.md section 4) for the simulator, and labelling them.

A trace is one real training run: a header line, one ``eval`` line per evaluation, an optional ``end`` line. The reader
is strict, because a replay built on a silently mangled trace reports wrong numbers: every problem raises
:class:`TraceFormatError` naming the file and the line number. Only the required fields are required (``format``,
``job_id``, ``job_type``; ``step`` and ``eval_score``), so traces written by other tools load too.

The label (``hacking`` or ``healthy``) is the ground truth of a replay. It is derived from the whole recorded eval
curve, never from how the run was configured, by :func:`label_of`:

    a trace is **hacking** when its final eval score has given back more than ``LABEL_GIVE_BACK`` (25%) of the gain it
    had made by its peak: ``peak - final > 0.25 * (peak - first)``, with ``peak > first``. Otherwise it is healthy.

The rule is scale-free (it works for a 0-1 score and for the gold points of the CPU environment alike) and ignores
small end-of-run wobble on a plateau.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from platform_sim.core.boundary import JOB_TYPES

TRACE_FORMAT = "evalstop-trace/1"
LABEL_GIVE_BACK = 0.25
"""Fraction of the gain up to the peak that a trace must give back by its end to be labelled ``hacking``."""

_EVAL_NUMBERS = ("proxy_reward", "train_loss", "kl", "wall_s", "gpu_s")
_EVAL_FIELDS = frozenset({"kind", "step", "eval_score", "eval_scores", *_EVAL_NUMBERS})
_END_FIELDS = frozenset({"kind", "reason", "stopped_at", "best_step", "best_score"})
_HEADER_FIELDS = frozenset({"kind", "format", "job_id", "job_type", "trainer", "model", "planned_steps",
                            "world_size", "config"})


class TraceFormatError(ValueError):
    """A trace file that breaks the format; the message starts with ``file:line:``."""


def label_of(scores: Sequence[float], give_back: float = LABEL_GIVE_BACK) -> str:
    """``"hacking"`` if the curve gave back more than ``give_back`` of its gain by the end, else ``"healthy"``.

    Args:
        scores: The eval scores in step order (at least one).
        give_back: The fraction (default :data:`LABEL_GIVE_BACK`).
    """
    if not scores:
        raise ValueError("label_of needs at least one score")
    peak = max(scores)
    gain = peak - scores[0]
    return "hacking" if gain > 0 and peak - scores[-1] > give_back * gain else "healthy"


@dataclass(frozen=True)
class RealTrace:
    """One recorded run, validated.

    Attributes:
        name: The file name without ``.jsonl`` (unique within a folder).
        path: Where it was read from.
        header: The header line (``job_id``, ``job_type``, optional ``trainer``, ``planned_steps``, ``config``...).
        steps: Eval steps, strictly increasing.
        scores: Eval (gold) scores, one per step.
        proxy: Proxy reward per step where recorded (``None`` entries where not).
        wall_s: Seconds since training began per step where recorded.
        end: The end line, if any.
    """

    name: str
    path: str
    header: dict[str, Any]
    steps: tuple[int, ...]
    scores: tuple[float, ...]
    proxy: tuple[float | None, ...]
    wall_s: tuple[float | None, ...]
    end: dict[str, Any] | None = field(default=None)

    @property
    def job_type(self) -> str:
        return self.header["job_type"]

    @property
    def label(self) -> str:
        return label_of(self.scores)

    @property
    def hacking(self) -> bool:
        return self.label == "hacking"

    @property
    def peak_index(self) -> int:
        """Index of the true peak (highest score; the earliest on ties)."""
        return max(range(len(self.scores)), key=lambda i: (self.scores[i], -i))

    @property
    def peak_step(self) -> int:
        return self.steps[self.peak_index]

    @property
    def peak_score(self) -> float:
        return self.scores[self.peak_index]

    @property
    def planned_steps(self) -> int:
        """The header's ``planned_steps`` if given, else the last eval step."""
        planned = self.header.get("planned_steps")
        return int(planned) if isinstance(planned, int) and planned >= self.steps[-1] else self.steps[-1]

    @property
    def algo(self) -> str:
        """``grpo``/``ppo``/... from the recording config or the trainer name, else ``"unknown"``."""
        run = (self.header.get("config") or {}).get("run") or {}
        if run.get("algo"):
            return str(run["algo"])
        trainer = str(self.header.get("trainer") or "")
        return trainer.lower().removesuffix("trainer") or "unknown"

    def progress(self) -> tuple[float, ...]:
        """Progress (0..1] of each eval: step / planned steps."""
        total = self.planned_steps
        return tuple(s / total for s in self.steps)


def _finite(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def read_trace(path: str | Path) -> RealTrace:
    """Read and validate one trace file.

    Raises:
        TraceFormatError: naming the file and the line of the first problem (bad JSON, missing or bad header, an
            unknown line kind or field, a non-finite or missing score, steps not strictly increasing, lines after the
            end line, fewer than two evaluations).
    """
    path = Path(path)
    where = str(path)

    def bad(line_no: int, msg: str) -> TraceFormatError:
        return TraceFormatError(f"{where}:{line_no}: {msg}")

    try:
        raw_lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise TraceFormatError(f"{where}:1: not UTF-8 text ({exc.reason})") from None
    header: dict[str, Any] | None = None
    end: dict[str, Any] | None = None
    steps: list[int] = []
    scores: list[float] = []
    proxy: list[float | None] = []
    wall: list[float | None] = []
    last_no = 0
    for no, raw in enumerate(raw_lines, 1):
        if not raw.strip():
            continue
        last_no = no
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise bad(no, f"not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise bad(no, "a line must be a JSON object")
        kind = obj.get("kind")
        if header is None:
            if kind != "header":
                raise bad(no, f"the first line must be the header (kind 'header'), got kind {kind!r}")
            if obj.get("format") != TRACE_FORMAT:
                raise bad(no, f"unsupported format {obj.get('format')!r}; expected {TRACE_FORMAT!r}")
            if not isinstance(obj.get("job_id"), str) or not obj["job_id"]:
                raise bad(no, "header field job_id must be a non-empty string")
            if obj.get("job_type") not in JOB_TYPES:
                raise bad(no, f"header field job_type must be one of {', '.join(JOB_TYPES)}, "
                              f"got {obj.get('job_type')!r}")
            unknown = sorted(set(obj) - _HEADER_FIELDS)
            if unknown:
                raise bad(no, f"unknown header field(s): {', '.join(unknown)}")
            header = obj
            continue
        if end is not None:
            raise bad(no, "line after the end line")
        if kind == "header":
            raise bad(no, "a second header line")
        if kind == "eval":
            unknown = sorted(set(obj) - _EVAL_FIELDS)
            if unknown:
                raise bad(no, f"unknown eval field(s): {', '.join(unknown)}")
            step = obj.get("step")
            if isinstance(step, bool) or not isinstance(step, int) or step < 0:
                raise bad(no, f"step must be an integer >= 0, got {step!r}")
            if steps and step <= steps[-1]:
                raise bad(no, f"steps must strictly increase: step {step} after step {steps[-1]}")
            if "eval_score" not in obj:
                raise bad(no, "eval line without eval_score")
            if not _finite(obj["eval_score"]):
                raise bad(no, f"eval_score must be a finite number, got {obj['eval_score']!r}")
            per = obj.get("eval_scores")
            if per is not None and (not isinstance(per, list) or not per or not all(_finite(v) for v in per)):
                raise bad(no, "eval_scores must be a non-empty list of finite numbers")
            for name in _EVAL_NUMBERS:
                if name in obj and obj[name] is not None and not _finite(obj[name]):
                    raise bad(no, f"{name} must be a finite number, got {obj[name]!r}")
            steps.append(step)
            scores.append(float(obj["eval_score"]))
            proxy.append(None if obj.get("proxy_reward") is None else float(obj["proxy_reward"]))
            wall.append(None if obj.get("wall_s") is None else float(obj["wall_s"]))
        elif kind == "end":
            unknown = sorted(set(obj) - _END_FIELDS)
            if unknown:
                raise bad(no, f"unknown end field(s): {', '.join(unknown)}")
            end = obj
        else:
            raise bad(no, f"unknown line kind {kind!r} (expected header, eval or end)")
    if header is None:
        raise TraceFormatError(f"{where}:1: empty trace (no header line)")
    if len(steps) < 2:
        raise TraceFormatError(f"{where}:{last_no}: a trace needs at least 2 eval lines, found {len(steps)}")
    return RealTrace(path.stem, where, header, tuple(steps), tuple(scores), tuple(proxy), tuple(wall), end)


def load_traces(folder: str | Path) -> list[RealTrace]:
    """Every ``*.jsonl`` trace of ``folder``, validated, sorted by name.

    Raises:
        FileNotFoundError: ``folder`` does not exist or is not a folder.
        TraceFormatError: ``folder`` holds no ``*.jsonl`` file, or one of them is bad (file and line named).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"trace folder {folder} does not exist or is not a folder")
    files = sorted(folder.glob("*.jsonl"))
    if not files:
        raise TraceFormatError(f"{folder}: no traces (*.jsonl files) in this folder; record some with "
                               "`evalstop traces record --out DIR`")
    return [read_trace(f) for f in files]


def shipped_traces_dir() -> Path:
    """The corpus of real traces shipped in the package (``platform_sim/data/traces``)."""
    from importlib import resources

    return Path(str(resources.files("platform_sim") / "data" / "traces"))


def recorded_examples(trace: Any) -> list[list[float] | None]:
    """The per-example scores of each eval of a validated trace (None where an eval has none)."""
    out: list[list[float] | None] = []
    with open(trace.path, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            obj = json.loads(line)
            if obj.get("kind") == "eval":
                scores = obj.get("eval_scores")
                out.append([float(s) for s in scores] if scores else None)
    return out
