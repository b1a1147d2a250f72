"""The evalstop/* keys reach a real TensorBoard event file through ``report_to="tensorboard"``.

transformers' TensorBoardCallback writes with tensorboardX here (torch's writer needs the tensorboard package). The
event file is read back as what it is on disk: TFRecord frames (length, CRC, serialized ``Event``, CRC), decoded with
tensorboardX's own protobuf.
"""

from __future__ import annotations

import struct

import pytest
from test_callback_setup import COMMON, sft

pytest.importorskip("tensorboardX")

from _callback_helpers import HELDOUT_PROMPTS, gold  # noqa: E402
from tensorboardX.proto.event_pb2 import Event  # noqa: E402

from evalstop_callbacks import EvalStopCallback, RewardFunctionEvaluator  # noqa: E402


def read_scalars(folder) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of every event file under ``folder``: tag -> [(step, value)]."""
    scalars: dict[str, list[tuple[int, float]]] = {}
    files = sorted(folder.rglob("events.out.tfevents.*"))
    assert files, f"no event file under {folder}"
    for path in files:
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos : pos + 8])
            event = Event.FromString(data[pos + 12 : pos + 12 + length])
            pos += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_every_evaluation_is_in_the_tensorboard_event_file(tmp_path, monkeypatch):
    cb = EvalStopCallback(
        RewardFunctionEvaluator(HELDOUT_PROMPTS * 4, gold, max_new_tokens=8), eval_steps=2, k=2, job_type="sft"
    )
    logs = tmp_path / "tb"
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(logs))  # transformers 5's TensorBoardCallback reads it
    trainer = sft(tmp_path / "out", [cb], report_to="tensorboard")
    cb.attach(trainer)  # the evalstop/* values reach report_to backends through the trainer's callbacks
    assert COMMON["report_to"] == "none"  # the override above is what turns TensorBoard on
    trainer.train()
    scalars = read_scalars(logs)
    got = scalars.get("train/evalstop/eval_score")
    assert got is not None, sorted(scalars)
    assert [step for step, _ in got] == [h["step"] for h in cb.history]
    assert [v for _, v in got] == pytest.approx([h["eval_score"] for h in cb.history], rel=1e-6)
    assert [v for _, v in scalars["train/evalstop/declines"]] == [h["declines"] for h in cb.history]
    assert scalars["train/evalstop/best_score"][-1][1] == pytest.approx(cb.best_score, rel=1e-6)
    assert scalars["train/evalstop/stop_step"] == [(cb.stopped_at, pytest.approx(cb.stopped_at))]
