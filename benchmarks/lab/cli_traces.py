"""``python -m lab traces record``: record a grid of real training runs of one environment as JSONL traces."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path

from evalstop_callbacks.cli_args import Parser, log_warnings, nonneg_int, pos_int
from evalstop_callbacks.cli_args import fail as _fail
from platform_sim.trace_format import trace_complete

from .envs import ENVIRONMENTS, get
from .record import run_in_subprocess
from .runs import EVAL_SAMPLES_ENVS, default_grid
from .trainers import ppo_available


def fail(flag: str, reason: str) -> int:
    """``python -m lab traces record: error: FLAG: REASON`` on stderr; exit code 2."""
    return _fail(flag, reason, prog="python -m lab traces record")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``traces`` (and its ``record``) to the lab's subcommands ``sub``."""
    traces = sub.add_parser("traces", help="record real training traces", description="Trace commands.")
    tsub = traces.add_subparsers(dest="traces_command", metavar="{record}", parser_class=Parser)

    rec = tsub.add_parser(
        "record",
        help="record a grid of real runs (observe mode, full length) as JSONL traces",
        description="Runs the grid of real training runs of one overoptimization environment to their full length "
        "with EvalStopCallback in observe mode, one at a time, each in its own process, and writes one "
        "JSONL trace per run (evalstop-trace/1, the header names the environment and its split). Each "
        "environment has hacking configurations (its proxy, no KL) and healthy controls (gold as the "
        "reward, a strong KL or a small learning rate); environments: "
        + "; ".join(f"{e.name} ({e.split}): {e.failure}" for e in ENVIRONMENTS.values())
        + ". Existing complete traces are kept (an interrupted recording resumes) unless --force.",
    )
    rec.add_argument(
        "--env",
        default="bow-proxy",
        choices=sorted(ENVIRONMENTS),
        help="the environment to record (default bow-proxy, the learned bag-of-words proxy)",
    )
    rec.add_argument("--out", default="evalstop-traces", help="output folder (default: ./evalstop-traces)")
    rec.add_argument(
        "--seeds",
        type=nonneg_int,
        default=None,
        help="seeds per configuration (default: the environment's own; 6 for bow-proxy)",
    )
    rec.add_argument(
        "--ppo-seeds", type=nonneg_int, default=5, help="bow-proxy only: seeds of PPO vs proxy, no KL (default 5)"
    )
    rec.add_argument(
        "--ppo-kl-seeds", type=nonneg_int, default=2, help="bow-proxy only: seeds of PPO vs proxy, KL 0.2 (default 2)"
    )
    rec.add_argument("--grpo-steps", type=pos_int, default=300, help="bow-proxy only: GRPO run length (default 300)")
    rec.add_argument("--ppo-steps", type=pos_int, default=120, help="bow-proxy only: PPO run length (default 120)")
    rec.add_argument(
        "--only",
        default=None,
        help="record only runs whose name contains this text "
        "(names look like bow-proxy-grpo-proxy-kl0-s3 or length-rloo-llama-proxy-kl0-lr0.0003-s1)",
    )
    rec.add_argument(
        "--ppo-python",
        default=None,
        help="Python interpreter with trl==1.12.0 for the PPO runs (e.g. .venv-ppo/bin/python); "
        "default: this one if it has trl.experimental.ppo",
    )
    rec.add_argument(
        "--eval-every",
        type=pos_int,
        default=None,
        metavar="N",
        help="evaluate every this many steps instead of the grid's cadence (a dense recording, for replaying cadence "
        "hints); the trace names end in -every<N>",
    )
    rec.add_argument(
        "--eval-samples",
        type=pos_int,
        default=None,
        metavar="N",
        help="completions per held-out prompt in each evaluation instead of the environment's 2 (length and keyword "
        "only: a larger eval set, for measuring how much of an eval's movement is sampling noise); the trace names "
        "end in -x<N>",
    )
    rec.add_argument("--skip-ppo", action="store_true", help="record no PPO runs")
    rec.add_argument("--force", action="store_true", help="re-record runs whose trace already exists")
    rec.add_argument(
        "--cache-dir", default=None, help="environment cache (default $EVALSTOP_CACHE or ~/.cache/evalstop)"
    )
    rec.add_argument("--json", action="store_true", help="print one JSON object with the recorded runs")
    rec.set_defaults(func=cmd_record)

    def traces_help(ns: argparse.Namespace) -> int:
        traces.print_help()
        return 0

    traces.set_defaults(func=traces_help)


