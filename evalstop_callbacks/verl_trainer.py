"""EvalStop inside verl's v1 PPO trainer: report each validation to the core, keep the best, stop the loop.

verl (0.9) validates every ``trainer.test_freq`` steps and logs ``val-core/<data_source>/<var>/<metric>`` through its
``Tracking`` logger, but its loop ends only at the configured total steps. :func:`register_trainers` adds, for every
trainer verl registers with ``@register_trainer`` (``sync``, ``colocate_async``, ``separate_async``), a subclass
registered as ``evalstop_<mode>``, chosen like any other with ``trainer.v1.trainer_mode=evalstop_sync``. It:

* reports each ``_validate`` result (the metric the glob ``trainer.evalstop.metric`` names; with one data source and
  the ``reward`` variable also the per-prompt scores, paired across validations by prompt text) to the scheduler core:
  :class:`~evalstop_callbacks.client.EmbeddedClient` by default, ``PlatformClient`` with ``trainer.evalstop.server``;
* at each validation that ranks among the ``trainer.evalstop.keep_best`` best (default 1) saves a checkpoint with
  verl's own ``_save_checkpoint`` (unless ``save_freq`` saves that step anyway) and hard-links it into
  ``<default_local_dir>/evalstop-best-<step>`` (:class:`~evalstop_callbacks.keeper.BestCheckpoints`), out of reach
  of ``max_actor_ckpt_to_keep``; a copy that falls out of the K best is deleted, and with
  ``trainer.evalstop.prune_others`` so are verl's folders that are neither kept nor the newest;
* puts the decision in verl's own logger beside the same step's validation metrics (``evalstop/stop``,
  ``evalstop/declines``, ``evalstop/score``, ``evalstop/best_step``, ``evalstop/best_score``: numbers, which every
  backend, TensorBoard included, takes), and the reason in Python logging;
* at a stop ends the loop cleanly (``trainer.evalstop.mode=enforce``, the default): no exception, verl's
  ``on_train_end`` runs (verl's own last-step branch returns without it); ``mode=observe`` never stops and keeps the
  best checkpoints all the same. ``<default_local_dir>/evalstop-result.json`` holds the outcome in
  ``evalstop watch``'s format (``mode``, ``keep_best``, ``kept``, ``pruned`` included);
* saves the core's state in each checkpoint folder, so a resumed run continues with the same history.

verl builds the trainer inside a Ray actor (``TaskRunnerV1``), so the registration must happen in that process: run
``python -m evalstop_callbacks.verl_trainer <verl's hydra overrides>`` (verl's ``main_ppo`` with the hook below added),
or give verl's own entry point Ray's worker setup hook,
``+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=evalstop_callbacks.verl_trainer.register_trainers``.
verl is imported only inside :func:`register_trainers` and :func:`main`.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from .keeper import BestCheckpoints
from .outcome import worded
from .verl_monitor import MODE_PREFIX, RESULT_FILE, STATE_FILE, EvalStopMonitor, VerlEvalStopConfig, make_client

logger = logging.getLogger(__name__)

SETUP_HOOK = f"ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={__name__}.register_trainers"


class EvalStopTrainerMixin:
    """EvalStop for a verl ``PPOTrainer`` subclass; comes first in the bases (``(EvalStopTrainerMixin, PPOTrainerSync)``).

    It overrides only methods verl's ``fit`` calls (``_validate``, ``_maybe_log_val_generations``, ``_save_checkpoint``,
    ``_load_checkpoint``, ``on_train_end``, ``fit``) and always calls verl's own. ``_evalstop_base_mode`` names the
    registered mode it extends.
    """

    _evalstop_base_mode: str = "sync"
    # Attributes verl's PPOTrainer sets; declared for the type checker (the mixin itself sets none of them).
    config: Any
    global_steps: int
    total_training_steps: int

    def __init__(self, config: Any) -> None:
        from omegaconf import open_dict

        # verl branches on ``trainer_mode == "sync"`` (replay buffer, TransferQueue checkpoints) and reads the mode's
        # settings from ``trainer.v1.<mode>``: from here on it must see the mode this class extends.
        with open_dict(config):
            config.trainer.v1.trainer_mode = self._evalstop_base_mode
        super().__init__(config)  # type: ignore[call-arg]  # verl's PPOTrainer takes the config
        settings = VerlEvalStopConfig.from_mapping(config.trainer.get("evalstop"))
        job_id = settings.job_id or f"{config.trainer.project_name}/{config.trainer.experiment_name}"
        self.evalstop = EvalStopMonitor(settings, make_client(settings), job_id)
        self._evalstop_samples: list[tuple[str, float]] | None = None
        root = config.trainer.default_local_dir
        self._evalstop_keeper = (
            BestCheckpoints(root, settings.keep_best, prune_others=settings.prune_others)
            if settings.protect_best
            else None
        )
        self._evalstop_finished = False

    # ---- validation: report, keep the best, stop ----

    def _maybe_log_val_generations(
        self, inputs: Sequence[str], outputs: Sequence[str], scores: Sequence[float]
    ) -> None:
        # verl's _validate hands every validation sample's prompt and summed reward here, and nowhere else.
        self._evalstop_samples = [(str(i), float(s)) for i, s in zip(inputs, scores)]
        super()._maybe_log_val_generations(inputs, outputs, scores)  # type: ignore[misc]

    def _validate(self) -> dict[str, Any]:
        self._evalstop_samples = None
        metrics: dict[str, Any] = super()._validate()  # type: ignore[misc]
        step = self.global_steps
        monitor = self.evalstop
        if monitor.evals and step <= monitor.evals[-1][0]:
            # A resumed run validates its resume step again (val_before_train): that step is already reported.
            return metrics
        if monitor.stopping:
            return metrics  # the loop is ending; verl's own last-step validation may still come
        planned = getattr(self, "total_training_steps", None)  # verl's planned steps, set before fit() trains
        decision = monitor.observe(step, metrics, self._evalstop_samples, planned if isinstance(planned, int) else None)
        if decision is None:  # a NaN or inf validation: recorded, not decided on (evalstop_callbacks.nonfinite)
            self._evalstop_write_state()
            if monitor.stopping:
                logger.warning("evalstop: stop at step %d (%s)", step, monitor.stop_reason)
                self.total_training_steps = step  # as at a decline: this pass is the last one
            return metrics
        value = float(monitor.evals[-1][1])
        if step > 0 and self._evalstop_ranks(step, monitor.core_score(value)):
            self._evalstop_keep_best(step, monitor.core_score(value))
        else:
            # verl saves a save_freq step before validating it: that checkpoint's state must hold this eval too.
            self._evalstop_write_state()
        metrics.update(monitor.log_fields(decision, value))
        if decision.should_stop and monitor.would_stop_at == step:
            keeper, best_step = self._evalstop_keeper, decision.best_step
            best = keeper.get(best_step) if keeper is not None and best_step is not None else None
            logger.warning(
                "evalstop%s: stop at step %d (%s); best step %s, %s=%s, checkpoint %s",
                "" if monitor.stopping else " (observe: not stopping)",
                step,
                worded(decision.reason, monitor.config.mode),
                decision.best_step,
                monitor.metric_name,
                monitor.best_score(),
                best.path if best is not None else None,
            )
        if monitor.stopping:
            # fit() loops while global_steps <= total_training_steps and counts the step up after logging it:
            # capping the total at this step makes this pass the last one, and fit() then calls on_train_end.
            self.total_training_steps = step
        return metrics

    def _evalstop_ranks(self, step: int, score: float) -> bool:
        """Whether this validation is one to keep: among the K best (the core's best step without a keeper)."""
        if self._evalstop_keeper is not None:
            return self._evalstop_keeper.ranks(step, score)
        decision = self.evalstop.decision
        return decision is not None and decision.best_step == step

    def _evalstop_keep_best(self, step: int, score: float) -> None:
        trainer = self.config.trainer
        settings = self.evalstop.config
        saved_anyway = trainer.save_freq > 0 and (step % trainer.save_freq == 0 or step >= self.total_training_steps)
        if settings.save_best and not saved_anyway:
            self._save_checkpoint()
        folder = os.path.join(trainer.default_local_dir, f"global_step_{step}")
        if not os.path.isdir(folder):  # save_best off, or an asynchronous save not on disk yet
            logger.warning("evalstop: best step %d has no checkpoint folder %s", step, folder)
        elif self._evalstop_keeper is not None:
            self._evalstop_keeper.protect(step, score, folder)
        self._evalstop_write_state()  # after protecting: the state names the kept checkpoints

    # ---- checkpoints carry the core's state ----

    def _save_checkpoint(self) -> None:
        super()._save_checkpoint()  # type: ignore[misc]
        self._evalstop_write_state()
        if self._evalstop_keeper is not None and self._evalstop_keeper.prune_others:
            self._evalstop_keeper.prune()  # verl's own saves too: only the K best and the newest stay

    def _evalstop_write_state(self) -> None:
        """The core's state into this step's checkpoint folder (if there is one), replaced, never rewritten in place:
        the file may also be hard-linked into ``evalstop-best-<step>``."""
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        if not os.path.isdir(folder):
            return
        keeper = self._evalstop_keeper
        state = {"monitor": self.evalstop.state_dict(), "keeper": keeper.state_dict() if keeper is not None else None}
        path = os.path.join(folder, STATE_FILE)
        with open(path + ".tmp", "w", encoding="utf-8") as fh:
            json.dump(state, fh)
        os.replace(path + ".tmp", path)

    def _load_checkpoint(self) -> None:
        super()._load_checkpoint()  # type: ignore[misc]
        if self.global_steps <= 0:
            return
        path = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}", STATE_FILE)
        if not os.path.exists(path):
            logger.warning("evalstop: %s not found; the core starts a new history at step %d", path, self.global_steps)
            if self._evalstop_keeper is not None:
                self._evalstop_keeper.adopt()  # the evalstop-best-<step> folders name their step and score
            return
        with open(path, encoding="utf-8") as fh:
            state = json.load(fh)
        self.evalstop.load_state_dict(state["monitor"])
        if self._evalstop_keeper is not None and state.get("keeper"):
            self._evalstop_keeper.load_state_dict(state["keeper"])

    # ---- the end of the run ----

    def on_train_end(self) -> None:
        super().on_train_end()  # type: ignore[misc]
        self._evalstop_finish()

    def fit(self, agent_loop_manager: Any) -> None:
        super().fit(agent_loop_manager)  # type: ignore[misc]
        # verl returns from its last step without on_train_end: finish here too (once).
        self._evalstop_finish()

    def _evalstop_finish(self) -> None:
        if self._evalstop_finished:
            return
        self._evalstop_finished = True
        monitor = self.evalstop
        result = monitor.result(self._evalstop_keeper)
        monitor.client.finish(monitor.job_id, "stopped" if result["decision"] == "stop" else "completed")
        path = monitor.config.result or os.path.join(self.config.trainer.default_local_dir, RESULT_FILE)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=1)
        logger.info("evalstop: %s; result in %s", json.dumps(result["decision"]), path)


