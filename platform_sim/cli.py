"""``evalstop-sim``: the platform simulator's command line (pyproject script ``platform_sim.cli:main``).

It assembles the engine's commands (:mod:`platform_sim.sim.cli`: ``run``, ``paper``, ``sweep``) and the studies'
commands (:mod:`platform_sim.studies.cli`: ``replay``, ``detectors``, ``benchmark``, ``tune``); their shared flags
are in :mod:`platform_sim.sim.cli_args`. Bad input ends with a one-line error that names the flag and exit code 2.
Every command given no detector runs :func:`platform_sim.core.default_spec`, except ``paper``, which reproduces the
paper with its rule (:func:`platform_sim.core.paper_spec`); :func:`default_detector_specs` lists them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from platform_sim.core.detectors import default_spec, detector_from_spec, paper_spec
from platform_sim.sim.cli import ENGINE_COMMANDS
from platform_sim.sim.cli_args import Parser, UsageError
from platform_sim.sim.cli_output import setup_logging
from platform_sim.studies.cli import STUDY_COMMANDS

__all__ = ["COMMANDS", "UsageError", "build_parser", "default_detector_specs", "main"]

COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [*ENGINE_COMMANDS, *STUDY_COMMANDS]
"""Sub-command builders, in ``--help`` order."""


def build_parser() -> argparse.ArgumentParser:
    """The ``evalstop-sim`` parser with every sub-command."""
    parser = Parser(
        prog="evalstop-sim",
        description="EvalStop platform simulator: 64 GPUs, RLHF/DPO/LoRA jobs, "
        "base schedulers with and without EvalStop.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for add in COMMANDS:
        add(sub)
    return parser


def default_detector_specs() -> dict[str, dict[str, Any]]:
    """The complete detector spec each command runs when given no detector flag, by command name.

    ``paper`` reproduces the paper and runs its rule; every other command runs the project's default (``tune``'s
    Ray Tune scheduler included). ``detectors`` and ``benchmark`` compare many detectors: theirs is the row
    labelled ``default``.
    """
    default = detector_from_spec(default_spec()).spec()
    specs = {name: default for name in ("run", "sweep", "replay", "detectors", "benchmark", "tune")}
    specs["paper"] = detector_from_spec(paper_spec()).spec()
    return specs


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``evalstop-sim`` with ``argv`` (default: the process's arguments); the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging()
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        sys.stderr.write(f"evalstop-sim {args.command}: error: {exc}\n")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
