"""``EvalStopCallback``: world-feedback early stopping inside any transformers or TRL trainer.

At step 0 (the baseline) and then every ``eval_steps`` optimizer steps (and at the last step), or per epoch, the
callback scores the live policy with its :class:`~evalstop_callbacks.evaluators.Evaluator`, sends a whitelisted
:class:`~platform_sim.core.Report` through its boundary client and applies the :class:`~platform_sim.core.Decision`:
at a new best it keeps that step's weights on disk and points ``state.best_model_checkpoint`` at them (so
``save_total_limit`` rotation keeps them); on a stop it ends training with the stop step's checkpoint saved and loads
the best weights back into the live model. Every evaluation is logged through the trainer (``evalstop/*`` keys), so
every ``report_to`` backend receives it.

The decision rule is not here: it lives in the scheduler core (``platform_sim.core``), reached through the client.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import shutil
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from platform_sim.core import (
    JOB_TYPES,
    Decision,
    EvalBudget,
    Report,
    cadence_from_spec,
    default_spec,
    detector_from_spec,
)
from platform_sim.core.checks import check_int

from .checkpoints import (
    BEST_PREFIX,
    CheckpointError,
    best_weights_dir,
    checkpoint_dir,
    mark_best,
    restore_checkpoint,
    save_best_weights,
)
from .client import BoundaryClient, CadenceClient, EmbeddedClient, takes_cadence
from .distributed import barrier, share_from_main, world
from .evaluators import EvalResult, Evaluator, EvaluatorError, MetricEvaluator, unwrap_model
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


def _check_detector_args(spec: Mapping[str, Any], k: Any, min_delta: Any) -> None:
    """``k``/``min_delta`` next to ``detector=``: the spec decides, and a warning says so whenever they differ from
    the detector's own value or the detector has no such parameter (never silently ignored)."""
    params = spec.get("params") or {}
    for name, value in (("k", k), ("min_delta", min_delta)):
        if value is None or params.get(name, object()) == value:
            continue
        if name in params:
            logger.warning(
                "EvalStopCallback: %s=%r is not used: the detector spec decides, and %r has %s=%r (set "
                "it in the spec's params)",
                name,
                value,
                spec.get("name"),
                name,
                params[name],
            )
        else:
            logger.warning(
                "EvalStopCallback: %s=%r is not used: detector %r has no %s parameter",
                name,
                value,
                spec.get("name"),
                name,
            )


def _find_trainer(callback: Any) -> Any:
    """The trainer whose callback handler holds ``callback``, found among the callers of the current event.

    Trainers call events as ``self.callback_handler.on_<event>(...)``, so the trainer is the ``self`` of a caller
    frame a few levels up. Callbacks are not handed the trainer otherwise; the callback needs it to log through
    ``trainer.callback_handler`` (every ``report_to`` backend), to save weights-only checkpoints with
    ``trainer.save_model`` and to run the step-0 evaluation of trainer metrics.
    """
    frame = inspect.currentframe()
    try:
        for _ in range(16):
            frame = frame.f_back if frame is not None else None
            if frame is None:
                return None
            obj = frame.f_locals.get("self")
            handler = getattr(obj, "callback_handler", None)
            if handler is not None and any(cb is callback for cb in getattr(handler, "callbacks", ())):
                return obj
        return None
    finally:
        del frame


def _is_rl_trainer(trainer: Any) -> bool:
    # Online RL trainers score their own samples with the reward being optimized: their eval metrics are the proxy.
    return any(hasattr(trainer, a) for a in ("reward_funcs", "value_model", "reward_model")) or type(
        trainer
    ).__name__ in ("PPOTrainer", "GRPOTrainer", "RLOOTrainer", "OnlineDPOTrainer")


def _strategy(value: Any) -> str:
    return str(getattr(value, "value", value) or "no")


