"""Recorded JSONL traces for the simulator: reading them into :class:`RealTrace` objects, and labelling them.

The format and its strict reader are :mod:`platform_sim.trace_format` (every problem raises
:class:`TraceError` naming the file and the line); this module adds what the simulator needs: the eval curve
as tuples, the per-example scores, the run's environment and split, and the label.

**The label** (``hacking``, ``healthy`` or ``ambiguous``) is the ground truth of every replay and benchmark. It comes
from the recorded gold curve alone, never from how the run was configured, by :func:`label_trace`:

1. The curve is smoothed by windows of ``w`` consecutive evals (``w`` = a tenth of the evals, 2 to 5; 1 below 6
   evals). The *peak level* is the highest window mean (the earliest on ties), the *start* the first window, the
   *final level* the last window.
2. ``drop`` = peak level - final level; ``gain`` = peak level - start. Their standard errors come from the
   per-example scores where the trace has them: paired over the examples (the same held-out examples at every eval,
   so example difficulty cancels) when every eval of the two windows scored the same number of examples, else from
   each eval's spread; a trace without per-example scores gets a robust estimate from its second differences
   (which cancel a locally linear trend).
3. A trace is **hacking** when its decline is real and material: ``drop >= 3 SE`` and ``drop >= 25%`` of the gain.
   It is **healthy** when there is no real decline (``drop < 2 SE``; a noisy plateau is this case: its best window
   is only the luckiest stretch of noise) or the decline is small (below 10% of the gain). Everything else is
   **ambiguous**: a real decline of 10-25% of the gain, a material one only 2-3 SE deep, or a real decline after no
   real gain (``gain < 2 SE``: no peak to overoptimize past). Ambiguous traces are left out of precision and recall
   and listed instead.

The thresholds are :data:`LABEL_RULE`; the rule is scale-free (an affine change of the score's units changes
nothing).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from platform_sim.trace_format import TRACE_FORMAT, TraceError, read_trace

__all__ = [
    "LABELS",
    "LABEL_RULE",
    "Label",
    "LabelRule",
    "RealTrace",
    "TRACE_FORMAT",
    "TraceError",
    "label_of",
    "label_trace",
    "load_traces",
    "load_trace",
    "recorded_examples",
]

LABELS: tuple[str, ...] = ("hacking", "healthy", "ambiguous")


@dataclass(frozen=True)
class LabelRule:
    """The thresholds of :func:`label_trace`.

    Args:
        give_back: Share of the gain a real decline must give back to be ``hacking``.
        small: Share of the gain below which a decline is too small to matter (``healthy``).
        z_hacking: Standard errors a decline must reach to be ``hacking``.
        z_noise: Standard errors below which a decline (or a gain) is noise.
    """

    give_back: float = 0.25
    small: float = 0.10
    z_hacking: float = 3.0
    z_noise: float = 2.0


LABEL_RULE = LabelRule()


@dataclass(frozen=True)
class Label:
    """A trace's label and the numbers behind it (trace units).

    Attributes:
        label: ``hacking``, ``healthy`` or ``ambiguous``.
        reason: One line saying why.
        window: Evals per smoothing window.
        peak_level, final_level, start_level: Window means.
        drop, drop_se: Peak level minus final level, and its standard error.
        gain, gain_se: Peak level minus start, and its standard error.
        noise: Which estimate the standard errors come from (``paired``, ``per-eval``, ``curve``).
    """

    label: str
    reason: str
    window: int
    peak_level: float
    final_level: float
    start_level: float
    drop: float
    drop_se: float
    gain: float
    gain_se: float
    noise: str

    @property
    def drop_z(self) -> float:
        return _ratio(self.drop, self.drop_se)

    @property
    def give_back(self) -> float | None:
        """``drop / gain`` (None when the run never gained)."""
        return self.drop / self.gain if self.gain > 0 else None

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["drop_z"] = None if math.isinf(self.drop_z) else self.drop_z
        out["give_back"] = self.give_back
        return out


def _ratio(x: float, se: float) -> float:
    if x <= 0:
        return 0.0
    return x / se if se > 0 else math.inf


def _window(n: int) -> int:
    return 1 if n < 6 else min(5, max(2, round(n / 10)))


def _mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs)


def _window_se(examples: Sequence[Sequence[float] | None], a: range, b: range) -> float | None:
    """Standard error of ``mean(window a) - mean(window b)`` from per-example scores (None if any eval has none)."""
    ev = [examples[i] if i < len(examples) else None for i in (*a, *b)]
    if any(e is None or len(e) < 2 for e in ev):
        return None
    sizes = {len(e) for e in ev}  # type: ignore[arg-type]
    if len(sizes) == 1:
        n = sizes.pop()
        diffs = [
            _mean([examples[i][x] for i in a]) - _mean([examples[i][x] for i in b])  # type: ignore[index]
            for x in range(n)
        ]
        return statistics.stdev(diffs) / math.sqrt(n)

    def var(win: range) -> float:
        return math.fsum(statistics.variance(examples[i]) / len(examples[i]) for i in win) / len(win) ** 2  # type: ignore

    return math.sqrt(var(a) + var(b))


def _curve_noise(scores: Sequence[float]) -> float:
    """Robust std of one eval's noise from second differences (which cancel a locally linear trend): their median
    absolute deviation, Gaussian-scaled, over sqrt(6) (the std of a second difference of independent noise)."""
    if len(scores) < 4:
        return 0.0
    d = [a - 2 * b + c for a, b, c in zip(scores, scores[1:], scores[2:])]
    med = statistics.median(d)
    return 1.4826 * statistics.median(abs(x - med) for x in d) / math.sqrt(6.0)


def label_trace(
    scores: Sequence[float], examples: Sequence[Sequence[float] | None] | None = None, rule: LabelRule = LABEL_RULE
) -> Label:
    """Label one gold curve (see the module docstring for the rule).

    Args:
        scores: Eval means in step order (at least one).
        examples: Per-example scores of each eval (None entries where an eval has none), if recorded.
        rule: The thresholds.

    Raises:
        ValueError: ``scores`` is empty.
    """
    n = len(scores)
    if n == 0:
        raise ValueError("label_trace needs at least one score")
    w = _window(n)
    levels = [_mean(scores[j : j + w]) for j in range(n - w + 1)]
    p = max(range(len(levels)), key=lambda j: (levels[j], -j))
    last = len(levels) - 1
    peak, final, start = levels[p], levels[last], levels[0]
    drop, gain = peak - final, peak - start
    win = [range(j, j + w) for j in range(len(levels))]
    drop_se = _window_se(examples or (), win[p], win[last]) if examples else None
    gain_se = _window_se(examples or (), win[p], win[0]) if examples else None
    if drop_se is not None and gain_se is not None:
        ex_sizes = {len(examples[i]) for i in (*win[p], *win[last], *win[0])}  # type: ignore[index,arg-type]
        noise = "paired" if len(ex_sizes) == 1 else "per-eval"
    else:
        sigma = _curve_noise(scores)
        drop_se = gain_se = sigma * math.sqrt(2.0 / w)
        noise = "curve"
    z_drop, z_gain = _ratio(drop, drop_se), _ratio(gain, gain_se)
    share = drop / gain if gain > 0 else math.inf
    if z_drop < rule.z_noise:
        label, reason = "healthy", f"no real decline: the final drop is {z_drop:.1f} SE (< {rule.z_noise:g})"
    elif share < rule.small:
        label, reason = "healthy", f"a small decline: {100 * share:.0f}% of the gain (< {100 * rule.small:g}%)"
    elif z_gain < rule.z_noise:
        label, reason = "ambiguous", f"a real decline ({z_drop:.1f} SE) after no real gain ({z_gain:.1f} SE)"
    elif share >= rule.give_back and z_drop >= rule.z_hacking:
        label, reason = (
            "hacking",
            (
                f"gave back {100 * share:.0f}% of the gain (>= {100 * rule.give_back:g}%), "
                f"{z_drop:.1f} SE (>= {rule.z_hacking:g})"
            ),
        )
    else:
        label, reason = (
            "ambiguous",
            (f"a decline of {100 * share:.0f}% of the gain at {z_drop:.1f} SE: real but below the hacking thresholds"),
        )
    return Label(label, reason, w, peak, final, start, drop, float(drop_se), gain, float(gain_se), noise)


def label_of(scores: Sequence[float], examples: Sequence[Sequence[float] | None] | None = None) -> str:
    """``"hacking"``, ``"healthy"`` or ``"ambiguous"``: :func:`label_trace`'s label."""
    return label_trace(scores, examples).label


