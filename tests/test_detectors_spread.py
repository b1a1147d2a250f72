"""Evidence modes: a detector fed an eval's spread (``eval_std``, ``eval_n``) decides on it and says so.

Every decision's reason leads with the mode it was decided in (per-example, mean-and-spread, means only); ``trend``
(the default) tests the slope of the means with each mean's variance known (``std**2 / n``) when every eval of its
spread window carries a spread, or per-example scores it is derived from.
"""

from __future__ import annotations

import json
import math

import pytest

from platform_sim.core import detector_from_spec
from platform_sim.core.boundary import Action, EvidenceMode, InvalidReportError, Report
from platform_sim.core.detectors import KDeclineDetector, PairedTestDetector, Spread, TrendDetector
from platform_sim.core.detectors.base import Detector
from platform_sim.core.monitor import JobMonitor

SPREAD = EvidenceMode.MEAN_AND_SPREAD


def _monitor(**params):
    return JobMonitor("j", "rlhf", TrendDetector(**params))


def _feed(mon, means, std=None, n=None, scores=None):
    return [mon.observe(10 * i, m, scores, std, n) for i, m in enumerate(means)]


# A window of 3 evals falling by d per eval: the least-squares slope is -d and, with every mean's variance v known,
# its standard deviation is sqrt(v / 2); one-sided at alpha 0.01 the z statistic must be below -2.326. With std 0.1
# and n 50, v = 2e-4 and the slope's standard deviation is 0.01.
def test_the_known_variance_slope_test_stops_on_a_fall_of_three_standard_errors_and_not_two():
    stopped = _feed(_monitor(window=3, alpha=0.01), [0.5, 0.47, 0.44], std=0.1, n=50)
    assert stopped[-1].action is Action.STOP
    assert EvidenceMode.of_reason(stopped[-1].reason) is SPREAD and "known-variance z test" in stopped[-1].reason
    kept = _feed(_monitor(window=3, alpha=0.01), [0.5, 0.48, 0.46], std=0.1, n=50)
    assert kept[-1].action is Action.CONTINUE and EvidenceMode.of_reason(kept[-1].reason) is SPREAD


def test_the_spread_decides_where_the_means_alone_do_not():
    # The same means: a small spread stops the job, a large one does not, and the means alone do not either
    # (the residuals of a steady fall are tiny but the test on them has 1 degree of freedom here).
    means = [0.5, 0.47, 0.44]
    assert _feed(_monitor(window=3, alpha=0.01), means, std=0.05, n=50)[-1].action is Action.STOP
    assert _feed(_monitor(window=3, alpha=0.01), means, std=0.5, n=50)[-1].action is Action.CONTINUE
    alone = _feed(_monitor(window=3, alpha=0.01), [0.5, 0.47, 0.43])
    assert EvidenceMode.of_reason(alone[-1].reason) is EvidenceMode.MEANS_ONLY


def test_n_of_two_is_a_spread():
    # n = 2 is the smallest count with a standard deviation; the mean's variance is std**2 / 2.
    assert _feed(_monitor(window=3, alpha=0.01), [0.5, 0.47, 0.44], std=0.02, n=2)[-1].action is Action.STOP
    assert _feed(_monitor(window=3, alpha=0.01), [0.5, 0.47, 0.44], std=0.2, n=2)[-1].action is Action.CONTINUE


def test_a_zero_spread_is_certain_evidence_of_a_fall_and_none_of_a_rise():
    fall = _feed(_monitor(window=3, alpha=0.01), [0.5, 0.49, 0.489], std=0.0, n=8)
    assert fall[-1].action is Action.STOP and "p=0" in fall[-1].reason
    # Below the best but the fitted slope rises: never significant, whatever the spread.
    rise = _feed(_monitor(window=3, alpha=0.01), [0.3, 0.6, 0.5], std=0.0, n=8)
    assert rise[-1].action is Action.CONTINUE


