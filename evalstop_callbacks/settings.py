"""The callback's settings: its constructor arguments, checked once, so that a bad one fails at construction.

:meth:`CallbackSettings.check` turns the arguments of :class:`~evalstop_callbacks.EvalStopCallback` into one frozen
record (the detector and cadence specs built, the budget made); the callback reads its settings from there.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from platform_sim.core import JOB_TYPES, EvalBudget, cadence_from_spec, default_spec, detector_from_spec
from platform_sim.core.checks import check_int

from .client import BoundaryClient, CadenceClient, register_takes, takes_cadence
from .evaluators import Evaluator
from .nonfinite import DEFAULT_MAX_CONSECUTIVE, check_max_consecutive

logger = logging.getLogger(__name__)

MODES: tuple[str, ...] = ("enforce", "observe")


def check_detector_args(spec: Mapping[str, Any], k: Any, min_delta: Any) -> None:
    """Warn when ``k``/``min_delta`` passed next to ``detector=`` differ from the detector's own value or the detector
    has no such parameter: the spec decides, and a value is never silently ignored.

    Args:
        spec: The detector's spec (``{"name": ..., "params": {...}}``).
        k: The callback's ``k`` argument (None: not given).
        min_delta: The callback's ``min_delta`` argument (None: not given).
    """
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


@dataclass(frozen=True)
class CallbackSettings:
    """The checked arguments of :class:`~evalstop_callbacks.EvalStopCallback`, built by :meth:`check` from them.

    The callback's arguments:
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
        max_non_finite (`int`, *optional*, defaults to 3):
            Keyword-only. NaN or inf evaluations in a row that end the run gracefully (as a stop: the best weights
            restored); fewer are recorded in `history` and not decided on (:mod:`evalstop_callbacks.nonfinite`).

    Fields: the arguments as checked; ``detector_spec`` is the built detector spec (``default_spec()`` with no
    detector, ``k`` nor ``min_delta``; the paper's ``k-decline`` with ``k``/``min_delta`` only), ``cadence_spec``
    the cadence policy's (None: fixed), ``cadence_client`` the client when a cadence is set (its ``register`` takes
    one), ``eval_budget`` the :class:`~platform_sim.core.EvalBudget` of ``max_extra_evals``/``max_eval_share``.
    """

    eval_steps: int | str | None
    k: int
    min_delta: float
    job_type: str
    mode: str
    job_id: str | None
    restore_best: bool
    trace_path: str | None
    detector_spec: dict[str, Any]
    cadence_spec: dict[str, Any] | None
    cadence_client: CadenceClient | None
    eval_budget: EvalBudget
    eval_on_start: bool
    trace_extras: Callable[[Any, Any], Mapping[str, float]] | None
    max_non_finite: int = DEFAULT_MAX_CONSECUTIVE

    @classmethod
    def check(
        cls,
        *,
        evaluator: Any,
        eval_steps: Any,
        k: Any,
        min_delta: Any,
        client: Any,
        job_id: Any,
        job_type: Any,
        mode: Any,
        restore_best: Any,
        trace_path: Any,
        detector: Any,
        trace_extras: Any,
        cadence: Any,
        max_extra_evals: Any,
        max_eval_share: Any,
        eval_on_start: Any,
        max_non_finite: Any = DEFAULT_MAX_CONSECUTIVE,
    ) -> CallbackSettings:
        """Check the callback's arguments (same names) and build the settings; raise a one-line error otherwise.

        Raises:
            TypeError: ``evaluator``, ``client`` or ``trace_extras`` is of the wrong kind.
            ValueError: Any other argument is out of range, or a cadence is given with a client that takes none.
        """
        if evaluator is not None and not isinstance(evaluator, Evaluator):
            raise TypeError(
                f"evaluator must be an evalstop_callbacks Evaluator (e.g. RewardFunctionEvaluator) or None, "
                f"got {type(evaluator).__name__}"
            )
        if eval_steps is not None and eval_steps != "epoch":
            check_int("eval_steps", eval_steps, 1)
        checked_k = check_int("k", 2 if k is None else k, 1)
        delta = 0.0 if min_delta is None else min_delta
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not math.isfinite(delta) or delta < 0:
            raise ValueError(f"min_delta must be a finite number >= 0, got {delta!r}")
        if job_type not in JOB_TYPES:
            raise ValueError(f"job_type must be one of {', '.join(JOB_TYPES)}; got {job_type!r}")
        if mode not in MODES:
            raise ValueError(f"mode must be 'enforce' or 'observe', got {mode!r}")
        if job_id is not None and (not isinstance(job_id, str) or not job_id):
            raise ValueError(f"job_id must be a non-empty string or None, got {job_id!r}")
        if not isinstance(client, BoundaryClient):
            raise TypeError(
                f"client must implement register/report/finish (BoundaryClient), got {type(client).__name__}"
            )
        if detector is None and k is None and min_delta is None:
            detector = default_spec()  # the project's default, chosen on held-out environments
        detector_spec = (
            {"name": "k-decline", "params": {"k": checked_k, "min_delta": float(delta)}}
            if detector is None
            else detector_from_spec(detector).spec()  # builds it once: a bad spec fails here, not mid-training
        )
        if detector is not None:
            check_detector_args(detector_spec, k, min_delta)
        if trace_extras is not None and not callable(trace_extras):
            raise TypeError("trace_extras must be callable(args, state) -> mapping")
        policy = cadence_from_spec(cadence)  # a bad spec fails here
        cadence_client: CadenceClient | None = None
        if policy is not None:
            if not takes_cadence(client):
                raise ValueError(
                    f"cadence hints are decided by the scheduler, but {type(client).__name__}.register takes "
                    "no cadence: pass cadence with EmbeddedClient or PlatformClient, or leave it out"
                )
            cadence_client = client
        # One budget object with the simulator, so that a budget means the same in a run and in its replay.
        budget = EvalBudget(check_int("max_extra_evals", max_extra_evals, 0), max_eval_share)
        if not isinstance(eval_on_start, bool):
            raise ValueError(f"eval_on_start must be True or False, got {eval_on_start!r}")
        return cls(
            eval_steps=eval_steps,
            k=checked_k,
            min_delta=float(delta),
            job_type=job_type,
            mode=mode,
            job_id=job_id,
            restore_best=bool(restore_best),
            trace_path=None if trace_path is None else str(trace_path),
            detector_spec=detector_spec,
            cadence_spec=policy.spec() if policy is not None else None,
            cadence_client=cadence_client,
            eval_budget=budget,
            eval_on_start=eval_on_start,
            trace_extras=trace_extras,
            max_non_finite=check_max_consecutive(max_non_finite),
        )

    def register(self, client: BoundaryClient, job_id: str | None, planned_steps: int | None = None) -> str:
        """Register the job with ``client`` (with its cadence when one is set) and return its id.

        ``planned_steps`` (the trainer's ``max_steps``) goes to a client whose ``register`` takes it
        (``PlatformClient``): the service decides with the plan a job registered, never with a report's, so without
        it a service's default would test per look where the embedded core tests per run.
        """
        extra: dict[str, Any] = {}
        if planned_steps and register_takes(client, "planned_steps"):
            extra["planned_steps"] = planned_steps
        if self.cadence_client is not None:  # only with a cadence: other clients' register() takes none
            return self.cadence_client.register(
                self.job_type, self.detector_spec, job_id=job_id, cadence=self.cadence_spec, **extra
            )
        return client.register(self.job_type, self.detector_spec, job_id=job_id, **extra)
