"""The cadence hint against the Oracle bound: rows as shares of the Oracle's gains, and the with/without comparison.

:func:`~platform_sim.sim.metrics.add_oracle_shares` gives each table row its waste cut and JCT gain as a share of the Oracle's on the same
base and seeds (``waste_cut_share_of_oracle``, ``jct_gain_share_of_oracle``). :func:`cadence_comparison` runs, on one
workload point and the same seeds, the base alone, the Oracle, and EvalStop with the fixed and the adaptive cadence,
with evaluations priced (``eval_cost`` of a regular eval interval each): what ``docs/simulation.md`` reports.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from platform_sim.core.cadence import EvalBudget
from platform_sim.sim.engine import DEFAULT_EVAL_COST
from platform_sim.sim.eval_scores import observation_for
from platform_sim.sim.experiments import PolicySpec, SimTask, run_task
from platform_sim.sim.metrics import add_oracle_shares, metric_row
from platform_sim.sim.runner import Runner, SerialRunner
from platform_sim.sim.workload import WorkloadConfig


def cadence_comparison(
    workload: WorkloadConfig,
    seeds: Sequence[int],
    base: str = "srtf-est",
    detector: Mapping[str, Any] | None = None,
    cadences: Sequence[tuple[str, Mapping[str, Any] | str | None]] = (("fixed", None), ("adaptive", "adaptive")),
    eval_cost: float = DEFAULT_EVAL_COST,
    runner: Runner | None = None,
    progress: Callable[[int], None] | None = None,
    eval_budget: EvalBudget | None = None,
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
        eval_budget: What a job may spend on hints (None: no limit), as the callback's budget.
    """
    none = PolicySpec(base=base)
    oracle = PolicySpec(base=base, stop="oracle")
    stops = [PolicySpec(base=base, stop="evalstop", detector=detector, cadence=spec) for _, spec in cadences]
    specs = (none, oracle, *stops)
    # A detector that reads per-example scores gets generated ones (regular and extra evals), as in `paper`.
    observation = observation_for(detector)
    tasks = [
        SimTask(workload, seed, specs, observation=observation, eval_cost=eval_cost, eval_budget=eval_budget)
        for seed in seeds
    ]
    results = (runner or SerialRunner()).map(run_task, tasks, progress)
    per = [[res[i] for res in results] for i in range(len(specs))]
    oracle_row = metric_row(base, "oracle", per[1], per[0], cadence="-")
    rows = [oracle_row] + [
        metric_row(base, "evalstop", per[2 + i], per[0], cadence=label) for i, (label, _) in enumerate(cadences)
    ]
    add_oracle_shares(rows, oracle_row)
    return rows
