"""``evalstop-sim sweep GRID``: every combination of the parameters listed in a TOML or YAML grid file.

A grid file (TOML shown; YAML with the same keys works too)::

    seeds = 10                      # a count (seeds 0..9) or a list of seeds
    [workload]                      # fixed workload parameters (default: the paper's point)
    gpus = 64
    n_jobs = 200
    [grid]                          # the axes: one cell per combination, in the order written
    sigma = [0.01, 0.05]
    hack_rate = [0.4, 0.8]
    k = [1, 2, 3]                   # detector parameter (also: min_delta, detector.<name>)
    base = ["fifo", "srtf-est"]
    [[policies]]                    # run on every cell (default: one, stop = "evalstop")
    stop = "evalstop"
    [[policies]]
    stop = "stop-at-p"
    params = { p = 0.65 }

Axes may name any workload parameter (``n_jobs`` or ``jobs``, ``gpus``, ``mix``, ``hack_rate``, ``sigma``,
``n_evals`` or ``evals``, ``load``, ``est_error``, ``hack_gamma``), the base scheduler (``base``), the stop policy
(``stop``, instead of a ``policies`` list), the detector (``detector`` for its name, ``k``, ``min_delta``,
``detector.<param>``) and a stop policy's parameters (``<stop policy>.<param>``, e.g. ``stop-at-p.p``; applied to
that policy only). Each policy of each cell
is compared, seed by seed on the same workload, with the same base scheduler without a stop policy; every row holds
the mean over seeds with a 95% confidence interval, like ``evalstop-sim paper``.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from platform_sim.core.detectors import default_spec, detector_from_spec
from platform_sim.sim.policies.stop_policies import STOP_POLICIES

from .experiments import PolicySpec, SimTask, run_task
from .metrics import metric_row
from .runner import Runner, SerialRunner
from .workload import WorkloadConfig

_ALIASES = {"jobs": "n_jobs", "evals": "n_evals"}
_WORKLOAD_FIELDS = frozenset(WorkloadConfig.__dataclass_fields__)
_POLICY_KEYS = frozenset({"base", "stop", "detector", "params"})


class SweepFileError(ValueError):
    """A grid file that cannot be read or that names an unknown parameter; the message names the file and key."""


@dataclass(frozen=True)
class SweepSpec:
    """A parsed grid.

    Args:
        seeds: Workload seeds; every cell runs all of them.
        workload: Fixed workload parameters (the cells' starting point).
        axes: ``(name, values)`` in file order; names normalized (``jobs`` -> ``n_jobs``, ``-`` -> ``_``).
        policies: Policies run on every cell, as ``{"base"?, "stop", "detector"?, "params"?}``.
        source: Where the grid came from (for messages and the JSON output).
    """

    seeds: tuple[int, ...]
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    axes: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    policies: tuple[Mapping[str, Any], ...] = ({"stop": "evalstop"},)
    source: str = "<grid>"

    def cells(self) -> list[dict[str, Any]]:
        """Every combination of the axes' values, as ``{axis: value}``, in file order (last axis fastest)."""
        names = [n for n, _ in self.axes]
        return [dict(zip(names, combo)) for combo in itertools.product(*(v for _, v in self.axes))]


def _norm(name: str) -> str:
    name = name.strip()
    if "." in name:  # detector.<param> or <stop policy>.<param>: stop policy names keep their hyphens
        return name
    name = name.replace("-", "_")
    return _ALIASES.get(name, name)


def _check_axis(src: str, name: str) -> None:
    if name in _WORKLOAD_FIELDS or name in ("base", "stop", "detector", "k", "min_delta"):
        return
    prefix, _, param = name.partition(".")
    if param and (prefix == "detector" or prefix in STOP_POLICIES):
        return
    raise SweepFileError(
        f"{src}: [grid] {name!r} is not a sweepable parameter; use a workload parameter "
        f"({', '.join(sorted(_WORKLOAD_FIELDS))}), base, stop, detector, k, min_delta, detector.<param> or "
        "<stop policy>.<param>"
    )


def parse_sweep(data: Mapping[str, Any], source: str = "<grid>") -> SweepSpec:
    """Validate a grid given as plain data (what a TOML or YAML file holds).

    Raises:
        SweepFileError: unknown keys or parameters, empty axes, bad seeds, or a cell whose workload or policy is
            invalid (every cell is built once before anything runs).
    """
    src = source
    if not isinstance(data, Mapping):
        raise SweepFileError(f"{src}: the grid must be a table/mapping at the top level")
    unknown = sorted(set(data) - {"seeds", "workload", "grid", "policies"})
    if unknown:
        raise SweepFileError(
            f"{src}: unknown top-level key(s) {', '.join(unknown)}; expected seeds, workload, grid, policies"
        )
    seeds_raw = data.get("seeds", 10)
    if isinstance(seeds_raw, bool):
        raise SweepFileError(f"{src}: seeds must be a count >= 1 or a list of integers >= 0")
    if isinstance(seeds_raw, int):
        if seeds_raw < 1:
            raise SweepFileError(f"{src}: seeds must be >= 1, got {seeds_raw}")
        seeds = tuple(range(seeds_raw))
    elif (
        isinstance(seeds_raw, list)
        and seeds_raw
        and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds_raw)
    ):
        if len(set(seeds_raw)) != len(seeds_raw):
            raise SweepFileError(f"{src}: seeds lists a seed twice")
        seeds = tuple(seeds_raw)
    else:
        raise SweepFileError(
            f"{src}: seeds must be a count >= 1 or a non-empty list of integers >= 0, got {seeds_raw!r}"
        )

    wl_raw = data.get("workload", {}) or {}
    if not isinstance(wl_raw, Mapping):
        raise SweepFileError(f"{src}: [workload] must be a table")
    wl_kwargs: dict[str, Any] = {}  # checked by WorkloadConfig itself (TypeError/ValueError below)
    for key, value in wl_raw.items():
        name = _norm(str(key))
        if name not in _WORKLOAD_FIELDS:
            raise SweepFileError(
                f"{src}: [workload] unknown parameter {key!r}; choose from {', '.join(sorted(_WORKLOAD_FIELDS))}"
            )
        wl_kwargs[name] = tuple(value) if isinstance(value, list) else value
    try:
        workload = WorkloadConfig(**wl_kwargs)
    except (TypeError, ValueError) as exc:
        raise SweepFileError(f"{src}: [workload] {exc}") from None

    grid_raw = data.get("grid", {}) or {}
    if not isinstance(grid_raw, Mapping):
        raise SweepFileError(f"{src}: [grid] must be a table of parameter = [values]")
    axes = []
    for key, values in grid_raw.items():
        name = _norm(str(key))
        _check_axis(src, name)
        if not isinstance(values, list):
            values = [values]
        if not values:
            raise SweepFileError(f"{src}: [grid] {key!r} has no values")
        axes.append((name, tuple(tuple(v) if isinstance(v, list) else v for v in values)))
    if len({n for n, _ in axes}) != len(axes):
        raise SweepFileError(f"{src}: [grid] names a parameter twice (after aliases: {[n for n, _ in axes]})")

    pol_raw = data.get("policies")
    axis_names = {n for n, _ in axes}
    if pol_raw is None:
        policies: tuple[Mapping[str, Any], ...] = ({"stop": "evalstop"},)
    else:
        if "stop" in axis_names:
            raise SweepFileError(f"{src}: give either a 'stop' axis in [grid] or a [[policies]] list, not both")
        if not isinstance(pol_raw, list) or not pol_raw:
            raise SweepFileError(f"{src}: policies must be a non-empty list of tables ([[policies]])")
        for i, p in enumerate(pol_raw):
            if not isinstance(p, Mapping) or "stop" not in p:
                raise SweepFileError(f'{src}: policies[{i}] must be a table with at least stop = "..."')
            bad = sorted(set(p) - _POLICY_KEYS)
            if bad:
                raise SweepFileError(
                    f"{src}: policies[{i}] unknown key(s) {', '.join(bad)}; expected {', '.join(sorted(_POLICY_KEYS))}"
                )
        policies = tuple(dict(p) for p in pol_raw)
    if "stop" in axis_names:
        policies = ({"stop": None},)  # filled from the axis per cell
    spec = SweepSpec(seeds=seeds, workload=workload, axes=tuple(axes), policies=policies, source=source)
    for cell in spec.cells():  # fail now, not after an hour of simulations
        try:
            cell_workload(spec, cell)
            for pol in cell_policies(spec, cell):
                pol.validate()
        except (TypeError, ValueError) as exc:
            raise SweepFileError(f"{src}: cell {cell}: {exc}") from None
    return spec


