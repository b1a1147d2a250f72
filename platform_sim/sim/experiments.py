"""Experiments: plain-data task descriptions, the picklable task function, and the paper's experiment plan.

A :class:`SimTask` is one workload (config + seed) and the policies to run on it; :func:`run_task` generates the
workload once and runs each policy on it (same jobs, same eval noise: paired comparisons), returning one
:func:`~platform_sim.sim.metrics.run_metrics` dict per policy. Multi-run commands build tasks, hand them to a
:class:`~platform_sim.sim.runner.Runner`, and assemble rows with :func:`~platform_sim.sim.metrics.metric_row`.

:func:`paper` reproduces every experiment of the paper: the main table, composability, the noise sweep, the
hacking-rate sweep and the k sweep.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from platform_sim.core.cadence import EvalBudget
from platform_sim.core.detectors import detector_from_spec, paper_spec
from platform_sim.sim.policies.policies import PREEMPTION_COST_H, make_base_policy
from platform_sim.sim.policies.stop_policies import DEFAULT_STOP_TYPES, Scheduler, make_stop_policy, with_stop

from .engine import DEFAULT_EVAL_COST, SimResult, simulate
from .metrics import add_oracle_shares, metric_row, run_metrics
from .observe import make_observation_model
from .runner import Runner, SerialRunner
from .workload import Workload, WorkloadConfig, generate_workload

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PolicySpec:
    """A scheduler as plain data.

    Args:
        base: Base policy name (``fifo``, ``sjf-est``, ``srtf-est``, ``loss-aware``).
        stop: Stop policy name (``none``, ``evalstop``, ``stop-at-p``, ``loss-plateau``, ``oracle``).
        detector: Detector spec for ``evalstop`` (None: k-decline, k=2, min_delta=0).
        stop_params: Extra stop-policy parameters (``p`` for stop-at-p, ``window`` for loss-plateau, ...).
        base_params: Extra base-policy parameters.
        stop_types: Job types the stop policy covers.
        cadence: Cadence spec of ``evalstop`` (None: fixed; ``"adaptive"``: the core's cadence hints).
    """

    base: str = "srtf-est"
    stop: str = "none"
    detector: Mapping[str, Any] | None = None
    stop_params: Mapping[str, Any] = field(default_factory=dict)
    base_params: Mapping[str, Any] = field(default_factory=dict)
    stop_types: tuple[str, ...] = DEFAULT_STOP_TYPES
    cadence: Mapping[str, Any] | str | None = None

    def validate(self) -> None:
        """Build the policies once so that bad names or parameters fail before any run starts."""
        make_base_policy(self.base, **dict(self.base_params))
        if self.stop == "evalstop":
            detector_from_spec(paper_spec() if self.detector is None else self.detector)
        if self.stop != "oracle":
            self._stop_policy(None)

    def _stop_policy(self, workload: Workload | None):  # noqa: ANN202 - StopPolicy
        params: dict[str, Any] = dict(self.stop_params)
        if self.stop != "none":
            params["job_types"] = self.stop_types
        if self.stop == "evalstop":
            params["detector"] = self.detector
            if self.cadence is not None:
                params["cadence"] = self.cadence
        if self.stop == "oracle":
            params["peak_steps"] = workload.peak_steps() if workload is not None else {}
        return make_stop_policy(self.stop, **params)

    def build(self, workload: Workload) -> Scheduler:
        """A fresh scheduler for one run on ``workload`` (the Oracle is handed its ground truth here)."""
        return with_stop(make_base_policy(self.base, **dict(self.base_params)), self._stop_policy(workload))

    def key(self) -> str:
        d = dataclasses.asdict(self)
        if d["cadence"] is None:  # keys of fixed-cadence specs read as before
            del d["cadence"]
        return json.dumps(d, sort_keys=True)


@dataclass(frozen=True)
class SimTask:
    """One workload and the policies to run on it.

    Args:
        workload: Workload parameters.
        seed: Seed of the workload.
        policies: Policies to run, each on the same workload.
        preemption_cost_h: Resume cost after a preemption.
        observation: Observation-model spec for :func:`~platform_sim.sim.observe.make_observation_model`
            (None: Gaussian noise, no per-example scores).
        eval_cost: What one eval costs, as a share of a regular eval interval (see
            :func:`~platform_sim.sim.engine.simulate`).
        eval_budget: What a job may spend on cadence hints (None: no limit; see
            :func:`~platform_sim.sim.engine.simulate`).
    """

    workload: WorkloadConfig
    seed: int
    policies: tuple[PolicySpec, ...]
    preemption_cost_h: float = PREEMPTION_COST_H
    observation: Mapping[str, Any] | None = None
    eval_cost: float = DEFAULT_EVAL_COST
    eval_budget: EvalBudget | None = None


def run_policies(
    workload: Workload,
    policies: Sequence[PolicySpec],
    seed: int,
    *,
    gpus: int,
    observation: Mapping[str, Any] | None = None,
    preemption_cost_h: float = PREEMPTION_COST_H,
    eval_cost: float = DEFAULT_EVAL_COST,
    eval_budget: EvalBudget | None = None,
    extra: Callable[[SimResult], Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Run every policy on the same ``workload``; one :func:`run_metrics` dict per policy, in order, with ``seed``.

    The one loop behind every multi-policy task (the paper's, the replay's and the detector study's).

    Args:
        workload: The generated workload every policy runs on.
        policies: The schedulers to run, each built fresh for its run.
        seed: The workload's seed, recorded in every metrics dict.
        gpus: Cluster size.
        observation: Observation-model spec (None: Gaussian noise, no per-example scores). A fresh model is built
            per policy, since models may keep per-job state (e.g. per-example generators).
        preemption_cost_h: Resume cost after a preemption.
        eval_cost: One eval's GPU time, as a share of a regular eval interval.
        eval_budget: What a job may spend on cadence hints (None: no limit).
        extra: Further metrics of a run, merged into its dict (e.g. the detector study's per-job delays).
    """
    out = []
    for spec in policies:
        result = simulate(
            workload,
            spec.build(workload),
            gpus=gpus,
            preemption_cost_h=preemption_cost_h,
            observation=make_observation_model(workload, observation),
            eval_cost=eval_cost,
            eval_budget=eval_budget,
        )
        m = run_metrics(result)
        m["seed"] = seed
        if extra is not None:
            m.update(extra(result))
        out.append(m)
    return out


def run_task(task: SimTask) -> list[dict[str, Any]]:
    """Run every policy of ``task`` on its workload; one metrics dict per policy, in order. Picklable, pure."""
    return run_policies(
        generate_workload(task.workload, task.seed),
        task.policies,
        task.seed,
        gpus=task.workload.gpus,
        observation=task.observation,
        preemption_cost_h=task.preemption_cost_h,
        eval_cost=task.eval_cost,
        eval_budget=task.eval_budget,
    )


def run_one(
    workload_config: WorkloadConfig,
    spec: PolicySpec,
    seed: int,
    preemption_cost_h: float = PREEMPTION_COST_H,
    observation: Mapping[str, Any] | None = None,
    eval_cost: float = DEFAULT_EVAL_COST,
    eval_budget: EvalBudget | None = None,
) -> tuple[SimResult, dict[str, Any]]:
    """One simulation in this process: the raw result and its metrics."""
    workload = generate_workload(workload_config, seed)
    result = simulate(
        workload,
        spec.build(workload),
        gpus=workload_config.gpus,
        preemption_cost_h=preemption_cost_h,
        observation=make_observation_model(workload, observation),
        eval_cost=eval_cost,
        eval_budget=eval_budget,
    )
    return result, run_metrics(result)


# -- the paper ----------------------------------------------------------------------------------------------------

SIGMAS: tuple[float, ...] = (0.01, 0.02, 0.03, 0.05, 0.08, 0.12)
HACK_RATES: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8)
KS: tuple[int, ...] = (1, 2, 3, 4, 5)
BASES: tuple[str, ...] = ("fifo", "sjf-est", "srtf-est", "loss-aware")
MAIN_STOPS: tuple[str, ...] = ("none", "evalstop", "stop-at-p", "loss-plateau", "oracle")


