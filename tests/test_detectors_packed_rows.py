"""The per-example rows of the default detector's state, packed (platform_sim/core/detectors/packed_rows.py): exact
to the bit, readable in both forms (states written before kept lists of numbers), refused with the field's name when
broken, and smaller than lists of numbers."""

from __future__ import annotations

import base64
import json
import random
import struct

import numpy as np
import pytest

from platform_sim.core import JobMonitor, default_spec, detector_from_spec
from platform_sim.core.detectors.packed_rows import pack_row, unpack_row


def test_a_row_round_trips_to_the_bit_from_a_list_a_tuple_or_an_array() -> None:
    rng = random.Random(0)
    values = [rng.uniform(-1e6, 1e6) for _ in range(200)] + [0.0, -0.0, 5e-324, 1e-300, 0.1, 1 / 3]
    for given in (values, tuple(values), np.asarray(values)):
        back = unpack_row(json.loads(json.dumps(pack_row(given))), "row")
        assert [struct.pack("<d", v) for v in back] == [struct.pack("<d", v) for v in values]
        assert all(type(v) is float for v in back)
    # The format is base64 of little-endian float64 (what another reader of a stored state would decode).
    assert base64.b64decode(pack_row([1.0, -2.5])) == struct.pack("<2d", 1.0, -2.5)


def test_a_list_of_numbers_is_read_as_before() -> None:
    assert unpack_row([1, 0.5, 0], "row") == [1.0, 0.5, 0.0]
    assert all(type(v) is float for v in unpack_row([1, 0], "row"))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("not base64!", r"recent_scores\[2\] is not base64"),
        (base64.b64encode(b"\x00" * 12).decode(), r"recent_scores\[2\] holds 12 bytes, not whole 8-byte"),
        (pack_row([0.5, float("nan")]), r"recent_scores\[2\] holds a score that is not finite"),
        (pack_row([float("inf")]), r"recent_scores\[2\] holds a score that is not finite"),
        ([0.5, "0.4"], r"recent_scores\[2\] must be a list of numbers or a packed row"),
        ([0.5, True], r"recent_scores\[2\] must be a list of numbers or a packed row"),
        ([0.5, float("nan")], r"recent_scores\[2\] holds a score that is not finite"),
        ({"f64": "AAAAAAAA8D8="}, r"recent_scores\[2\] must be .* got dict"),
    ],
)
def test_a_broken_row_is_refused_naming_the_field(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        unpack_row(value, "recent_scores[2]")


def _run(n_evals: int, examples: int, planned: int, seed: int = 1) -> list[tuple[int, float, list[float]]]:
    """A run that rises for two thirds of its evals, then falls; ``examples`` scores an eval."""
    rng = random.Random(seed)
    out = []
    for i in range(n_evals):
        level = (
            0.3 + 0.004 * i
            if i < 2 * n_evals // 3
            else 0.3 + 0.004 * (2 * n_evals // 3) - 0.008 * (i - 2 * n_evals // 3)
        )
        scores = [level + rng.gauss(0.0, 0.2) for _ in range(examples)]
        out.append((i + 1, sum(scores) / examples, scores))
    assert planned >= n_evals
    return out


def _as_lists(state: object) -> object:
    """``state`` with every packed row written out as a list of numbers: a state as written before rows were packed."""
    if isinstance(state, dict):
        out = {}
        for key, value in state.items():
            if key in ("best_scores", "recent_scores", "rows"):
                value = (
                    [None if r is None else unpack_row(r, key) for r in value]
                    if isinstance(value, list)
                    else None
                    if value is None
                    else unpack_row(value, key)
                )
            out[key] = _as_lists(value)
        return out
    return state


@pytest.mark.parametrize("cut", [20, 45, 70])
def test_a_monitor_resumed_from_a_packed_or_a_list_state_decides_as_one_that_never_stopped(cut: int) -> None:
    evals = _run(90, 64, planned=90)

    def feed(mon: JobMonitor, part: list[tuple[int, float, list[float]]]) -> list[dict]:
        return [mon.observe(step, mean, scores, planned_steps=90).to_dict() for step, mean, scores in part]

    whole = JobMonitor("j", "rlhf", detector_from_spec(default_spec()))
    want = feed(whole, evals)
    assert any(d["action"] == "stop" for d in want)  # the run is stopped somewhere: the rows decide something
    first = JobMonitor("j", "rlhf", detector_from_spec(default_spec()))
    got = feed(first, evals[:cut])
    state = json.loads(json.dumps(first.state_dict()))
    detector_state = state["detector_state"]
    assert all(isinstance(r, str) for r in detector_state["recent_scores"])  # packed
    assert all(isinstance(r, str) for r in detector_state["planned"]["evidence"]["rows"] if r is not None)
    old = _as_lists(state)
    assert old != state and all(isinstance(r, list) for r in old["detector_state"]["recent_scores"])
    for loaded in (state, old):
        again = JobMonitor.from_state_dict(loaded)
        assert got + feed(again, evals[cut:]) == want


def test_a_state_with_a_broken_row_is_refused_not_misread() -> None:
    mon = JobMonitor("j", "rlhf", detector_from_spec(default_spec()))
    for step, mean, scores in _run(30, 16, planned=60):
        mon.observe(step, mean, scores, planned_steps=60)
    state = json.loads(json.dumps(mon.state_dict()))
    state["detector_state"]["planned"]["evidence"]["rows"][-1] = "AAAA"
    with pytest.raises(ValueError, match=r"evidence\.rows\[\d+\] holds 3 bytes"):
        JobMonitor.from_state_dict(state)


def test_a_wide_runs_state_is_about_eleven_characters_a_kept_score() -> None:
    # 1,000 examples an eval, every step of a 300-step plan: the state is its rows (the window's and the planned
    # window's); packed, each kept score costs 8 bytes in base64 (10.7 characters), against about 19 as a number.
    mon = JobMonitor("j", "rlhf", detector_from_spec(default_spec()))
    evals = _run(150, 1000, planned=300)
    for step, mean, scores in evals[:120]:
        mon.observe(step, mean, scores, planned_steps=300)
    state = mon.state_dict()["detector_state"]
    kept = len([r for r in state["recent_scores"] if r is not None])
    kept += len([r for r in state["planned"]["evidence"]["rows"] if r is not None]) + 1  # + best_scores
    size = len(json.dumps(state))
    assert kept > 20
    assert size < 11 * 1000 * kept
    as_numbers = len(json.dumps(_as_lists(state)))
    assert size < 0.65 * as_numbers
