"""The project's default detector is the one the held-out real-trace benchmark chooses, everywhere it applies."""

from __future__ import annotations

import pytest

from evalstop_callbacks import EvalStopCallback
from platform_sim.core import default_spec, detector_from_spec, paper_spec
from platform_sim.core.monitor import JobMonitor
from platform_sim.sim.corpora import corpus_dir
from platform_sim.studies.benchmark import benchmark


def _normal(spec):
    return detector_from_spec(spec).spec()


@pytest.fixture(scope="module")
def shipped_benchmark():
    return benchmark(corpus_dir("real"), resamples=0)


def test_the_default_is_the_benchmarks_best_on_the_held_out_environments(shipped_benchmark):
    # Tuned on the tune-split environments only, judged once on the test split: the winner is the default.
    assert _normal(shipped_benchmark["best"]["spec"]) == _normal(default_spec())


def test_the_default_beats_the_papers_rule_on_the_test_environments(shipped_benchmark):
    rows = {(r["candidate"], r["group"]): r for r in shipped_benchmark["results"] if r["kind"] == "split"}
    best, paper = shipped_benchmark["best"]["candidate"], "k-decline (paper, untuned)"
    mine, theirs = rows[(best, "test")], rows[(paper, "test")]
    assert mine["healthy_stopped"] < theirs["healthy_stopped"]
    assert mine["precision"] > theirs["precision"]


def test_every_entry_point_uses_the_default_and_the_paper_keeps_its_rule():
    assert EvalStopCallback().detector_spec == _normal(default_spec())
    assert EvalStopCallback(k=3).detector_spec == {"name": "k-decline", "params": {"k": 3, "min_delta": 0.0}}
    assert _normal(paper_spec()) == {"name": "k-decline", "params": {"k": 2, "min_delta": 0.0}}
    assert JobMonitor(job_id="j", job_type="rlhf").detector.spec() == _normal(paper_spec())  # the core's neutral rule