@dataclass(frozen=True)
class PaperConfig:
    """What ``evalstop-sim paper`` runs.

    Args:
        seeds: Number of seeds (0 .. seeds-1).
        workload: The default point (sigma 0.02, 60% hacking, rlhf-heavy, 64 GPUs, 200 jobs).
        detector: Detector spec of EvalStop. The k sweep always uses ``k-decline`` (with this spec's ``min_delta`` when
            it is ``k-decline``), since k is that rule's parameter.
        base: Base policy of the main table and the sweeps.
        stop_at_p: p of StopAt-p.
        observation: Observation-model spec (None: Gaussian noise).
        cadence: Cadence spec of every EvalStop cell (None: the fixed cadence, as in the paper).
        eval_cost: What one eval costs, as a share of a regular eval interval.
        eval_budget: What a job may spend on cadence hints (None: no limit).
    """

    seeds: int = 30
    workload: WorkloadConfig = WorkloadConfig()
    detector: Mapping[str, Any] | None = None
    base: str = "srtf-est"
    stop_at_p: float = 0.65
    observation: Mapping[str, Any] | None = None
    cadence: Mapping[str, Any] | str | None = None
    eval_cost: float = DEFAULT_EVAL_COST
    eval_budget: EvalBudget | None = None


@dataclass(frozen=True)
class _Cell:
    experiment: str
    params: tuple[tuple[str, Any], ...]
    workload: WorkloadConfig
    spec: PolicySpec
    baseline: PolicySpec | None  # same workload, base with no stop policy


