"""``python -m lab``: the lab's command line (run with ``benchmarks/`` on the path: ``PYTHONPATH=benchmarks``).

- ``python -m lab traces record``: record real training runs of the overoptimization worlds as JSONL traces.

Bad input ends with a one-line reason naming the flag and exit code 2; ``--json`` prints machine-readable output.

Each subcommand lives in its own module, listed in :data:`SUBCOMMANDS`. Such a module provides
``add_parser(subparsers) -> None``: it adds its parser with ``subparsers.add_parser(NAME, ...)`` (the parser class
is :class:`~evalstop_callbacks.cli_args.Parser`, so errors are one line) and sets ``set_defaults(func=handler)``,
where ``handler(namespace) -> int`` sets up its logging, runs the command and returns the exit code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from evalstop_callbacks.cli_args import Parser

from . import cli_traces

PROG = "python -m lab"

#: The modules of the lab's subcommands, in the order ``--help`` lists them.
SUBCOMMANDS = (cli_traces,)


def build_parser() -> argparse.ArgumentParser:
    """The lab's parser with every subcommand of :data:`SUBCOMMANDS`."""
    parser = Parser(prog=PROG, description="The EvalStop lab: recording real training runs as traces.")
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
