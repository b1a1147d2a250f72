"""What the default detector's state costs the service per report, rows packed against rows as lists of numbers.

The service writes a job's detector state with every report it applies (one SQLite transaction, in the single
writer). With per-example scores the default (``trend``) keeps the rows of its window and of its planned window, so
for a wide eval set reported at every step the state is mostly those rows. This runs one such job through a real
:class:`~platform_sim.service.store_sqlite.SQLiteStore` on a temporary file twice in the same process: with the rows
as the code writes them (packed: base64 of float64, ``platform_sim/core/detectors/packed_rows.py``) and with
``pack_row`` replaced by a list of floats, the state as it was written before. The decisions are compared (they must
be the same), and per form it prints the median and 90th percentile of a report's time once the windows are full
(the last ``--tail`` reports), the stored state's size, and ``json.dumps`` / ``json.loads`` of that state alone.

A second table gives the state's size in both forms for a few eval-set sizes and plans (the core alone, no store):
the default fed a rising run at every step up to 80% of its plan.

    python benchmarks/bench_state_rows.py [--examples 1000] [--planned 300] [--reports 250] [--tail 100]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from platform_sim.core import JobMonitor, Report, default_spec, detector_from_spec
from platform_sim.core.detectors import progress, trend
from platform_sim.service.store import JobRecord
from platform_sim.service.store_sqlite import SQLiteStore

FORMS = ("packed (now)", "lists of numbers (before)")


@contextlib.contextmanager
def rows_as_lists() -> Iterator[None]:
    """While open, the default detector writes its rows as lists of floats (as before they were packed)."""
    saved = [(module, module.pack_row) for module in (trend, progress)]  # type: ignore[attr-defined]
    for module, _ in saved:
        module.pack_row = lambda row: list(map(float, row))  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for module, pack in saved:
            module.pack_row = pack  # type: ignore[attr-defined]


def reports(examples: int, planned: int, n: int, seed: int = 0) -> list[Report]:
    """A job reporting at every step: rising for most of its plan, with per-example noise of sd 0.2."""
    rng = random.Random(seed)
    out = []
    for step in range(1, n + 1):
        level = 0.4 + 0.3 * step / planned
        scores = tuple(level + rng.gauss(0.0, 0.2) for _ in range(examples))
        out.append(Report("j", "rlhf", step, sum(scores) / examples, eval_scores=scores, planned_steps=planned))
    return out


def run(reps: list[Report], planned: int, tail: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        db = Path(folder) / "service.db"
        store = SQLiteStore(db)
        try:
            tenant, _ = store.add_tenant("t")
            store.register_job(tenant.tenant_id, JobRecord("j", "rlhf", default_spec(), planned_steps=planned))
            times, decisions = [], []
            for report in reps:
                t0 = time.perf_counter()
                outcome = store.submit_report(tenant.tenant_id, report).result(timeout=120)
                times.append(time.perf_counter() - t0)
                decisions.append(outcome.decision.to_dict())
        finally:
            store.close()
        with sqlite3.connect(db) as conn:
            (state,) = conn.execute("SELECT detector_state FROM jobs").fetchone()
        db_bytes = sum(f.stat().st_size for f in Path(folder).iterdir())
    t0 = time.perf_counter()
    parsed = json.loads(state)
    t1 = time.perf_counter()
    json.dumps(parsed)
    t2 = time.perf_counter()
    last = sorted(times[-tail:])
    return {
        "decisions": decisions,
        "median_ms": 1000 * statistics.median(last),
        "p90_ms": 1000 * last[int(0.9 * (len(last) - 1))],
        "state_bytes": len(state),
        "dumps_ms": 1000 * (t2 - t1),
        "loads_ms": 1000 * (t1 - t0),
        "db_bytes": db_bytes,
    }


def state_bytes(examples: int, planned: int) -> int:
    """``json.dumps`` length of the default's state after a rising run reported at every step to 80% of its plan."""
    monitor = JobMonitor("j", "rlhf", detector_from_spec(default_spec()))
    for report in reports(examples, planned, int(0.8 * planned)):
        monitor.observe_report(report)
    return len(json.dumps(monitor.state_dict()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=1000, help="example scores per eval (default 1000)")
    ap.add_argument("--planned", type=int, default=300, help="the job's planned steps, one report a step (300)")
    ap.add_argument("--reports", type=int, default=250, help="reports sent (default 250)")
    ap.add_argument("--tail", type=int, default=100, help="the last reports timed (default 100)")
    args = ap.parse_args()
    reps = reports(args.examples, args.planned, args.reports)
    print(
        f"# one job, {args.examples} example scores a report, one report a step of a {args.planned}-step plan, "
        f"{args.reports} reports; load average {os.getloadavg()[0]:.1f}"
    )
    results = {}
    for form in FORMS:
        with rows_as_lists() if form != FORMS[0] else contextlib.nullcontext():
            results[form] = run(reps, args.planned, args.tail)
    same = results[FORMS[0]]["decisions"] == results[FORMS[1]]["decisions"]
    print(f"same decisions in both forms: {same}")
    print(
        f"| state's rows | report, median (last {args.tail}) | 90th pct | stored state | json.dumps | json.loads | "
        "database files |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for form, r in results.items():
        print(
            f"| {form} | {r['median_ms']:.1f} ms | {r['p90_ms']:.1f} ms | {r['state_bytes'] / 1e6:.2f} MB | "
            f"{r['dumps_ms']:.1f} ms | {r['loads_ms']:.1f} ms | {r['db_bytes'] / 1e6:.1f} MB |"
        )
    now, before = results[FORMS[0]], results[FORMS[1]]
    print(
        f"before / now: report {before['median_ms'] / now['median_ms']:.1f}x, state "
        f"{before['state_bytes'] / now['state_bytes']:.2f}x, dumps {before['dumps_ms'] / now['dumps_ms']:.0f}x"
    )
    print("\n| examples, planned steps | packed (now) | lists of numbers (before) |")
    print("|---|---:|---:|")
    for examples, planned in ((64, 300), (1000, 300), (1000, 1000)):
        packed = state_bytes(examples, planned)
        with rows_as_lists():
            lists = state_bytes(examples, planned)
        print(f"| {examples}, {planned} | {packed / 1e6:.2f} MB | {lists / 1e6:.2f} MB |")
    if not same:
        raise SystemExit("the two forms decided differently")


if __name__ == "__main__":
    main()
