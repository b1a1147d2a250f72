"""The Report/Decision whitelist (docs/design.md section 3)."""

from __future__ import annotations

import math

import pytest

from platform_sim.core import Action, BoundaryError, Decision, EvidenceMode, InvalidReportError, Report


def test_report_round_trip():
    r = Report("j1", "rlhf", 10, 0.5, (0.4, 0.6))
    assert Report.from_dict(r.to_dict()) == r
    assert "eval_scores" not in Report("j1", "rlhf", 10, 0.5).to_dict()


@pytest.mark.parametrize("field", ["train_loss", "proxy_reward", "kl", "checkpoint_path", "hostname", "labels"])
def test_fields_outside_the_whitelist_are_rejected_by_name(field):
    with pytest.raises(InvalidReportError, match=f"unknown report field.*{field}"):
        Report.from_dict({"job_id": "j", "job_type": "rlhf", "step": 1, "eval_score": 0.1, field: 1})


def test_missing_fields_named():
    with pytest.raises(InvalidReportError, match="missing report field.*eval_score"):
        Report.from_dict({"job_id": "j", "job_type": "rlhf", "step": 1})


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"job_id": ""}, "job_id"),
        ({"job_type": "pretrain"}, "job_type"),
        ({"step": -1}, "step"),
        ({"eval_score": math.nan}, "eval_score"),
        ({"eval_score": math.inf}, "eval_score"),
        ({"eval_scores": ()}, "eval_scores"),
        ({"eval_scores": (0.1, math.nan)}, "eval_scores"),
        ({"eval_scores": "0.1"}, "eval_scores"),
        ({"eval_std": 0.1}, "eval_std was given without eval_n"),
        ({"eval_n": 8}, "eval_n was given without eval_std"),
        ({"eval_std": -0.1, "eval_n": 8}, "eval_std must be >= 0"),
        ({"eval_std": math.nan, "eval_n": 8}, "eval_std must be finite"),
        ({"eval_std": math.inf, "eval_n": 8}, "eval_std must be finite"),
        ({"eval_std": "0.1", "eval_n": 8}, "eval_std must be a number"),
        ({"eval_std": 0.1, "eval_n": 1}, "eval_n must be an integer >= 2"),
        ({"eval_std": 0.1, "eval_n": 2.0}, "eval_n must be an integer >= 2"),
        ({"eval_std": 0.1, "eval_n": True}, "eval_n must be an integer >= 2"),
        ({"eval_scores": (0.0, 1.0), "eval_std": 0.7071067811865476, "eval_n": 3}, "eval_n is 3 but eval_scores"),
        ({"eval_scores": (0.0, 1.0), "eval_std": 0.5, "eval_n": 2}, "disagrees with the sample standard deviation"),
    ],
)
def test_bad_values_rejected(kwargs, match):
    base = {"job_id": "j", "job_type": "rlhf", "step": 0, "eval_score": 0.1}
    with pytest.raises(InvalidReportError, match=match):
        Report(**{**base, **kwargs})


def test_the_spread_travels_with_its_count_and_names_the_mode():
    spread = Report("j1", "rlhf", 10, 0.5, eval_std=0.25, eval_n=64)
    assert Report.from_dict(spread.to_dict()) == spread
    assert spread.to_dict()["eval_std"] == 0.25 and spread.to_dict()["eval_n"] == 64
    assert spread.mode is EvidenceMode.MEAN_AND_SPREAD
    assert Report("j1", "rlhf", 10, 0.5).mode is EvidenceMode.MEANS_ONLY
    assert "eval_std" not in Report("j1", "rlhf", 10, 0.5).to_dict()
    # with the vector: the spread must be the vector's own (ddof=1), up to float32-sized rounding; the mode is richer
    scores = (1e9 + 0.25, 1e9 + 0.75, 1e9 + 0.5)  # far from zero: a naive sum of squares loses the spread
    both = Report("j1", "rlhf", 10, 1e9 + 0.5, scores, eval_std=0.25 * (1 + 1e-7), eval_n=3)
    assert both.mode is EvidenceMode.PER_EXAMPLE and Report.from_dict(both.to_dict()) == both
    assert Report("j1", "rlhf", 10, 0.5, (0.5, 0.5), eval_std=0.0, eval_n=2).eval_std == 0.0


def test_a_reason_names_its_mode_and_gives_it_back():
    for mode in EvidenceMode:
        assert EvidenceMode.of_reason(mode.label("slope < 0 (p=0.001)")) is mode
    assert EvidenceMode.of_reason("2 consecutive declines (k=2, min_delta=0)") is None


def test_report_from_non_mapping():
    with pytest.raises(InvalidReportError, match="must be an object"):
        Report.from_dict([1, 2])  # type: ignore[arg-type]


def test_decision_round_trip_and_rejections():
    d = Decision(Action.STOP, "2 declines", 2, 10, 0.7)
    assert Decision.from_dict(d.to_dict()) == d and d.should_stop
    with pytest.raises(BoundaryError, match="unknown decision field"):
        Decision.from_dict({**d.to_dict(), "loss": 1})
    with pytest.raises(BoundaryError, match="no valid action"):
        Decision.from_dict({"action": "pause"})
