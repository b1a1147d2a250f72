"""``evalstop-sim tune``: recorded traces as the trials of a real local Ray Tune experiment, with and without EvalStop.

Every trace of the folder is one trial. The trial replays the trace's eval curve at a scaled wall-clock pace: it
sleeps ``--eval-seconds`` for the training between two evals, then reports ``{"step", "eval_score"}`` (plus
``eval_scores`` for detectors that read per-example scores, and the header's ``planned_steps`` as
``TuneClient`` reports the trainer's ``max_steps``) through ``ray.tune.report``, while holding
``--gpus-per-trial`` units of a custom ``evalstop_gpu`` resource of which the local Ray instance has ``--gpus``. So at
most ``gpus / gpus_per_trial`` trials run at once and the others wait in Tune's queue, as jobs wait for GPUs.

The experiment runs twice: with the base scheduler alone (``without``) and with
:class:`~platform_sim.integrations.ray_tune.EvalStopScheduler` around it (``with``). Scores are mapped onto the
simulator's 0-1 scale by the same corpus-wide affine map as ``evalstop-sim replay``, and the embedded core is run on
every trace's eval sequence (``platform_sim.studies.trace_detection.trace_detection``) to check that Tune's decisions equal the
core's for every trace.

Measured figures (from the driver's clock, through a Tune callback, counted from the start of the first trial):
``makespan_s`` (to the last trial's end), each trial's waiting time in the queue (``mean_wait_s``, ``max_wait_s``) and
running time, ``trial_hours`` (the running times summed and converted
to the recorded runs' time scale: one eval interval stands for ``--hours-per-eval`` hours of training, so a wall second
stands for ``hours_per_eval * 3600 / eval_seconds`` seconds). Only traces labelled ``hacking`` or ``healthy`` are
counted in ``stopped_hacking``/``stopped_healthy``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from platform_sim.core import default_spec, detector_from_spec
from platform_sim.sim.cli_args import add_corpus_arg, add_detector_args, detector_from_args, traces_folder
from platform_sim.sim.report import detector_line

logger = logging.getLogger(__name__)

RESOURCE = "evalstop_gpu"
"""The custom Ray resource the trials hold (a stand-in for GPUs on a CPU-only machine)."""
BASES: tuple[str, ...] = ("fifo", "asha")
COUNTED_LABELS: tuple[str, ...] = ("hacking", "healthy")


class TuneUsageError(ValueError):
    """Bad input to ``evalstop-sim tune``; the message names the flag."""


@dataclass(frozen=True)
class TuneReplayConfig:
    """One ``evalstop-sim tune`` experiment.

    Args:
        base: Base scheduler, ``"fifo"`` or ``"asha"``.
        gpus: Units of the ``evalstop_gpu`` resource of the local Ray instance. Integer >= 1.
        gpus_per_trial: Units each trial holds while it runs. Integer in [1, gpus].
        eval_seconds: Wall-clock seconds of training between two evals of a trial. > 0.
        hours_per_eval: Hours of training one eval interval stands for (the time scale of ``trial_hours``). > 0.
        detector: EvalStop's detector spec on the 0-1 scale (None: the project's default).
        cpus: CPUs of the local Ray instance (the trials take none; Tune's driver and the actors share them).
    """

    base: str = "fifo"
    gpus: int = 8
    gpus_per_trial: int = 1
    eval_seconds: float = 0.25
    hours_per_eval: float = 0.5
    detector: Mapping[str, Any] | None = None
    cpus: int = 2

    def __post_init__(self) -> None:
        if self.base not in BASES:
            raise TuneUsageError(f"--base must be one of {', '.join(BASES)}, got {self.base!r}")
        for name in ("gpus", "gpus_per_trial", "cpus"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise TuneUsageError(f"--{name.replace('_', '-')} must be an integer >= 1, got {v!r}")
        if self.gpus_per_trial > self.gpus:
            raise TuneUsageError(
                f"--gpus-per-trial ({self.gpus_per_trial}) exceeds --gpus ({self.gpus}): no trial could ever start"
            )
        for name in ("eval_seconds", "hours_per_eval"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise TuneUsageError(f"--{name.replace('_', '-')} must be a finite number > 0, got {v!r}")

    @property
    def time_scale(self) -> float:
        """Seconds of the recorded runs' time per wall-clock second of the replay."""
        return self.hours_per_eval * 3600.0 / self.eval_seconds


def _replay_trial(config: dict[str, Any], curves: Mapping[str, Mapping[str, Any]], eval_seconds: float) -> None:
    """The trainable: one trace's evals, one ``tune.report`` per eval, ``eval_seconds`` of 'training' before each."""
    from ray import tune

    from platform_sim.integrations.ray_tune import PLANNED_KEY

    curve = curves[config["trace"]]
    examples = curve.get("examples")
    for i, (step, score) in enumerate(zip(curve["steps"], curve["scores"])):
        time.sleep(eval_seconds)
        metrics: dict[str, Any] = {"step": step, "eval_score": score}
        if examples and examples[i]:
            metrics["eval_scores"] = examples[i]
        if curve.get("planned_steps"):
            # As TuneClient reports the trainer's max_steps: the scheduler's per-run test reads it, as the embedded
            # core's check (trace_detection) reads the header's.
            metrics[PLANNED_KEY] = curve["planned_steps"]
        tune.report(metrics)


def _timing_callback() -> Any:
    from ray.tune import Callback

    class _Timing(Callback):
        """Driver-side clock of every trial: start, end, last reported step."""

        def __init__(self) -> None:
            self.t0 = time.monotonic()
            self.trials: dict[str, dict[str, Any]] = {}

        def _row(self, trial: Any) -> dict[str, Any]:
            return self.trials.setdefault(
                trial.trial_id,
                {"trace": trial.config["trace"], "start": None, "end": None, "last_step": None, "error": False},
            )

        def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self._row(trial)["start"] = time.monotonic() - self.t0

        def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
            if "step" in result:
                self._row(trial)["last_step"] = result["step"]

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self._row(trial)["end"] = time.monotonic() - self.t0

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            row = self._row(trial)
            row["end"], row["error"] = time.monotonic() - self.t0, True

    return _Timing()


def _base_scheduler(base: str, n_evals: int) -> Any:
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    if base == "fifo":
        return FIFOScheduler()
    # ASHA as a user would run it on these trials: one rung halfway through, the better half goes on.
    return ASHAScheduler(
        time_attr="training_iteration",
        metric="eval_score",
        mode="max",
        max_t=n_evals,
        grace_period=max(1, n_evals // 2),
        reduction_factor=2,
    )


def run_tune_experiment(
    curves: Mapping[str, Mapping[str, Any]], cfg: TuneReplayConfig, evalstop: bool, storage_path: str
) -> tuple[dict[str, dict[str, Any]], Any]:
    """Run one Tune experiment over ``curves`` on the Ray instance already started; per-trace timings and the
    EvalStop scheduler (None without EvalStop).

    Args:
        curves: Trace name -> ``{"steps", "scores", "examples"}`` (scores on the 0-1 scale).
        cfg: The experiment.
        evalstop: Wrap the base scheduler in :class:`EvalStopScheduler`.
        storage_path: Folder for Tune's results.
    """
    from ray import tune

    from platform_sim.integrations.ray_tune import EvalStopScheduler

    n_evals = max(len(c["steps"]) for c in curves.values())
    base = _base_scheduler(cfg.base, n_evals)
    scheduler = EvalStopScheduler(base, detector=cfg.detector) if evalstop else None
    timing = _timing_callback()
    trainable = tune.with_resources(
        tune.with_parameters(_replay_trial, curves=dict(curves), eval_seconds=cfg.eval_seconds),
        {"CPU": 0, RESOURCE: cfg.gpus_per_trial},
    )
    tuner = tune.Tuner(
        trainable,
        param_space={"trace": tune.grid_search(sorted(curves))},
        tune_config=tune.TuneConfig(scheduler=scheduler or base, reuse_actors=True),
        run_config=tune.RunConfig(
            storage_path=storage_path,
            name=f"evalstop-{'with' if evalstop else 'without'}",
            verbose=0,
            callbacks=[timing],
        ),
    )
    timing.t0 = time.monotonic()
    grid = tuner.fit()
    if grid.errors:
        raise RuntimeError(f"{len(grid.errors)} trial(s) failed: {grid.errors[0]}")
    rows: dict[str, dict[str, Any]] = {}
    for tid, row in timing.trials.items():
        row = dict(row, trial_id=tid)
        if scheduler is not None and tid in scheduler._monitors:
            row["evalstop_stop_step"] = scheduler.monitor(tid).stopped_at
        else:
            row["evalstop_stop_step"] = None
        rows[row["trace"]] = row
    return rows, scheduler


def summarize(
    rows: Mapping[str, Mapping[str, Any]],
    labels: Mapping[str, str],
    last_steps: Mapping[str, int],
    cfg: TuneReplayConfig,
) -> dict[str, Any]:
    """One side of the comparison: trials stopped by label, trial-hours, makespan and queue waits."""
    stopped = {name: r["last_step"] is not None and r["last_step"] < last_steps[name] for name, r in rows.items()}
    run_s = [r["end"] - r["start"] for r in rows.values()]
    # The clock starts when the first trial starts: Tune's own set-up before it is the same with and without.
    origin = min(r["start"] for r in rows.values())
    waits = [r["start"] - origin for r in rows.values()]
    return {
        "trials": len(rows),
        "hacking": sum(labels[n] == "hacking" for n in rows),
        "healthy": sum(labels[n] == "healthy" for n in rows),
        "stopped_hacking": sum(stopped[n] and labels[n] == "hacking" for n in rows),
        "stopped_healthy": sum(stopped[n] and labels[n] == "healthy" for n in rows),
        "trial_s": sum(run_s),
        "trial_hours": sum(run_s) * cfg.time_scale / 3600.0,
        "makespan_s": max(r["end"] for r in rows.values()) - origin,
        "mean_wait_s": sum(waits) / len(waits),
        "max_wait_s": max(waits),
    }


def tune_replay(traces: Sequence[Any], cfg: TuneReplayConfig, address: str | None = None) -> dict[str, Any]:
    """Both experiments over ``traces`` and the check against the embedded core.

    Args:
        traces: Validated traces (:func:`platform_sim.sim.traces.load_traces`).
        cfg: The experiment.
        address: An existing Ray cluster to use (it must offer the ``evalstop_gpu`` resource); None starts a local
            instance with ``cfg.cpus`` CPUs and ``cfg.gpus`` units of it, shut down at the end.

    Returns:
        ``{"with", "without", "traces", "decisions_equal_core", "config"}``.
    """
    import ray

    from platform_sim.sim.traces import recorded_examples
    from platform_sim.studies.trace_detection import corpus_scale, trace_detection

    if not traces:
        raise TuneUsageError("--traces: no traces")
    scale = corpus_scale(traces)
    det = detector_from_spec(default_spec() if cfg.detector is None else cfg.detector)  # as the scheduler reads it
    spec = det.spec()
    per_example = det.uses_example_scores
    curves: dict[str, dict[str, Any]] = {}
    for t in traces:
        examples = None
        if per_example:
            examples = [[scale(v) for v in e] if e else None for e in recorded_examples(t)]
        curves[t.name] = {
            "steps": list(t.steps),
            "scores": [scale(s) for s in t.scores],
            "examples": examples,
            "planned_steps": t.reported_planned_steps,
        }
    labels = {t.name: t.label for t in traces}
    last_steps = {t.name: t.steps[-1] for t in traces}
    core = {t.name: trace_detection(t, spec, scale) for t in traces}

    owns = False
    if not ray.is_initialized():
        if address is None:
            ray.init(
                num_cpus=cfg.cpus,
                resources={RESOURCE: cfg.gpus},
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
        else:
            ray.init(address=address, log_to_driver=False)
        owns = True
    try:
        with tempfile.TemporaryDirectory(prefix="evalstop-tune-") as storage:
            without, _ = run_tune_experiment(curves, cfg, False, storage)
            with_rows, _ = run_tune_experiment(curves, cfg, True, storage)
    finally:
        if owns:
            ray.shutdown()

    rows = []
    for t in traces:
        w, c = with_rows[t.name], core[t.name]
        core_stop = c["stop_step"]
        tune_stop = w["evalstop_stop_step"]
        # The base (ASHA) may end a trial before EvalStop saw the eval the core stops at: that is no disagreement.
        ended_before = w["last_step"] is not None and core_stop is not None and w["last_step"] < core_stop
        rows.append(
            {
                "trace": t.name,
                "label": t.label,
                "core_stop_step": core_stop,
                "tune_stop_step": tune_stop,
                "last_step_with": w["last_step"],
                "last_step_without": without[t.name]["last_step"],
                "agree": tune_stop == core_stop or (tune_stop is None and ended_before),
            }
        )
    counted = {n for n, lab in labels.items() if lab in COUNTED_LABELS}
    return {
        "with": summarize({n: with_rows[n] for n in counted}, labels, last_steps, cfg),
        "without": summarize({n: without[n] for n in counted}, labels, last_steps, cfg),
        "traces": rows,
        "decisions_equal_core": all(r["agree"] for r in rows),
        "config": {
            "base": cfg.base,
            "gpus": cfg.gpus,
            "gpus_per_trial": cfg.gpus_per_trial,
            "eval_seconds": cfg.eval_seconds,
            "hours_per_eval": cfg.hours_per_eval,
            "detector": spec,
            "n_traces": len(traces),
            "counted_traces": len(counted),
            "cpus": cfg.cpus,
            "scale": {"lo": scale.lo, "hi": scale.hi},
        },
    }


# -- command line -------------------------------------------------------------------------------------------------


def add_tune(sub: argparse._SubParsersAction) -> None:
    """Add ``tune`` to ``evalstop-sim``."""
    p = sub.add_parser(
        "tune",
        help="recorded traces as trials of a real local Ray Tune experiment, with and without EvalStop",
        description="Run every trace of DIR as one Ray Tune trial that replays its eval curve at a scaled "
        "wall-clock pace while holding a custom GPU resource; run the experiment with the base scheduler "
        "alone and with EvalStopScheduler around it, and compare trials stopped, trial-hours, makespan "
        "and queue waits. Needs the ray extra.",
    )
    p.add_argument("--traces", default=None, metavar="DIR", help="folder of *.jsonl traces (default: the real corpus)")
    add_corpus_arg(p)
    p.add_argument("--base", default="fifo", choices=list(BASES), help="base scheduler (default fifo)")
    p.add_argument("--gpus", type=int, default=8, help="units of the custom GPU resource (default 8)")
    p.add_argument("--gpus-per-trial", type=int, default=1, help="units each trial holds (default 1)")
    p.add_argument(
        "--eval-seconds",
        type=float,
        default=0.25,
        help="wall-clock seconds between two evals of a trial (default 0.25)",
    )
    p.add_argument(
        "--hours-per-eval",
        type=float,
        default=0.5,
        help="hours of training one eval interval stands for, for trial_hours (default 0.5)",
    )
    p.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray instance (default 2)")
    p.add_argument("--address", default=None, help="an existing Ray cluster offering the evalstop_gpu resource")
    add_detector_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.set_defaults(func=cmd_tune)


ROW_KEYS = ("trials", "stopped_hacking", "stopped_healthy", "trial_hours", "makespan_s", "mean_wait_s", "max_wait_s")


def text_report(results: Mapping[str, Any]) -> str:
    lines = ["| run | " + " | ".join(ROW_KEYS) + " |", "|---" * (len(ROW_KEYS) + 1) + "|"]
    for side in ("without", "with"):
        r = results[side]
        cells = [f"{r[k]:.1f}" if isinstance(r[k], float) else str(r[k]) for k in ROW_KEYS]
        lines.append(f"| {side} EvalStop | " + " | ".join(cells) + " |")
    w, wo = results["with"], results["without"]
    saved = 100.0 * (1 - w["trial_hours"] / wo["trial_hours"]) if wo["trial_hours"] else 0.0
    lines.append("")
    lines.append(
        f"trial-hours saved {wo['trial_hours'] - w['trial_hours']:.1f} ({saved:.1f}%); makespan "
        f"{wo['makespan_s']:.1f} s -> {w['makespan_s']:.1f} s; Tune's decisions equal the embedded core's "
        f"for every trace: {'yes' if results['decisions_equal_core'] else 'NO'}"
    )
    return "\n".join(lines)


def cmd_tune(args: argparse.Namespace) -> int:
    from platform_sim.sim.traces import TraceError, load_traces

    try:
        cfg = TuneReplayConfig(
            base=args.base,
            gpus=args.gpus,
            gpus_per_trial=args.gpus_per_trial,
            eval_seconds=args.eval_seconds,
            hours_per_eval=args.hours_per_eval,
            detector=detector_from_args(args),
            cpus=args.cpus,
        )
        folder = traces_folder(args)
        try:
            traces = load_traces(folder)
        except (FileNotFoundError, TraceError) as exc:
            raise TuneUsageError(f"--traces: {exc}") from None
        try:
            import ray  # noqa: F401
        except ImportError:
            raise TuneUsageError("Ray is not installed: pip install 'evalstop[ray]'") from None
    except TuneUsageError as exc:
        sys.stderr.write(f"evalstop-sim tune: error: {exc}\n")
        return 2
    # Tune prints its experiment boxes on stdout; they go to stderr so that --json prints one JSON object.
    with contextlib.redirect_stdout(sys.stderr):
        results = tune_replay(traces, cfg, address=args.address)
    results["config"]["traces_dir"] = str(folder) if args.traces is not None else "shipped corpus"
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(text_report(results) + "\n" + detector_line(results["config"]["detector"]))
    return 0 if results["decisions_equal_core"] else 1