def _detector_with_k(detector: Mapping[str, Any] | None, k: int) -> dict[str, Any]:
    spec = detector_from_spec(paper_spec() if detector is None else detector).spec()
    if spec["name"] != "k-decline":
        spec = paper_spec()
    spec["params"]["k"] = k
    return spec


def paper_cells(cfg: PaperConfig) -> list[_Cell]:
    """Every (experiment, parameter, workload, policy) cell of the paper, with its no-stop baseline."""
    wl, det, base = cfg.workload, cfg.detector, cfg.base

    def spec(stop: str, b: str = base, detector: Mapping[str, Any] | None = det) -> PolicySpec:
        params: dict[str, Any] = {"p": cfg.stop_at_p} if stop == "stop-at-p" else {}
        return PolicySpec(
            base=b,
            stop=stop,
            detector=detector if stop == "evalstop" else None,
            stop_params=params,
            cadence=cfg.cadence if stop == "evalstop" else None,
        )

    cells: list[_Cell] = []
    for stop in MAIN_STOPS:
        cells.append(_Cell("main", (), wl, spec(stop), spec("none")))
    for b in BASES:
        for stop in ("none", "evalstop"):
            cells.append(_Cell("composability", (), wl, spec(stop, b), spec("none", b)))
    for sigma in SIGMAS:
        w = replace(wl, sigma=sigma)
        cells.append(_Cell("noise", (("sigma", sigma),), w, spec("evalstop"), spec("none")))
    for rate in HACK_RATES:
        w = replace(wl, hack_rate=rate)
        cells.append(_Cell("hack_rate", (("hack_rate", rate),), w, spec("evalstop"), spec("none")))
    for k in KS:
        cells.append(_Cell("k", (("k", k),), wl, spec("evalstop", detector=_detector_with_k(det, k)), spec("none")))
    return cells