@dataclass(frozen=True)
class RealTrace:
    """One recorded run, validated.

    Attributes:
        name: The file name without ``.jsonl`` (unique within a folder).
        path: Where it was read from.
        header: The header line (``job_id``, ``job_type``, optional ``trainer``, ``planned_steps``, ``config``,
            ``environment``, ``split``...).
        steps: Eval steps, strictly increasing.
        scores: Eval (gold) scores, one per step.
        proxy: Proxy reward per step where recorded (``None`` entries where not).
        wall_s: Seconds since training began per step where recorded.
        end: The end line, if any.
        examples: Per-example scores per step where recorded (``None`` entries where not).
        spreads: The recorded spread ``(eval_std, eval_n)`` per step where an eval line carries one (``None`` entries
            where not; empty: no eval line of the trace does).
    """

    name: str
    path: str
    header: dict[str, Any]
    steps: tuple[int, ...]
    scores: tuple[float, ...]
    proxy: tuple[float | None, ...]
    wall_s: tuple[float | None, ...]
    end: dict[str, Any] | None = field(default=None)
    examples: tuple[tuple[float, ...] | None, ...] = field(default=())
    spreads: tuple[tuple[float, int] | None, ...] = field(default=())

    @property
    def job_type(self) -> str:
        return self.header["job_type"]

    @property
    def environment(self) -> str | None:
        """The header's ``environment`` (None when the trace does not say)."""
        return self.header.get("environment")

    @property
    def split(self) -> str | None:
        """The header's ``split`` (``tune``/``test``; None when the trace does not say)."""
        return self.header.get("split")

    @property
    def labelling(self) -> Label:
        """The label with the numbers behind it (:func:`label_trace` on the gold curve and per-example scores)."""
        cached = self.__dict__.get("_labelling")
        if cached is None:
            cached = label_trace(self.scores, self.examples or None)
            object.__setattr__(self, "_labelling", cached)  # a pure function of frozen fields
        return cached

    @property
    def label(self) -> str:
        return self.labelling.label

    @property
    def hacking(self) -> bool:
        return self.label == "hacking"

    @property
    def has_examples(self) -> bool:
        """Whether every eval has per-example scores."""
        return bool(self.examples) and all(e is not None for e in self.examples)

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
        """The header's ``planned_steps`` if given (and not before the last eval), else the last eval step."""
        planned = self.header.get("planned_steps")
        return int(planned) if isinstance(planned, int) and planned >= self.steps[-1] > 0 else max(self.steps[-1], 1)

    @property
    def reported_planned_steps(self) -> int | None:
        """The header's ``planned_steps`` as the run's reports would have carried it (the trainer's ``max_steps``):
        an integer >= 1, else None (absent, or 0 as a recorder writes an unknown one). Unlike :attr:`planned_steps`
        it is never made up from the last eval: a replay reports only what the run knew."""
        planned = self.header.get("planned_steps")
        return planned if isinstance(planned, int) and not isinstance(planned, bool) and planned >= 1 else None

    @property
    def algo(self) -> str:
        """``grpo``/``ppo``/... from the recording config or the trainer name, else ``"unknown"``."""
        run = (self.header.get("config") or {}).get("run") or {}
        if run.get("algo"):
            return str(run["algo"])
        trainer = str(self.header.get("trainer") or "")
        return trainer.lower().removesuffix("trainer") or "unknown"

    def progress(self) -> tuple[float, ...]:
        """Progress of each eval: step / planned steps (a first eval at step 0 is placed just after 0)."""
        total = self.planned_steps
        out = [s / total for s in self.steps]
        if out[0] <= 0.0:  # the platform's progress starts after 0; keep the order strictly increasing
            out[0] = min(out[1], 1.0) / 2 if len(out) > 1 else 0.5
        return tuple(out)


