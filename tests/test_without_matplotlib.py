"""The base install has no matplotlib (it comes with the ``plot`` and ``demo`` extras): what runs without it, and what
says in one line that it needs it.

Each check runs in a fresh interpreter where ``import matplotlib`` fails as it does when the package is absent
(``sys.modules["matplotlib"] = None``, which is also what ``importlib.util.find_spec`` then reports: not found).
"""

from __future__ import annotations

import json
import subprocess
import sys

BLOCK = "import sys; sys.modules['matplotlib'] = None\n"


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + code], capture_output=True, text=True, timeout=300)


def test_the_simulator_and_evalstop_watch_run_without_matplotlib():
    proc = _run(
        "from platform_sim.cli import main\n"
        "code = main(['run', '--jobs', '20', '--json'])\n"
        "from evalstop_callbacks import cli\n"
        "try:\n    cli.main(['watch', '--help'])\nexcept SystemExit as exc:\n    code += exc.code\n"
        "sys.exit(code)\n"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage: evalstop watch" in proc.stdout
    assert json.loads(proc.stdout[: proc.stdout.index("usage:")])["jobs"] == 20


def test_a_command_that_plots_says_so_before_it_runs():
    proc = _run("from platform_sim.cli import main\nsys.exit(main(['paper', '--seeds', '1']))\n")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "evalstop-sim paper: error: plots need matplotlib, which is not installed: pip install 'evalstop[plot]', "
        "or pass --no-plots"
    )


def test_the_demo_names_its_extra():
    proc = _run("from evalstop_callbacks.cli import main\nsys.exit(main(['demo']))\n")
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert err.startswith("evalstop demo: error: needs the Python package 'matplotlib', which is not installed")
    assert "evalstop[demo]" in err and "\n" not in err
