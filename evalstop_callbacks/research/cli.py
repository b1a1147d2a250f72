"""``evalstop``: the trainer side's command line.

- ``evalstop demo``: the CPU reward-hacking demo, end to end (see :mod:`evalstop_callbacks.research.demo`).
- ``evalstop traces record``: record real training runs of the overoptimization environment as JSONL traces.

Bad input ends with a one-line reason naming the flag and exit code 2; ``--json`` prints machine-readable output.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

from platform_sim.sim.cli_args import detector_param  # the simulator's --detector-param type, shared


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse prints usage first, which is noise here)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _fail(flag: str, reason: str) -> int:
    print(f"evalstop: error: {flag}: {reason}", file=sys.stderr)
    return 2


def _nonneg_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _pos_int(text: str) -> int:
    value = _nonneg_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _nonneg_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="evalstop", description="EvalStop, trainer side: the CPU demo and trace recording.")
    sub = parser.add_subparsers(dest="command", metavar="{demo,traces}", parser_class=_Parser)

    demo = sub.add_parser(
        "demo",
        help="the CPU reward-hacking demo, end to end (under 3 minutes on 2 cores)",
        description="Builds the overoptimization environment, runs one real GRPO job against the learned proxy with "
        "EvalStopCallback (embedded scheduler core) while printing proxy and gold at each eval, stops it, "
        "restores the best checkpoint and checks its gold score, then runs the simulated 64-GPU platform "
        "on the shipped real traces and prints the main table.",
    )
    demo.add_argument(
        "--out",
        default="evalstop-demo",
        help="folder for the plot, the trace and summary.json (default: ./evalstop-demo)",
    )
    demo.add_argument("--json", action="store_true", help="print a JSON summary object instead of the human output")
    demo.add_argument("--seed", type=_nonneg_int, default=0, help="environment and training seed (default 0)")
    demo.add_argument(
        "--k",
        type=_pos_int,
        default=None,
        help="use the paper's k-decline rule, stopping after this many consecutive declines (default: "
        "the project's default detector; with --min-delta or --warmup alone, k is 2)",
    )
    demo.add_argument(
        "--min-delta",
        type=_nonneg_float,
        default=None,
        help="k-decline: a drop must exceed this to count as a decline, in gold points (0 unless given)",
    )
    demo.add_argument(
        "--warmup", type=_nonneg_int, default=None, help="k-decline: the first evals count no decline (0 unless given)"
    )
    demo.add_argument(
        "--detector",
        default=None,
        help="use this registered detector (default: the project's default detector, chosen on held-out "
        "environments; --k, --min-delta and --warmup then do not apply); the platform part gets "
        "the same spec on its 0-1 scale, so prefer scale-free detectors (shape, cusum, trend)",
    )
    demo.add_argument(
        "--detector-param",
        action="append",
        type=detector_param,
        default=[],
        metavar="KEY=VALUE",
        help="a parameter of --detector (repeatable; values parsed as JSON)",
    )
    demo.add_argument("--steps", type=_pos_int, default=300, help="planned GRPO steps (default 300)")
    demo.add_argument("--eval-steps", type=_pos_int, default=10, help="evaluate every this many steps (default 10)")
    demo.add_argument("--traces", default=None, help="trace folder for the platform part (default: the shipped corpus)")
    demo.add_argument(
        "--sim-seeds", type=_pos_int, default=3, help="simulator seeds for the platform table (default 3)"
    )
    demo.add_argument("--no-sim", action="store_true", help="skip the simulated platform part")

    traces = sub.add_parser("traces", help="record real training traces", description="Trace commands.")
    tsub = traces.add_subparsers(dest="traces_command", metavar="{record}", parser_class=_Parser)
    from .envs import ENVIRONMENTS

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
        type=_nonneg_int,
        default=None,
        help="seeds per configuration (default: the environment's own; 6 for bow-proxy)",
    )
    rec.add_argument(
        "--ppo-seeds", type=_nonneg_int, default=5, help="bow-proxy only: seeds of PPO vs proxy, no KL (default 5)"
    )
    rec.add_argument(
        "--ppo-kl-seeds", type=_nonneg_int, default=2, help="bow-proxy only: seeds of PPO vs proxy, KL 0.2 (default 2)"
    )
    rec.add_argument("--grpo-steps", type=_pos_int, default=300, help="bow-proxy only: GRPO run length (default 300)")
    rec.add_argument("--ppo-steps", type=_pos_int, default=120, help="bow-proxy only: PPO run length (default 120)")
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
        type=_pos_int,
        default=None,
        metavar="N",
        help="evaluate every this many steps instead of the grid's cadence (a dense recording, for replaying cadence "
        "hints); the trace names end in -every<N>",
    )
    rec.add_argument(
        "--eval-samples",
        type=_pos_int,
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
    return parser


def cmd_record(ns: argparse.Namespace) -> int:
    from platform_sim.trace_format import trace_complete

    from .envs import get
    from .record import EVAL_SAMPLES_ENVS, default_grid, ppo_available, run_in_subprocess

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
            return _fail(
                "--eval-samples", f"only the {', '.join(EVAL_SAMPLES_ENVS)} environments take it, not {ns.env}"
            )
        grid = [replace(s, eval_samples=ns.eval_samples) for s in grid]
    if ns.only:
        grid = [s for s in grid if ns.only in s.name]
    if not grid:
        return _fail("--only" if ns.only else "--seeds", "no run selected")
    ppo_python = ns.ppo_python
    if ppo_python is not None and not (shutil.which(ppo_python) or os.access(ppo_python, os.X_OK)):
        return _fail("--ppo-python", f"{ppo_python} is not an executable interpreter")
    if any(s.algo == "ppo" for s in grid) and ppo_python is None and not ppo_available():
        return _fail(
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


def cmd_demo(ns: argparse.Namespace) -> int:
    from .demo import run_demo

    if ns.traces is not None and not Path(ns.traces).is_dir():
        return _fail("--traces", f"{ns.traces} is not a folder")
    if ns.detector_param and ns.detector is None:
        return _fail("--detector-param", "needs --detector")
    rule_flags = [
        f for f, v in (("--k", ns.k), ("--min-delta", ns.min_delta), ("--warmup", ns.warmup)) if v is not None
    ]
    if ns.detector is not None and rule_flags:
        return _fail(rule_flags[0], "applies to the k-decline rule only, not with --detector")
    if ns.detector is not None:
        from platform_sim.core import detector_from_spec

        try:  # validated before minutes of training, with the registry's own message
            ns.detector_spec = detector_from_spec({"name": ns.detector, "params": dict(ns.detector_param)}).spec()
        except (ValueError, TypeError) as exc:
            return _fail("--detector", str(exc))
    elif not rule_flags:
        from platform_sim.core import default_spec

        ns.detector_spec = default_spec()
    else:
        ns.detector_spec = None  # k-decline with the given --k/--min-delta/--warmup
        ns.k = 2 if ns.k is None else ns.k
        ns.min_delta = 0.0 if ns.min_delta is None else ns.min_delta
        ns.warmup = 0 if ns.warmup is None else ns.warmup
    return run_demo(ns)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if ns.command == "demo":
        return cmd_demo(ns)
    if ns.command == "traces":
        if ns.traces_command == "record":
            return cmd_record(ns)
        parser.parse_args(["traces", "--help"])
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