def cmd_record(ns: argparse.Namespace) -> int:
    """Record the grid that the flags of ``ns`` select; returns 1 if any run failed."""
    log_warnings()
    if ns.env == "bow-proxy":
        grid = default_grid(
            6 if ns.seeds is None else ns.seeds,
            0 if ns.skip_ppo else ns.ppo_seeds,
            0 if ns.skip_ppo else ns.ppo_kl_seeds,
            ns.grpo_steps,
            ns.ppo_steps,
        )
    else:
        env = get(ns.env)
        grid = env.grid() if ns.seeds is None else env.grid(ns.seeds)
        if ns.skip_ppo:
            grid = [s for s in grid if s.algo != "ppo"]
    if ns.eval_every is not None:
        grid = [replace(s, eval_steps=ns.eval_every, dense=True) for s in grid]
    if ns.eval_samples is not None:
        if ns.env not in EVAL_SAMPLES_ENVS:
            return fail("--eval-samples", f"only the {', '.join(EVAL_SAMPLES_ENVS)} environments take it, not {ns.env}")
        grid = [replace(s, eval_samples=ns.eval_samples) for s in grid]
    if ns.only:
        grid = [s for s in grid if ns.only in s.name]
    if not grid:
        return fail("--only" if ns.only else "--seeds", "no run selected")
    ppo_python = ns.ppo_python
    if ppo_python is not None and not (shutil.which(ppo_python) or os.access(ppo_python, os.X_OK)):
        return fail("--ppo-python", f"{ppo_python} is not an executable interpreter")
    if any(s.algo == "ppo" for s in grid) and ppo_python is None and not ppo_available():
        return fail(
            "--ppo-python",
            "the grid has PPO runs but this Python has no trl.experimental.ppo "
            "(trl==1.12.0); pass --ppo-python .venv-ppo/bin/python or --skip-ppo",
        )
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    from tqdm import tqdm

    results, failures = [], []
    bar = tqdm(grid, desc="recording", unit="run", disable=None, file=sys.stderr)
    for spec in bar:
        bar.set_postfix_str(spec.name)
        path = out / f"{spec.name}.jsonl"
        if path.exists() and not ns.force and trace_complete(path):
            results.append({"name": spec.name, "trace": str(path), "skipped": True})
            continue
        try:
            res = run_in_subprocess(
                spec, path, python=ppo_python if spec.algo == "ppo" else None, cache_dir=ns.cache_dir
            )
        except Exception as exc:  # noqa: BLE001 - report and continue with the next run
            # A crashed run leaves a partial trace: set it aside so the folder holds complete traces only.
            if path.exists():
                path.replace(path.with_name(path.name + ".failed"))
            failures.append({"name": spec.name, "error": str(exc)})
            bar.write(f"FAILED {spec.name}: {exc}", file=sys.stderr)
            continue
        results.append({"name": res.name, "trace": res.trace, "wall_s": round(res.wall_s, 1), "evals": res.evals})
        bar.write(f"{res.name}: {res.evals} evals in {res.wall_s:.0f} s", file=sys.stderr)
    bar.close()
    from platform_sim.sim.traces import load_traces

    labels = {}
    try:
        labels = {t.name: t.label for t in load_traces(out)}
    except Exception as exc:  # noqa: BLE001 - labelling is a summary; the traces are written already
        logging.getLogger(__name__).warning("could not label the traces: %s", exc)
    for r in results:
        r["label"] = labels.get(r["name"])
    if ns.json:
        print(json.dumps({"out": str(out), "runs": results, "failures": failures}, indent=1))
    else:
        for r in results:
            print(f"{r['name']:<24} {r.get('label') or '?':<8} {'(kept)' if r.get('skipped') else ''}")
        n_hack = sum(1 for r in results if r.get("label") == "hacking")
        print(
            f"{len(results)} traces in {out} ({n_hack} hacking, {len(results) - n_hack} healthy), "
            f"{len(failures)} failed"
        )
    return 1 if failures else 0
