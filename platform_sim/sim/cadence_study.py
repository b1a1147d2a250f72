"""The cadence hint against the Oracle bound: rows as shares of the Oracle's gains, and the with/without comparison.

:func:`~platform_sim.sim.metrics.add_oracle_shares` gives each table row its waste cut and JCT gain as a share of the Oracle's on the same
base and seeds (``waste_cut_share_of_oracle``, ``jct_gain_share_of_oracle``). :func:`cadence_comparison` runs, on one
workload point and the same seeds, the base alone, the Oracle, and EvalStop with the fixed and the adaptive cadence,
with evaluations priced (``eval_cost`` of a regular eval interval each): what ``docs/simulation.md`` reports.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..core.cadence import cadence_from_spec
from .backend_cli import detector_param
from .engine import DEFAULT_EVAL_COST
from .eval_scores import observation_for
from .experiments import PolicySpec, SimTask, run_task
from .metrics import add_oracle_shares, metric_row
from .runner import Runner, SerialRunner
from .workload import WorkloadConfig


def cadence_comparison(
    workload: WorkloadConfig,
    seeds: Sequence[int],
    base: str = "srtf-est",
    detector: Mapping[str, Any] | None = None,
    cadences: Sequence[tuple[str, Mapping[str, Any] | str | None]] = (("fixed", None), ("adaptive", "adaptive")),
    eval_cost: float = DEFAULT_EVAL_COST,
    runner: Runner | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """Rows for the Oracle and for EvalStop at each cadence, on the same seeds, each against the base alone.

    Args:
        workload: The workload point.
        seeds: Workload seeds.
        base: Base policy.
        detector: EvalStop's detector spec (None: k-decline, k=2).
        cadences: ``(label, cadence spec)`` pairs; each row gets ``cadence`` = its label.
        eval_cost: What one eval costs, as a share of a regular eval interval.
        runner: Where to run (default: serially here).
        progress: Progress callback (finished tasks).
    """
    none = PolicySpec(base=base)
    oracle = PolicySpec(base=base, stop="oracle")
    stops = [PolicySpec(base=base, stop="evalstop", detector=detector, cadence=spec) for _, spec in cadences]
    specs = (none, oracle, *stops)
    # A detector that reads per-example scores gets generated ones (regular and extra evals), as in `paper`.
    observation = observation_for(detector)
    tasks = [SimTask(workload, seed, specs, observation=observation, eval_cost=eval_cost) for seed in seeds]
    results = (runner or SerialRunner()).map(run_task, tasks, progress)
    per = [[res[i] for res in results] for i in range(len(specs))]
    oracle_row = metric_row(base, "oracle", per[1], per[0], cadence="-")
    rows = [oracle_row] + [
        metric_row(base, "evalstop", per[2 + i], per[0], cadence=label) for i, (label, _) in enumerate(cadences)
    ]
    add_oracle_shares(rows, oracle_row)
    return rows


def add_cadence_args(p: Any) -> None:
    """Add ``--cadence``, ``--cadence-param`` and ``--eval-cost`` to a command's parser (``run``, ``paper``,
    ``replay``)."""
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
        help="a parameter of --cadence adaptive: fraction, min_drop or p_hint (repeatable; e.g. p_hint=0.8)",
    )
    p.add_argument(
        "--eval-cost",
        type=float,
        default=DEFAULT_EVAL_COST,
        metavar="SHARE",
        help="GPU time of one eval as a share of a regular eval interval (default "
        f"{DEFAULT_EVAL_COST:g}; regular evals are part of a run's planned time, extra ones add to it)",
    )


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