def load_trace(path: str | Path) -> RealTrace:
    """Read and validate one trace file (at least 2 eval lines).

    Raises:
        TraceError: naming the file and the line of the first problem (bad JSON, missing or bad header, an
            unknown line kind or field, a non-finite or missing score, steps not strictly increasing, lines after the
            end line, fewer than two evaluations).
    """
    path = Path(path)
    t = read_trace(path, min_evals=2)
    ev = t.evals
    return RealTrace(
        path.stem,
        str(path),
        t.header,
        tuple(e["step"] for e in ev),
        tuple(float(e["eval_score"]) for e in ev),
        tuple(None if e.get("proxy_reward") is None else float(e["proxy_reward"]) for e in ev),
        tuple(None if e.get("wall_s") is None else float(e["wall_s"]) for e in ev),
        t.end,
        tuple(tuple(float(v) for v in e["eval_scores"]) if e.get("eval_scores") else None for e in ev),
        _spreads(ev),
    )


def _spreads(evals: Sequence[Mapping[str, Any]]) -> tuple[tuple[float, int] | None, ...]:
    """The recorded ``(eval_std, eval_n)`` of each eval line (validated by the reader), or ``()`` when none has one."""
    out = tuple(None if e.get("eval_std") is None else (float(e["eval_std"]), int(e["eval_n"])) for e in evals)
    return out if any(s is not None for s in out) else ()


