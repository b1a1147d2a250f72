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

from .client import BoundaryClient, CadenceClient, takes_cadence
from .evaluators import Evaluator

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
    """The checked arguments of :class:`~evalstop_callbacks.EvalStopCallback` (see its Args for their meaning).

    Args:
        eval_steps: An integer >= 1, ``"epoch"`` or None (the trainer's ``eval_strategy``).
        k: The paper rule's ``k`` (2 when not given); used only when ``detector_spec`` is that rule.
        min_delta: The paper rule's ``min_delta`` (0.0 when not given), finite and >= 0.
        job_type: One of :data:`platform_sim.core.JOB_TYPES`.
        mode: One of :data:`MODES`.
        job_id: The job's id at the scheduler, or None (the client chooses one).
        restore_best: Whether enforce mode loads the best weights back at the end.
        trace_path: Where the JSONL trace goes, or None (no trace).
        detector_spec: The detector's built spec: ``default_spec()`` with no detector, k nor min_delta; the paper's
            ``k-decline`` with ``k``/``min_delta`` only.
        cadence_spec: The cadence policy's spec, or None (fixed cadence).
        cadence_client: The client, when a cadence is set (its ``register`` takes one); else None.
        eval_budget: The limits on hinted evaluations.
        eval_on_start: Whether step 0 is evaluated before training.
        trace_extras: The callable adding research fields to the trace, or None.
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
        )
