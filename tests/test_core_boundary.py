"""The Report/Decision whitelist (docs/design.md section 3)."""

from __future__ import annotations

import math

import pytest

from platform_sim.core import Action, BoundaryError, Decision, InvalidReportError, Report


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
    ],
)
def test_bad_values_rejected(kwargs, match):
    base = {"job_id": "j", "job_type": "rlhf", "step": 0, "eval_score": 0.1}
    with pytest.raises(InvalidReportError, match=match):
        Report(**{**base, **kwargs})


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
