"""The distribution's one version: where it is set, what reads it, and the changelog section that goes with it."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from packaging.version import Version

import evalstop_callbacks
import platform_sim

REPO = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    if sys.version_info < (3, 11):
        pytest.skip("tomllib needs Python 3.11")
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def test_pyproject_reads_the_version_from_platform_sim() -> None:
    config = _pyproject()
    assert "version" not in config["project"], "pyproject.toml must not repeat the version"
    assert "version" in config["project"]["dynamic"]
    assert config["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "platform_sim.__version__"}


def test_both_packages_report_one_pep440_version() -> None:
    version = Version(platform_sim.__version__)  # raises InvalidVersion on a malformed one
    assert evalstop_callbacks.__version__ == platform_sim.__version__
    assert str(version) == platform_sim.__version__, "the version is written in its normalized form"


def test_the_changelog_has_the_section_of_this_version() -> None:
    """A release has its own section; a development version's changes are under [Unreleased], which names it."""
    changelog = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    version = Version(platform_sim.__version__)
    if version.is_devrelease or version.is_prerelease:
        unreleased = changelog.split("## [Unreleased]", 1)
        assert len(unreleased) == 2, "CHANGELOG.md has no [Unreleased] section"
        assert f"`{version}`" in unreleased[1].split("\n## [", 1)[0]
    else:
        assert re.search(rf"^## \[{re.escape(str(version))}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.M), (
            f"CHANGELOG.md has no dated section ## [{version}]"
        )
