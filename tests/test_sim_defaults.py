"""One default: every ``evalstop-sim`` command given no detector runs ``default_spec()``; ``paper`` the paper's rule.

Each command is run (or, for the slow multi-run ones, parsed and handed to the same code the command runs) with no
detector flag, and the spec it ran is read back from its own output.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from platform_sim.cli import build_parser, default_detector_specs, main
from platform_sim.core import default_spec, detector_from_spec, paper_spec
from platform_sim.sim.report import PER_RUN_NOTE
from platform_sim.sim.sweep import SweepSpec, cell_policies
from platform_sim.studies.benchmark import DEFAULT_REFERENCE
from platform_sim.studies.detector_study import CANDIDATES

DEFAULT = detector_from_spec(default_spec()).spec()
PAPER = detector_from_spec(paper_spec()).spec()


def test_the_helper_names_the_default_of_every_command():
    specs = default_detector_specs()
    assert set(specs) == {"run", "paper", "sweep", "replay", "detectors", "benchmark", "tune"}
    assert specs.pop("paper") == PAPER
    assert all(spec == DEFAULT for spec in specs.values())
    assert DEFAULT["name"] != PAPER["name"]  # the test could not tell the two apart otherwise


def test_run_without_a_detector_runs_the_default_and_names_it(capsys):
    assert main(["run", "--jobs", "20", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["detector"] == default_detector_specs()["run"]
    assert main(["run", "--jobs", "20"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("detector: "))
    # Every simulated job's reports carry its planned steps, so the default tests per run, and the line says so
    # (its spec lists only the per-look parameters); the paper's rule needs no plan and is not said to.
    assert line.startswith(f"detector: {DEFAULT['name']} ") and line.endswith(PER_RUN_NOTE)
    assert main(["run", "--jobs", "20", "--detector", PAPER["name"]]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("detector: "))
    assert line.startswith(f"detector: {PAPER['name']} ") and PER_RUN_NOTE not in line


def test_k_alone_still_means_k_decline(capsys):
    assert main(["run", "--jobs", "20", "--json", "--k", "3"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["detector"] == {
        "name": "k-decline",
        "params": {"k": 3, "min_delta": 0.0},
    }


def _traces(folder: Path) -> Path:
    p = np.arange(1, 11) / 10
    for i, peak in enumerate((0.4, 0.6)):
        scores = np.where(p <= peak, 4 * p / peak, 4 - 12 * (p - peak))
        lines = [{"kind": "header", "format": "evalstop-trace/1", "job_id": f"h{i}", "job_type": "rlhf"}]
        lines += [{"kind": "eval", "step": 10 * (j + 1), "eval_score": float(s)} for j, s in enumerate(scores)]
        (folder / f"h{i}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return folder


def test_replay_without_a_detector_runs_the_default_and_names_it(tmp_path, capsys):
    argv = ["replay", "--traces", str(_traces(tmp_path)), "--seeds", "1", "--backend", "serial", "--jobs", "20"]
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["detector"] == default_detector_specs()["replay"]
    assert main(argv) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("detector: "))
    assert line.startswith(f"detector: {DEFAULT['name']} ") and line.endswith(PER_RUN_NOTE)


def test_paper_keeps_the_papers_rule_and_says_so(capsys):
    from platform_sim.sim.cli_args import detector_from_args

    with pytest.raises(SystemExit):
        build_parser().parse_args(["paper", "--help"])
    assert "the paper's rule" in capsys.readouterr().out
    args = build_parser().parse_args(["paper"])
    assert detector_from_args(args, fallback=paper_spec()) == default_detector_specs()["paper"]


@pytest.mark.parametrize("command", ["tune", "replay"])
def test_the_study_flags_default_to_the_default(command):
    from platform_sim.sim.cli_args import detector_from_args

    assert detector_from_args(build_parser().parse_args([command])) == default_detector_specs()[command]


def test_sweep_policies_without_a_detector_run_the_default():
    spec = SweepSpec(seeds=(0,), axes=(("k", (3,)),), policies=({"stop": "evalstop"},))
    (with_k,) = cell_policies(spec, {"k": 3})
    assert with_k.detector == {"name": "k-decline", "params": {"k": 3, "min_delta": 0.0}}
    (plain,) = cell_policies(SweepSpec(seeds=(0,), policies=({"stop": "evalstop"},)), {})
    assert plain.detector == default_detector_specs()["sweep"]


def test_the_studies_compare_a_default_row():
    assert dict(CANDIDATES)["default"] == default_spec()
    assert DEFAULT_REFERENCE[1] == default_spec()
