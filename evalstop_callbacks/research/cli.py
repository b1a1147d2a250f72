"""``evalstop``: the trainer side's command line.

- ``evalstop demo``: the CPU reward-hacking demo, end to end (see :mod:`evalstop_callbacks.research.demo`).
- ``evalstop traces record``: record real training runs of the overoptimization environment as JSONL traces.
- ``evalstop watch``: follow any run's metrics log (verl, OpenRLHF, TensorBoard, JSONL) and stop it when its eval score
  declines (the library's :mod:`evalstop_callbacks.watch`).
- ``evalstop llamafactory train config.yaml``: LLaMA-Factory's training with EvalStop, from its own YAML plus an
  ``evalstop:`` section (:mod:`evalstop_callbacks.integrations.llamafactory`).

Bad input ends with a one-line reason naming the flag and exit code 2; ``--json`` prints machine-readable output.

Each subcommand lives in its own module, listed in :data:`SUBCOMMANDS`. Such a module provides
``add_parser(subparsers) -> None``: it adds its parser with ``subparsers.add_parser(NAME, ...)`` (the parser class
is :class:`~evalstop_callbacks.research.cli_args.Parser`, so errors are one line) and sets
``set_defaults(func=handler)``, where ``handler(namespace) -> int`` sets up its logging, runs the command and returns
the exit code. To add one, import its module here and append it to :data:`SUBCOMMANDS`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..integrations import llamafactory as cli_llamafactory
from ..watch import cli as cli_watch
from . import cli_demo, cli_traces
from .cli_args import Parser

#: The modules of the ``evalstop`` subcommands, in the order ``--help`` lists them.
SUBCOMMANDS = (cli_demo, cli_traces, cli_watch, cli_llamafactory)


def build_parser() -> argparse.ArgumentParser:
    """The ``evalstop`` parser with every subcommand of :data:`SUBCOMMANDS`."""
    parser = Parser(
        prog="evalstop",
        description="EvalStop, trainer side: the CPU demo, trace recording, and watching a run's metrics log.",
    )
    sub = parser.add_subparsers(dest="command", parser_class=Parser)
    for module in SUBCOMMANDS:
        module.add_parser(sub)
    sub.metavar = "{" + ",".join(sub.choices) + "}"  # names the subcommands in usage and errors, not "command"
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if getattr(ns, "func", None) is None:
        parser.print_help()
        return 2
    return int(ns.func(ns))


if __name__ == "__main__":
    sys.exit(main())
