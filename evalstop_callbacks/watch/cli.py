"""``evalstop watch``: follow a run's metrics log and stop the run when its eval score declines.

``add_parser(subparsers)`` registers the ``watch`` subcommand on the ``evalstop`` command; ``main(argv)`` runs it on
its own (``python -m evalstop_callbacks.watch LOG --metric NAME ...``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from platform_sim.core import default_spec
from platform_sim.core.detectors.registry import parse_detector_param

from ..nonfinite import DEFAULT_MAX_CONSECUTIVE
from .actions import STOP_WITH, process_state, stop_with_command
from .follow import Backoff
from .loop import StopPlan, run, write_result
from .records import FORMATS, WatchError
from .watcher import Watcher

logger = logging.getLogger(__name__)

DESCRIPTION = """\
Follow a training run's metrics log while it is written, hand each evaluation of --metric to the EvalStop core
(embedded, or an evalstop-server with --server/--token: only the whitelisted report crosses) and, at a stop, end
the run: SIGTERM to --pid and its whole process tree (SIGKILL after --grace) or the --on-stop command. The run
itself is not changed. A NaN or inf evaluation is recorded in the result and skipped; --max-non-finite of them in a
row stop the run as a decline would, with the best checkpoint kept.

Formats: verl's file logger (VERL_FILE_LOGGER_PATH: {"step": N, "data": {...}} per line), TensorBoard event files
(a file, or a folder searched at any depth; needs pip install 'evalstop[watch]'), plain JSONL ({"step": N, NAME:
value}). --format auto tells them apart and says which it chose."""

EPILOG = """\
The result (--result, default LOG.evalstop.json beside the log) holds decision, stop_step, best_step, best_score,
best_checkpoint, detector, evals, mode, keep_best, kept (the protected checkpoints: step, score, path, source) and
pruned (the folders deleted); the same JSON is printed as one line on stdout when the watch ends.
--on-stop runs through the shell with EVALSTOP_STOP_STEP, EVALSTOP_BEST_STEP, EVALSTOP_BEST_SCORE,
EVALSTOP_BEST_CHECKPOINT, EVALSTOP_PROTECTED_CHECKPOINT and EVALSTOP_RESULT in its environment, e.g.
  --on-stop 'ray job stop "$RAY_JOB_ID"'   --on-stop 'scancel "$SLURM_JOB_ID"'   --on-stop 'sky jobs cancel -y 3'

Exit status: 0 after a stop carried out, or when the watch ended with decision "continue" after --timeout; the
exit status of --pid when that process ended on its own; 1 when the --on-stop command failed; 2 on bad input (a log
of no known format, a --metric glob matching several series, a --pid of no process) and when the watch decided on
nothing (the log never appeared, or --metric never appeared in it: the line names the series seen and the closest);
130 when interrupted (SIGINT or SIGTERM), after writing the decision so far."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive(text: str) -> float:
    """Seconds: a finite number > 0."""
    try:
        value = float(text)
        ok = 0 < value < float("inf")
    except ValueError:
        value, ok = 0.0, False
    if not ok:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def _count(text: str) -> int:
    """A count: an integer >= 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return int(text)


def _pid(text: str) -> int:
    """A process id: an integer >= 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a process id >= 1, got {text!r}")
    return int(text)


def _detector(text: str) -> Any:
    """A detector name, or a JSON spec {"name": ..., "params": {...}}."""
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"not valid JSON: {exc.msg}") from None
    return text