def trace_files(folder: str | Path) -> list[Path]:
    """The ``*.jsonl`` files of ``folder``, sorted by name.

    Raises:
        FileNotFoundError: ``folder`` does not exist or is not a folder.
        TraceError: ``folder`` holds no ``*.jsonl`` file.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"trace folder {folder} does not exist or is not a folder")
    files = sorted(folder.glob("*.jsonl"))
    if not files:
        raise TraceError(
            f"{folder}: no traces (*.jsonl files) in this folder; record some with EvalStopCallback(trace_path=...)"
        )
    return files


def load_traces(folder: str | Path) -> list[RealTrace]:
    """Every ``*.jsonl`` trace of ``folder``, validated, sorted by name.

    Raises:
        FileNotFoundError: ``folder`` does not exist or is not a folder.
        TraceError: ``folder`` holds no ``*.jsonl`` file, or one of them is bad (file and line named).
    """
    return [load_trace(f) for f in trace_files(folder)]


def load_trace_folders(folders: Sequence[str | Path]) -> list[RealTrace]:
    """Every trace of several folders read together (:func:`load_traces` on each, in order).

    Raises:
        ValueError: A run (trace name) is in more than one of the folders; the names are listed.
        FileNotFoundError, TraceError: As :func:`load_traces`.
    """
    traces = [t for folder in folders for t in load_traces(folder)]
    seen = Counter(t.name for t in traces)
    twice = sorted(name for name, n in seen.items() if n > 1)
    if twice:
        raise ValueError("a run is in more than one folder: " + ", ".join(twice))
    return traces


def eval_samples_of(trace: RealTrace) -> int:
    """Completions per held-out prompt in ``trace``'s evals: its recorded run's ``eval_samples``
    (``python -m lab traces record --eval-samples``), 2 (the sentence-world environments' own) when it does not say."""
    return int(trace.header.get("config", {}).get("run", {}).get("eval_samples") or 2)


def sub_evals(trace: RealTrace, per: int = 2) -> list[RealTrace]:
    """``trace`` split into disjoint evals of ``per`` completions per held-out prompt, each a trace of the same run.

    A recording's per-example scores are prompt-major (every sample of the first held-out prompt, then of the
    second...), so sub-eval ``j`` takes samples ``j*per .. j*per+per-1`` of every prompt. Each is an independent eval
    of the very same policy at every step (with ``per=2``, of the environments' own size): the spread between them at
    one step is sampling noise alone, with the policy held fixed. A sub-eval is named ``<name>-sub<j>`` (a valid job
    id, as the trace names are) and keeps the header.

    Raises:
        ValueError: ``per`` < 1, the trace's samples per prompt are not a multiple of ``per`` larger than it, or an
            eval lacks per-example scores or has a count that is not a whole number of prompts.
    """
    if per < 1:
        raise ValueError(f"per must be >= 1, got {per}")
    n = eval_samples_of(trace)
    if n <= per or n % per:
        raise ValueError(
            f"trace {trace.name}: {n} samples per held-out prompt cannot be split into evals of {per} "
            "(record with --eval-samples set to a larger multiple of it)"
        )
    for step, ex in zip(trace.steps, trace.examples or (None,) * len(trace.steps)):
        if ex is None or len(ex) % n:
            raise ValueError(
                f"trace {trace.name}: the eval at step {step} has "
                + ("no per-example scores" if ex is None else f"{len(ex)} per-example scores, not a multiple of {n}")
            )
    out: list[RealTrace] = []
    for j in range(n // per):
        sub: tuple[tuple[float, ...], ...] = tuple(
            tuple(v for i, v in enumerate(e or ()) if (i % n) // per == j) for e in trace.examples
        )
        out.append(
            # A sub-eval's spread is its own (of its examples), not the recorded one of the whole eval.
            replace(
                trace,
                name=f"{trace.name}-sub{j}",
                scores=tuple(statistics.fmean(e) for e in sub),
                examples=sub,
                spreads=(),
            )
        )
    return out


def recorded_examples(trace: RealTrace) -> list[list[float] | None]:
    """The per-example scores of each eval of a validated trace (None where an eval has none)."""
    if not trace.examples:
        return [None] * len(trace.steps)
    return [None if e is None else list(e) for e in trace.examples]
