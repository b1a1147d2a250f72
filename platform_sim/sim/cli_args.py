"""The argument-parser helpers of ``evalstop-sim`` (:mod:`platform_sim.cli`): one module for every command's flags.

The simulator's library modules never import this module: the commands import the library, not the other way round.
Here: :class:`Parser` (argparse with one-line errors), :class:`UsageError` (bad input, exit code 2), the workload
and detector flags (:func:`add_workload_args`, :func:`add_detector_args`, :func:`workload_from_args`,
:func:`detector_from_args`, :func:`detector_param`), the cadence flags of ``run``, ``paper`` and ``replay``
(:func:`add_cadence_args`, :func:`cadence_or_usage`, :func:`budget_or_usage`), and the flags that choose where the
independent simulations of a multi-run command run:

Every multi-run command of ``evalstop-sim`` (``paper``, ``replay``, ``detectors``, ``sweep``) calls
:func:`add_backend_args` on its sub-parser and :func:`runner_for_command` to get its
:class:`~platform_sim.sim.runner.Runner`:

- ``--backend pool`` (default): a local process pool of ``--workers`` processes;
- ``--backend ray``: Ray tasks, on the cluster at ``--address`` (or ``$RAY_ADDRESS``), else on a local Ray instance
  of ``--workers`` CPUs started for the command;
- ``--backend serial``: in this process (debugging, profiling).

Results are the same whatever the backend: each task carries its seed. What the commands print and write
(progress bar, ``--out``, ``--json``) is in :mod:`platform_sim.sim.cli_output`.

**The detector a command runs when given none** is the project's default, :func:`platform_sim.core.default_spec`
(``--k``/``--min-delta`` alone select ``k-decline``); only ``evalstop-sim paper`` runs the paper's rule
(:func:`platform_sim.core.paper_spec`), since it reproduces the paper.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

from platform_sim.core.cadence import EvalBudget, cadence_from_spec
from platform_sim.core.detectors import (
    DETECTORS,
    default_spec,
    detector_from_spec,
    paper_spec,
    parse_detector_param,
)

from .curve_fit import calibration_from_args
from .engine import DEFAULT_EVAL_COST
from .runner import ProcessRunner, Runner, SerialRunner
from .workload import MIXES, WorkloadConfig

BACKENDS: tuple[str, ...] = ("pool", "ray", "serial")


class UsageError(Exception):
    """Bad command-line input: printed as one line by :func:`platform_sim.cli.main`, exit code 2.

    Defined here, not in ``cli``, so that it is one class even under ``python -m platform_sim.cli``, where ``cli``
    runs as ``__main__``.
    """


def require_matplotlib(how_to_skip: str) -> None:
    """Refuse a command that will write plots, before it runs, when matplotlib is not installed (the base install
    has none: plots come with the ``plot`` extra).

    Args:
        how_to_skip: The flag change that runs the command without plots, said in the error (``pass --no-plots``).

    Raises:
        UsageError: matplotlib is not installed.
    """
    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError(
            f"plots need matplotlib, which is not installed: pip install 'evalstop[plot]', or {how_to_skip}"
        )


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (``prog: error: message``, exit code 2) instead of the usage block."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


class BackendArgError(ValueError):
    """A bad backend flag; the message names the flag."""


def add_backend_args(p: argparse.ArgumentParser) -> None:
    """Add ``--backend``, ``--workers`` and ``--address`` to a multi-run command's parser."""
    g = p.add_argument_group("where the simulations run")
    g.add_argument(
        "--backend",
        choices=BACKENDS,
        default="pool",
        help="pool: local process pool (default); ray: Ray tasks (pip install 'evalstop[ray]'); "
        "serial: in this process",
    )
    g.add_argument(
        "--workers",
        type=int,
        default=None,
        help="simulations at once (default: the CPUs available here; with --backend ray and --address: "
        "the whole cluster)",
    )
    g.add_argument(
        "--address",
        default=None,
        help="Ray cluster to use (e.g. ray://head:10001, or 'auto' on a cluster node); default: "
        "$RAY_ADDRESS, else a local Ray instance for this command",
    )


