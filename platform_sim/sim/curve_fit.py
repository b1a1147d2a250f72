"""Calibrating the simulator's RLHF curves on recorded runs: per-trace shape fits and the distributions they give.

The synthetic workload draws its RLHF eval curves from Gao et al.'s form with our parameter ranges. The real-calibrated
workload (``WorkloadConfig(real_curves=...)``, ``evalstop-sim paper --curves real``) instead draws their *shape* from
recorded traces. Each trace (:class:`~platform_sim.sim.traces.RealTrace`) is fitted on its own, in its own units and
against its own progress (step / planned steps), so traces of different lengths, eval intervals and score scales mix:

- a **hacking** trace (label from :func:`~platform_sim.sim.traces.label_of`) is fitted with
  :class:`~platform_sim.sim.curves.PeakDeclineCurve`: the progress of its true peak, its post-peak decline rate in gains
  (the rise from the start to the peak) per unit of progress, and the total decline, in gains, after which it levels
  off (a run whose decline lasts to the end has ``drop = decline * (1 - peak)``);
- a **healthy** trace is fitted with :class:`~platform_sim.sim.curves.RiseCurve`: its plateau share, the share of its
  rise made by progress :data:`PLATEAU_AT` (0.5: a steady rise; near 1: done early, then a plateau);
- every trace gets its **per-eval noise** as a fraction of its gain (the fitted rise), so it carries over to any score
  scale: from the per-example scores where the trace has them (the standard error of each eval's mean,
  ``std / sqrt(n)``, root-mean-square over the evals), else from the fit's residuals. The per-example estimate is an
  upper bound of the eval-to-eval noise when every eval scores the same examples (a fixed example's difficulty moves
  every eval alike); the residual estimate is kept beside it (``noise_residual``) so the two can be compared.

Fits are least squares over a grid of the non-linear parameters (peak and levelling-off point; the rise's rate) with
the linear ones (start, gain, decline) solved exactly at each grid point, then refined on a finer grid around the
best; deterministic, no optimizer state.

:func:`calibrate` turns the fits into a :class:`CurveCalibration`: the fitted parameters per trace (the empirical
distribution, parameters kept together per trace so that their correlations survive), the share of hacking runs, and
which traces it came from. :meth:`CurveCalibration.draw` samples it with a smoothed bootstrap (a trace at random, then
a Gaussian kernel on each parameter on a logit or log scale).

**Split discipline.** When the traces' headers carry ``split`` (``tune``/``test``), :func:`calibration_from_folder`
reads only the ``tune`` traces: a ``test`` trace's file is opened for its header line only, never parsed further, so
nothing of a held-out run reaches the calibration. A folder whose traces carry no ``split`` is used whole, and the
calibration says so (``split = "all"``).

Everything here except :func:`calibration_from_folder` (which reads files) is pure.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .corpora import corpus_dir
from .curve_calibration import SMOOTHING, CurveCalibration
from .curves import RiseCurve
from .traces import RealTrace, TraceError, load_trace, recorded_examples

logger = logging.getLogger(__name__)

PLATEAU_AT = 0.5
"""Progress at which a healthy curve's plateau share (the share of its rise made so far) is measured."""

MIN_EVALS = 5
"""Fewest evals a trace needs to be fitted (a rise, a peak and a decline need a few points each)."""

SPLITS = ("tune", "test")


