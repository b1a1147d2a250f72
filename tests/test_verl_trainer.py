"""The in-process verl adapter against verl's real v1 trainer, on CPU.

Real: verl 0.9's shipped ``ppo_trainer`` config (hydra), its trainer registry (``register_trainer``/
``get_trainer_cls``), ``PPOTrainerSync`` built by its own ``__init__`` (replay buffer, checkpoint callback), the whole
``PPOTrainer.fit`` loop (test_freq/save_freq schedule, step counting, the last-step branch, ``on_train_end``), its
``Tracking`` logger with the ``file`` backend (verl's ``FileLogger`` writes the log read here), ``_save_checkpoint``
and ``_load_checkpoint`` (folders, ``data.pt`` from a real ``StatefulDataLoader``, ``latest_checkpointed_iteration.txt``)
and the dump executor, and verl's checkpoint rotation (``max_actor_ckpt_to_keep``: ``BaseCheckpointManager``'s
``ensure_checkpoint_capacity``/``register_checkpoint``, called around each save as verl's FSDP checkpoint manager does).
Replaced (they need Ray workers, a rollout engine and a GPU): the body of ``PPOTrainer._validate`` (rollout and reward
of the validation set) by a real run's recorded validation at that step, handed to verl's
``_maybe_log_val_generations`` and returned as verl's ``val-core`` metrics; the training ``step`` (rollout, advantage,
actor update) by a no-op; the actor worker group's checkpoint save/load by one that writes/reads a file; the weight
sync, TransferQueue's ``kv_clear`` and ``_compute_metrics`` (throughput metrics of a real batch) by no-ops.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("verl.trainer.ppo.v1", reason="needs verl (the .venv-verl environment)")

from _verl_helpers import HACKING, HEALTHY, METRIC, Curve, core_verdict, file_log, load_curve, verl_config  # noqa: E402

from evalstop_callbacks.verl_trainer import register_trainers  # noqa: E402

pytestmark = pytest.mark.verl


class _ActorGroup:
    """The actor worker group's checkpoint calls: one weights file per save, rotated by verl's own code."""

    def __init__(self) -> None:
        from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager

        # verl's rotation state and methods, without the model, optimizer and process group its __init__ wants.
        self.rotation = BaseCheckpointManager.__new__(BaseCheckpointManager)
        self.rotation.previous_saved_paths = []

    def save_checkpoint(self, local_path: str, hdfs_path: Any, global_step: int, max_ckpt_to_keep: Any = None) -> None:
        # As FSDPCheckpointManager.save_checkpoint on rank 0: make room, save, then register (and rotate).
        self.rotation.ensure_checkpoint_capacity(max_ckpt_to_keep)
        os.makedirs(local_path, exist_ok=True)
        Path(local_path, "model.pt").write_text(f"weights of step {global_step}")
        self.rotation.register_checkpoint(local_path, max_ckpt_to_keep)

    def load_checkpoint(self, local_path: str, del_local_after_load: bool = False) -> None:
        self.loaded = Path(local_path, "model.pt").read_text()


class _WeightSync:
    def update_weights(self, *args: Any) -> None:
        return None

    def sleep_replicas(self) -> None:
        return None


def _trainer(
    tmp_path: Path, curve: Curve, total: int, monkeypatch: pytest.MonkeyPatch, *extra: str, metric: str = METRIC
) -> Any:
    """verl's ``evalstop_sync`` trainer as ``TaskRunnerV1`` gets it, with the GPU parts replaced (module docstring)."""
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl.trainer.ppo.v1 import get_trainer_cls, trainer_base

    register_trainers()
    config = verl_config(
        [
            "trainer.v1.trainer_mode=evalstop_sync",
            "algorithm.adv_estimator=grpo",  # GRPO: no critic
            "trainer.logger=[file]",
            f"trainer.test_freq={curve.every}",
            f"trainer.total_training_steps={total}",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            "trainer.val_before_train=False",
            "trainer.project_name=evalstop-test",
            f"trainer.experiment_name={curve.name}",
            f"+trainer.evalstop.metric={metric}",
            *extra,
        ]
    )
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "verl-log.jsonl"))

    def recorded_validation(self: Any) -> dict[str, float]:
        mean, per = curve.at(self.global_steps)
        prompts = [f"held-out prompt {i:03d}" for i in range(len(per))]
        self._maybe_log_val_generations(inputs=prompts, outputs=[""] * len(per), scores=per)
        return {METRIC: mean, "val-aux/bow-proxy/reward/std@1": 0.0}

    ended: list[int] = []
    monkeypatch.setattr(trainer_base.PPOTrainer, "_validate", recorded_validation)
    monkeypatch.setattr(trainer_base.PPOTrainer, "on_train_end", lambda self: ended.append(self.global_steps))
    monkeypatch.setattr(trainer_base.tq, "kv_clear", lambda **kwargs: None)

    trainer = get_trainer_cls("evalstop_sync")(config)
    trainer.steps_done = []
    trainer.ended = ended
    trainer.global_steps = 0
    trainer.total_training_steps = total
    trainer.steps_per_epoch = total
    trainer.train_dataloader = StatefulDataLoader(list(range(8)), batch_size=2)
    trainer.actor_rollout_wg = _ActorGroup()
    trainer.checkpoint_manager = _WeightSync()
    trainer.step = lambda metrics, timing_raw: (
        trainer.steps_done.append(trainer.global_steps) or SimpleNamespace(keys=[], partition_id="train")
    )
    trainer._compute_metrics = lambda *args, **kwargs: None
    trainer._init_dump_executor()
    return trainer