def test_the_spread_mode_has_its_own_window_and_level():
    det = TrendDetector(window=6, alpha=0.01, spread_window=3, spread_alpha=0.2)
    assert det.params()["spread_window"] == 3 and det.params()["spread_alpha"] == 0.2
    mon = JobMonitor("j", "rlhf", det)
    # Std 0.5, n 50: v = 5e-3, slope sd 0.05; a fall of 0.05 per eval is z = -1, p = 0.16 < 0.2.
    assert _feed(mon, [0.5, 0.45, 0.40], std=0.5, n=50)[-1].action is Action.STOP
    # Without the spread parameters the spec is the one written before spreads existed.
    assert set(TrendDetector().params()) == {
        "window", "alpha", "k", "min_drop", "test", "se", "short_window", "level_alpha", "warmup"
    }  # fmt: skip
    with pytest.raises(ValueError, match="spread_window"):
        TrendDetector(spread_window=2)
    with pytest.raises(ValueError, match="spread_alpha"):
        TrendDetector(spread_alpha=1.0)


def test_per_example_scores_give_the_spread_when_some_evals_carry_only_a_spread():
    # Mixed reports: evals with per-example scores and evals with a spread only. Not every eval has per-example
    # scores, so the paired test cannot run; each eval's spread (reported, or computed from its scores with ddof=1)
    # is known, so the mode is mean-and-spread.
    per = [0.5 + 0.1 * (i % 5 - 2) for i in range(50)]  # mean 0.5, sample std 0.1428...
    std = math.sqrt(sum((p - 0.5) ** 2 for p in per) / 49)
    assert EvidenceMode.of_reason(_monitor(window=3).observe(0, 0.5, per).reason) is EvidenceMode.PER_EXAMPLE
    mon = _monitor(window=3, alpha=0.01)
    got = [mon.observe(0, 0.5, None, std, 50), mon.observe(10, 0.46, [p - 0.04 for p in per])]
    got.append(mon.observe(20, 0.42, [p - 0.08 for p in per]))
    assert [EvidenceMode.of_reason(d.reason) for d in got] == [SPREAD] * 3 and got[-1].action is Action.STOP
    # The same with the first eval's spread six times as large: the slope's variance grows and the stop goes away.
    mon = _monitor(window=3, alpha=0.01)
    mon.observe(0, 0.5, None, 6 * std, 50)
    mon.observe(10, 0.46, [p - 0.04 for p in per])
    assert mon.observe(20, 0.42, [p - 0.08 for p in per]).action is Action.CONTINUE


def test_an_eval_without_spread_in_the_window_means_the_means_alone():
    mon = _monitor(window=3, alpha=0.01)
    got = [
        mon.observe(0, 0.5, None, 0.1, 50),
        mon.observe(10, 0.52),  # no spread: the window of 3 holds an eval without one
        mon.observe(20, 0.49, None, 0.1, 50),
        mon.observe(30, 0.51, None, 0.1, 50),
        mon.observe(40, 0.50, None, 0.1, 50),  # the window is all spreads again
    ]
    modes = [EvidenceMode.of_reason(d.reason) for d in got]
    assert modes == [SPREAD, EvidenceMode.MEANS_ONLY, EvidenceMode.MEANS_ONLY, EvidenceMode.MEANS_ONLY, SPREAD]


def test_resume_from_state_mid_window_decides_the_same():
    means = [0.50, 0.52, 0.53, 0.51, 0.49, 0.50, 0.46, 0.44, 0.43, 0.40]
    spreads = [(0.2, 64) if i % 3 else None for i in range(len(means))]  # mixed: some evals without a spread
    spreads[6:] = [(0.2, 64)] * 4
    whole = _monitor(window=4, alpha=0.05)
    expected = [whole.observe(10 * i, m, None, *(s or (None, None))) for i, (m, s) in enumerate(zip(means, spreads))]
    assert any(d.action is Action.STOP for d in expected)
    for cut in range(1, len(means)):
        first = _monitor(window=4, alpha=0.05)
        got = [
            first.observe(10 * i, m, None, *(s or (None, None))) for i, (m, s) in enumerate(zip(means[:cut], spreads))
        ]
        state = json.loads(json.dumps(first.state_dict()))  # plain data, through JSON
        resumed = JobMonitor.from_state_dict(state)
        got += [
            resumed.observe(10 * i, m, None, *(s or (None, None)))
            for i, (m, s) in enumerate(zip(means, spreads))
            if i >= cut
        ]
        assert got == expected, cut


def test_a_state_without_spreads_is_the_state_written_before_spreads_and_loads():
    det = TrendDetector(window=3)
    for i, m in enumerate([0.5, 0.49, 0.47]):
        det.update(i, m)
    state = det.state_dict()
    assert "recent_spreads" not in state
    again = TrendDetector(window=3)
    again.load_state_dict(state)
    assert again.mode() is EvidenceMode.MEANS_ONLY and again.state_dict() == state
    det.update(3, 0.45, None, Spread(0.1, 10))
    assert det.state_dict()["recent_spreads"] == [None, None, [0.1, 10]]


