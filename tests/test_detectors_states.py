"""Detector states written by earlier code load into today's detectors, which continue with the same decisions.

``tests/data/detector_states.json`` was written by ``tests/data/make_detector_states.py`` with the detectors as they
were before they moved into ``platform_sim.core.detectors`` (one module per detector, a shared base class): for 15
detector configurations on two eval streams, each eval's decision, evidence count and stop reason, and the state at
a few evals.
"""

from __future__ import annotations

import json
import logging

import pytest

from platform_sim.core import KDeclineDetector, detector_from_spec
from platform_sim.core.detectors.packed_rows import unpack_row


def _runs(data):
    return [(run, int(at)) for run in data["runs"] for at in run["states"] if int(at) < len(run["outcomes"]) - 1]


def _same(got, want, rel=1e-9):
    """``got == want`` with floats compared to ``rel``: the float fields are sums and fits whose last bits depend on
    the machine's BLAS kernels (the states were written elsewhere); everything else must be equal. A row of scores
    written now is packed (base64 of float64, ``packed_rows``) where the earlier code wrote a list: its scores must
    be the list's."""
    if isinstance(got, str) and isinstance(want, list):  # a row packed since (packed_rows): the same scores
        return _same(unpack_row(got, "row"), want, rel)
    if isinstance(want, float) and isinstance(got, float):
        return got == pytest.approx(want, rel=rel, abs=1e-300)
    if isinstance(want, dict) and isinstance(got, dict):
        return got.keys() == want.keys() and all(_same(got[k], want[k], rel) for k in want)
    if isinstance(want, list) and isinstance(got, list):
        return len(got) == len(want) and all(_same(g, w, rel) for g, w in zip(got, want))
    return type(got) is type(want) and got == want


def _outcome(det, ev):
    verdict = det.judge(ev["step"], ev["score"], ev["scores"])
    return {"stop": verdict.stop, "declines": det.declines, "reason": verdict.reason or None}


def test_the_fixture_covers_every_detector_and_both_outcomes(detector_states):
    names = {run["spec"]["name"] for run in detector_states["runs"]}
    assert names == {"k-decline", "k-decline-se", "paired-test", "cusum", "trend", "shape"}
    stops = [o["stop"] for run in detector_states["runs"] for o in run["outcomes"]]
    assert any(stops) and not all(stops)


def test_recorded_states_load_and_continue_with_the_recorded_decisions(detector_states, caplog):
    cases = _runs(detector_states)
    assert len(cases) == 90
    for run, at in cases:
        evals = detector_states["curves"][run["curve"]]
        det = detector_from_spec(run["spec"])
        assert det.spec() == run["spec"]
        det.load_state_dict(json.loads(json.dumps(run["states"][str(at)])))
        with caplog.at_level(logging.ERROR, logger="platform_sim.core.detectors"):
            rest = [_outcome(det, ev) for ev in evals[at + 1 :]]
        assert rest == run["outcomes"][at + 1 :], (run["spec"], run["curve"], at)
        # The state written now is the one the earlier code wrote after the same evals (same fields, same values).
        assert _same(det.state_dict(), run["states"][str(len(evals) - 1)]), (run["spec"], run["curve"], at)


def test_fresh_detectors_make_the_recorded_decisions_and_states(detector_states, caplog):
    for run in detector_states["runs"]:
        det = detector_from_spec(run["spec"])
        with caplog.at_level(logging.ERROR, logger="platform_sim.core.detectors"):
            outcomes = []
            for i, ev in enumerate(detector_states["curves"][run["curve"]]):
                outcomes.append(_outcome(det, ev))
                if str(i) in run["states"]:
                    assert _same(det.state_dict(), run["states"][str(i)]), (run["spec"], run["curve"], i)
        assert outcomes == run["outcomes"], (run["spec"], run["curve"])


def test_update_and_reason_agree_with_the_verdict(detector_states):
    run = next(r for r in detector_states["runs"] if r["spec"]["name"] == "trend")
    a, b = detector_from_spec(run["spec"]), detector_from_spec(run["spec"])
    for ev in detector_states["curves"][run["curve"]]:
        verdict = a.judge(ev["step"], ev["score"], ev["scores"])
        stop = b.update(ev["step"], ev["score"], ev["scores"])
        assert verdict.stop is stop and (verdict.reason == b.reason() if stop else verdict.reason == "")
        should_stop, reason = verdict  # unpacks like Lightning's (should_stop, reason)
        assert (should_stop, reason) == (stop, verdict.reason)


@pytest.mark.parametrize("prev_score, stops", [(0.5, True), (None, False)])
def test_a_k_decline_state_without_seen_is_read_as_past_the_warm_up(prev_score, stops):
    # States of the paper's rule (no warm-up) have no "seen" field. Loaded into a rule with a warm-up, a state that
    # has seen evals is past the warm-up: the next decline counts at once. An empty state starts the warm-up.
    det = KDeclineDetector(k=1, warmup=3)
    det.load_state_dict({"prev_score": prev_score, "declines": 0})
    assert det.seen == (3 if prev_score is not None else 0)
    assert det.update(100, 0.4) is stops
