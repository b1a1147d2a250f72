"""``EvalStopPruner``: EvalStop as an Optuna pruner.

A trial's intermediate values (``trial.report(value, step)``) are its eval scores; at every ``trial.should_prune()`` the
pruner runs the scheduler core (:class:`~platform_sim.core.JobMonitor` with the chosen detector) over them in step
order and prunes when the core says STOP. The pruner keeps no state of its own: the intermediate values live in the
study's storage, so the same decision comes out in every process that shares an RDB storage (SQLite, PostgreSQL,
MySQL), after a crash, and for a trial reported from several workers.

``Trainer.hyperparameter_search(backend="optuna", pruner=EvalStopPruner(), ...)`` works with it: transformers reports
``compute_objective(metrics)`` after every evaluation and prunes the trial when the pruner says so.

Per-run error control: trials carry no planned length of their own, so the default detector tests each trial per
look unless ``planned_steps`` (the trials' planned number of steps, e.g. the objective's last step) is given; then its
false-stop rate is bounded per trial however often the trial reports (docs/reference/detectors.md).

Direction: EvalStop treats higher as better. In a study that minimizes, the intermediate values are taken as losses and
negated before the core sees them (``direction`` overrides this).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import optuna
from optuna.pruners import BasePruner
from optuna.study import StudyDirection

from platform_sim.core import Decision, JobMonitor, detector_from_spec
from platform_sim.core.boundary import check_job_type, check_planned_steps

logger = logging.getLogger(__name__)

DIRECTIONS = ("maximize", "minimize")


class EvalStopPruner(BasePruner):
    """Prune a trial when the EvalStop core stops its sequence of intermediate values.

    Args:
        detector: Detector spec of the core (a name or ``{"name": ..., "params": {...}}``); None: the project's
            default (the project's default detector, `platform_sim.core.default_spec()`).
        base: Another pruner consulted when EvalStop does not prune (e.g. ``MedianPruner``); None: EvalStop alone.
        direction: ``"maximize"`` (values are scores) or ``"minimize"`` (values are losses, negated); None: the
            study's direction.
        job_type: Job type of every trial, one of the core's job types (default ``"rlhf"``).
        planned_steps: The trials' planned number of steps (the last step an objective reports, an integer >= 1), so
            the default detector bounds its false stops per trial rather than per reported value; None: unknown
            (the per-look test).

    Raises:
        ValueError: a bad detector spec, direction, job type or planned steps.
    """

    def __init__(
        self,
        detector: str | Mapping[str, Any] | None = None,
        *,
        base: BasePruner | None = None,
        direction: str | None = None,
        job_type: str = "rlhf",
        planned_steps: int | None = None,
    ) -> None:
        if base is not None and not isinstance(base, BasePruner):
            raise TypeError(f"base must be an optuna pruner, got {type(base).__name__}")
        if direction is not None and direction not in DIRECTIONS:
            raise ValueError(f"direction must be 'maximize', 'minimize' or None, got {direction!r}")
        self.detector_spec: dict[str, Any] = detector_from_spec(
            detector
        ).spec()  # None: the default; a bad spec fails here
        self.base = base
        self.direction = direction
        self.job_type = check_job_type(job_type)
        self.planned_steps = check_planned_steps(planned_steps)

    def _sign(self, study: optuna.study.Study) -> float:
        if self.direction is not None:
            return 1.0 if self.direction == "maximize" else -1.0
        return -1.0 if study.direction == StudyDirection.MINIMIZE else 1.0

    def decision(self, study: optuna.study.Study, trial: optuna.trial.FrozenTrial) -> Decision | None:
        """The core's decision after the trial's last intermediate value (None before the first one).

        Raises:
            ValueError: a non-finite intermediate value (naming the trial and the step).
        """
        sign = self._sign(study)
        monitor = JobMonitor(
            job_id=f"trial-{trial.number}", job_type=self.job_type, detector=detector_from_spec(self.detector_spec)
        )
        decision = None
        for step in sorted(trial.intermediate_values):
            value = trial.intermediate_values[step]
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(
                    f"EvalStop: trial {trial.number} reported {value!r} at step {step}; EvalStop never "
                    "decides on a non-finite score"
                )
            decision = monitor.observe(int(step), sign * float(value), planned_steps=self.planned_steps)
            if decision.should_stop:
                break
        return decision

    def prune(self, study: optuna.study.Study, trial: optuna.trial.FrozenTrial) -> bool:
        decision = self.decision(study, trial)
        if decision is not None and decision.should_stop:
            logger.info(
                "EvalStop: pruning trial %d (%s); best step %s, value %s",
                trial.number,
                decision.reason,
                decision.best_step,
                decision.best_score,
            )
            return True
        return bool(self.base.prune(study, trial)) if self.base is not None else False
