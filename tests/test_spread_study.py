"""The three-mode study's rule for making a mode's reports from a recorded trace (benchmarks/mean_and_spread.py)."""

from __future__ import annotations

from platform_sim.core.boundary import EvidenceMode, Report
from platform_sim.sim.corpora import corpus_dir
from platform_sim.sim.traces import load_trace
from platform_sim.studies.spread_study import mode_inputs

TRACE = "dpo-noisy-dpo-gpt2-beta0.1-lr0.001-n64-flip0-s1"


def test_a_mean_and_spread_report_carries_the_spread_of_the_recorded_scores_and_not_the_scores():
    trace = load_trace(corpus_dir("real") / f"{TRACE}.jsonl")
    examples, spreads = mode_inputs(trace, EvidenceMode.MEAN_AND_SPREAD)
    assert examples == () and spreads is not None and len(spreads) == len(trace.steps)
    for step, score, per, (std, n) in zip(trace.steps, trace.scores, trace.examples, spreads):
        # The report's own check accepts the spread beside the scores it was derived from (ddof=1, n = count).
        Report("j", "rlhf", step, score, per, std, n)
        assert n == len(per)
    assert mode_inputs(trace, EvidenceMode.MEANS_ONLY) == ((), None)
    assert mode_inputs(trace, EvidenceMode.PER_EXAMPLE) == (trace.examples, None)
