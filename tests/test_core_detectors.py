"""The k-decline rule (docs/design.md section 2) and the detector registry."""

from __future__ import annotations

import json
import math

import pytest

from platform_sim.core import (
    DETECTORS,
    Detector,
    KDeclineDetector,
    default_spec,
    detector_from_spec,
    make_detector,
    paper_spec,
    register_detector,
    spec_plan_matters,
)


def feed(det: Detector, scores: list[float]) -> list[bool]:
    return [det.update(i, s) for i, s in enumerate(scores)]


def test_two_consecutive_declines_stop_with_paper_defaults():
    det = KDeclineDetector()
    assert (det.k, det.min_delta) == (2, 0.0)
    assert feed(det, [0.1, 0.3, 0.5, 0.4, 0.3]) == [False, False, False, False, True]
    assert det.declines == 2
    assert "2 consecutive declines" in det.reason()


def test_a_non_decline_resets_the_count():
    det = KDeclineDetector(k=2)
    # decline, rise, decline, equal (not a decline: strictly below is required), decline
    assert feed(det, [0.5, 0.4, 0.45, 0.44, 0.44, 0.43]) == [False] * 6
    assert det.declines == 1


def test_equal_scores_are_not_declines():
    det = KDeclineDetector(k=1)
    assert feed(det, [0.5, 0.5, 0.5]) == [False, False, False]


def test_first_eval_never_declines():
    det = KDeclineDetector(k=1)
    assert det.update(0, -100.0) is False
    assert det.declines == 0


def test_k1_stops_at_the_first_decline():
    assert feed(KDeclineDetector(k=1), [0.2, 0.3, 0.29]) == [False, False, True]


@pytest.mark.parametrize("k", [3, 5])
def test_k_declines_needed(k):
    det = KDeclineDetector(k=k)
    scores = [1.0 - 0.1 * i for i in range(k + 1)]
    out = feed(det, scores)
    assert out[-1] is True and not any(out[:-1])


def test_min_delta_tolerates_small_drops():
    det = KDeclineDetector(k=2, min_delta=0.05)
    # drops of 0.04 are within tolerance, then two drops of 0.06 count
    assert feed(det, [0.5, 0.46, 0.42, 0.36, 0.30]) == [False, False, False, False, True]


def test_min_delta_boundary_is_strict():
    det = KDeclineDetector(k=1, min_delta=0.25)
    # a drop of exactly min_delta is not a decline: score_t < score_{t-1} - min_delta is required
    assert det.update(0, 1.0) is False
    assert det.update(1, 0.75) is False
    assert det.update(2, 0.49) is True


@pytest.mark.parametrize("k", [0, -1, 1.5, True, "2", None])
def test_bad_k_rejected_naming_k(k):
    with pytest.raises(ValueError, match="k must be"):
        KDeclineDetector(k=k)


@pytest.mark.parametrize("md", [-0.1, math.nan, math.inf, "0", True])
def test_bad_min_delta_rejected(md):
    with pytest.raises(ValueError, match="min_delta"):
        KDeclineDetector(min_delta=md)


def test_state_dict_round_trip_continues_identically():
    scores = [0.1, 0.3, 0.2, 0.25, 0.24, 0.23, 0.5]
    full = KDeclineDetector(k=2, min_delta=0.001)
    expected = feed(full, scores)
    first = KDeclineDetector(k=2, min_delta=0.001)
    feed(first, scores[:4])
    state = json.loads(json.dumps(first.state_dict()))  # must survive JSON
    second = detector_from_spec(first.spec())
    second.load_state_dict(state)
    rest = [second.update(i + 4, s) for i, s in enumerate(scores[4:])]
    assert rest == expected[4:]
    assert second.state_dict() == full.state_dict()


def test_spec_rebuilds_an_equal_detector():
    det = make_detector("k-decline", k=3, min_delta=0.01)
    assert det.spec() == {"name": "k-decline", "params": {"k": 3, "min_delta": 0.01}}
    again = detector_from_spec(det.spec())
    assert isinstance(again, KDeclineDetector) and again.params() == det.params()