def runner_from_args(args: argparse.Namespace) -> Runner:
    """The runner chosen by :func:`add_backend_args`'s flags.

    Raises:
        BackendArgError: ``--workers`` < 1, ``--address`` without ``--backend ray``, or Ray not installed.
    """
    workers = getattr(args, "workers", None)
    backend = getattr(args, "backend", "pool")
    address = getattr(args, "address", None)
    if workers is not None and workers < 1:
        raise BackendArgError(f"--workers must be >= 1, got {workers}")
    if address is not None and backend != "ray":
        raise BackendArgError(f"--address needs --backend ray (got --backend {backend})")
    if backend == "ray":
        try:
            import ray  # noqa: F401  - fail here, with the flag's name, rather than at the first task
        except ImportError:
            raise BackendArgError("--backend ray needs Ray: pip install 'evalstop[ray]'") from None
        from .ray_backend import RayRunner

        return RayRunner(workers=workers, address=address)
    if backend == "serial":
        return SerialRunner()
    if backend != "pool":
        raise BackendArgError(f"--backend: unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    return ProcessRunner(workers=workers)


def runner_for_command(args: argparse.Namespace) -> Runner:
    """:func:`runner_from_args` for a command: a bad flag becomes the CLI's one-line usage error (exit code 2).

    Raises:
        UsageError: What :func:`runner_from_args` raises as :class:`BackendArgError`.
    """
    try:
        return runner_from_args(args)
    except BackendArgError as exc:
        raise UsageError(str(exc)) from None


# -- workload and detector flags ----------------------------------------------------------------------------------

#: ``WorkloadConfig`` field -> the flag that sets it, so that the config's own checks name the flag.
WORKLOAD_FLAGS: dict[str, str] = {
    "n_jobs": "--jobs",
    "gpus": "--gpus",
    "mix": "--mix",
    "hack_rate": "--hack-rate",
    "sigma": "--sigma",
    "n_evals": "--evals",
    "load": "--load",
    "est_error": "--est-error",
    "hack_gamma": "--hack-gamma",
}


def detector_param(text: str) -> tuple[str, Any]:
    """argparse type of ``--detector-param KEY=VALUE`` (:func:`~platform_sim.core.detectors.parse_detector_param`)."""
    try:
        return parse_detector_param(text)
    except ValueError as exc:  # argparse prints an ArgumentTypeError's own message
        raise argparse.ArgumentTypeError(str(exc)) from None


def seed_arg(text: str) -> int:
    """argparse type of a seed: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {value}")
    return value


def add_workload_args(p: argparse.ArgumentParser, *, paper_rule: bool = False) -> None:
    """Workload and detector flags shared by ``run``, ``paper`` and ``replay``.

    Args:
        p: The command's parser.
        paper_rule: See :func:`add_detector_args`.
    """
    d = WorkloadConfig()
    g = p.add_argument_group("workload")
    g.add_argument("--gpus", type=int, default=d.gpus, help=f"cluster size (default {d.gpus})")
    g.add_argument("--jobs", type=int, default=d.n_jobs, help=f"jobs per run (default {d.n_jobs})")
    g.add_argument("--mix", choices=list(MIXES), default=d.mix, help=f"job-type mix (default {d.mix})")
    g.add_argument("--sigma", type=float, default=d.sigma, help=f"eval noise std, >= 0 (default {d.sigma})")
    g.add_argument(
        "--hack-rate",
        type=float,
        default=d.hack_rate,
        help=f"fraction of RLHF jobs that hack, in [0, 1] (default {d.hack_rate})",
    )
    g.add_argument("--evals", type=int, default=d.n_evals, help=f"evals per run (default {d.n_evals})")
    g.add_argument("--load", type=float, default=d.load, help=f"offered load (default {d.load})")
    g.add_argument(
        "--est-error",
        type=float,
        default=d.est_error,
        help=f"std of log(user estimate / true duration) (default {d.est_error})",
    )
    g.add_argument(
        "--hack-gamma",
        type=float,
        default=d.hack_gamma,
        help=f"steepness of the hacking curves' decline (default {d.hack_gamma}; 1 = Gao's d linear)",
    )
    e = add_detector_args(p, paper_rule=paper_rule)
    e.add_argument("--stop-at-p", type=float, default=0.65, help="p of the stop-at-p baseline (default 0.65)")


def add_detector_args(p: argparse.ArgumentParser, *, paper_rule: bool = False) -> Any:
    """Add ``--detector``, ``--k``, ``--min-delta`` and ``--detector-param`` (group "EvalStop detector").

    Args:
        p: The command's parser.
        paper_rule: Whether the command's detector, when none is given, is the paper's rule (``paper`` only) rather
            than the project's default; it changes the help text only (:func:`detector_from_args` takes the spec).

    Returns:
        The argument group, for a command's further detector flags.
    """
    default = "the paper's rule, k-decline k=2" if paper_rule else f"the project's default, {default_spec()['name']}"
    e = p.add_argument_group("EvalStop detector")
    e.add_argument(
        "--detector",
        default=None,
        help=f"detector name (default: {default}; --k/--min-delta alone: k-decline; "
        f"registered: {', '.join(sorted(DETECTORS))})",
    )
    e.add_argument("--k", type=int, default=None, help="consecutive declines that stop a job (k-decline default 2)")
    e.add_argument("--min-delta", type=float, default=None, help="decline tolerance (k-decline default 0)")
    e.add_argument(
        "--detector-param",
        action="append",
        type=detector_param,
        default=[],
        metavar="KEY=VALUE",
        help="extra detector parameter (repeatable; value parsed as JSON when it can be)",
    )
    return e


def workload_from_args(args: argparse.Namespace) -> WorkloadConfig:
    """The :class:`WorkloadConfig` of :func:`add_workload_args`' flags; its own checks, reported with the flag.

    Raises:
        UsageError: a value the config rejects (the message names the flag), or a bad ``--stop-at-p``.
    """
    if not (0 < args.stop_at_p <= 1):
        raise UsageError(f"--stop-at-p must be in (0, 1], got {args.stop_at_p}")
    # WorkloadConfig does not check the decline's steepness; a curve with gamma <= 0 would not decline at all.
    if not (args.hack_gamma > 0) or not math.isfinite(args.hack_gamma):
        raise UsageError(f"--hack-gamma must be > 0, got {args.hack_gamma}")
    try:  # --curves/--curve-traces (run and paper only; other commands have no such flags)
        real_curves = calibration_from_args(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        return WorkloadConfig(
            n_jobs=args.jobs,
            gpus=args.gpus,
            mix=args.mix,
            hack_rate=args.hack_rate,
            sigma=args.sigma,
            n_evals=args.evals,
            load=args.load,
            est_error=args.est_error,
            hack_gamma=args.hack_gamma,
            real_curves=real_curves,
        )
    except ValueError as exc:
        msg = str(exc)
        flag = next((f for name, f in WORKLOAD_FLAGS.items() if name in msg), "workload")
        raise UsageError(f"{flag}: {msg}") from None


def detector_from_args(args: argparse.Namespace, fallback: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The detector spec of ``--detector/--k/--min-delta/--detector-param``, validated and complete.

    Args:
        args: The parsed flags of :func:`add_detector_args`.
        fallback: The spec when no detector flag is given (None: :func:`~platform_sim.core.default_spec`; ``paper``
            passes :func:`~platform_sim.core.paper_spec`). ``--k``/``--min-delta``/``--detector-param`` without
            ``--detector`` apply to ``k-decline``.

    Raises:
        UsageError: an unknown detector or a parameter it rejects (the message names the flag).
    """
    if args.detector is not None and args.detector not in DETECTORS:
        raise UsageError(
            f"--detector: unknown detector {args.detector!r}; choose one of {', '.join(sorted(DETECTORS))}"
        )
    params: dict[str, Any] = {}
    if args.k is not None:
        if args.k < 1:
            raise UsageError(f"--k must be an integer >= 1, got {args.k}")
        params["k"] = args.k
    if args.min_delta is not None:
        if not (args.min_delta >= 0) or not math.isfinite(args.min_delta):
            raise UsageError(f"--min-delta must be a finite number >= 0, got {args.min_delta}")
        params["min_delta"] = args.min_delta
    params.update(dict(args.detector_param))
    if args.detector is None and not params:
        return detector_from_spec(default_spec() if fallback is None else fallback).spec()
    spec = {"name": args.detector or paper_spec()["name"], "params": params}
    try:
        return detector_from_spec(spec).spec()
    except ValueError as exc:
        raise UsageError(f"--detector-param: {exc}") from None


def floats_arg(flag: str, text: str) -> tuple[float, ...]:
    """Comma-separated numbers >= 0 of ``flag``.

    Raises:
        UsageError: naming ``flag``.
    """
    try:
        vals = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UsageError(f"{flag} must be comma-separated numbers, got {text!r}") from None
    if not vals or any(not (v >= 0) for v in vals):
        raise UsageError(f"{flag} must be comma-separated numbers >= 0, got {text!r}")
    return vals


def add_cadence_args(p: Any) -> None:
    """Add ``--cadence``, ``--cadence-param``, ``--eval-cost`` and ``--max-extra-evals`` to a command's parser
    (``run``, ``paper``, ``replay``)."""
    p.add_argument(
        "--cadence",
        choices=("fixed", "adaptive"),
        default="fixed",
        help="EvalStop's eval cadence: fixed (every 5%% of a run, the default) or adaptive (the scheduler "
        "asks for a sooner eval while a decline may have begun)",
    )
    p.add_argument(
        "--cadence-param",
        action="append",
        type=detector_param,  # the same KEY=VALUE syntax as --detector-param
        default=[],
        metavar="KEY=VALUE",
        help="a parameter of --cadence adaptive: fraction, min_drop, p_hint, p_hint_at_best or confirm (repeatable; "
        "e.g. p_hint=0.8)",
    )
    p.add_argument(
        "--eval-cost",
        type=float,
        default=DEFAULT_EVAL_COST,
        metavar="SHARE",
        help="GPU time of one eval as a share of a regular eval interval (default "
        f"{DEFAULT_EVAL_COST:g}; regular evals are part of a run's planned time, extra ones add to it)",
    )
    p.add_argument(
        "--max-extra-evals",
        type=int,
        default=None,
        metavar="N",
        help="with --cadence adaptive: at most N extra evals per job, as EvalStopCallback's max_extra_evals "
        "(default: no limit)",
    )
    p.add_argument(
        "--max-eval-share",
        type=float,
        default=None,
        metavar="SHARE",
        help="with --cadence adaptive: follow no hint while a job's evals so far took more than SHARE of its time "
        "so far, as EvalStopCallback's max_eval_share (0 < SHARE < 1; the regular interval alone spends "
        "--eval-cost of it; default: no limit)",
    )


def eval_budget_from_args(args: Any) -> EvalBudget | None:
    """The parsed ``--max-extra-evals`` and ``--max-eval-share`` as one budget (None: neither given, no limit).

    Raises:
        ValueError: A value is out of range, or either is given without ``--cadence adaptive``.
    """
    n = getattr(args, "max_extra_evals", None)
    share = getattr(args, "max_eval_share", None)
    if n is None and share is None:
        return None
    if n is not None and n < 0:
        raise ValueError(f"--max-extra-evals must be an integer >= 0, got {n}")
    if share is not None and not 0.0 < share < 1.0:
        raise ValueError(f"--max-eval-share must be a number strictly between 0 and 1, got {share}")
    if args.cadence != "adaptive":
        flag = "--max-extra-evals" if n is not None else "--max-eval-share"
        raise ValueError(f"{flag} needs --cadence adaptive")
    return EvalBudget(max_extra_evals=n, max_eval_share=share)


def cadence_from_args(args: Any) -> tuple[str | dict[str, Any] | None, float]:
    """The cadence spec (None: fixed) and the eval cost of parsed ``--cadence``/``--cadence-param``/``--eval-cost``.

    Raises:
        ValueError: ``--eval-cost`` is negative or not finite, ``--cadence-param`` without ``--cadence adaptive``,
            or a parameter the cadence policy rejects (the message names the flag).
    """
    cost = args.eval_cost
    if not (cost >= 0 and cost < float("inf")):
        raise ValueError(f"--eval-cost must be a finite number >= 0, got {cost}")
    params = dict(getattr(args, "cadence_param", None) or [])
    if args.cadence == "fixed":
        if params:
            raise ValueError("--cadence-param needs --cadence adaptive")
        return None, float(cost)
    if not params:
        return args.cadence, float(cost)
    spec = {"name": args.cadence, "params": params}
    try:
        policy = cadence_from_spec(spec)
    except ValueError as exc:
        raise ValueError(f"--cadence-param: {exc}") from None
    assert policy is not None  # an adaptive spec always builds a policy
    return policy.spec(), float(cost)


def cadence_or_usage(args: argparse.Namespace) -> tuple[str | dict[str, Any] | None, float]:
    """:func:`cadence_from_args`, a bad value as the CLI's one-line usage error."""
    try:
        return cadence_from_args(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def budget_or_usage(args: argparse.Namespace) -> EvalBudget | None:
    """:func:`eval_budget_from_args`, a bad value as the CLI's one-line usage error."""
    try:
        return eval_budget_from_args(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def add_corpus_arg(p: argparse.ArgumentParser) -> None:
    """Add ``--corpus NAME`` (a recorded corpus by name, :mod:`platform_sim.sim.corpora`) beside a study's
    ``--traces FOLDER``."""
    from .corpora import corpora

    p.add_argument(
        "--corpus",
        default=None,
        metavar="NAME",
        help=f"a recorded corpus by name instead of --traces ({', '.join(corpora())}; default: real)",
    )


def traces_folder(args: argparse.Namespace) -> Path:
    """The folder of ``--traces`` or ``--corpus`` (neither: the ``real`` corpus).

    Raises:
        UsageError: Both are given, or an unknown or uninstalled corpus.
    """
    from .corpora import DEFAULT_CORPUS, corpus_dir

    if args.traces is not None and args.corpus is not None:
        raise UsageError("--traces and --corpus: give one of them")
    if args.traces is not None:
        return Path(args.traces)
    try:
        return corpus_dir(args.corpus or DEFAULT_CORPUS)
    except (ValueError, FileNotFoundError) as exc:
        raise UsageError(f"--corpus: {exc}") from None
