"""The wheel, built from the checkout's files as a fresh clone has them: what it ships and what it does not.

It ships the library (``evalstop_callbacks``, the demo included) and ``platform_sim`` with the ``real`` corpus; the lab
(``benchmarks/lab``), the tests, the benchmarks and the research corpora stay in the repository.
"""

from __future__ import annotations

import collections
import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import platform_sim

REPO = Path(__file__).resolve().parents[1]
#: The wheel's metadata folder: its name carries the version pyproject.toml reads from platform_sim.__version__.
INFO = f"evalstop-{platform_sim.__version__}.dist-info"


def _checkout_files() -> list[str]:
    """The files a clone has: tracked, or new and not ignored (the environments' symlinks left out)."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [f for f in out.split("\0") if f and (REPO / f).is_file() and not (REPO / f).is_symlink()]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout")
    if importlib.util.find_spec("setuptools") is None:  # --no-build-isolation builds with this interpreter's
        pytest.skip("needs setuptools in this environment (the build backend, pyproject's build-system)")
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for rel in _checkout_files():  # a copy, so the build's build/ and egg-info stay out of the checkout
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, src / rel)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = out.glob("evalstop-*.whl")
    return zipfile.ZipFile(path)


def test_the_wheel_ships_the_two_packages_and_no_lab(wheel):
    names = wheel.namelist()
    tops = collections.Counter(n.split("/")[0] for n in names)
    assert set(tops) == {"evalstop_callbacks", "platform_sim", INFO}, tops
    assert not [n for n in names if n.startswith(("lab/", "benchmarks/", "tests/"))]
    lab_modules = {p.name for p in (REPO / "benchmarks" / "lab").glob("*.py")} - {
        "__init__.py",
        "__main__.py",
        "cli.py",
    }
    shipped = {n.rsplit("/", 1)[-1] for n in names}
    assert not lab_modules & shipped, lab_modules & shipped  # no lab module copied into the packages either


def test_the_wheel_ships_the_demo_and_its_corpus_and_the_real_traces_only(wheel):
    names = set(wheel.namelist())
    assert {"evalstop_callbacks/cli.py", "evalstop_callbacks/demo/run.py", "evalstop_callbacks/demo/tiny.py"} <= names
    assert "evalstop_callbacks/demo/data/corpus.txt" in names  # the tiny world's tokenizer is trained on it
    corpora = {n.split("/")[3] for n in names if n.startswith("platform_sim/data/corpora/") and n.count("/") > 3}
    assert corpora == {"real"}


def test_the_entry_point_is_library_code_and_matplotlib_is_an_extra(wheel):
    info = INFO
    assert f"Version: {platform_sim.__version__}" in wheel.read(f"{info}/METADATA").decode().splitlines()
    assert "evalstop = evalstop_callbacks.cli:main" in wheel.read(f"{info}/entry_points.txt").decode()
    requires = [x for x in wheel.read(f"{info}/METADATA").decode().splitlines() if x.startswith("Requires-Dist:")]
    base = [r for r in requires if "extra ==" not in r]
    assert base and not [r for r in base if "matplotlib" in r]
    assert 'Requires-Dist: matplotlib>=3.8; extra == "plot"' in requires
    assert 'Requires-Dist: evalstop[plot,train]; extra == "demo"' in requires  # what the README's command installs