def _ckpt_steps(tmp_path: Path) -> list[int]:
    return sorted(int(p.name.split("_")[-1]) for p in (tmp_path / "ckpt").glob("global_step_*"))


def test_a_stop_ends_verls_loop_cleanly_at_the_cores_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    curve = load_curve(HACKING)
    stop, best = core_verdict(curve)
    assert stop is not None and best is not None and stop < curve.steps[-1]
    trainer = _trainer(tmp_path, curve, curve.steps[-1], monkeypatch)
    assert type(trainer).__name__ == "EvalStopPPOTrainerSync" and trainer.trainer_mode == "sync"

    trainer.fit(agent_loop_manager=None)  # returns: no exception at the stop

    assert trainer.steps_done == list(range(1, stop + 1))  # not one training step after the stop
    assert trainer.ended == [stop + 1]  # verl's on_train_end ran, once, after the stop step was counted
    log = file_log(tmp_path / "verl-log.jsonl")
    assert log[-1]["step"] == stop
    last = log[-1]["data"]
    assert last["evalstop/stop"] == 1.0 and last["evalstop/best_step"] == best
    assert last["evalstop/best_score"] == pytest.approx(curve.at(best)[0])
    assert [line["data"]["evalstop/stop"] for line in log if "evalstop/stop" in line["data"]][:-1] == [0.0] * (
        len(curve.steps[: curve.steps.index(stop)])
    )
    # A checkpoint at every new best (save_freq is off), the best one kept out of the rotation's reach.
    bests = [line["step"] for line in log if line["data"].get("evalstop/best_step") == line["step"]]
    assert _ckpt_steps(tmp_path) == bests and bests[-1] == best
    protected = tmp_path / "ckpt" / f"evalstop-best-{best}"
    kept = tmp_path / "ckpt" / f"global_step_{best}" / "actor" / "model.pt"
    assert os.path.samefile(protected / "actor" / "model.pt", kept)
    assert (protected / "data.pt").exists()
    result = json.loads((tmp_path / "ckpt" / "evalstop-result.json").read_text())
    assert (result["decision"], result["stop_step"], result["best_step"]) == ("stop", stop, best)
    assert result["best_checkpoint"] == str(kept.parents[1]) and result["protected_checkpoint"] == str(protected)
    assert result["detector"]["name"] == "trend"
    assert result["evals"][-1] == [stop, pytest.approx(curve.at(stop)[0])]
    assert (result["mode"], result["keep_best"], result["pruned"]) == (
        "enforce",
        1,
        [str(protected.parent / f"evalstop-best-{s}") for s in bests[:-1]],
    )
    assert [k["step"] for k in result["kept"]] == [best] and result["kept"][0]["path"] == str(protected)


