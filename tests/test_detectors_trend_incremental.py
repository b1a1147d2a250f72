"""``trend`` keeps running counts of the evidence its window's evals carry (instead of re-scanning the window at every
eval) and computes ``doubt()``'s t statistic only when asked: these tests pin that the modes it reads from them are
the window's, and that a detector restored from its state (where the counts are not stored) decides as one that
ran through."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from platform_sim.core import InvalidReportError, JobMonitor, default_spec, detector_from_spec
from platform_sim.core.boundary import MAX_ABS_SCORE, Action, EvidenceMode
from platform_sim.core.detectors import Spread
from platform_sim.core.detectors.packed_rows import unpack_row
from platform_sim.core.detectors.trend import TrendDetector
from platform_sim.core.detectors.trend_per_run import PerRunTests

PE, SP, MO = EvidenceMode.PER_EXAMPLE, EvidenceMode.MEAN_AND_SPREAD, EvidenceMode.MEANS_ONLY


def _evals(seed: int, kinds: str) -> list[tuple[int, float, list[float] | None, Spread | None]]:
    """One eval per letter: ``e`` 8 example scores, ``E`` 12, ``s`` a spread, ``m`` the mean alone; falling."""
    rng = random.Random(seed)
    out: list[tuple[int, float, list[float] | None, Spread | None]] = []
    for i, kind in enumerate(kinds):
        level = 1.0 - 0.05 * i
        if kind in "eE":
            scores = [level + rng.gauss(0.0, 0.2) for _ in range(8 if kind == "e" else 12)]
            out.append((10 * (i + 1), sum(scores) / len(scores), scores, None))
        else:
            spread = Spread(0.2, 8) if kind == "s" else None
            out.append((10 * (i + 1), level + rng.gauss(0.0, 0.02), None, spread))
    return out


def _run(det: TrendDetector, evals: list[tuple[int, float, list[float] | None, Spread | None]]) -> list[tuple]:
    out = []
    for step, score, scores, spread in evals:
        stop = det.update(step, score, scores, spread)
        out.append((stop, det.mode(), det.last_p, det.last_slope, det.reason(), det.doubt(), det.state_dict()))
    return out


def test_modes_follow_the_window_of_evals() -> None:
    # window 4, spread window 3: per-example needs the last 4 evals with scores of one length (fewer before it fills).
    det = TrendDetector(window=4, alpha=0.2, spread_window=3)
    modes = [row[1] for row in _run(det, _evals(0, "eeeeEEEEsEsssmeeee"))]
    assert modes == [PE, PE, PE, PE, SP, SP, SP, PE, SP, SP, SP, SP, SP, MO, MO, MO, SP, PE]


def test_restored_detector_decides_as_the_one_that_ran_through() -> None:
    kinds = "eeeeeeeesseesssmmeeeeEEEEEEEEssssssmmmmeeeeeeeeee"
    for params in ({"window": 6, "alpha": 0.01}, {"window": 4, "alpha": 0.3, "spread_window": 3, "short_window": 3}):
        evals = _evals(1, kinds)
        through = _run(TrendDetector(**params), evals)
        assert any(row[0] for row in through)  # the trace stops somewhere: the decisions compared are not all "go on"
        assert {row[1] for row in through} == {PE, SP, MO}
        for cut in range(1, len(evals)):
            first = TrendDetector(**params)
            _run(first, evals[:cut])
            restored = TrendDetector(**params)
            restored.load_state_dict(json.loads(json.dumps(first.state_dict())))
            assert _run(restored, evals[cut:]) == through[cut:], (params, cut)


def test_scores_as_a_tuple_a_list_or_ints_decide_the_same() -> None:
    # The detector keeps a tuple of scores as it is (the monitor's validated tuple, no copy per eval) and converts
    # anything else: binary per-example scores given as lists of ints, tuples of ints or tuples of floats give the same
    # decisions, p-values, reasons and state (of floats).
    rng = random.Random(3)
    evals = []
    for i in range(30):
        p = 0.3 + 0.04 * i if i < 15 else 0.9 - 0.06 * (i - 15)
        ints = [1 if rng.random() < p else 0 for _ in range(40)]
        evals.append((10 * (i + 1), sum(ints) / len(ints), ints))
    runs = []
    for convert in (list, tuple, lambda s: tuple(map(float, s))):
        det = TrendDetector(window=5, alpha=0.05)
        runs.append(_run(det, [(step, mean, convert(s), None) for step, mean, s in evals]))
    assert any(row[0] for row in runs[0])  # it stops somewhere
    assert runs[1] == runs[0] and runs[2] == runs[0]
    state = runs[1][-1][-1]
    rows = [unpack_row(row, "row") for row in state["recent_scores"]]
    assert rows == [[float(v) for v in s] for _, _, s in evals[-len(rows) :]]
    assert all(type(v) is float for row in rows for v in row)
    assert json.loads(json.dumps(state)) == state


def _planned_run(seed: int) -> list[tuple[int, float, list[float]]]:
    """A run of 150 evals with 8 example scores each: rising for 100 evals (no test runs: the mean never falls below
    its best), then falling."""
    rng = random.Random(seed)
    out = []
    for i in range(150):
        level = 0.02 * i if i < 100 else 2.0 - 0.04 * (i - 100)
        scores = [level + rng.gauss(0.0, 0.01) for _ in range(8)]
        out.append((10 * (i + 1), sum(scores) / len(scores), scores))
    return out


def _fed(det: TrendDetector, evals: list[tuple[int, float, list[float]]], read: set[int]) -> list[tuple]:
    """Each eval's decision; the reason and state only at the evals in ``read`` (None elsewhere)."""
    out = []
    for j, (step, score, scores) in enumerate(evals):
        det.plan(1500 if j == 0 else None)
        stop = det.update(step, score, scores)
        seen = (det.reason(), json.dumps(det.state_dict())) if j in read else None
        out.append((stop, det.mode(), det.last_p, det.last_slope, det.doubt(), seen))
    return out


