"""The `evalstop` command's frame: subcommands named by module path in `SUBCOMMANDS`, imported when they run."""

from __future__ import annotations

import subprocess
import sys

import pytest

from evalstop_callbacks import cli

HELLO = """\
import argparse

def main(argv):
    parser = argparse.ArgumentParser(prog="evalstop hello")
    parser.add_argument("--times", type=int, default=1)
    return 40 + parser.parse_args(argv).times
"""


@pytest.fixture
def hello(tmp_path, monkeypatch) -> str:
    # A subcommand module as an integration would write one: main(argv) -> int, in a module of its own.
    (tmp_path / "evalstop_hello_cmd.py").write_text(HELLO, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.SUBCOMMANDS, "hello", cli.Subcommand("evalstop_hello_cmd", "say hello"))
    return "hello"


def test_a_subcommand_plugs_in_by_module_path(hello, capsys):
    assert cli.main(["hello", "--times", "2"]) == 42
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert ",hello}" in out and "say hello" in out


def test_the_help_lists_the_subcommands_without_importing_them():
    # A fresh interpreter: `evalstop --help` must not load torch, transformers or any subcommand's module.
    code = (
        "import sys\n"
        "from evalstop_callbacks import cli\n"
        "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
        "loaded = [m for m in ('torch', 'transformers', 'matplotlib', 'evalstop_callbacks.demo.command',"
        " 'evalstop_callbacks.watch.cli') if m in sys.modules]\n"
        "print('LOADED', loaded)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "usage: evalstop [-h] {watch,demo,llamafactory" in proc.stdout
    assert "LOADED []" in proc.stdout


def test_no_subcommand_prints_the_help_and_exits_2(capsys):
    assert cli.main([]) == 2
    assert "usage: evalstop [-h] {watch,demo" in capsys.readouterr().out  # later subcommands may follow


def test_an_unknown_subcommand_is_named_in_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["bogus"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("evalstop: error: argument {watch,demo") and "\n" not in err
    assert "invalid choice: 'bogus' (choose from 'watch', 'demo'" in err


def test_a_missing_framework_is_named_in_one_line(monkeypatch, capsys):
    entry = cli.Subcommand("evalstop_callbacks.watch.cli", "x", requires=("no_such_framework_xyz",), install="pip x")
    monkeypatch.setitem(cli.SUBCOMMANDS, "needsit", entry)
    assert cli.main(["needsit", "--help"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "evalstop needsit: error: needs the Python package 'no_such_framework_xyz', which is not installed; "
        "install it with: pip x"
    )


def test_a_module_missing_from_this_install_is_named_in_one_line(monkeypatch, capsys):
    monkeypatch.setitem(cli.SUBCOMMANDS, "gone", cli.Subcommand("evalstop_callbacks.integrations.no_such_one", "x"))
    assert cli.main(["gone"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("evalstop gone: error: this install has no module evalstop_callbacks.integrations.no_such")
    assert "\n" not in err


def test_a_framework_the_module_imports_is_named_in_one_line(tmp_path, monkeypatch, capsys):
    # The module exists but imports a framework that is not installed (no `requires` declared for it).
    (tmp_path / "evalstop_needs_fw.py").write_text("import no_such_framework_abc\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.SUBCOMMANDS, "fw", cli.Subcommand("evalstop_needs_fw", "x", install="pip install fw"))
    assert cli.main(["fw"]) == 2
    assert capsys.readouterr().err.strip() == (
        "evalstop fw: error: needs the Python package 'no_such_framework_abc', which is not installed; "
        "install it with: pip install fw"
    )


def test_the_llamafactory_subcommand_is_registered_lazily():
    # No up-front requirement: its entry point checks the config and then the installed release itself.
    entry = cli.SUBCOMMANDS["llamafactory"]
    assert entry.module == "evalstop_callbacks.integrations.llamafactory" and entry.requires == ()
