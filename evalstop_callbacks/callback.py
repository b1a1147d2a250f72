"""``EvalStopCallback``: world-feedback early stopping inside any transformers or TRL trainer.

Every ``eval_steps`` optimizer steps (and at the last step) the callback scores the live policy with its
:class:`~evalstop_callbacks.evaluators.Evaluator`, sends a whitelisted :class:`~platform_sim.core.Report` through its
boundary client and applies the :class:`~platform_sim.core.Decision`: at a new best it forces a checkpoint and points
``state.best_model_checkpoint`` at it (so ``save_total_limit`` rotation keeps it); on a stop it ends training with the
stop step's checkpoint saved and loads the best weights back into the live model.

The decision rule is not here: it lives in the scheduler core (``platform_sim.core``), reached through the client.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable, Mapping

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from platform_sim.core import JOB_TYPES, Decision, Report, cadence_from_spec, detector_from_spec
from platform_sim.core.checks import check_int, check_nonneg

from .checkpoints import CheckpointError, checkpoint_dir, mark_best, restore_checkpoint
from .client import BoundaryClient, EmbeddedClient
from .distributed import barrier, share_from_main, world
from .evaluators import EvalResult, Evaluator, EvaluatorError, unwrap_model
from .integrations import WandbLogger, reports_to
from .trace import TraceRecorder, eval_prefix

logger = logging.getLogger(__name__)

MODES: tuple[str, ...] = ("enforce", "observe")

# Keys of the trainers' own logs that the trace may carry (first match wins). Research data only: never reported.
_LOG_KEYS: dict[str, tuple[str, ...]] = {
    "train_loss": ("loss", "train_loss", "loss/policy_avg"),
    "proxy_reward": ("reward", "objective/scores", "objective/rlhf_reward", "rewards/chosen"),
    "kl": ("kl", "objective/kl"),
}


class EvalStopTrainingStopped(RuntimeError):
    """Raised to end a trainer whose loop ignores ``control.should_training_stop`` (TRL 1.12's ``PPOTrainer``).

    By the time it is raised the stop step's checkpoint is saved, the best weights are restored into the live model,
    the trace is closed and the scheduler was told. :func:`evalstop_callbacks.ppo.train_with_evalstop` catches it.

    Args:
        step: Step at which EvalStop stopped the run.
        best_step: Step of the restored best checkpoint.
        best_score: Its eval score.
        reason: The scheduler's reason.
    """

    def __init__(self, step: int, best_step: int | None, best_score: float | None, reason: str) -> None:
        self.step, self.best_step, self.best_score, self.reason = step, best_step, best_score, reason
        super().__init__(
            f"EvalStop stopped training at step {step} ({reason}); best checkpoint: step {best_step} "
            f"(score {best_score}), restored into the model. TRL's PPOTrainer ignores should_training_stop, so the "
            "stop ends trainer.train() with this exception: call "
            "evalstop_callbacks.ppo.train_with_evalstop(trainer) instead of trainer.train() to return normally."
        )


def _trainer_name(args: Any) -> str:
    # GRPOConfig -> GRPOTrainer, TrainingArguments -> Trainer: the callback never sees the trainer object itself.
    name = type(args).__name__
    return name[:-6] + "Trainer" if name.endswith("Config") else "Trainer"


class EvalStopCallback(TrainerCallback, ExportableState):
    """A [`TrainerCallback`] that stops training after ``k`` consecutive declines of a held-out world-feedback score.

    It evaluates the live model every ``eval_steps`` steps and at the last step, reports the score through a
    boundary client to the EvalStop scheduler core, and applies the decision. Works with ``Trainer``, ``SFTTrainer``,
    ``DPOTrainer``, ``GRPOTrainer``, ``RLOOTrainer`` and (through :mod:`evalstop_callbacks.ppo`) TRL 1.12's
    ``PPOTrainer``. Its state (the detector's declines, the best step and checkpoint) is saved in every checkpoint's
    ``trainer_state.json`` and restored by ``trainer.train(resume_from_checkpoint=...)``.

    Args:
        evaluator (`Evaluator`):
            The world-feedback evaluator, e.g. a [`RewardFunctionEvaluator`] on held-out prompts. Runs on the main
            process only.
        eval_steps (`int`):
            Evaluate every `eval_steps` optimizer steps (`state.global_step`), and once more at the last step.
            Integer >= 1.
        k (`int`, *optional*, defaults to 2):
            Consecutive declines that stop the run (the paper's k). Integer >= 1.
        min_delta (`float`, *optional*, defaults to 0.0):
            A drop counts as a decline only if it exceeds `min_delta` (the paper uses 0). Finite, >= 0.
        client (`BoundaryClient`, *optional*):
            Where decisions come from. `None` means the scheduler core embedded in this process
            ([`EmbeddedClient`]). Pass `PlatformClient(url, token)` to report to an `evalstop-server` instead; nothing
            else changes. Only whitelisted fields (job id and type, step, eval score and per-example scores) are sent.
        job_id (`str`, *optional*):
            The job's id at the scheduler. `None` lets the client choose one (kept across resumes).
        job_type (`str`, *optional*, defaults to `"rlhf"`):
            One of `"rlhf"`, `"dpo"`, `"lora"`, `"sft"`, `"other"`.
        mode (`str`, *optional*, defaults to `"enforce"`):
            `"enforce"` stops training on the scheduler's stop decision, keeps the best checkpoint and restores it.
            `"observe"` evaluates, reports and records the same way but never stops, never forces checkpoints and
            never restores weights: for shadow runs and for recording full traces (`would_stop_at` tells when
            enforce mode would have stopped).
        restore_best (`bool`, *optional*, defaults to `True`):
            In enforce mode, load the best checkpoint's weights (PEFT adapters included) into the live model when
            training stops or ends, so that the model in memory is the best one.
        trace_path (`str` or `os.PathLike`, *optional*):
            Write the run's JSONL trace (DESIGN.md section 4) there, from the main process.
        detector (`str` or `dict`, *optional*):
            Keyword-only. A detector spec for the scheduler core (`{"name": ..., "params": {...}}` or a name) that
            replaces the default `{"name": "k-decline", "params": {"k": k, "min_delta": min_delta}}`.
        trace_extras (`Callable[[TrainingArguments, TrainerState], Mapping[str, float]]`, *optional*):
            Keyword-only. Called on the main process at each evaluation; its `proxy_reward`, `train_loss`, `kl`,
            `wall_s`, `gpu_s` go into the trace line (they override the values taken from the trainer's logs). Never
            sent to the scheduler.
        cadence (`str` or `dict`, *optional*):
            Keyword-only. `"adaptive"` (or `{"name": "adaptive", "params": {"fraction": ...}}`) asks the scheduler
            core for cadence hints: while a decline may have begun, its decisions name a `next_eval_step` sooner
            than the next regular evaluation, and the callback evaluates there too. `None` (the default) or
            `"fixed"`: every `eval_steps` only. With the embedded client only (the service's registration takes
            no cadence); a hint that a client's decision carries anyway is honoured within `max_extra_evals`.
        max_extra_evals (`int`, *optional*, defaults to 4):
            Keyword-only. At most this many evaluations per run beyond the regular ones (0: ignore hints). An extra
            evaluation is a full one: reported, checkpointed when it is a new best, and written to the trace as an
            eval line at its (off-cadence) step.

    Attributes:
        history (`list[dict]`): One entry per evaluation: `step`, `eval_score`, `declines`, `action`.
        best_step, best_score: Best evaluation so far.
        stopped_at (`int` or `None`): Step at which enforce mode stopped training.
        would_stop_at (`int` or `None`): First step at which the scheduler said stop (both modes).
        restored_from (`str` or `None`): Checkpoint folder whose weights were loaded into the model.
        extra_eval_steps (`list[int]`): Steps of the evaluations made at a cadence hint (also marked `"extra"` in
            `history`).
        eval_seconds, overhead_seconds (`list[float]`): Per evaluation: the evaluator's time, and the callback's own
            time (report, decision, bookkeeping, trace), measured on the main process.
    """

    def __init__(
        self,
        evaluator: Evaluator,
        eval_steps: int,
        k: int = 2,
        min_delta: float = 0.0,
        client: BoundaryClient | None = None,
        job_id: str | None = None,
        job_type: str = "rlhf",
        mode: str = "enforce",
        restore_best: bool = True,
        trace_path: str | None = None,
        *,
        detector: str | Mapping[str, Any] | None = None,
        trace_extras: Callable[[Any, Any], Mapping[str, float]] | None = None,
        cadence: str | Mapping[str, Any] | None = None,
        max_extra_evals: int = 4,
    ) -> None:
        if not isinstance(evaluator, Evaluator):
            raise TypeError(
                f"evaluator must be an evalstop_callbacks Evaluator (e.g. RewardFunctionEvaluator), "
                f"got {type(evaluator).__name__}"
            )
        self.evaluator = evaluator
        self.eval_steps = check_int("eval_steps", eval_steps, 1)
        self.k = check_int("k", k, 1)
        self.min_delta = check_nonneg("min_delta", min_delta)
        if job_type not in JOB_TYPES:
            raise ValueError(f"job_type must be one of {', '.join(JOB_TYPES)}; got {job_type!r}")
        self.job_type = job_type
        if mode not in MODES:
            raise ValueError(f"mode must be 'enforce' or 'observe', got {mode!r}")
        self.mode = mode
        if job_id is not None and (not isinstance(job_id, str) or not job_id):
            raise ValueError(f"job_id must be a non-empty string or None, got {job_id!r}")
        self.job_id = job_id
        self.client: BoundaryClient = client if client is not None else EmbeddedClient()
        if not isinstance(self.client, BoundaryClient):
            raise TypeError(f"client must implement register/report/finish (BoundaryClient), "
                            f"got {type(self.client).__name__}")
        self.restore_best = bool(restore_best)
        self.trace_path = None if trace_path is None else str(trace_path)
        self.detector_spec: dict[str, Any] = (
            {"name": "k-decline", "params": {"k": self.k, "min_delta": self.min_delta}} if detector is None
            else detector_from_spec(detector).spec()  # builds it once: a bad spec fails here, not mid-training
        )
        if trace_extras is not None and not callable(trace_extras):
            raise TypeError("trace_extras must be callable(args, state) -> mapping")
        self.trace_extras = trace_extras
        policy = cadence_from_spec(cadence)  # a bad spec fails here
        self.cadence_spec: dict[str, Any] | None = policy.spec() if policy is not None else None
        if self.cadence_spec is not None and not isinstance(self.client, EmbeddedClient):
            raise ValueError("cadence hints are decided by the scheduler core: pass cadence with the embedded client "
                             "only (the service's job registration takes no cadence)")
        self.max_extra_evals = check_int("max_extra_evals", max_extra_evals, 0)
        self.extra_eval_steps: list[int] = []
        self._hinted_step: int | None = None

        self.history: list[dict[str, Any]] = []
        self.best_step: int | None = None
        self.best_score: float | None = None
        self.best_checkpoint: str | None = None
        self.stopped_at: int | None = None
        self.stop_reason: str = ""
        self.would_stop_at: int | None = None
        self.last_decision: Decision | None = None
        self.restored_from: str | None = None
        self.eval_seconds: list[float] = []
        self.overhead_seconds: list[float] = []

        self._last_eval_step: int | None = None
        self._registered = False
        self._finished = False
        self._is_main = True
        self._is_ppo = False
        self._raise_after_save = False
        self._trace: TraceRecorder | None = None
        self._pending: dict[str, Any] | None = None
        self._wandb = WandbLogger(False)
        self._t0 = time.perf_counter()
        self._wall_offset = 0.0
        self._own_time = 0.0
        self._last_logs: tuple[int, dict[str, Any]] | None = None

    # -- ExportableState: saved into trainer_state.json with every checkpoint --------------------------------------

    def state(self) -> dict[str, Any]:
        client_state = self.client.state_dict() if callable(getattr(self.client, "state_dict", None)) else None
        return {
            "args": {
                "eval_steps": self.eval_steps, "k": self.k, "min_delta": self.min_delta, "job_id": self.job_id,
                "job_type": self.job_type, "mode": self.mode, "restore_best": self.restore_best,
                "trace_path": self.trace_path,
            },
            "attributes": {
                "evalstop": {
                    "job_id": self.job_id,
                    "detector": self.detector_spec,
                    "history": list(self.history),
                    "best_step": self.best_step,
                    "best_score": self.best_score,
                    "best_checkpoint": self.best_checkpoint,
                    "stopped_at": self.stopped_at,
                    "would_stop_at": self.would_stop_at,
                    "last_eval_step": self._last_eval_step,
                    "extra_eval_steps": list(self.extra_eval_steps),
                    "hinted_step": self._hinted_step,
                    "wall_s": self._wall(),
                    "client_state": client_state,
                }
            },
        }

    def _load_saved(self, saved: Mapping[str, Any]) -> None:
        if saved.get("detector") != self.detector_spec:
            raise ValueError(
                f"the checkpoint's EvalStop detector {saved.get('detector')} differs from this callback's "
                f"{self.detector_spec}; resume with the same k, min_delta and detector"
            )
        if self.job_id is not None and saved.get("job_id") not in (None, self.job_id):
            raise ValueError(f"the checkpoint belongs to EvalStop job {saved.get('job_id')!r}, not {self.job_id!r}")
        self.job_id = saved.get("job_id")
        self.history = list(saved.get("history") or [])
        self.best_step = saved.get("best_step")
        self.best_score = saved.get("best_score")
        self.best_checkpoint = saved.get("best_checkpoint")
        self.stopped_at = saved.get("stopped_at")
        self.would_stop_at = saved.get("would_stop_at")
        self._last_eval_step = saved.get("last_eval_step")
        self.extra_eval_steps = list(saved.get("extra_eval_steps") or [])
        self._hinted_step = saved.get("hinted_step")
        self._wall_offset = float(saved.get("wall_s") or 0.0)
        client_state = saved.get("client_state")
        if client_state is not None and callable(getattr(self.client, "load_state_dict", None)):
            self.client.load_state_dict(client_state)
        logger.info("EvalStop resumed job %s: %d evals, best step %s, declines %s", self.job_id, len(self.history),
                    self.best_step, self.history[-1]["declines"] if self.history else 0)

    # -- events ------------------------------------------------------------------------------------------------------

    def on_init_end(self, args, state, control, **kwargs):
        if getattr(args, "restore_callback_states_from_checkpoint", False):
            # transformers would rebuild the callback from JSON args, without its evaluator and client.
            raise ValueError(
                "EvalStopCallback restores its own state from the checkpoint; leave "
                "restore_callback_states_from_checkpoint=False (the default): transformers would rebuild the "
                "callback without its evaluator"
            )

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._is_main = bool(getattr(state, "is_world_process_zero", True))
        self._is_ppo = model is not None and unwrap_model(model) is not model and hasattr(model, "value_model")
        self._finished = False
        self._raise_after_save = False
        resuming = state.global_step > 0
        if not resuming and (self.history or self._registered):
            # A second run would re-report steps the core has seen (conflicts) and inherit this run's best step.
            raise ValueError("this EvalStopCallback already served a training run; create a new one for a new run")
        if resuming:
            saved = (getattr(state, "stateful_callbacks", None) or {}).get(type(self).__name__)
            if isinstance(saved, list):  # several EvalStop callbacks: the one of our job, else the first
                saved = next((s for s in saved if s.get("attributes", {}).get("evalstop", {}).get("job_id")
                              == self.job_id), saved[0])
            if saved and "evalstop" in saved.get("attributes", {}):
                self._load_saved(saved["attributes"]["evalstop"])
        if self.mode == "enforce" and getattr(args, "load_best_model_at_end", False):
            logger.warning("EvalStop keeps and restores its own best checkpoint (by the world score); "
                           "load_best_model_at_end with metric_for_best_model competes for state.best_model_checkpoint")
        self._t0 = time.perf_counter()
        if self._is_main:
            self._register()
            self._wandb = WandbLogger(reports_to(args, "wandb"))
            if self.trace_path is not None:
                self._open_trace(args, state, model, resuming)
        self._pending = None
        logger.info("EvalStop job %s: every %d steps, detector %s, mode %s", self.job_id, self.eval_steps,
                    self.detector_spec, self.mode)

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        step = state.global_step
        self._flush_trace(step)
        if not self._due(step, state):
            return control
        if self.evaluator.uses_trainer_metrics:
            control.should_evaluate = True  # the report happens in on_evaluate, with the trainer's metrics
            return control
        payload: dict[str, Any] | None = None
        if self._is_main:
            t_eval = time.perf_counter()
            try:
                result = self.evaluator.evaluate(unwrap_model(model), processing_class)
                eval_s = time.perf_counter() - t_eval
                payload = self._report(args, state, step, result, eval_s)
            except Exception as exc:  # noqa: BLE001 - shared with every rank below, then raised everywhere
                payload = {"error": f"{type(exc).__name__}: {exc}", "exc": exc}
        self._apply(args, state, control, step, payload)
        return control

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        step = state.global_step
        if not self.evaluator.uses_trainer_metrics or not self._due(step, state):
            return control
        payload: dict[str, Any] | None = None
        if self._is_main:
            try:
                payload = self._report(args, state, step, self.evaluator.from_metrics(metrics or {}), 0.0)
            except Exception as exc:  # noqa: BLE001
                payload = {"error": f"{type(exc).__name__}: {exc}", "exc": exc}
        self._apply(args, state, control, step, payload)
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        # The transformers loop logs a step after on_step_end (merge into the pending trace line of that step);
        # PPO logs it before (kept here and merged when the eval of that step is made).
        if not logs or not self._is_main:
            return control
        self._last_logs = (state.global_step, dict(logs))
        if self._pending is not None and state.global_step == self._pending["step"]:
            self._merge_logs(logs)
        return control

    def _merge_logs(self, logs: Mapping[str, Any]) -> None:
        assert self._pending is not None
        for field, keys in _LOG_KEYS.items():
            if field in self._pending["fixed"]:
                continue
            for key in keys:
                value = logs.get(key)
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    self._pending["fields"][field] = float(value)
                    break

    def on_save(self, args, state, control, model=None, **kwargs):
        if self._raise_after_save:
            # PPO (TRL 1.12) ignores should_training_stop: end train() here, after the stop step's checkpoint.
            self._raise_after_save = False
            self._finish(args, state, model)
            raise EvalStopTrainingStopped(self.stopped_at or state.global_step, self.best_step, self.best_score,
                                          self.stop_reason)
        return control

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self._finish(args, state, model)
        return control

    # -- internals ---------------------------------------------------------------------------------------------------

    def _register(self) -> None:
        if self.cadence_spec is not None:  # only then: other clients' register() takes no cadence
            self.job_id = self.client.register(self.job_type, self.detector_spec, job_id=self.job_id,
                                               cadence=self.cadence_spec)
        else:
            self.job_id = self.client.register(self.job_type, self.detector_spec, job_id=self.job_id)
        self._registered = True

    def _wall(self) -> float:
        return self._wall_offset + (time.perf_counter() - self._t0)

    def _due(self, step: int, state: Any) -> bool:
        if self.stopped_at is not None or self._finished:
            return False
        if self._last_eval_step is not None and step <= self._last_eval_step:
            return False
        last = bool(state.max_steps) and step >= state.max_steps
        return step > 0 and (step % self.eval_steps == 0 or last or step == self._hinted_step)

    def _take_hint(self, step: int, decision: Decision, max_steps: int) -> None:
        """Remember the decision's cadence hint if it is sooner than the next regular eval and the budget allows."""
        self._hinted_step = None
        hint = decision.next_eval_step
        if hint is None or decision.should_stop or len(self.extra_eval_steps) >= self.max_extra_evals:
            return
        next_regular = (step // self.eval_steps + 1) * self.eval_steps
        if max_steps:
            next_regular = min(next_regular, max_steps)
        if step < hint < next_regular:
            self._hinted_step = hint

    def _report(self, args: Any, state: Any, step: int, result: EvalResult, eval_s: float) -> dict[str, Any]:
        """Main process: send the report, return the payload every rank applies. Timed as the callback's own cost."""
        t0 = time.perf_counter()
        if not isinstance(result, EvalResult):
            raise EvaluatorError(f"{type(self.evaluator).__name__}.evaluate must return an EvalResult")
        if not math.isfinite(result.score):
            raise EvaluatorError(f"{type(self.evaluator).__name__} returned a non-finite eval score {result.score} "
                                 f"at step {step}; EvalStop never decides on NaN or inf")
        if not self._registered:
            self._register()
        report = Report(self.job_id, self.job_type, step, result.score,
                        tuple(result.scores) if result.scores else None)
        decision = self.client.report(report)
        fixed: dict[str, float] = {}
        if self.trace_extras is not None:
            fixed = {k: v for k, v in dict(self.trace_extras(args, state) or {}).items() if v is not None}
        self._pending = {"step": step, "score": result.score, "scores": result.scores, "fields": dict(fixed),
                         "fixed": set(fixed), "wall_s": self._wall()}
        if self._last_logs is not None and self._last_logs[0] == step:
            self._merge_logs(self._last_logs[1])
        self.eval_seconds.append(eval_s)
        payload = {"step": step, "score": result.score, "decision": decision.to_dict()}
        self._own_time = time.perf_counter() - t0
        return payload

    def _apply(self, args: Any, state: Any, control: Any, step: int, payload: dict[str, Any] | None) -> None:
        t0 = time.perf_counter()
        shared = share_from_main(None if payload is None else {k: v for k, v in payload.items() if k != "exc"})
        if "error" in shared:
            if payload is not None and "exc" in payload:
                raise payload["exc"]
            raise RuntimeError(f"EvalStop evaluation failed on the main process at step {step}: {shared['error']}")
        decision = Decision.from_dict(shared["decision"])
        self.last_decision = decision
        self._last_eval_step = step
        score = shared["score"]
        entry = {"step": step, "eval_score": score, "declines": decision.declines, "action": decision.action.value}
        if step == self._hinted_step:
            entry["extra"] = True
            self.extra_eval_steps.append(step)
        self.history.append(entry)
        self._take_hint(step, decision, int(getattr(state, "max_steps", 0) or 0))
        if decision.best_step is not None and decision.best_step != self.best_step:
            if decision.best_step != step:
                # Only the step being evaluated can still be saved; a scheduler naming another step as best (a
                # history this run does not share) would point restore at a checkpoint that was never written.
                logger.warning("EvalStop: the scheduler names step %s as best, but this run evaluated step %s "
                               "and has no checkpoint of step %s", decision.best_step, step, decision.best_step)
            self.best_step, self.best_score = decision.best_step, decision.best_score
            if self.mode == "enforce":
                # A new best: save it now and protect it from save_total_limit rotation.
                self.best_checkpoint = mark_best(state, args.output_dir, self.best_step, self.best_score)
                control.should_save = True
        elif decision.best_step is not None and self.mode == "enforce":
            mark_best(state, args.output_dir, self.best_step, self.best_score)  # keep it set (resume, other tools)
        if decision.should_stop and self.would_stop_at is None:
            self.would_stop_at = step
            self.stop_reason = decision.reason
            if self.mode == "enforce":
                self.stopped_at = step
                control.should_training_stop = True
                control.should_save = True  # the stop step's checkpoint, for inspection and resume
                self._raise_after_save = self._is_ppo
                logger.warning("EvalStop: stopping at step %d (%s); best step %s, score %s", step, decision.reason,
                               self.best_step, self.best_score)
                if self._is_main:
                    self._wandb.on_stop(step, decision.reason, self.best_step, self.best_score)
            else:
                logger.info("EvalStop (observe): would stop at step %d (%s)", step, decision.reason)
        if self._is_main:
            self._wandb.log_eval(step, score, decision.declines, self.best_step, self.best_score,
                                 self.stopped_at is not None)
            self.overhead_seconds.append(self._own_time + (time.perf_counter() - t0))
            self._own_time = 0.0

    def _open_trace(self, args: Any, state: Any, model: Any, resuming: bool) -> None:
        kept: list[dict[str, Any]] = []
        if resuming:  # the eval lines up to the checkpoint (a crash may have cut the last line)
            kept = eval_prefix(self.trace_path, state.global_step)
        policy = unwrap_model(model) if model is not None else None
        config = {"eval_steps": self.eval_steps, "detector": self.detector_spec, "mode": self.mode,
                  **self.evaluator.describe()}
        if self.cadence_spec is not None:  # extra evals are the trace's eval lines off the eval_steps cadence
            config["cadence"] = self.cadence_spec
            config["max_extra_evals"] = self.max_extra_evals
        self._trace = TraceRecorder(
            self.trace_path, job_id=self.job_id, job_type=self.job_type, trainer=_trainer_name(args),
            model=type(policy).__name__ if policy is not None else None, planned_steps=int(state.max_steps or 0),
            world_size=world()[1], config=config,
        )
        if kept:  # a resumed run continues the trace of the checkpoint it resumed from
            self._trace.append_raw(kept)

    def _flush_trace(self, now_step: int | None = None) -> None:
        pending = self._pending
        if pending is None or (now_step is not None and now_step <= pending["step"]):
            return
        self._pending = None
        if self._trace is None or self._trace.closed:
            return
        t0 = time.perf_counter()
        self._trace.eval(pending["step"], pending["score"], eval_scores=list(pending["scores"] or []) or None,
                         wall_s=pending["wall_s"], **pending["fields"])
        if self.overhead_seconds:
            self.overhead_seconds[-1] += time.perf_counter() - t0

    def _finish(self, args: Any, state: Any, model: Any) -> None:
        """End of the run (stop or completion): restore the best weights, close the trace, tell the scheduler."""
        if self._finished:
            return
        self._finished = True
        self._flush_trace()
        if (self.mode == "enforce" and self.restore_best and self.best_step is not None and model is not None
                and self.best_step != state.global_step):
            path = self.best_checkpoint or checkpoint_dir(args.output_dir, self.best_step)
            barrier()  # rank 0 wrote the checkpoint; every rank reads it
            try:
                restore_checkpoint(unwrap_model(model), path)
            except CheckpointError:
                logger.error("EvalStop could not restore the best checkpoint (step %s)", self.best_step)
                raise
            self.restored_from = path
            logger.info("EvalStop restored the best checkpoint: step %s, score %s", self.best_step, self.best_score)
        if not self._is_main:
            return
        reason = "stopped" if self.stopped_at is not None else "completed"
        if self._trace is not None:
            self._trace.end(reason, best_step=self.best_step, best_score=self.best_score, stopped_at=self.stopped_at)
        if self._registered and self.job_id is not None:
            self.client.finish(self.job_id, reason)