def test_the_planned_test_fed_when_read_decides_and_saves_as_one_read_at_every_eval() -> None:
    # The planned test is fed lazily (trend_per_run.PerRunTests): a detector whose state is read only at a few evals
    # holds evals unfed in between (more than MAX_PENDING over the 100 rising evals), and must decide, explain and
    # save exactly as one whose state is read (so fed) at every eval; a restore from the sparse state goes on alike.
    evals = _planned_run(2)
    read = {0, 40, 99, 120, 149}
    dense = _fed(TrendDetector(), evals, set(range(len(evals))))
    sparse_det = TrendDetector()
    sparse = _fed(sparse_det, evals, read)
    assert any(row[0] for row in dense) and any(row[2] is not None for row in dense)  # tests ran; it stops
    assert [row[:5] for row in sparse] == [row[:5] for row in dense]
    assert [row[5] for j, row in enumerate(sparse) if j in read] == [row[5] for j, row in enumerate(dense) if j in read]
    for cut in (30, 99, 110):
        first = TrendDetector()
        _fed(first, evals[:cut], set())
        assert bool(first._per_run._pending) == (cut < 100)  # evals held unfed while rising: the state feeds them
        assert len(first._per_run._pending) < PerRunTests.MAX_PENDING < 99  # bounded, however long a run rises
        restored = TrendDetector()
        restored.load_state_dict(json.loads(json.dumps(first.state_dict())))
        rest = _fed(restored, evals[cut:], {j - cut for j in read if j >= cut})
        assert [row[:5] for row in rest] == [row[:5] for row in dense[cut:]], cut


def _read_only(row: list[float]) -> np.ndarray:
    arr = np.array(row, dtype=np.float64)
    arr.flags.writeable = False
    return arr


def _numbers_are_python(value: object) -> bool:
    """Whether every number in a state is a Python int or float (no numpy scalar from an array row)."""
    if isinstance(value, dict):
        return all(_numbers_are_python(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_numbers_are_python(v) for v in value)
    return value is None or type(value) in (bool, int, float, str)


@pytest.mark.parametrize("name", ["trend", "paired-test", "k-decline-se", "shape", "cusum"])
def test_per_example_scores_as_a_read_only_array_decide_and_save_as_a_tuple(name: str) -> None:
    # The simulator hands each eval's per-example scores as a read-only float64 array (no Python float per score):
    # the monitor checks it in two reductions; trend keeps it as it is, every other detector gets a tuple as before.
    # Decisions, reasons and the saved state (lists of floats) must be those of the same scores as a tuple or a list.
    spec = default_spec() if name == "trend" else {"name": name, "params": {}}
    evals = _planned_run(3)
    outs = []
    for as_row in (tuple, list, _read_only, lambda r: np.array(r, dtype=np.float64)):
        mon = JobMonitor("j", "rlhf", detector_from_spec(spec))
        out = []
        for j, (step, score, scores) in enumerate(evals):
            d = mon.observe(step, score, as_row(scores), planned_steps=1500 if j % 3 == 0 else None)
            out.append(json.dumps(d.to_dict()))
            if d.action is Action.STOP:
                break
        outs.append((out, json.dumps(mon.state_dict())))
    assert outs[0] == outs[1] == outs[2] == outs[3]
    assert _numbers_are_python(json.loads(outs[2][1])) and _numbers_are_python(mon.state_dict())
    if name == "trend":
        assert any('"action": "stop"' in d for d in outs[0][0]) and "per-example" in outs[0][0][-1]


def test_a_kept_array_cannot_be_changed_by_its_caller() -> None:
    # A writable array is copied by the monitor (read-only), so changing it afterwards changes nothing kept.
    evals = _planned_run(4)[:12]
    decided = []
    for mutate in (False, True):
        mon = JobMonitor("j", "rlhf", detector_from_spec(default_spec()))
        for step, score, scores in evals:
            row = np.array(scores, dtype=np.float64)
            mon.observe(step, score, row, planned_steps=1500)
            if mutate:
                row[:] = 0.0
        decided.append(json.dumps(mon.state_dict()))
    assert decided[0] == decided[1]


@pytest.mark.parametrize("bad", [[0.1, math.nan], [0.1, math.inf], [-math.inf, 0.1], [0.1, 2 * MAX_ABS_SCORE], []])
def test_an_array_of_scores_is_refused_as_the_same_list_is(bad: list) -> None:
    refusals = []
    for scores in (bad, np.array(bad, dtype=np.float64)):
        mon = JobMonitor("j", "rlhf", detector_from_spec(default_spec()))
        with pytest.raises(InvalidReportError) as err:
            mon.observe(1, 0.5, scores)
        refusals.append(str(err.value))
        assert not mon.steps  # a refused report changes nothing
    assert refusals[0] == refusals[1]


def test_an_array_of_another_type_or_shape_is_refused_as_before() -> None:
    # Not a float64 vector: checked value by value as any sequence (numpy's int64 and rows are not numbers there).
    for scores, why in ((np.array([1, 2]), "got int64"), (np.array([[0.1, 0.2]]), "got ndarray")):
        with pytest.raises(InvalidReportError, match=why):
            JobMonitor("j", "rlhf", detector_from_spec(default_spec())).observe(1, 0.5, scores)