def paper(
    cfg: PaperConfig,
    runner: Runner | None = None,
    progress: Callable[[int], None] | None = None,
    on_plan: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Run every experiment of the paper; return ``{"main": [...], "composability": [...], "noise": [...],
    "hack_rate": [...], "k": [...], "config": {...}}`` with one :func:`metric_row` per row.

    Args:
        cfg: What to run.
        runner: Where to run it (default: serially in this process).
        progress: Called with the number of finished tasks (for a progress bar).
        on_plan: Called once with the total number of tasks before they start.
    """
    if cfg.seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {cfg.seeds}")
    cells = paper_cells(cfg)
    # Group every distinct policy by workload config, so each (workload, seed) is generated once per task.
    by_wl: dict[str, tuple[WorkloadConfig, dict[str, PolicySpec]]] = {}
    for c in cells:
        # The Oracle on every (workload, base): each row's waste cut is also given as a share of the Oracle's.
        for s in (c.spec, c.baseline, PolicySpec(base=c.spec.base, stop="oracle")):
            if s is None:
                continue
            wkey = json.dumps(c.workload.to_dict(), sort_keys=True)
            by_wl.setdefault(wkey, (c.workload, {}))[1].setdefault(s.key(), s)
    tasks: list[SimTask] = []
    index: list[tuple[str, list[str]]] = []
    for wkey, (w, specs) in by_wl.items():
        for seed in range(cfg.seeds):
            tasks.append(
                SimTask(
                    w,
                    seed,
                    tuple(specs.values()),
                    observation=cfg.observation,
                    eval_cost=cfg.eval_cost,
                    eval_budget=cfg.eval_budget,
                )
            )
            index.append((wkey, list(specs)))
    if on_plan:
        on_plan(len(tasks))
    results = (runner or SerialRunner()).map(run_task, tasks, progress)
    # runs[(workload key, policy key)] = metrics per seed, in seed order
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for (wkey, skeys), res in zip(index, results):
        for skey, m in zip(skeys, res):
            runs.setdefault((wkey, skey), []).append(m)
    out: dict[str, Any] = {"main": [], "composability": [], "noise": [], "hack_rate": [], "k": []}
    for c in cells:
        wkey = json.dumps(c.workload.to_dict(), sort_keys=True)
        mine = runs[(wkey, c.spec.key())]
        base_runs = runs[(wkey, c.baseline.key())] if c.baseline is not None and c.spec.stop != "none" else None
        row = metric_row(c.spec.base, c.spec.stop, mine, base_runs, **dict(c.params))
        oracle_runs = runs[(wkey, PolicySpec(base=c.spec.base, stop="oracle").key())]
        add_oracle_shares(
            [row], metric_row(c.spec.base, "oracle", oracle_runs, base_runs) if base_runs is not None else None
        )
        out[c.experiment].append(row)
    out["config"] = {
        "seeds": cfg.seeds,
        "workload": cfg.workload.to_dict(),
        "detector": detector_from_spec(paper_spec() if cfg.detector is None else cfg.detector).spec(),
        "base": cfg.base,
        "stop_at_p": cfg.stop_at_p,
        "observation": cfg.observation,
        "cadence": cfg.cadence,
        "eval_cost": cfg.eval_cost,
        **(cfg.eval_budget or EvalBudget()).to_dict(),
        "tasks": len(tasks),
    }
    return out


def rows_for_policies(
    workload: WorkloadConfig,
    specs: Sequence[PolicySpec],
    seeds: Sequence[int],
    runner: Runner | None = None,
    progress: Callable[[int], None] | None = None,
    observation: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """One row per spec over ``seeds`` on ``workload``, each against the same base with no stop policy
    (added to the runs when missing). Reusable by ``replay``/``detectors``-style commands."""
    all_specs: dict[str, PolicySpec] = {s.key(): s for s in specs}
    for s in specs:
        b = PolicySpec(base=s.base, base_params=s.base_params)
        all_specs.setdefault(b.key(), b)
    keys = list(all_specs)
    tasks = [SimTask(workload, seed, tuple(all_specs.values()), observation=observation) for seed in seeds]
    results = (runner or SerialRunner()).map(run_task, tasks, progress)
    per: dict[str, list[dict[str, Any]]] = {k: [res[i] for res in results] for i, k in enumerate(keys)}
    rows = []
    for s in specs:
        b = PolicySpec(base=s.base, base_params=s.base_params)
        rows.append(metric_row(s.base, s.stop, per[s.key()], per[b.key()] if s.stop != "none" else None))
    return rows