@dataclass(frozen=True)
class TraceFit:
    """The fitted shape of one trace (trace units for ``s0``/``gain``; the rest is scale-free).

    Args:
        name: The trace's name.
        label: ``hacking`` or ``healthy``.
        s0: Fitted score at progress 0.
        gain: Fitted rise: to the peak (hacking) or over the run (healthy), > 0.
        peak: Progress of the fitted true peak (hacking; None for healthy).
        decline: Post-peak decline, gains per unit of progress (hacking).
        drop: Total post-peak decline in gains before the curve levels off (hacking).
        plateau_share: Share of the rise made by progress :data:`PLATEAU_AT` (healthy).
        noise: Per-eval noise std / gain (the estimate the calibration uses).
        noise_source: ``examples`` (per-example scores) or ``residual`` (the fit's residuals).
        noise_residual: The residual estimate / gain, whatever ``noise_source`` is.
        rmse: Root-mean-square residual of the fit, in trace units.
    """

    name: str
    label: str
    s0: float
    gain: float
    peak: float | None
    decline: float | None
    drop: float | None
    plateau_share: float | None
    noise: float
    noise_source: str
    noise_residual: float
    rmse: float


def _as_arrays(progress: Sequence[float], scores: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    p, y = np.asarray(progress, dtype=float), np.asarray(scores, dtype=float)
    if p.ndim != 1 or p.shape != y.shape:
        raise ValueError("progress and scores must be 1-D sequences of the same length")
    if len(p) < MIN_EVALS:
        raise ValueError(f"a fit needs at least {MIN_EVALS} evals, got {len(p)}")
    if np.any(np.diff(p) <= 0) or p[0] <= 0 or not np.all(np.isfinite(y)):
        raise ValueError("progress must strictly increase from > 0 and scores must be finite")
    return p, y


def _hacking_grid(
    p: np.ndarray, y: np.ndarray, peaks: np.ndarray, ends: np.ndarray
) -> tuple[float, float, float, float, float, float]:
    """Best ``(sse, s0, gain, c, peak, end)`` over every (peak, end) pair with ``end > peak``; ``c`` = gain x decline.

    The model at fixed (peak, end) is linear in (s0, gain, c): ``s0 + gain * rise(p) - c * (min(p, end) - peak)+``.
    """
    rise = 1.0 - (1.0 - np.minimum(p[None, :] / peaks[:, None], 1.0)) ** 2  # (I, n)
    fall = np.maximum(np.minimum(p[None, None, :], ends[None, :, None]) - peaks[:, None, None], 0.0)  # (I, J, n)
    design = np.stack(np.broadcast_arrays(np.ones_like(fall), rise[:, None, :], -fall), axis=-1)  # (I, J, n, 3)
    theta = np.einsum("ijkn,n->ijk", np.linalg.pinv(design), y)  # (I, J, 3)
    sse = ((np.einsum("ijnk,ijk->ijn", design, theta) - y) ** 2).sum(-1)
    ok = (ends[None, :] > peaks[:, None]) & (theta[..., 1] > 0) & (theta[..., 2] >= 0)
    if not ok.any():
        raise ValueError("no rise-then-decline shape fits these scores (no positive rise with a decline after it)")
    sse = np.where(ok, sse, np.inf)
    i, j = np.unravel_index(int(np.argmin(sse)), sse.shape)
    s0, gain, c = (float(v) for v in theta[i, j])
    return float(sse[i, j]), s0, gain, c, float(peaks[i]), float(ends[j])


def fit_hacking(progress: Sequence[float], scores: Sequence[float]) -> dict[str, float]:
    """Least-squares fit of :class:`~platform_sim.sim.curves.PeakDeclineCurve` (without its clip at 0).

    Args:
        progress: Progress of each eval, strictly increasing in (0, 1].
        scores: The eval scores (any units), at least :data:`MIN_EVALS`.

    Returns:
        ``{"s0", "gain", "peak", "decline", "drop", "sse"}``; the peak lies strictly between the first and the last
        eval.

    Raises:
        ValueError: too few evals, bad input, or no positive rise followed by a decline fits.
    """
    p, y = _as_arrays(progress, scores)
    lo, hi = p[0] + 1e-3 * (p[1] - p[0]), p[-2]
    peaks = np.linspace(lo, hi, 121)
    ends = np.linspace(0.0, 1.0, 101)[1:]
    sse, s0, gain, c, pk, end = _hacking_grid(p, y, peaks, ends)
    dp, de = (hi - lo) / 120, 0.01
    peaks = np.clip(np.linspace(pk - dp, pk + dp, 21), lo, hi)
    ends = np.clip(np.linspace(end - de, end + de, 21), 1e-6, 1.0)
    sse, s0, gain, c, pk, end = _hacking_grid(p, y, np.unique(peaks), np.unique(ends))
    end = min(end, 1.0)
    return {"s0": s0, "gain": gain, "peak": pk, "decline": c / gain, "drop": c * (end - pk) / gain, "sse": sse}


def _healthy_grid(p: np.ndarray, y: np.ndarray, kappas: np.ndarray) -> tuple[float, float, float, float]:
    h = RiseCurve.shape(kappas[:, None], p[None, :])  # (K, n)
    hm, ym = h.mean(1), y.mean()
    var = ((h - hm[:, None]) ** 2).sum(1)
    gain = np.where(var > 0, ((h - hm[:, None]) * (y - ym)).sum(1) / np.where(var > 0, var, 1.0), 0.0)
    s0 = ym - gain * hm
    sse = ((s0[:, None] + gain[:, None] * h - y) ** 2).sum(1)
    sse = np.where(gain > 0, sse, np.inf)
    if not np.isfinite(sse).any():
        raise ValueError("no rising curve fits these scores (they never rise)")
    k = int(np.argmin(sse))
    return float(sse[k]), float(s0[k]), float(gain[k]), float(kappas[k])


def fit_healthy(progress: Sequence[float], scores: Sequence[float]) -> dict[str, float]:
    """Least-squares fit of :class:`~platform_sim.sim.curves.RiseCurve`.

    Args:
        progress: Progress of each eval, strictly increasing in (0, 1].
        scores: The eval scores (any units), at least :data:`MIN_EVALS`.

    Returns:
        ``{"s0", "gain", "plateau_share", "sse"}``; ``plateau_share`` is the share of the rise made by progress
        :data:`PLATEAU_AT`.

    Raises:
        ValueError: too few evals, bad input, or the scores never rise.
    """
    p, y = _as_arrays(progress, scores)
    sse, s0, gain, kappa = _healthy_grid(p, y, np.linspace(-12.0, 16.0, 281))
    sse, s0, gain, kappa = _healthy_grid(p, y, np.linspace(kappa - 0.1, kappa + 0.1, 41))
    share = float(RiseCurve.shape(kappa, PLATEAU_AT))
    return {"s0": s0, "gain": gain, "plateau_share": share, "sse": sse}


def example_noise(examples: Sequence[Sequence[float] | None]) -> float | None:
    """Root-mean-square over evals of each eval's standard error ``std(ddof=1) / sqrt(n)`` (trace units).

    Args:
        examples: Per-example scores of each eval (None or fewer than 2 where an eval has none).

    Returns:
        The estimate, or None when no eval has at least 2 per-example scores.
    """
    var = [float(np.var(e, ddof=1)) / len(e) for e in examples if e is not None and len(e) >= 2]
    return math.sqrt(sum(var) / len(var)) if var else None


def fit_trace(trace: RealTrace, examples: Sequence[Sequence[float] | None] | None = None) -> TraceFit:
    """Fit one labelled trace (pure: the per-example scores are passed in).

    Args:
        trace: A validated trace; its label (``trace.label``) picks the model. Only ``hacking`` and ``healthy`` are
            fitted.
        examples: Its per-example scores per eval (:func:`~platform_sim.sim.traces.recorded_examples`), or None.

    Raises:
        ValueError: the label is neither ``hacking`` nor ``healthy``, the trace is too short, or no shape fits.
    """
    label = trace.label
    progress, scores = trace.progress(), trace.scores
    if label == "hacking":
        fit = fit_hacking(progress, scores)
        params = 5
    elif label == "healthy":
        fit = fit_healthy(progress, scores)
        params = 3
    else:
        raise ValueError(f"trace {trace.name}: label {label!r} is neither hacking nor healthy; not fitted")
    gain, n = fit["gain"], len(scores)
    rmse = math.sqrt(fit["sse"] / n)
    residual = math.sqrt(fit["sse"] / max(n - params, 1)) / gain
    per_example = example_noise(examples) if examples is not None else None
    noise, source = (per_example / gain, "examples") if per_example is not None else (residual, "residual")
    return TraceFit(
        trace.name,
        label,
        fit["s0"],
        gain,
        fit.get("peak"),
        fit.get("decline"),
        fit.get("drop"),
        fit.get("plateau_share"),
        noise,
        source,
        residual,
        rmse,
    )


NOISE_SOURCES = ("examples", "residual")


def calibrate(
    traces: Sequence[RealTrace],
    examples: Sequence[Sequence[Sequence[float] | None] | None] | None = None,
    split: str = "all",
    job_types: Sequence[str] | None = ("rlhf",),
    smoothing: float = SMOOTHING,
    noise: str = "examples",
) -> tuple[CurveCalibration, list[TraceFit]]:
    """Fit every usable trace and build the calibration (pure).

    Args:
        traces: The traces to fit (the caller has already applied the split discipline; see
            :func:`calibration_from_folder`).
        examples: Per-example scores of each trace (same order), or None for none.
        split: What ``traces`` are: ``tune`` or ``all``.
        job_types: Job types to fit (default RLHF only: the simulator's DPO and LoRA jobs keep their own curves);
            None: every type.
        smoothing: See :class:`CurveCalibration`.
        noise: ``examples``: each trace's per-example estimate where it has per-example scores, else its residual
            one (:class:`TraceFit` ``noise``); ``residual``: the residual estimate for every trace.

    Returns:
        The calibration and the per-trace fits. Traces of other job types, with another label (e.g. ``ambiguous``),
        too short, or that no shape fits are left out and logged.

    Raises:
        ValueError: no hacking or no healthy trace could be fitted.
    """
    if noise not in NOISE_SOURCES:
        raise ValueError(f"noise must be one of {', '.join(NOISE_SOURCES)}, got {noise!r}")
    if examples is not None and len(examples) != len(traces):
        raise ValueError(f"examples has {len(examples)} entries for {len(traces)} traces")
    fits: list[TraceFit] = []
    for i, trace in enumerate(traces):
        if job_types is not None and trace.job_type not in job_types:
            logger.info("curve calibration: %s skipped (job type %s)", trace.name, trace.job_type)
            continue
        try:
            fits.append(fit_trace(trace, examples[i] if examples is not None else None))
        except ValueError as exc:
            logger.warning("curve calibration: %s left out: %s", trace.name, exc)

    def noise_of(f: TraceFit) -> float:
        return f.noise if noise == "examples" else f.noise_residual

    hacking = tuple((f.peak, f.decline, f.drop, noise_of(f)) for f in fits if f.label == "hacking")
    healthy = tuple((f.plateau_share, noise_of(f)) for f in fits if f.label == "healthy")
    cal = CurveCalibration(
        hacking=hacking,  # type: ignore[arg-type]  # a hacking fit always has its peak, decline and drop
        healthy=healthy,  # type: ignore[arg-type]
        hack_share=len(hacking) / len(fits) if fits else 0.0,
        split=split,
        traces=tuple(f.name for f in fits),
        smoothing=smoothing,
    )
    return cal, fits


def _header_of(path: Path) -> dict[str, Any]:
    """The header line of a trace file, and nothing else of it."""
    with open(path, encoding="utf-8") as fh:
        for no, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{path}:{no}: not valid JSON ({exc.msg})") from None
            if not isinstance(obj, dict) or obj.get("kind") != "header":
                raise TraceError(f"{path}:{no}: the first line must be the header (kind 'header')")
            return obj
    raise TraceError(f"{path}:1: empty trace (no header line)")


def calibration_traces(folder: str | Path) -> tuple[list[RealTrace], str]:
    """The traces of ``folder`` a calibration may read, and which split they are.

    When any header carries ``split``, only the ``tune`` traces are read (a ``test`` trace's file is opened for its
    header line only; a trace without ``split`` in such a folder is not known to be a tuning trace and is left out);
    otherwise every trace is read and the split is ``all``.

    Raises:
        FileNotFoundError: ``folder`` is not a folder.
        TraceError: no traces, a bad header or ``split`` value (file and line named), no ``tune`` trace, or a
            bad tuning trace.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"trace folder {folder} does not exist or is not a folder")
    files = sorted(folder.glob("*.jsonl"))
    if not files:
        raise TraceError(f"{folder}: no traces (*.jsonl files) in this folder")
    headers = [_header_of(f) for f in files]
    for f, h in zip(files, headers):
        if "split" in h and h["split"] not in SPLITS:
            raise TraceError(f"{f}:1: header field split must be 'tune' or 'test', got {h['split']!r}")
    if not any("split" in h for h in headers):
        logger.info("curve calibration: the traces of %s carry no split; all %d are used", folder, len(files))
        return [load_trace(f) for f in files], "all"
    tune = [f for f, h in zip(files, headers) if h.get("split") == "tune"]
    unsplit = [f.name for f, h in zip(files, headers) if "split" not in h]
    if unsplit:
        logger.warning("curve calibration: %d trace(s) without split left out: %s", len(unsplit), ", ".join(unsplit))
    if not tune:
        raise TraceError(f"{folder}: no trace with split 'tune'; a calibration is fitted on tuning traces only")
    return [load_trace(f) for f in tune], "tune"


def calibration_from_folder(
    folder: str | Path,
    job_types: Sequence[str] | None = ("rlhf",),
    smoothing: float = SMOOTHING,
    noise: str = "examples",
) -> tuple[CurveCalibration, list[TraceFit]]:
    """Read the calibration traces of ``folder`` (:func:`calibration_traces`) and :func:`calibrate` them
    (arguments as there)."""
    traces, split = calibration_traces(folder)
    return calibrate(
        traces,
        [recorded_examples(t) for t in traces],
        split=split,
        job_types=job_types,
        smoothing=smoothing,
        noise=noise,
    )


# -- command-line flags ------------------------------------------------------------------------------------------

CURVE_MODES = ("synthetic", "real")


def add_curve_args(p: argparse.ArgumentParser) -> None:
    """``--curves`` and ``--curve-traces``, for commands that generate workloads."""
    g = p.add_argument_group("RLHF curves")
    g.add_argument(
        "--curves",
        choices=CURVE_MODES,
        default="synthetic",
        help="RLHF eval curves: synthetic (Gao et al.'s form, the default) or real (shapes and noise "
        "fitted on recorded traces; only their tune split when the traces carry one)",
    )
    g.add_argument(
        "--curve-traces",
        default=None,
        metavar="DIR",
        help="trace folder of --curves real (default: the shipped corpus)",
    )


def calibration_from_args(args: argparse.Namespace) -> CurveCalibration | None:
    """The calibration ``--curves``/``--curve-traces`` ask for (None: synthetic curves).

    Raises:
        ValueError: ``--curve-traces`` without ``--curves real``, or a folder that cannot be calibrated on (the
            message names the flag).
    """
    mode, folder = getattr(args, "curves", "synthetic"), getattr(args, "curve_traces", None)
    if mode != "real":
        if folder is not None:
            raise ValueError("--curve-traces needs --curves real")
        return None
    try:
        cal, _ = calibration_from_folder(folder if folder is not None else corpus_dir("real"))
    except (OSError, ValueError) as exc:  # TraceError is a ValueError
        raise ValueError(f"--curve-traces: {exc}") from None
    return cal