def _k_best(curve: Curve, last: int, k: int) -> list[int]:
    """The K best validation steps up to ``last``, best first (ties to the earliest step), from the curve itself."""
    steps = [s for s in curve.steps if 0 < s <= last]
    return sorted(steps, key=lambda s: (-curve.at(s)[0], s))[:k]


def test_keep_best_k_survives_verls_rotation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """keep_best=3 with max_actor_ckpt_to_keep=2: verl's rotation deletes all but its 2 newest actor folders, and
    exactly the 3 best validations' checkpoints are left in evalstop-best-<step>, each with its own step's weights."""
    curve = load_curve(HACKING)
    stop, _best = core_verdict(curve)
    assert stop is not None
    trainer = _trainer(
        tmp_path,
        curve,
        curve.steps[-1],
        monkeypatch,
        "trainer.max_actor_ckpt_to_keep=2",
        "+trainer.evalstop.keep_best=3",
    )
    trainer.fit(agent_loop_manager=None)

    want = _k_best(curve, stop, 3)
    ckpt = tmp_path / "ckpt"
    actors = sorted(int(p.parent.name.split("_")[-1]) for p in ckpt.glob("global_step_*/actor"))
    assert len(actors) == 2 and not set(want) <= set(actors)  # verl's rotation ran and took some of the best
    protected = sorted(int(p.name.rsplit("-", 1)[1]) for p in ckpt.glob("evalstop-best-*"))
    assert protected == sorted(want)
    for step in want:
        assert (ckpt / f"evalstop-best-{step}" / "actor" / "model.pt").read_text() == f"weights of step {step}"
    result = json.loads((ckpt / "evalstop-result.json").read_text())
    assert [k["step"] for k in result["kept"]] == want and result["keep_best"] == 3
    assert [k["score"] for k in result["kept"]] == [pytest.approx(curve.at(s)[0]) for s in want]
    assert all(Path(k["path"]).name == f"evalstop-best-{k['step']}" for k in result["kept"])
    assert result["best_step"] == want[0] and result["protected_checkpoint"] == str(ckpt / f"evalstop-best-{want[0]}")
    assert all(Path(p).name.startswith("evalstop-best-") for p in result["pruned"])  # no --prune-others: ours only


def test_observe_mode_never_stops_and_prune_others_leaves_the_k_best_and_the_newest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    curve = load_curve(HACKING)
    stop, _best = core_verdict(curve)
    assert stop is not None and stop < curve.steps[-1]
    last = curve.steps[-1]
    trainer = _trainer(
        tmp_path,
        curve,
        last,
        monkeypatch,
        "trainer.save_freq=50",
        "+trainer.evalstop.mode=observe",
        "+trainer.evalstop.keep_best=2",
        "+trainer.evalstop.prune_others=true",
    )
    trainer.fit(agent_loop_manager=None)

    assert trainer.steps_done == list(range(1, last + 1))  # observe: never stopped
    result = json.loads((tmp_path / "ckpt" / "evalstop-result.json").read_text())
    assert (result["decision"], result["stop_step"], result["would_stop_step"]) == ("continue", None, stop)
    want = _k_best(curve, last, 2)
    assert [k["step"] for k in result["kept"]] == want and result["mode"] == "observe"
    # verl's own folders left: the kept steps' and the newest (a resume's start); the rest pruned
    assert set(_ckpt_steps(tmp_path)) == {*want, last}
    assert any(Path(p).name.startswith("global_step_") for p in result["pruned"])


