"""docs/threat-model.md names, for each threat, the tests that show its defence: every test it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_test_the_threat_model_names_exists() -> None:
    text = (ROOT / "docs" / "threat-model.md").read_text()
    cited = set(re.findall(r"`(test_\w+\.py)::(test_\w+)`", text))
    assert len(cited) >= 30, "the threat model names its tests as `test_file.py::test_name`"
    missing = [
        f"{name}::{test}"
        for name, test in sorted(cited)
        if not (ROOT / "tests" / name).is_file()
        or not re.search(rf"^(async )?def {test}\(", (ROOT / "tests" / name).read_text(), re.M)
    ]
    assert not missing, f"docs/threat-model.md names tests that do not exist: {missing}"