def test_a_detector_that_cannot_use_a_spread_decides_on_the_means_and_says_so():
    mon = JobMonitor("j", "rlhf", KDeclineDetector(k=2))
    got = _feed(mon, [0.5, 0.4, 0.3], std=0.1, n=50)
    assert [EvidenceMode.of_reason(d.reason) for d in got] == [EvidenceMode.MEANS_ONLY] * 3
    assert got[-1].action is Action.STOP and got[-1].reason.startswith("means only: stopped at step 20: ")
    # The paired test reads per-example scores, not spreads: with a spread only it decides on the means.
    mon = JobMonitor("j", "rlhf", PairedTestDetector())
    assert EvidenceMode.of_reason(mon.observe(0, 0.5, [0.4, 0.6]).reason) is EvidenceMode.PER_EXAMPLE
    assert EvidenceMode.of_reason(mon.observe(10, 0.45, None, 0.1, 2).reason) is EvidenceMode.MEANS_ONLY


def test_a_detector_written_before_spreads_is_never_handed_one():
    class Old(Detector):
        name = "test-old"

        def update(self, step, score, scores=None):  # the interface before spreads
            return score < 0.3

        def params(self):
            return {}

        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

    mon = JobMonitor("j", "rlhf", Old())
    assert mon.observe(0, 0.5, None, 0.1, 50).reason == "means only: no stop signal"
    assert mon.observe(10, 0.2, None, 0.1, 50).action is Action.STOP


def test_a_stop_names_its_mode_after_the_stop_and_after_a_resume():
    mon = _monitor(window=3, alpha=0.01)
    _feed(mon, [0.5, 0.47, 0.44], std=0.1, n=50)
    later = mon.observe(30, 0.5)  # a job that keeps reporting, now without a spread
    assert later.action is Action.STOP and later.reason.startswith("mean-and-spread: stopped at step 20: ")
    resumed = JobMonitor.from_state_dict(json.loads(json.dumps(mon.state_dict())))
    assert resumed.observe(40, 0.5).reason == later.reason


@pytest.mark.parametrize(
    "std, n, scores, match",
    [
        (0.1, None, None, "eval_n"),
        (None, 10, None, "eval_std"),
        (-0.1, 10, None, "eval_std must be >= 0"),
        (float("nan"), 10, None, "eval_std"),
        (0.1, 1, None, "eval_n must be an integer >= 2"),
        (0.1, 3, [0.1, 0.2], "eval_n is 3"),
        (0.9, 2, [0.1, 0.2], "disagrees"),
    ],
)
def test_a_bad_spread_is_refused_and_changes_nothing(std, n, scores, match):
    mon = _monitor(window=3, alpha=0.01)
    mon.observe(0, 0.5, None, 0.1, 10)
    before = json.dumps(mon.state_dict())
    with pytest.raises(InvalidReportError, match=match):
        mon.observe(10, 0.4, scores, std, n)
    assert json.dumps(mon.state_dict()) == before


def test_a_report_carries_its_spread_to_the_detector():
    mon = _monitor(window=3, alpha=0.01)
    for i, m in enumerate([0.5, 0.47, 0.44]):
        d = mon.observe_report(Report("j", "rlhf", 10 * i, m, eval_std=0.1, eval_n=50))
    assert d.action is Action.STOP and EvidenceMode.of_reason(d.reason) is SPREAD


def test_the_default_decides_in_every_mode():
    spec_det = detector_from_spec(None)
    assert isinstance(spec_det, TrendDetector) and spec_det.takes_spread
    per = [0.4, 0.6, 0.5]
    mon = JobMonitor("j", "rlhf", detector_from_spec(None))
    assert EvidenceMode.of_reason(mon.observe(0, 0.5, per).reason) is EvidenceMode.PER_EXAMPLE
    mon = JobMonitor("j", "rlhf", detector_from_spec(None))
    assert EvidenceMode.of_reason(mon.observe(0, 0.5, None, 0.1, 3).reason) is SPREAD
    mon = JobMonitor("j", "rlhf", detector_from_spec(None))
    assert EvidenceMode.of_reason(mon.observe(0, 0.5).reason) is EvidenceMode.MEANS_ONLY