class EvalStopCallback(TrainerCallback, ExportableState):
    """A [`TrainerCallback`] that stops training after ``k`` consecutive declines of a held-out world-feedback score.

    It evaluates the live model at step 0 (the baseline, before any optimizer step), then on its cadence, reports the
    score through a boundary client to the EvalStop scheduler core, and applies the decision. Works with ``Trainer``,
    ``SFTTrainer``, ``DPOTrainer``, ``GRPOTrainer``, ``RLOOTrainer`` and (through :mod:`evalstop_callbacks.ppo`) TRL
    1.12's ``PPOTrainer``. Its state (the detector's declines, the best step and checkpoint) is saved in every
    checkpoint's ``trainer_state.json`` and restored by ``trainer.train(resume_from_checkpoint=...)``.

    ``EvalStopCallback()`` with no arguments watches the trainer's own eval metric (``metric_for_best_model``, else
    ``eval_loss``) on its ``eval_dataset``, on the trainer's ``eval_strategy`` cadence. Online RL trainers (GRPO, RLOO,
    PPO) need a world evaluator: their eval metrics score the reward being optimized.

    Args:
        evaluator (`Evaluator`, *optional*):
            The world-feedback evaluator, e.g. a [`RewardFunctionEvaluator`] on held-out prompts. Generating
            evaluators run on every rank, each on its shard of the held-out set. `None`: a [`MetricEvaluator`] of the
            trainer's `metric_for_best_model` (else `"loss"`), with its `greater_is_better`.
        eval_steps (`int` or `"epoch"`, *optional*):
            Evaluate every `eval_steps` optimizer steps (`state.global_step`) and once more at the last step, or at
            every epoch end with `"epoch"`. `None`: the trainer's `eval_strategy` (`"steps"` with its `eval_steps`,
            or `"epoch"`); an error at train start if that is `"no"`.
        k (`int`, *optional*):
            Passing `k` or `min_delta` (and no `detector`) selects the paper's rule, `k-decline`: stop after `k`
            consecutive declines (integer >= 1; 2 when only `min_delta` is given). With neither, and no `detector`,
            the project's default detector decides (`platform_sim.core.default_spec()`, chosen by the held-out
            real-trace benchmark). With `detector`, the spec decides (a warning says when `k` differs from it).
        min_delta (`float`, *optional*):
            With `k-decline`: a drop counts as a decline only if it exceeds `min_delta` (the paper uses 0; 0 when only
            `k` is given). Finite, >= 0. With `detector`, the spec decides (a warning says when it differs).
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
            `"observe"` evaluates, reports and records the same way but never stops, never saves checkpoints and
            never restores weights: for shadow runs and for recording full traces (`would_stop_at` tells when
            enforce mode would have stopped).
        restore_best (`bool`, *optional*, defaults to `True`):
            In enforce mode, load the best checkpoint's weights (PEFT adapters included) into the live model when
            training stops or ends, so that the model in memory is the best one.
        trace_path (`str` or `os.PathLike`, *optional*):
            Write the run's JSONL trace (format `evalstop-trace/1`) there, from the main process.
        detector (`str` or `dict`, *optional*):
            Keyword-only. A detector spec for the scheduler core (`{"name": ..., "params": {...}}` or a name) that
            replaces the default detector (e.g. `"k-decline"` for the paper's rule).
        trace_extras (`Callable[[TrainingArguments, TrainerState], Mapping[str, float]]`, *optional*):
            Keyword-only. Called on the main process at each evaluation; its `proxy_reward`, `train_loss`, `kl`,
            `wall_s`, `gpu_s` go into the trace line (they override the values taken from the trainer's logs). Never
            sent to the scheduler.
        cadence (`str` or `dict`, *optional*):
            Keyword-only. `"adaptive"` (or `{"name": "adaptive", "params": {"fraction": ...}}`) asks the scheduler
            core for cadence hints: while a decline may have begun (the paper's rule: after a first decline; a
            detector that tests, such as the default `trend`: while its last test's p-value is below `p_hint`, 0.5 by
            default), its decisions name a `next_eval_step` sooner than the next regular evaluation, and the
            callback evaluates there too. With `confirm` in the params, a weak stop is first confirmed by such a
            sooner evaluation (`platform_sim.core.cadence.CadencePolicy`). `None` (the default) or
            `"fixed"`: every `eval_steps` only. Needs a client whose `register` takes a cadence (`EmbeddedClient`,
            `PlatformClient`: the service then decides the hints); a hint that a client's decision carries anyway is
            honoured within `max_extra_evals`.
        max_extra_evals (`int`, *optional*, defaults to 4):
            Keyword-only. At most this many evaluations per run beyond the regular ones (0: ignore hints). An extra
            evaluation is a full one: reported, checkpointed when it is a new best, and written to the trace as an
            eval line at its (off-cadence) step.
        max_eval_share (`float`, *optional*):
            Keyword-only. A time budget for hinted evaluations, on top of `max_extra_evals`: a hint is not followed
            while the evaluations so far (regular and extra, the evaluator's measured time on the main process) took
            more than this share of the run's wall time since training began (e.g. `0.1`). Strictly between 0 and 1;
            `None` (the default): no time budget. Decided on the main process and shared, so every rank takes the
            same evaluations. Evaluations run by the trainer itself (`MetricEvaluator`) are not timed by the callback
            and do not count. Both limits are one `platform_sim.core.EvalBudget`, the one the simulator applies
            (`evalstop-sim ... --max-eval-share`).
        eval_on_start (`bool`, *optional*, defaults to `True`):
            Keyword-only. Evaluate at step 0, before the first optimizer step: the baseline of the decline rule, and
            tokenizer, metric, dataset and reward-function errors raise before training starts.

    Attributes:
        history (`list[dict]`): One entry per evaluation: `step`, `eval_score`, `declines`, `action`.
        best_step, best_score: Best evaluation so far.
        best_checkpoint (`str` or `None`): Folder holding the best weights.
        stopped_at (`int` or `None`): Step at which enforce mode stopped training.
        would_stop_at (`int` or `None`): First step at which the scheduler said stop (both modes).
        restored_from (`str` or `None`): Checkpoint folder whose weights were loaded into the model.
        extra_eval_steps (`list[int]`): Steps of the evaluations made at a cadence hint (also marked `"extra"` in
            `history`).
        eval_seconds, overhead_seconds (`list[float]`): Per evaluation: the evaluator's time on this process, and the
            callback's own time (report, decision, bookkeeping, logging, trace), measured on the main process.
        save_seconds (`list[float]`): Time of each weights-only best save (``trainer.save_model``).
    """

    def __init__(
        self,
        evaluator: Evaluator | None = None,
        eval_steps: int | str | None = None,
        k: int | None = None,
        min_delta: float | None = None,
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
        max_eval_share: float | None = None,
        eval_on_start: bool = True,
    ) -> None:
        if evaluator is not None and not isinstance(evaluator, Evaluator):
            raise TypeError(
                f"evaluator must be an evalstop_callbacks Evaluator (e.g. RewardFunctionEvaluator) or None, "
                f"got {type(evaluator).__name__}"
            )
        self.evaluator: Evaluator | None = evaluator
        if eval_steps is not None and eval_steps != "epoch":
            check_int("eval_steps", eval_steps, 1)
        self.eval_steps = eval_steps
        self.k = check_int("k", 2 if k is None else k, 1)
        delta = 0.0 if min_delta is None else min_delta
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not math.isfinite(delta) or delta < 0:
            raise ValueError(f"min_delta must be a finite number >= 0, got {delta!r}")
        self.min_delta = float(delta)
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
            raise TypeError(
                f"client must implement register/report/finish (BoundaryClient), got {type(self.client).__name__}"
            )
        self.restore_best = bool(restore_best)
        self.trace_path = None if trace_path is None else str(trace_path)
        if detector is None and k is None and min_delta is None:
            detector = default_spec()  # the project's default, chosen on held-out environments (docs/real-traces.md)
        self.detector_spec: dict[str, Any] = (
            {"name": "k-decline", "params": {"k": self.k, "min_delta": self.min_delta}}
            if detector is None
            else detector_from_spec(detector).spec()  # builds it once: a bad spec fails here, not mid-training
        )
        if detector is not None:
            _check_detector_args(self.detector_spec, k, min_delta)
        if trace_extras is not None and not callable(trace_extras):
            raise TypeError("trace_extras must be callable(args, state) -> mapping")
        self.trace_extras = trace_extras
        policy = cadence_from_spec(cadence)  # a bad spec fails here
        self.cadence_spec: dict[str, Any] | None = policy.spec() if policy is not None else None
        # The client that registers the cadence: set only with a cadence, and only a client whose register takes one.
        self._cadence_client: CadenceClient | None = None
        if self.cadence_spec is not None:
            if not takes_cadence(self.client):
                raise ValueError(
                    f"cadence hints are decided by the scheduler, but {type(self.client).__name__}.register takes "
                    "no cadence: pass cadence with EmbeddedClient or PlatformClient, or leave it out"
                )
            self._cadence_client = self.client
        # One budget object with the simulator, so that a budget means the same in a run and in its replay.
        self.eval_budget = EvalBudget(check_int("max_extra_evals", max_extra_evals, 0), max_eval_share)
        self.extra_eval_steps: list[int] = []
        self._hinted_step: int | None = None
        if not isinstance(eval_on_start, bool):
            raise ValueError(f"eval_on_start must be True or False, got {eval_on_start!r}")
        self.eval_on_start = eval_on_start

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
        self.save_seconds: list[float] = []

        self._cadence: tuple[str, int] = ("steps", 0)
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
        self._eval_offset = 0.0  # evaluator seconds before a resume (eval_seconds holds this process's since)
        self._own_time = 0.0
        self._last_logs: tuple[int, dict[str, Any]] | None = None
        self._trainer_ref: Callable[[], Any] = lambda: None
        self._emitting = False
        self._saves_before = 0.0
        self._epoch_eval_at: int | None = None
        self._metrics_at: tuple[int, dict[str, Any]] | None = None

    # -- ExportableState: saved into trainer_state.json with every checkpoint --------------------------------------

    def state(self) -> dict[str, Any]:
        save = getattr(self.client, "state_dict", None)  # optional: clients that keep local state offer it
        client_state = save() if callable(save) else None
        return {
            "args": {
                "eval_steps": self.eval_steps,
                "job_id": self.job_id,
                "job_type": self.job_type,
                "mode": self.mode,
                "restore_best": self.restore_best,
                "trace_path": self.trace_path,
                "detector": self.detector_spec,
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
                    "eval_s": self._eval_time(),
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
        self._eval_offset = float(saved.get("eval_s") or 0.0)
        client_state = saved.get("client_state")
        load = getattr(self.client, "load_state_dict", None)
        if client_state is not None and callable(load):
            load(client_state)
        logger.info(
            "EvalStop resumed job %s: %d evals, best step %s, declines %s",
            self.job_id,
            len(self.history),
            self.best_step,
            self.history[-1]["declines"] if self.history else 0,
        )

    # -- events ------------------------------------------------------------------------------------------------------

    def on_init_end(self, args, state, control, **kwargs):
        if getattr(args, "restore_callback_states_from_checkpoint", False):
            # transformers would rebuild the callback from JSON args, without its evaluator and client.
            raise ValueError(
                "EvalStopCallback restores its own state from the checkpoint; leave "
                "restore_callback_states_from_checkpoint=False (the default): transformers would rebuild the "
                "callback without its evaluator"
            )
        trainer = _find_trainer(self)
        if trainer is not None:
            self._trainer_ref = weakref.ref(trainer)
            self._resolve_evaluator(args, trainer)  # a callback that cannot work fails when the trainer is built

    def _trainer(self) -> Any:
        return self._trainer_ref()

    def _resolve_evaluator(self, args: Any, trainer: Any) -> None:
        """Choose the trainer-metric evaluator of ``EvalStopCallback()`` and check what it needs (one-line errors)."""
        name = type(trainer).__name__ if trainer is not None else "the trainer"
        if self.evaluator is None:
            if trainer is None:
                raise ValueError(
                    "EvalStopCallback() without an evaluator needs a transformers Trainer (it watches "
                    "the trainer's eval metric); pass an evaluator"
                )
            if _is_rl_trainer(trainer):
                raise ValueError(
                    f"EvalStopCallback() needs a world evaluator on {name}: its own eval metrics score the reward "
                    "it optimizes; pass e.g. EvalStopCallback(RewardFunctionEvaluator(heldout_prompts, gold_fn), "
                    "eval_steps=10)"
                )
            metric = getattr(args, "metric_for_best_model", None)
            gib = getattr(args, "greater_is_better", None) if metric else False
            self.evaluator = MetricEvaluator(metric or "loss", gib)
        if self.evaluator.uses_trainer_metrics and trainer is not None:
            if _is_rl_trainer(trainer) and hasattr(trainer, "value_model"):
                raise ValueError(
                    f"{type(self.evaluator).__name__} reads trainer.evaluate() metrics, which {name} "
                    "does not produce; pass a world evaluator (e.g. RewardFunctionEvaluator)"
                )
            if getattr(trainer, "eval_dataset", None) is None:
                raise ValueError(
                    f"{type(self.evaluator).__name__}({getattr(self.evaluator, 'metric', '')!r}) reads "
                    f"the trainer's eval metrics, but {name} has no eval_dataset; pass eval_dataset= "
                    "to the trainer or a world evaluator to the callback"
                )
        if self.eval_steps is None and _strategy(getattr(args, "eval_strategy", "no")) == "no":
            raise ValueError(
                "EvalStopCallback has no cadence: pass eval_steps=N (or 'epoch'), or set the trainer's "
                "eval_strategy to 'steps' or 'epoch'"
            )

    def _resolve_cadence(self, args: Any, state: Any) -> tuple[str, int]:
        if isinstance(self.eval_steps, int):
            return ("steps", self.eval_steps)
        if self.eval_steps == "epoch":
            return ("epoch", 0)
        assert self.evaluator is not None
        strategy = _strategy(getattr(args, "eval_strategy", "no"))
        if self.evaluator.uses_trainer_metrics:
            return ("trainer", 0)  # every evaluation the trainer makes on its own schedule
        if strategy == "epoch":
            return ("epoch", 0)
        n = getattr(state, "eval_steps", None) or getattr(args, "eval_steps", None)
        if strategy != "steps" or not n:
            raise ValueError(
                "EvalStopCallback has no cadence: pass eval_steps=N (or 'epoch'), or set the trainer's "
                "eval_strategy to 'steps' or 'epoch'"
            )
        return ("steps", int(n))

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        if self._trainer() is None:
            trainer = _find_trainer(self)  # added with trainer.add_callback after the trainer was built
            if trainer is not None:
                self._trainer_ref = weakref.ref(trainer)
        self._resolve_evaluator(args, self._trainer())
        assert self.evaluator is not None
        self._cadence = self._resolve_cadence(args, state)
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
                saved = next(
                    (s for s in saved if s.get("attributes", {}).get("evalstop", {}).get("job_id") == self.job_id),
                    saved[0],
                )
            if saved and "evalstop" in saved.get("attributes", {}):
                self._load_saved(saved["attributes"]["evalstop"])
        if self.mode == "enforce" and getattr(args, "load_best_model_at_end", False):
            logger.warning(
                "EvalStop keeps and restores its own best checkpoint (by the world score); "
                "load_best_model_at_end with metric_for_best_model competes for state.best_model_checkpoint"
            )
        self._t0 = time.perf_counter()
        if self._is_main:
            self._register()
            self._wandb = WandbLogger(reports_to(args, "wandb"))
            if self.trace_path is not None:
                self._open_trace(args, state, model, resuming)
        self._pending = None
        logger.info(
            "EvalStop job %s: cadence %s, detector %s, mode %s",
            self.job_id,
            self._cadence,
            self.detector_spec,
            self.mode,
        )
        if self.eval_on_start and not resuming and self._last_eval_step is None:
            self._baseline(args, state, control, model, processing_class)

    def _baseline(self, args: Any, state: Any, control: Any, model: Any, processing_class: Any) -> None:
        """Step 0: the score before any optimizer step, so that a broken evaluation fails before training."""
        assert self.evaluator is not None
        if not self.evaluator.uses_trainer_metrics:
            self._evaluate_now(args, state, control, 0, model, processing_class)
            return
        trainer = self._trainer()
        if getattr(args, "eval_on_start", False):
            return  # the trainer evaluates at step 0 itself, right after on_train_begin; on_evaluate reports it
        if trainer is None:
            logger.warning("EvalStop: no trainer found, so no step-0 evaluation of the trainer's metrics")
            return
        trainer.evaluate()  # on_evaluate reports step 0 (and raises on a metric that does not exist)

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        step = state.global_step
        self._flush_trace(step)
        if self._cadence[0] != "steps" or not self._due(step, state):
            return control
        if self.evaluator.uses_trainer_metrics:
            control.should_evaluate = True  # the report happens in on_evaluate, with the trainer's metrics
            return control
        self._evaluate_now(args, state, control, step, model, processing_class)
        return control

    def on_epoch_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        step = state.global_step
        if self._cadence[0] != "epoch" or not self._due(step, state, any_step=True):
            return control
        if self.evaluator.uses_trainer_metrics:
            self._epoch_eval_at = step
            control.should_evaluate = True
            return control
        self._evaluate_now(args, state, control, step, model, processing_class)
        return control

    def _evaluate_now(self, args: Any, state: Any, control: Any, step: int, model: Any, tok: Any) -> None:
        """Evaluate (on every rank for sharding evaluators, else on the main process), report, apply everywhere."""
        assert self.evaluator is not None
        every_rank = self.evaluator.shards and world()[1] > 1
        result: EvalResult | None = None
        error: BaseException | None = None
        eval_s = 0.0
        if every_rank or self._is_main:
            t_eval = time.perf_counter()
            try:
                result = self.evaluator.evaluate(unwrap_model(model), tok)
            except Exception as exc:  # noqa: BLE001 - named with the step, raised on every rank below
                error = _at_step(exc, step)
            eval_s = time.perf_counter() - t_eval
            self.eval_seconds.append(eval_s)
        if every_rank and error is not None:
            raise error  # the evaluator gathered the failure: every rank raises it at this step, none waits
        payload: dict[str, Any] | None = None
        if self._is_main:
            if error is not None:
                payload = {"error": f"{type(error).__name__}: {error}", "exc": error}
            else:
                try:
                    payload = self._report(args, state, step, result, eval_s)
                except Exception as exc:  # noqa: BLE001 - shared with every rank below, then raised everywhere
                    payload = {"error": f"{type(exc).__name__}: {exc}", "exc": exc}
        self._apply(args, state, control, step, payload)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if self._emitting or self.evaluator is None or not self.evaluator.uses_trainer_metrics:
            return control
        step = state.global_step
        due = (self._last_eval_step is None or step > self._last_eval_step) and (
            (step == 0 and self.eval_on_start)
            or self._cadence[0] == "trainer"
            or self._epoch_eval_at == step
            or (self._cadence[0] == "steps" and self._due(step, state))
        )
        if not due or self.stopped_at is not None or self._finished:
            return control
        # A dict eval_dataset gives one on_evaluate per dataset, each with its own eval_<name>_* metrics.
        if self._metrics_at is None or self._metrics_at[0] != step:
            self._metrics_at = (step, {})
        seen = self._metrics_at[1]
        seen.update(metrics or {})
        evaluator = self.evaluator
        if hasattr(evaluator, "key") and evaluator.key(seen) is None and not self._all_datasets_seen(seen):
            return control  # the metric belongs to a dataset evaluated next
        try:
            result = evaluator.from_metrics(seen)
        except Exception as exc:  # noqa: BLE001 - trainer metrics are the same on every rank: all raise here
            raise _at_step(exc, step) from exc
        payload: dict[str, Any] | None = None
        if self._is_main:
            try:
                payload = self._report(args, state, step, result, 0.0)
            except Exception as exc:  # noqa: BLE001
                payload = {"error": f"{type(exc).__name__}: {exc}", "exc": exc}
        self._apply(args, state, control, step, payload)
        return control

    def _all_datasets_seen(self, metrics: Mapping[str, Any]) -> bool:
        eval_dataset = getattr(self._trainer(), "eval_dataset", None)
        if not isinstance(eval_dataset, Mapping):
            return True
        return all(any(k.startswith(f"eval_{name}_") for k in metrics) for name in eval_dataset)

    def on_log(self, args, state, control, logs=None, **kwargs):
        # The transformers loop logs a step after on_step_end (merge into the pending trace line of that step);
        # PPO logs it before (kept here and merged when the eval of that step is made).
        if not logs or not self._is_main or self._emitting:
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
            raise EvalStopTrainingStopped(
                self.stopped_at or state.global_step, self.best_step, self.best_score, self.stop_reason
            )
        return control

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self._finish(args, state, model)
        return control

    # -- internals ---------------------------------------------------------------------------------------------------

    def _register(self) -> None:
        if self._cadence_client is not None:  # only with a cadence: other clients' register() takes none
            self.job_id = self._cadence_client.register(
                self.job_type, self.detector_spec, job_id=self.job_id, cadence=self.cadence_spec
            )
        else:
            self.job_id = self.client.register(self.job_type, self.detector_spec, job_id=self.job_id)
        self._registered = True

    def _wall(self) -> float:
        return self._wall_offset + (time.perf_counter() - self._t0)

    def _eval_time(self) -> float:
        return self._eval_offset + math.fsum(self.eval_seconds)

    @property
    def max_extra_evals(self) -> int:
        """The budget's count of hinted evaluations (see the class Args)."""
        n = self.eval_budget.max_extra_evals
        assert n is not None  # always set by __init__
        return n

    @property
    def max_eval_share(self) -> float | None:
        """The budget's share of time for evaluating (see the class Args)."""
        return self.eval_budget.max_eval_share

    def _hint_allowed(self, step: int) -> bool:
        """Main process: whether the budget leaves room for one more hinted evaluation after the eval of ``step``
        (which counts as extra when it was hinted). Measured times, so decided here and shared with every rank."""
        extra = len(self.extra_eval_steps) + (step == self._hinted_step)
        return self.eval_budget.allows(extra, self._eval_time(), self._wall())

    def _due(self, step: int, state: Any, any_step: bool = False) -> bool:
        if self.stopped_at is not None or self._finished:
            return False
        if self._last_eval_step is not None and step <= self._last_eval_step:
            return False
        if any_step:
            return step > 0
        last = bool(state.max_steps) and step >= state.max_steps
        return step > 0 and (step % self._cadence[1] == 0 or last or step == self._hinted_step)

    def _take_hint(self, step: int, decision: Decision, max_steps: int, allowed: bool = True) -> None:
        """Remember the decision's cadence hint if it is sooner than the next regular eval and the budget allows
        (``allowed``: the main process's :meth:`_hint_allowed`, shared with every rank)."""
        self._hinted_step = None
        hint = decision.next_eval_step
        interval = self._cadence[1] if self._cadence[0] == "steps" else 0
        if hint is None or not interval or decision.should_stop:
            return
        if not allowed:
            logger.debug("EvalStop: hint to evaluate at step %s not followed: the eval budget is spent", hint)
            return
        next_regular = (step // interval + 1) * interval
        if max_steps:
            next_regular = min(next_regular, max_steps)
        if step < hint < next_regular:
            self._hinted_step = hint

    def _report(self, args: Any, state: Any, step: int, result: EvalResult | None, eval_s: float) -> dict[str, Any]:
        """Main process: send the report, return the payload every rank applies. Timed as the callback's own cost."""
        t0 = time.perf_counter()
        if not isinstance(result, EvalResult):
            raise EvaluatorError(f"{type(self.evaluator).__name__}.evaluate must return an EvalResult (at step {step})")
        if not math.isfinite(result.score):
            raise EvaluatorError(
                f"{type(self.evaluator).__name__} returned a non-finite eval score {result.score} "
                f"at step {step}; EvalStop never decides on NaN or inf"
            )
        if not self._registered:
            self._register()
        if self.job_id is None:
            raise RuntimeError("EvalStop: the client returned no job id at registration")
        report = Report(self.job_id, self.job_type, step, result.score, tuple(result.scores) if result.scores else None)
        decision = self.client.report(report)
        fixed: dict[str, float] = {}
        if self.trace_extras is not None:
            fixed = {k: v for k, v in dict(self.trace_extras(args, state) or {}).items() if v is not None}
        self._pending = {
            "step": step,
            "score": result.score,
            "scores": result.scores,
            "fields": dict(fixed),
            "fixed": set(fixed),
            "wall_s": self._wall(),
        }
        if self._last_logs is not None and self._last_logs[0] == step:
            self._merge_logs(self._last_logs[1])
        payload = {
            "step": step,
            "score": result.score,
            "decision": decision.to_dict(),
            "hint_allowed": self._hint_allowed(step),
        }
        self._own_time = time.perf_counter() - t0
        return payload

    def _apply(self, args: Any, state: Any, control: Any, step: int, payload: dict[str, Any] | None) -> None:
        t0 = time.perf_counter()
        self._saves_before = sum(self.save_seconds)  # the weights-only save is timed apart (save_seconds)
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
        self._take_hint(
            step, decision, int(getattr(state, "max_steps", 0) or 0), bool(shared.get("hint_allowed", True))
        )
        stopping = decision.should_stop and self.would_stop_at is None
        if decision.best_step is not None and decision.best_step != self.best_step:
            if decision.best_step != step:
                # Only the step being evaluated can still be saved; a scheduler naming another step as best (a
                # history this run does not share) would point restore at a checkpoint that was never written.
                logger.warning(
                    "EvalStop: the scheduler names step %s as best, but this run evaluated step %s "
                    "and has no checkpoint of step %s",
                    decision.best_step,
                    step,
                    decision.best_step,
                )
            self.best_step, self.best_score = decision.best_step, decision.best_score
            if self.mode == "enforce":
                self._keep_best(args, state, control, step, stopping and self.mode == "enforce")
        elif (
            decision.best_step is not None
            and self.best_step is not None
            and self.mode == "enforce"
            and self.best_checkpoint is not None
        ):
            # keep it set (resume, other tools, the trainer's own best-metric bookkeeping)
            mark_best(state, self.best_checkpoint, self.best_step, self._metric(self.best_score))
        if stopping:
            self.would_stop_at = step
            self.stop_reason = decision.reason
            if self.mode == "enforce":
                self.stopped_at = step
                control.should_training_stop = True
                control.should_save = True  # the stop step's full checkpoint, for inspection and resume
                self._raise_after_save = self._is_ppo
                logger.warning(
                    "EvalStop: stopping at step %d (%s); best step %s, score %s",
                    step,
                    decision.reason,
                    self.best_step,
                    self.best_score,
                )
                if self._is_main:
                    self._wandb.on_stop(step, decision.reason, self.best_step, self.best_score)
            else:
                logger.info("EvalStop (observe): would stop at step %d (%s)", step, decision.reason)
        logs: dict[str, float] = {
            "evalstop/eval_score": score,
            "evalstop/declines": decision.declines,
            "evalstop/stopped": int(self.stopped_at is not None),
        }
        if self.best_score is not None and self.best_step is not None:
            logs["evalstop/best_score"] = self.best_score
            logs["evalstop/best_step"] = self.best_step
        if stopping:
            logs["evalstop/stop_step"] = step  # the stop event (in observe mode: where enforce would stop)
        self._log(args, state, control, logs)
        if self._is_main:
            saved = sum(self.save_seconds) - self._saves_before
            self.overhead_seconds.append(self._own_time + (time.perf_counter() - t0) - saved)
            self._own_time = 0.0

    def _metric(self, score: float | None) -> float:
        assert self.evaluator is not None and score is not None
        return float(self.evaluator.to_metric(score))

    def _keep_best(self, args: Any, state: Any, control: Any, step: int, stopping: bool) -> None:
        """Keep the new best step's weights on disk and point ``state.best_model_checkpoint`` at them.

        If the step is saved anyway (the trainer's own schedule, or the stop), the Trainer's full checkpoint folder
        is the best one. Otherwise the weights alone go to ``evalstop-best-<step>`` (no optimizer state), replacing
        the previous such folder.
        """
        trainer = self._trainer()
        previous = self.best_checkpoint
        if control.should_save or stopping or trainer is None or not callable(getattr(trainer, "save_model", None)):
            if step == 0:
                logger.warning("EvalStop: no trainer to save the step-0 weights with; restore cannot go back to them")
                return
            path = checkpoint_dir(args.output_dir, step)
            control.should_save = True
            if (
                previous
                and os.path.basename(previous).startswith(BEST_PREFIX + "-")
                and self._is_main
                and os.path.isdir(previous)
            ):
                shutil.rmtree(previous, ignore_errors=True)
        else:
            path = best_weights_dir(args.output_dir, step)
            t0 = time.perf_counter()
            save_best_weights(trainer, path, previous)
            self.save_seconds.append(time.perf_counter() - t0)
        self.best_checkpoint = mark_best(state, path, step, self._metric(self.best_score))

    def _log(self, args: Any, state: Any, control: Any, logs: dict[str, float]) -> None:
        """Into the trainer's logs, as ``Trainer.log`` does: ``log_history`` and every callback's ``on_log``.

        Every ``report_to`` backend (TensorBoard, wandb, MLflow, ...) is a callback of the trainer, so each receives
        the ``evalstop/*`` keys at the evaluation's ``global_step``.
        """
        if getattr(state, "epoch", None) is not None:
            logs = {**logs, "epoch": state.epoch}
        state.log_history.append({**logs, "step": state.global_step})
        handler = getattr(self._trainer(), "callback_handler", None)
        if handler is None:
            return
        self._emitting = True
        should_log = control.should_log  # the handler resets it; the trainer's own log of this step must still run
        try:
            handler.on_log(args, state, control, dict(logs))
        finally:
            self._emitting = False
            control.should_log = should_log

    def _open_trace(self, args: Any, state: Any, model: Any, resuming: bool) -> None:
        kept: list[dict[str, Any]] = []
        if resuming:  # the eval lines up to the checkpoint (a crash may have cut the last line)
            kept = eval_prefix(self.trace_path, state.global_step)
        policy = unwrap_model(model) if model is not None else None
        assert self.evaluator is not None
        config = {
            "eval_steps": self.eval_steps if self.eval_steps is not None else self._cadence[1] or self._cadence[0],
            "detector": self.detector_spec,
            "mode": self.mode,
            **self.evaluator.describe(),
        }
        if self.cadence_spec is not None:  # extra evals are the trace's eval lines off the eval_steps cadence
            config["cadence"] = self.cadence_spec
            config["max_extra_evals"] = self.max_extra_evals
            if self.max_eval_share is not None:
                config["max_eval_share"] = self.max_eval_share
        if self.trace_path is None or self.job_id is None:
            raise RuntimeError("EvalStop: a trace needs trace_path and a registered job id")
        self._trace = TraceRecorder(
            self.trace_path,
            job_id=self.job_id,
            job_type=self.job_type,
            trainer=_trainer_name(args),
            model=type(policy).__name__ if policy is not None else None,
            planned_steps=int(state.max_steps or 0),
            world_size=world()[1],
            config=config,
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
        self._trace.eval(
            pending["step"],
            pending["score"],
            eval_scores=list(pending["scores"] or []) or None,
            wall_s=pending["wall_s"],
            **pending["fields"],
        )
        if self.overhead_seconds:
            self.overhead_seconds[-1] += time.perf_counter() - t0

    def _finish(self, args: Any, state: Any, model: Any) -> None:
        """End of the run (stop or completion): restore the best weights, close the trace, tell the scheduler."""
        if self._finished:
            return
        self._finished = True
        self._flush_trace()
        if (
            self.mode == "enforce"
            and self.restore_best
            and self.best_step is not None
            and model is not None
            and self.best_step != state.global_step
            and self.best_checkpoint is not None
        ):
            path = self.best_checkpoint
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


def _at_step(exc: BaseException, step: int) -> BaseException:
    """``exc`` with the evaluation step in its message (an :class:`EvaluatorError`, chained to the original)."""
    if f"at step {step}" in str(exc):
        return exc
    what = str(exc) if isinstance(exc, EvaluatorError) else f"{type(exc).__name__}: {exc}"
    new = EvaluatorError(f"EvalStop evaluation at step {step} failed: {what}")
    new.__cause__ = exc
    return new