def register_trainers() -> dict[str, type]:
    """Register ``evalstop_<mode>`` for every trainer mode verl has registered; idempotent.

    Also Ray's worker setup hook (it is called with no arguments in each worker process).

    Returns:
        The registered EvalStop trainer classes by mode name.
    """
    from verl.trainer.ppo.v1 import trainer_base  # the package imports and registers verl's own trainers

    registry: dict[str, type] = trainer_base.TRAINER_REGISTRY
    out: dict[str, type] = {}
    for mode, base in list(registry.items()):
        if mode.startswith(MODE_PREFIX):
            continue
        name = MODE_PREFIX + mode
        cls = registry.get(name)
        if cls is None:
            attrs = {"_evalstop_base_mode": mode, "__module__": __name__, "__qualname__": f"EvalStop{base.__name__}"}
            cls = type(f"EvalStop{base.__name__}", (EvalStopTrainerMixin, base), attrs)
            trainer_base.register_trainer(name)(cls)
        out[name] = cls
    return out


def main(argv: Sequence[str] | None = None) -> None:
    """verl's ``main_ppo`` with the EvalStop trainers registered in the Ray workers (hydra overrides as arguments)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not any("worker_process_setup_hook" in a for a in args):
        args.append("+" + SETUP_HOOK)
    register_trainers()
    from verl.trainer.main_ppo import main as verl_main

    sys.argv = [sys.argv[0], *args]  # hydra reads its overrides from sys.argv
    verl_main()


if __name__ == "__main__":
    main()