def test_a_healthy_run_trains_to_verls_last_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    curve = load_curve(HEALTHY)
    assert core_verdict(curve)[0] is None
    total = curve.steps[-1]
    trainer = _trainer(tmp_path, curve, total, monkeypatch, "trainer.save_freq=100")

    trainer.fit(agent_loop_manager=None)

    assert trainer.steps_done == list(range(1, total + 1))
    assert trainer.ended == []  # verl's last-step branch returns without on_train_end; the adapter finishes anyway
    log = file_log(tmp_path / "verl-log.jsonl")
    assert log[-1]["step"] == total and log[-1]["data"]["evalstop/stop"] == 0.0
    result = json.loads((tmp_path / "ckpt" / "evalstop-result.json").read_text())
    assert result["decision"] == "continue" and result["stop_step"] is None
    assert len(result["evals"]) == len(curve.steps)
    assert {100, 200, 300} <= set(_ckpt_steps(tmp_path))  # verl's own saves still happen


def test_a_resumed_run_reaches_the_same_stop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    curve = load_curve(HACKING)
    stop, best = core_verdict(curve)
    assert stop is not None and stop > 50
    first = _trainer(tmp_path, curve, 50, monkeypatch, "trainer.save_freq=50")
    first.fit(agent_loop_manager=None)  # ends at verl's last step, 50, before the stop; saves step 50
    assert first.steps_done[-1] == 50 and (tmp_path / "ckpt" / "global_step_50" / "evalstop_state.json").exists()

    second = _trainer(tmp_path, curve, curve.steps[-1], monkeypatch, "trainer.resume_mode=auto")
    second._load_checkpoint()  # verl's own resume (its _setup calls it); the core's state comes back with it
    assert second.global_steps == 50 and second.actor_rollout_wg.loaded == "weights of step 50"
    second.fit(agent_loop_manager=None)

    assert second.steps_done == list(range(51, stop + 1))
    result = json.loads((tmp_path / "ckpt" / "evalstop-result.json").read_text())
    assert (result["decision"], result["stop_step"], result["best_step"]) == ("stop", stop, best)
    assert [e[0] for e in result["evals"]] == curve.steps[: curve.steps.index(stop) + 1]


def test_a_metric_glob_matching_nothing_names_what_verl_logged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    curve = load_curve(HACKING)
    trainer = _trainer(tmp_path, curve, 30, monkeypatch, metric="val-core/*/acc/mean@1")
    with pytest.raises(ValueError, match="val-core/bow-proxy/reward/mean@1"):
        trainer.fit(agent_loop_manager=None)


def test_verls_own_launcher_finds_the_evalstop_trainer_in_its_ray_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verl's ``run_ppo`` (its ``ray.init`` with the config's runtime env) and the setup hook the docs give: the
    trainer lookup ``TaskRunnerV1.run`` makes in its Ray actor finds ``evalstop_sync`` there."""
    import ray
    from verl.trainer.main_ppo import run_ppo

    from evalstop_callbacks.verl_trainer import SETUP_HOOK

    here = str(Path(__file__).resolve().parent)  # the workers import the probe from the tests folder
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p))
    from _verl_ray_probe import TrainerLookup

    config = verl_config(
        [
            "trainer.v1.trainer_mode=evalstop_sync",
            "+" + SETUP_HOOK,
            "ray_kwargs.ray_init.num_cpus=1",
            f"trainer.default_local_dir={tmp_path}",
        ]
    )
    try:
        run_ppo(config, task_runner_class=TrainerLookup)
    finally:
        ray.shutdown()
    assert (tmp_path / "trainer.txt").read_text() == "evalstop_callbacks.verl_trainer.EvalStopPPOTrainerSync"