def load_sweep_file(path: str | os.PathLike[str]) -> SweepSpec:
    """Read a grid from a ``.toml``, ``.yaml`` or ``.yml`` file (see the module docstring for the format)."""
    path = os.fspath(path)
    ext = os.path.splitext(path)[1].lower()
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise SweepFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if ext == ".toml":
        try:
            import tomllib
        except ImportError:  # Python 3.10: the same parser as a package
            try:
                import tomli as tomllib  # type: ignore[no-redef]
            except ImportError:
                raise SweepFileError(f"{path}: TOML grids need Python 3.11 or the tomli package; or use YAML") from None
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise SweepFileError(f"{path}: not valid TOML: {exc}") from None
    elif ext in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise SweepFileError(f"{path}: YAML grids need PyYAML (pip install pyyaml), or use TOML") from None
        try:
            data = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise SweepFileError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    else:
        raise SweepFileError(f"{path}: unknown grid format {ext or '(no extension)'!r}; use .toml, .yaml or .yml")
    return parse_sweep(data if data is not None else {}, source=path)


def cell_workload(spec: SweepSpec, cell: Mapping[str, Any]) -> WorkloadConfig:
    """The workload of one cell: the fixed workload with the cell's workload axes applied."""
    changes = {k: v for k, v in cell.items() if k in _WORKLOAD_FIELDS}
    return replace(spec.workload, **changes) if changes else spec.workload