def _detector_param(text: str) -> tuple[str, Any]:
    """``KEY=VALUE``, the value read as JSON (else kept as text), as the other commands' --detector-param."""
    try:
        return parse_detector_param(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_checkpoint_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of the best checkpoints (:class:`~evalstop_callbacks.keeper.BestCheckpoints`) and of the mode."""
    add = parser.add_argument
    add(
        "--checkpoints",
        type=Path,
        metavar="DIR",
        help="the framework's checkpoint folder (verl global_step_<N>, "
        "transformers checkpoint-<N>, OpenRLHF global_step<N>, NeMo-RL step_<N>): the best step's folder is named in the "
        "result, and the --keep-best best ones are protected from rotation as evalstop-best-<step> (hard-linked, else "
        "copied; said which)",
    )
    add(
        "--keep-best",
        type=_count,
        default=1,
        metavar="K",
        help="how many best checkpoints to keep protected (default 1; needs --checkpoints); one that falls out of "
        "the K best loses its evalstop-best-<step> copy",
    )
    add(
        "--prune-others",
        action="store_true",
        help="also delete the framework's checkpoints under --checkpoints that are neither among the K best nor "
        "the newest (the one a resume starts from); listed in the result's pruned",
    )
    add(
        "--mode",
        choices=("enforce", "observe"),
        default="enforce",
        help="enforce (default): act at a stop; observe: never stop, follow the log to its end, keep the best "
        "checkpoints and record where it would have stopped (would_stop_step)",
    )
    add(
        "--best-dir",
        type=Path,
        metavar="DIR",
        help="where the protected copies evalstop-best-<step> go (default "
        "the --checkpoints DIR; OpenRLHF deletes unknown folders in its checkpoint folder: give one outside it)",
    )


def _add_evidence_flags(parser: argparse.ArgumentParser) -> None:
    """What the detector sees of each evaluation beyond its mean: per-example scores, or the mean's spread."""
    add = parser.add_argument
    add(
        "--examples",
        type=Path,
        metavar="DIR",
        help="verl's validation dump (trainer.validation_data_dir: one "
        "<step>.jsonl per validation): per-example scores, paired across steps by input, for the detector; without "
        "it the detector decides on each eval's mean, with its spread where the log has one (and says so)",
    )
    add(
        "--std-metric",
        metavar="NAME",
        help="the series of the metric's standard deviation (a name ending in 'stderr': its standard error); default: "
        "the metric's sibling when the log holds one ('.../mean' -> '.../std', 'X' -> 'X_std', 'X_stderr'); with --n "
        "the detector decides on each eval's mean and spread",
    )
    add(
        "--n",
        type=int,
        metavar="N",
        help="how many example scores each evaluation averages (>= 2), which the spread needs",
    )
    add(
        "--planned-steps",
        type=int,
        metavar="N",
        help="the run's planned training steps (its max_steps, >= 1): the default detector then bounds its false "
        "stops per run, however often the run is evaluated; without it, per evaluation",
    )


def _add_stop_flags(parser: argparse.ArgumentParser) -> None:
    """How a stop reaches the run: a signal to its process tree, a command, or its cluster scheduler."""
    add = parser.add_argument
    stop = parser.add_mutually_exclusive_group()
    stop.add_argument(
        "--pid",
        type=_pid,
        metavar="PID",
        help="the trainer's process, or its launcher (bash, torchrun, accelerate launch): SIGTERM at a stop to it and "
        "every process below it (SIGKILL after --grace), and the watch checks they are gone; when it ends on its own "
        "the watch ends with its exit status. It must exist when the watch starts",
    )
    stop.add_argument(
        "--on-stop", metavar="CMD", help="shell command run at a stop, the decision in its environment (see below)"
    )
    stop.add_argument(
        "--stop-with",
        choices=STOP_WITH,
        help="end the job through its scheduler at a stop (Slurm scancel, Ray stop_job, Kubernetes suspend), "
        "the job named by --stop-handle or found in the environment",
    )
    add("--stop-handle", metavar="REF", help="the job's name for --stop-with (Slurm job id, Ray submission id, ...)")
    add(
        "--stop-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of the --stop-with actuator (repeatable), e.g. address=http://127.0.0.1:8265 for ray "
        "(default $RAY_ADDRESS)",
    )
    add("--grace", type=_positive, default=30.0, metavar="S", help="seconds from SIGTERM to SIGKILL (default 30)")


def configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``watch`` arguments to ``parser``."""
    add = parser.add_argument
    add("log", metavar="LOG", type=Path, help="the metrics log: a file, or a folder of TensorBoard event files")
    add(
        "--metric",
        required=True,
        metavar="NAME",
        help="the eval metric's name, or a glob matching exactly one "
        "series (verl: 'val-core/*/reward/mean@1'; OpenRLHF: 'eval/eval_*_pass1')",
    )
    add("--format", choices=FORMATS, default="auto", help="the log's format (default: auto, said which)")
    direction = parser.add_mutually_exclusive_group()
    direction.add_argument(
        "--greater-is-better",
        dest="greater_is_better",
        action="store_true",
        default=True,
        help="a higher metric is better (default)",
    )
    direction.add_argument(
        "--lower-is-better",
        dest="greater_is_better",
        action="store_false",
        help="a lower metric is better (a loss, an error rate): the detector sees the metric "
        "negated (-value, per-example scores too), so a rise is a decline; the result's scores "
        "stay in the metric's own units",
    )
    _add_evidence_flags(parser)
    add(
        "--detector",
        type=_detector,
        metavar="SPEC",
        help="detector name or JSON spec "
        '\'{"name": ..., "params": {...}}\' (default: the project\'s default detector, platform_sim.core.'
        "default_spec())",
    )
    add(
        "--detector-param",
        type=_detector_param,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set one parameter of --detector (repeatable; the value is read as JSON)",
    )
    add("--server", metavar="URL", help="an evalstop-server to decide (default: the embedded core, no server)")
    add("--token", metavar="T", help="the tenant's token for --server")
    _add_stop_flags(parser)
    add(
        "--timeout",
        type=_positive,
        metavar="S",
        help="end the watch after S seconds without a new evaluation of "
        "the metric; if it was never seen, with a one-line error naming the series the log showed",
    )
    add(
        "--warn-after",
        type=_positive,
        default=120.0,
        metavar="S",
        help="warn again every S seconds while the log does not exist or --metric has not appeared in it (default "
        "120; a metric is also warned about once other eval series were logged at two steps)",
    )
    add(
        "--max-non-finite",
        type=_count,
        default=DEFAULT_MAX_CONSECUTIVE,
        metavar="N",
        help="NaN or inf evaluations of the metric in a row that stop the run, with the best checkpoint kept "
        f"(default {DEFAULT_MAX_CONSECUTIVE}); fewer are recorded in the result and skipped",
    )
    _add_checkpoint_flags(parser)
    add("--result", type=Path, metavar="FILE", help="where the result JSON goes (default: LOG.evalstop.json)")
    add("--job-id", metavar="ID", help="the job's id (default: from the log's path, the same after a restart)")
    add("--job-type", choices=("rlhf", "dpo", "sft", "lora", "other"), default="rlhf", help="default rlhf")
    add(
        "--poll",
        type=_positive,
        default=1.0,
        metavar="S",
        help="longest wait between two reads of an idle log (default 1 s; 50 ms while lines arrive)",
    )
    add("-q", "--quiet", action="store_true", help="log warnings only")
    return parser


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``watch`` on an ``evalstop`` subparsers object; its handler is ``args.func(args) -> int``."""
    parser = subparsers.add_parser(
        "watch",
        help="follow a run's metrics log and stop it at a decline",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    configure(parser)
    parser.set_defaults(func=run_args)
    return parser


def _client(args: argparse.Namespace) -> Any:
    if args.server is None:
        if args.token is not None:
            raise WatchError("--token needs --server")
        return None
    if not args.token:
        raise WatchError("--server needs --token (evalstop-server tenant add NAME prints one)")
    from ..platform_client import PlatformClient  # httpx is only needed with a server

    try:
        # The watch says in its own terms (--planned-steps) what a job without a plan gives up.
        return PlatformClient(args.server, args.token, warn_without_plan=False)
    except ValueError as exc:
        raise WatchError(f"--server: {exc}") from None


def _on_stop(args: argparse.Namespace) -> str | None:
    """The ``--on-stop`` command, or the one that carries out ``--stop-with`` (:func:`.actions.stop_with_command`)."""
    if args.stop_with is None:
        if args.stop_handle is not None or args.stop_option:
            raise WatchError("--stop-handle and --stop-option need --stop-with")
        return args.on_stop  # type: ignore[no-any-return]
    try:
        return stop_with_command(args.stop_with, args.stop_handle, args.stop_option, os.environ)
    except ValueError as exc:
        raise WatchError(str(exc)) from None


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signum)


def run_args(args: argparse.Namespace) -> int:
    """Run a parsed ``watch`` command line; the exit status."""
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(message)s", stream=sys.stderr)
    detector = args.detector
    if args.detector_param:
        if detector is None or isinstance(detector, dict):
            base = detector or default_spec()
            detector = {"name": base["name"], "params": {**(base.get("params") or {}), **dict(args.detector_param)}}
        else:
            detector = {"name": detector, "params": dict(args.detector_param)}
    if args.examples is not None and not args.examples.exists():
        logger.info("evalstop watch: %s does not exist yet: waiting for verl's first validation dump", args.examples)
    if args.pid is not None and not process_state(args.pid).alive:
        why = "no such process (the trainer must run when the watch starts)"
        print(f"evalstop watch: error: --pid {args.pid}: {why}", file=sys.stderr)
        return 2
    result_file = args.result or args.log.with_name(args.log.name + ".evalstop.json")
    previous = signal.signal(signal.SIGTERM, _on_signal)  # a SIGTERM still writes the decision so far
    watcher = None
    try:
        watcher = Watcher(
            args.log,
            args.metric,
            format=args.format,
            greater_is_better=args.greater_is_better,
            examples=args.examples,
            detector=detector,
            client=_client(args),
            job_id=args.job_id,
            job_type=args.job_type,
            checkpoints=args.checkpoints,
            best_dir=args.best_dir,
            keep_best=args.keep_best,
            prune_others=args.prune_others,
            mode=args.mode,
            std_metric=args.std_metric,
            n=args.n,
            max_non_finite=args.max_non_finite,
            planned_steps=args.planned_steps,
        )
        plan = StopPlan(
            pid=args.pid,
            on_stop=_on_stop(args),
            grace=args.grace,
            timeout=args.timeout,
            backoff=Backoff(fast=min(0.05, args.poll), slow=args.poll),
            warn_after=args.warn_after,
        )
        outcome = run(watcher, plan, result_file)
    except WatchError as exc:
        print(f"evalstop watch: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if watcher is None:
            return 130
        result = watcher.result()
        result.ended = "interrupted"
        if result_file is not None:
            write_result(result, result_file)
        print(json.dumps(result.to_dict()), flush=True)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        if watcher is not None and hasattr(watcher.client, "close"):
            watcher.client.close()
    logger.info("evalstop watch: %s", outcome.message)
    print(json.dumps(outcome.result.to_dict()), flush=True)
    if outcome.error is not None:
        print(f"evalstop watch: error: {outcome.error}", file=sys.stderr)
    return outcome.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m evalstop_callbacks.watch LOG --metric NAME ...``: the exit status."""
    parser = _Parser(
        prog="evalstop watch",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    args = configure(parser).parse_args(argv)
    return run_args(args)
