"""The verl-free half of the verl adapter (evalstop_callbacks.verl_monitor): metric choice, signs, pairing, folders.

No verl needed (these run in the main environment); the adapter inside verl's trainer is tests/test_verl_trainer.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _verl_helpers import HACKING, core_verdict, load_curve

from evalstop_callbacks.client import EmbeddedClient
from evalstop_callbacks.keeper import BestCheckpoints
from evalstop_callbacks.verl_monitor import EvalStopMonitor, VerlEvalStopConfig, make_client

SOURCE = "val-core/gsm8k/reward/mean@1"


def _monitor(**settings: object) -> EvalStopMonitor:
    return EvalStopMonitor(VerlEvalStopConfig(**settings), EmbeddedClient(), "job")  # type: ignore[arg-type]


def test_a_lower_is_better_metric_stops_where_its_negation_would() -> None:
    curve = load_curve(HACKING)
    stop, best = core_verdict(curve, examples=False)
    monitor = _monitor(metric="val-core/*/loss", greater_is_better=False)
    for step, mean in zip(curve.steps, curve.means):
        decision = monitor.observe(step, {"val-core/gsm8k/loss": -mean})
        if decision.should_stop:
            break
    assert (monitor.evals[-1][0], decision.best_step) == (stop, best)
    assert monitor.best_score() == pytest.approx(-curve.at(best)[0])  # in the metric's own sign
    assert monitor.result(None)["best_score"] == pytest.approx(-curve.at(best)[0])


def test_a_glob_matching_several_series_is_refused_naming_them() -> None:
    monitor = _monitor()
    metrics = {"val-core/a/reward/mean@1": 1.0, "val-core/b/reward/mean@1": 2.0}
    with pytest.raises(ValueError, match="several.*val-core/a/reward/mean@1, val-core/b/reward/mean@1"):
        monitor.observe(10, metrics)


def test_per_prompt_scores_are_means_over_samples_in_prompt_order() -> None:
    monitor = _monitor()
    samples = [("b", 1.0), ("a", 0.0), ("b", 0.0), ("a", 1.0), ("a", 1.0)]
    assert monitor.paired_scores({SOURCE: 0.6}, SOURCE, samples) == [pytest.approx(2 / 3), 0.5]


@pytest.mark.parametrize(
    "metrics, name",
    [
        ({SOURCE: 0.5, "val-core/math/reward/mean@1": 0.1}, SOURCE),  # two sources: the samples mix them
        ({"val-core/gsm8k/acc/mean@1": 0.5}, "val-core/gsm8k/acc/mean@1"),  # samples carry the reward, not acc
    ],
)
def test_samples_that_are_not_the_metrics_examples_are_not_reported(metrics: dict, name: str) -> None:
    assert _monitor().paired_scores(metrics, name, [("a", 1.0)]) is None


def test_a_changed_prompt_set_falls_back_to_means_for_good() -> None:
    monitor = _monitor()
    assert monitor.paired_scores({SOURCE: 1.0}, SOURCE, [("a", 1.0), ("b", 0.0)]) is not None
    assert monitor.paired_scores({SOURCE: 1.0}, SOURCE, [("a", 1.0), ("c", 0.0)]) is None
    assert monitor.paired_scores({SOURCE: 1.0}, SOURCE, [("a", 1.0), ("b", 0.0)]) is None


def test_settings_refuse_unknown_keys_and_read_json_detector_specs() -> None:
    with pytest.raises(ValueError, match="unknown trainer.evalstop key.*metrc"):
        VerlEvalStopConfig.from_mapping({"metrc": "x"})
    spec = VerlEvalStopConfig(detector='{"name": "k-decline", "params": {"k": 3}}').detector_spec()
    assert spec == {"name": "k-decline", "params": {"k": 3}}
    assert VerlEvalStopConfig().detector_spec()["name"] == "trend"
    with pytest.raises(ValueError, match="needs trainer.evalstop.token"):
        make_client(VerlEvalStopConfig(server="http://127.0.0.1:1"))


def test_the_best_folder_is_hard_linked_as_evalstop_best_step_and_outlives_verls_delete(tmp_path: Path) -> None:
    for step in (10, 20):
        (tmp_path / f"global_step_{step}" / "actor").mkdir(parents=True)
        (tmp_path / f"global_step_{step}" / "actor" / "model.pt").write_text(f"step {step}")
    keeper = BestCheckpoints(tmp_path)
    assert keeper.protect(10, 0.5, tmp_path / "global_step_10") is not None
    kept = keeper.protect(20, 0.7, tmp_path / "global_step_20")
    assert kept is not None and kept.method == "hard-linked" and kept.path == str(tmp_path / "evalstop-best-20")
    assert not (tmp_path / "evalstop-best-10").exists()  # fell out of the one best: its copy is gone
    target = tmp_path / "evalstop-best-20" / "actor" / "model.pt"
    assert os.path.samefile(target, tmp_path / "global_step_20" / "actor" / "model.pt")
    (tmp_path / "global_step_20" / "actor" / "model.pt").unlink()  # verl's rotation removes the step's folder
    assert target.read_text() == "step 20"


def test_bad_evalstop_keys_get_one_line_naming_the_key() -> None:
    for values, needle in (
        ({"mode": "shadow"}, "trainer.evalstop.mode must be enforce or observe, got 'shadow'"),
        ({"keep_best": 0}, "trainer.evalstop.keep_best must be an integer >= 1, got 0"),
        ({"prune_others": "yes"}, "trainer.evalstop.prune_others must be true or false, got 'yes'"),
    ):
        with pytest.raises(ValueError, match=needle):
            VerlEvalStopConfig.from_mapping(values)
