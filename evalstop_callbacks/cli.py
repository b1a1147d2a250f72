"""``evalstop``: the trainer side's command line.

- ``evalstop watch``: follow any run's metrics log (verl, OpenRLHF, TensorBoard, JSONL) and stop it when its eval
  score declines (:mod:`evalstop_callbacks.watch`).
- ``evalstop demo``: the CPU reward-hacking demo, end to end (:mod:`evalstop_callbacks.demo`).
- ``evalstop llamafactory``: train with LLaMA-Factory under EvalStop (``evalstop_callbacks.integrations.llamafactory``).

Each subcommand is one entry of :data:`SUBCOMMANDS`: a module path, imported only when that subcommand runs (so
``evalstop watch`` never loads torch, and a subcommand whose framework is not installed costs nothing until it is
asked for). The module provides ``main(argv: list[str]) -> int``: it parses the arguments after the subcommand's name
(its parser's ``prog`` is ``evalstop NAME``), runs the command and returns the exit code. Bad input ends with a
one-line reason and exit code 2, here as in each subcommand.

To add a subcommand, add an entry::

    SUBCOMMANDS["mytool"] = Subcommand("mypackage.evalstop_cli", "what it does, in one line", requires=("mytool",))

The lab's commands (recording corpora of traces, the studies' worlds) are not here: they live beside the benchmarks
(``python -m lab`` with ``benchmarks/`` on the path) and are not installed with the package.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from .cli_args import Parser


@dataclass(frozen=True)
class Subcommand:
    """One ``evalstop`` subcommand, imported when it runs.

    Args:
        module: Dotted path of the module that implements it; it provides ``main(argv: list[str]) -> int``.
        help: One line for ``evalstop --help``.
        requires: Top-level packages it needs beyond the base install (its framework); checked before the module is
            imported, so a missing one ends with a one-line error naming it and ``install`` instead of a traceback.
        install: What to run to get them (the pip command), said in that error.
    """

    module: str
    help: str
    requires: tuple[str, ...] = ()
    install: str = ""


_DEMO_INSTALL = "pip install torch==2.13.0 && pip install 'evalstop[demo]' (see the README)"

#: The ``evalstop`` subcommands by name, in the order ``--help`` lists them.
SUBCOMMANDS: dict[str, Subcommand] = {
    "watch": Subcommand(
        "evalstop_callbacks.watch.cli",
        "follow a run's metrics log and stop it at a decline",
    ),
    "demo": Subcommand(
        "evalstop_callbacks.demo.command",
        "the CPU reward-hacking demo, end to end (under 3 minutes on 2 cores)",
        requires=("torch", "transformers", "trl", "datasets", "tokenizers", "matplotlib"),
        install=_DEMO_INSTALL,
    ),
    "llamafactory": Subcommand(
        "evalstop_callbacks.integrations.llamafactory",
        "train with LLaMA-Factory under EvalStop (evalstop llamafactory train config.yaml)",
        # No up-front requirement: the entry point checks the config's keys first, then the installed release
        # against the tested range, each in one line (so `--help` and a config typo answer without the framework).
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """The top-level ``evalstop`` parser: it lists :data:`SUBCOMMANDS` (for ``--help`` and the error on an unknown
    name); each subcommand parses its own arguments."""
    parser = Parser(
        prog="evalstop",
        description="EvalStop, trainer side: watch a run's metrics log, the CPU demo, framework integrations. "
        "Run 'evalstop NAME --help' for a subcommand's flags.",
    )
    sub = parser.add_subparsers(dest="command", parser_class=Parser)
    for name, entry in SUBCOMMANDS.items():
        sub.add_parser(name, help=entry.help, add_help=False)
    sub.metavar = "{" + ",".join(SUBCOMMANDS) + "}"  # names the subcommands in usage and errors, not "command"
    return parser


def _missing(entry: Subcommand) -> str | None:
    """The first package of ``entry.requires`` that this interpreter cannot import, or None."""
    for package in entry.requires:
        if importlib.util.find_spec(package) is None:
            return package
    return None


def run_subcommand(name: str, argv: Sequence[str]) -> int:
    """Import the module of subcommand ``name`` and run its ``main(argv)``; returns the exit code.

    A framework it needs that is not installed, or a module this install does not have, ends with one line on
    stderr (``evalstop NAME: error: ...``) and exit code 2.
    """
    entry = SUBCOMMANDS[name]
    missing = _missing(entry)
    if missing is not None:
        hint = f"; install it with: {entry.install}" if entry.install else ""
        return _error(name, f"needs the Python package {missing!r}, which is not installed{hint}")
    try:
        module = importlib.import_module(entry.module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (entry.module == exc.name or entry.module.startswith(exc.name + ".")):
            return _error(name, f"this install has no module {entry.module} (it is not in this version of evalstop)")
        hint = f"; install it with: {entry.install}" if entry.install else ""
        return _error(name, f"needs the Python package {exc.name!r}, which is not installed{hint}")
    command = getattr(module, "main", None)
    if not callable(command):
        return _error(name, f"{entry.module} has no main(argv) function")
    return int(command(list(argv)))


def _error(name: str, reason: str) -> int:
    print(f"evalstop {name}: error: {reason}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """The ``evalstop`` command: ``evalstop NAME [ARGS...]``. Returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in SUBCOMMANDS:
        return run_subcommand(args[0], args[1:])
    parser = build_parser()
    if not args:
        parser.print_help()
        return 2
    parser.parse_args(args)  # --help exits 0; an unknown name or flag exits 2 with one line
    parser.print_help()  # not reached: every other first argument is an error above
    return 2


if __name__ == "__main__":
    sys.exit(main())
