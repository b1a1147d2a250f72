"""Every registered detector takes every finite float within the core's bound, or refuses it with the core's domain
error (which the service answers with a 422): never an OverflowError, never a state that cannot be stored."""

from __future__ import annotations

import json
import math
import sys
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from platform_sim.core import DETECTORS, InvalidReportError, JobMonitor, Report, detector_from_spec
from platform_sim.core.boundary import MAX_ABS_SCORE

FINITE = st.floats(allow_nan=False, allow_infinity=False)  # the whole float range, up to +-1.7e308, subnormals too
# A report's scores: one magnitude for the whole report (so that huge values meet huge values), tiny or huge lists.
MAGNITUDE = st.sampled_from([0.0, 5e-324, 1e-300, 1e-8, 1.0, 1e8, 1e100, 1e150, 1e200, sys.float_info.max])
EVAL = st.tuples(
    MAGNITUDE, st.lists(st.floats(-1.0, 1.0), min_size=1, max_size=6), st.booleans(), st.sampled_from([1, 2, 7, 2000])
)


def _is_finite_json(value: object) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("name", sorted(DETECTORS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(evals=st.lists(EVAL, min_size=1, max_size=14), extra=st.lists(FINITE, max_size=4))
def test_every_detector_accepts_or_refuses_every_finite_float(name: str, evals: list, extra: list) -> None:
    monitor = JobMonitor("j", "rlhf", detector_from_spec(name))
    step = 0
    rows = [(mag * shape[0], [mag * x for x in shape], per, n) for mag, shape, per, n in evals]
    rows += [(x, [x], True, 1) for x in extra]
    for score, shape, per, n in rows:
        step += 1
        scores = [shape[i % len(shape)] for i in range(n)] if per else None
        in_bound = abs(score) <= MAX_ABS_SCORE and all(abs(s) <= MAX_ABS_SCORE for s in scores or ())
        before = json.dumps(monitor.state_dict())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # detectors warn once about missing per-example scores
            try:
                decision = monitor.observe(step, score, scores)
            except InvalidReportError:
                # Refused (out of bound, or per-example scores of another length for a paired test): nothing changed.
                assert json.dumps(monitor.state_dict()) == before
                continue
        assert in_bound, f"{name} accepted |score| {abs(score):g} above the bound"
        assert _is_finite_json(monitor.state_dict()), f"{name}: state not finite after score {score!r}"
        assert math.isfinite(decision.best_score)


def test_the_bound_is_the_reports_too() -> None:
    with pytest.raises(InvalidReportError, match="magnitude"):
        Report("j", "rlhf", 0, 1e200)
    with pytest.raises(InvalidReportError, match="magnitude"):
        Report("j", "rlhf", 0, 0.5, eval_scores=(0.5, -1e101))
    with pytest.raises(InvalidReportError, match="magnitude"):
        Report("j", "rlhf", 0, 10**400)
    assert Report("j", "rlhf", 0, -MAX_ABS_SCORE, eval_scores=(5e-324, MAX_ABS_SCORE)).eval_score == -MAX_ABS_SCORE