def cell_policies(spec: SweepSpec, cell: Mapping[str, Any]) -> list[PolicySpec]:
    """The policies of one cell, with the cell's scheduler, detector and stop-parameter axes applied."""
    out = []
    for pol in spec.policies:
        stop = cell.get("stop", pol.get("stop"))
        base = cell.get("base", pol.get("base", "srtf-est"))
        stop_params = dict(pol.get("params") or {})
        stop_params.update({k.split(".", 1)[1]: v for k, v in cell.items() if k.split(".", 1)[0] == stop})
        detector = None
        if stop == "evalstop":
            det = pol.get("detector")
            if isinstance(det, str):
                det = {"name": det, "params": {}}
            named = bool(det) or "detector" in cell
            det = {"name": (det or {}).get("name", "k-decline"), "params": dict((det or {}).get("params", {}))}
            if "detector" in cell:
                det = {"name": cell["detector"], "params": {}}
            for k, v in cell.items():
                if k in ("k", "min_delta"):
                    det["params"][k] = v
                elif k.startswith("detector."):
                    det["params"][k.split(".", 1)[1]] = v
            # No detector and no detector axis: the project's default (k/min_delta axes alone mean k-decline's).
            detector = detector_from_spec(det if named or det["params"] else default_spec()).spec()
        out.append(PolicySpec(base=base, stop=stop, detector=detector, stop_params=stop_params))
    return out


def sweep(
    spec: SweepSpec,
    runner: Runner | None = None,
    progress: Callable[[int], None] | None = None,
    on_plan: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Run every cell of ``spec`` over its seeds; one row per (cell, policy).

    All cells' tasks go to ``runner`` in one map, so a pool or a cluster stays busy across cells. A task is one
    (cell, seed): the cell's policies and their no-stop baselines on the same generated workload.

    Returns:
        ``{"config": {...}, "rows": [...]}``; each row has the cell's axis values, ``base``, ``stop`` and the
        metric means with ``ci95`` (see :func:`~platform_sim.sim.metrics.metric_row`).
    """
    plan = []
    tasks: list[SimTask] = []
    for cell in spec.cells():
        wl = cell_workload(spec, cell)
        pols = cell_policies(spec, cell)
        all_specs: dict[str, PolicySpec] = {p.key(): p for p in pols}
        for p in pols:
            b = PolicySpec(base=p.base, base_params=p.base_params)
            all_specs.setdefault(b.key(), b)
        keys = list(all_specs)
        first = len(tasks)
        tasks.extend(SimTask(wl, seed, tuple(all_specs.values())) for seed in spec.seeds)
        plan.append((cell, pols, keys, first))
    if on_plan:
        on_plan(len(tasks))
    t0 = time.perf_counter()
    results = (runner or SerialRunner()).map(run_task, tasks, progress)
    wall = time.perf_counter() - t0
    rows = []
    for cell, pols, keys, first in plan:
        chunk = results[first : first + len(spec.seeds)]
        per = {k: [res[i] for res in chunk] for i, k in enumerate(keys)}
        for p in pols:
            base_key = PolicySpec(base=p.base, base_params=p.base_params).key()
            params = {k: v for k, v in cell.items() if k not in ("base", "stop")}  # already columns of the row
            row = metric_row(p.base, p.stop, per[p.key()], per[base_key] if p.stop != "none" else None, **params)
            row["detector"] = p.detector  # the spec this row's EvalStop ran (None: a policy without one)
            rows.append(row)
    return {
        "config": {
            "grid": spec.source,
            "seeds": list(spec.seeds),
            "workload": spec.workload.to_dict(),
            "axes": {n: list(v) for n, v in spec.axes},
            "policies": [dict(p) for p in spec.policies],
            "cells": len(plan),
            "tasks": len(tasks),
            "simulations": sum(len(t.policies) for t in tasks),
            "runner": getattr(runner, "name", "serial"),
            "wall_s": wall,
        },
        "rows": rows,
    }


# -- output ---------------------------------------------------------------------------------------------------------


def sweep_text(spec: SweepSpec, results: Mapping[str, Any], backend: str) -> str:
    """The human output of ``sweep``: the table, one column per swept axis, then a line of totals."""
    from .report import detector_line, markdown_table

    lead = tuple((n, n, "s") for n, _ in spec.axes if n not in ("stop",))
    if len({r["base"] for r in results["rows"]}) > 1 and "base" not in {n for n, _ in spec.axes}:
        lead = (("base", "base", "s"),) + lead
    cfg = results["config"]
    specs = {json.dumps(r["detector"], sort_keys=True): r["detector"] for r in results["rows"] if r.get("detector")}
    named = "".join(f"\n{detector_line(d)}" for d in specs.values())
    return (
        markdown_table(results["rows"], lead=lead) + "\n" + named + "\n"
        f"\n{cfg['cells']} cells x {len(spec.seeds)} seeds = {cfg['tasks']} tasks ({cfg['simulations']} "
        f"simulations) on {backend} in {cfg['wall_s']:.1f} s"
    )
