"""``evalstop demo``: its flags and their checks; the demo itself is :mod:`evalstop_callbacks.demo.run`.

``main(argv)`` is what the ``evalstop`` command calls with the arguments after ``demo``
(:data:`evalstop_callbacks.cli.SUBCOMMANDS`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from platform_sim.core import default_spec, detector_from_spec

from ..cli_args import Parser, detector_param, log_warnings, nonneg_float, nonneg_int, pos_int
from ..cli_args import fail as _fail
from .run import run_demo

PROG = "evalstop demo"


def fail(flag: str, reason: str) -> int:
    """``evalstop demo: error: FLAG: REASON`` on stderr; exit code 2."""
    return _fail(flag, reason, prog=PROG)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``evalstop demo``'s flags."""
    demo = Parser(
        prog=PROG,
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
    demo.add_argument("--seed", type=nonneg_int, default=0, help="environment and training seed (default 0)")
    demo.add_argument(
        "--k",
        type=pos_int,
        default=None,
        help="use the paper's k-decline rule, stopping after this many consecutive declines (default: "
        "the project's default detector; with --min-delta or --warmup alone, k is 2)",
    )
    demo.add_argument(
        "--min-delta",
        type=nonneg_float,
        default=None,
        help="k-decline: a drop must exceed this to count as a decline, in gold points (0 unless given)",
    )
    demo.add_argument(
        "--warmup", type=nonneg_int, default=None, help="k-decline: the first evals count no decline (0 unless given)"
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
    demo.add_argument("--steps", type=pos_int, default=300, help="planned GRPO steps (default 300)")
    demo.add_argument("--eval-steps", type=pos_int, default=10, help="evaluate every this many steps (default 10)")
    demo.add_argument("--traces", default=None, help="trace folder for the platform part (default: the shipped corpus)")
    demo.add_argument("--sim-seeds", type=pos_int, default=3, help="simulator seeds for the platform table (default 3)")
    demo.add_argument("--no-sim", action="store_true", help="skip the simulated platform part")
    return demo


def main(argv: Sequence[str] | None = None) -> int:
    """``evalstop demo [FLAGS]``: parse ``argv`` (the arguments after ``demo``), run the demo; the exit code."""
    return cmd_demo(build_parser().parse_args(argv))


def cmd_demo(ns: argparse.Namespace) -> int:
    """Check the flags of ``ns`` (before minutes of training), settle the detector spec, run the demo."""
    log_warnings()
    if ns.traces is not None and not Path(ns.traces).is_dir():
        return fail("--traces", f"{ns.traces} is not a folder")
    if ns.detector_param and ns.detector is None:
        return fail("--detector-param", "needs --detector")
    rule_flags = [
        f for f, v in (("--k", ns.k), ("--min-delta", ns.min_delta), ("--warmup", ns.warmup)) if v is not None
    ]
    if ns.detector is not None and rule_flags:
        return fail(rule_flags[0], "applies to the k-decline rule only, not with --detector")
    if ns.detector is not None:
        try:  # validated before minutes of training, with the registry's own message
            ns.detector_spec = detector_from_spec({"name": ns.detector, "params": dict(ns.detector_param)}).spec()
        except (ValueError, TypeError) as exc:
            return fail("--detector", str(exc))
    elif not rule_flags:
        ns.detector_spec = default_spec()
    else:
        ns.detector_spec = None  # k-decline with the given --k/--min-delta/--warmup
        ns.k = 2 if ns.k is None else ns.k
        ns.min_delta = 0.0 if ns.min_delta is None else ns.min_delta
        ns.warmup = 0 if ns.warmup is None else ns.warmup
    return run_demo(ns)