def test_detector_from_spec_forms():
    # None is the project's default (what a job registered without a detector runs); the paper's rule is asked for.
    assert detector_from_spec(None).spec() == detector_from_spec(default_spec()).spec()
    assert default_spec()["name"] == "trend"
    assert detector_from_spec(paper_spec()).spec() == {"name": "k-decline", "params": {"k": 2, "min_delta": 0.0}}
    assert isinstance(detector_from_spec("k-decline"), KDeclineDetector)
    assert detector_from_spec({"name": "k-decline"}).params() == {"k": 2, "min_delta": 0.0}
    with pytest.raises(ValueError, match="unknown detector spec field"):
        detector_from_spec({"name": "k-decline", "k": 2})
    with pytest.raises(ValueError, match="a detector spec is"):
        detector_from_spec({"params": {}})
    with pytest.raises(ValueError, match="a detector spec is"):
        detector_from_spec(42)  # type: ignore[arg-type]


def test_unknown_detector_and_bad_parameters_name_the_problem():
    with pytest.raises(ValueError, match="unknown detector 'nope'"):
        make_detector("nope")
    with pytest.raises(ValueError, match="bad parameters for detector 'k-decline'"):
        make_detector("k-decline", window=3)


def test_register_detector_makes_it_selectable_and_requires_a_name():
    class Always(Detector):
        name = "test-always-stop"

        def update(self, step, score, scores=None):
            return True

        def params(self):
            return {}

        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

    try:
        register_detector(Always)
        assert isinstance(make_detector("test-always-stop"), Always)
    finally:
        DETECTORS.pop("test-always-stop", None)

    class Nameless(Always):
        name = ""

    with pytest.raises(TypeError, match="no detector name"):
        register_detector(Nameless)


def test_parse_detector_param():
    from platform_sim.core.detectors import parse_detector_param

    assert parse_detector_param("k=3") == ("k", 3)
    assert parse_detector_param("se=null") == ("se", None)
    assert parse_detector_param("test=wilcoxon") == ("test", "wilcoxon")  # not JSON: kept as text
    assert parse_detector_param("x=a=b") == ("x", "a=b")
    for bad in ("k", "=3", ""):
        with pytest.raises(ValueError, match="expected key=value"):
            parse_detector_param(bad)


def test_detectors_declare_whether_they_read_per_example_scores():
    assert Detector.uses_example_scores is False and KDeclineDetector.uses_example_scores is False
    readers = {name for name, cls in DETECTORS.items() if cls.uses_example_scores}
    assert readers == {"k-decline-se", "paired-test", "cusum", "trend", "shape"}


def test_judge_returns_the_verdict_with_its_reason_and_a_plain_detector_gets_it_from_update():
    det = KDeclineDetector(k=2)
    verdicts = [det.judge(i, s) for i, s in enumerate([0.5, 0.4, 0.3])]
    assert verdicts[:2] == [(False, ""), (False, "")]
    assert verdicts[2] == (True, "2 consecutive declines (k=2, min_delta=0)")

    class Always(Detector):  # the interface alone: update() and reason(), no EvidenceDetector
        name = "test-always"

        def update(self, step, score, scores=None):
            return True

        def params(self):
            return {}

        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

    assert Always().judge(1, 0.5) == (True, "test-always fired")


def test_update_is_the_one_method_that_takes_an_eval():
    # One name per concept: a detector's eval is update(); observe() is the monitor's (it answers a Decision).
    assert not hasattr(KDeclineDetector(k=2), "observe")


@pytest.mark.parametrize(
    "spec",
    [*sorted(DETECTORS)]
    + [{"name": "trend", "params": {"means_test": m}} for m in ("auto", "window", "progress")]
    + [default_spec(), paper_spec()],
)
def test_a_specs_plan_matters_without_building_it_is_the_built_detectors(spec) -> None:
    # The service reads it from every stored spec it lists; it must agree with the detector the spec builds.
    built = detector_from_spec(spec)
    assert spec_plan_matters(built.spec()) is built.plan_matters


def test_only_the_default_family_decides_differently_with_a_plan() -> None:
    assert spec_plan_matters(default_spec()) is True
    assert spec_plan_matters(paper_spec()) is False
    with pytest.raises(ValueError, match="unknown detector 'nope'"):
        spec_plan_matters({"name": "nope", "params": {}})
