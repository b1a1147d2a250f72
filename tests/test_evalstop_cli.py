"""The `evalstop` command's frame: one module per subcommand, plugged in through `SUBCOMMANDS`."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest

from evalstop_callbacks.research import cli


def _hello_module() -> SimpleNamespace:
    # A subcommand module as a new one would be written: add_parser(subparsers) with set_defaults(func=handler).
    def add_parser(sub: argparse._SubParsersAction) -> None:
        p = sub.add_parser("hello", help="say hello")
        p.add_argument("--times", type=int, default=1)
        p.set_defaults(func=lambda ns: 40 + ns.times)

    return SimpleNamespace(add_parser=add_parser)


def test_a_subcommand_module_plugs_in_through_the_list(monkeypatch, capsys):
    monkeypatch.setattr(cli, "SUBCOMMANDS", (*cli.SUBCOMMANDS, _hello_module()))
    assert cli.main(["hello", "--times", "2"]) == 42
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    assert ",hello}" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        cli.main(["hello", "--times", "x"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("evalstop hello: error: argument --times") and "\n" not in err  # one line, no usage


def test_no_subcommand_prints_the_help_and_exits_2(capsys):
    assert cli.main([]) == 2
    assert "usage: evalstop [-h] {demo,traces" in capsys.readouterr().out  # later subcommands may follow


def test_traces_alone_prints_its_help(capsys):
    assert cli.main(["traces"]) == 0
    assert "usage: evalstop traces [-h] {record}" in capsys.readouterr().out


def test_an_unknown_subcommand_is_named_in_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["bogus"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("evalstop: error: argument {demo,traces") and "\n" not in err
    assert "invalid choice: 'bogus' (choose from 'demo', 'traces'" in err
