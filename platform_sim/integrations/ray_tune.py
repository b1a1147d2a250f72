"""``EvalStopScheduler``: EvalStop as a Ray Tune trial scheduler that wraps any base scheduler.

Each trial is one job of the scheduler core. Every result a trial reports goes through the trial's
:class:`~platform_sim.core.JobMonitor` with the chosen detector; when the core says STOP, the trial is stopped (Tune
frees its resources and the base scheduler picks the next trial), otherwise the base scheduler decides as it would
alone. This is the wrapper of the EvalStop paper (a stop policy around FIFO/SJF/SRTF), with a Tune scheduler as the
base: FIFO by default, or ASHA, HyperBand, PBT.

What is read from a result: the step (``step_attr``, default ``"step"``), the eval score (``metric``, default
``"eval_score"``) and, when present, the per-example scores (``scores_attr``, default ``"eval_scores"``). These are the
fields of the core's :class:`~platform_sim.core.Report`; every other key of the result (losses, proxy rewards, Tune's
own bookkeeping) is ignored by EvalStop. A result without the eval score is left to the base scheduler alone.

Per-run error control: the default detector bounds its false stops per trial, however often the trial reports, when
it knows the trial's planned number of steps: a result's ``planned_steps`` key (``TuneClient`` sends the trainer's
``max_steps``), else the scheduler's ``planned_steps`` (the same for every trial, in ``step_attr``'s units, e.g.
``max_t`` of an ASHA base counted in steps); without either it tests per look (docs/reference/detectors.md).

State: every eval the scheduler takes is appended, as one JSON line, to a log in the experiment's driver folder
(a header line names the detector), so Tune's experiment checkpoint carries it; when ``Tuner.restore`` adds the
restored trials, the scheduler replays the log through fresh monitors, which rebuilds exactly the state it had (the
core is a deterministic function of the evals it saw). Appending keeps the cost of a result constant however many
trials and evals the experiment has. A trial that re-reports an
older step with another score (restored from an older checkpoint, or a PBT exploit) has its history cut back to the
evals before that step and continues from there.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from platform_sim.core import ConflictError, Decision, InvalidReportError, JobMonitor, detector_from_spec
from platform_sim.core.boundary import check_job_type, check_planned_steps

if TYPE_CHECKING:  # pragma: no cover
    from ray.tune.experiment import Trial

logger = logging.getLogger(__name__)

STATE_FORMAT = "evalstop-tune-scheduler/1"
LOG_FORMAT = "evalstop-tune-scheduler-log/1"
PLANNED_KEY = "planned_steps"
"""Result key of a trial's planned number of steps (the boundary field's name; ``TuneClient`` sends it)."""
LOG_FILE = "evalstop-scheduler-log.jsonl"
"""Name of the scheduler's log in the experiment folder (next to Tune's own ``experiment_state-*.json``)."""


class EvalStopScheduler(TrialScheduler):
    """A Ray Tune ``TrialScheduler`` that stops trials whose eval score declines and defers everything else to a base.

    Args:
        base: The scheduler that orders and otherwise stops trials (default: a new ``FIFOScheduler``). ASHA, HyperBand
            and PBT work; configure their own metric and mode as usual.
        metric: Result key of the eval score (higher is better; finite).
        step_attr: Result key of the training step of the evaluated checkpoint (an integer >= 0, strictly increasing
            per trial). Use ``"training_iteration"`` for trainables that report once per eval without a step.
        scores_attr: Result key of the per-example scores (a list of numbers), read when present; None never reads
            them.
        detector: Detector spec of the core (a name or ``{"name": ..., "params": {...}}``); None: the project's
            default (the project's default detector, `platform_sim.core.default_spec()`).
        job_type: Job type of every trial, one of the core's job types (default ``"rlhf"``).
        persist: Log every eval into the experiment folder, so that ``Tuner.restore`` resumes the state (default
            True).
        planned_steps: The trials' planned number of steps (in ``step_attr``'s units, an integer >= 1), so the
            default detector bounds its false stops per trial rather than per result; a result's own
            ``planned_steps`` key wins. None: unknown (the per-look test) unless the results carry it. Part of the
            saved state: a restore must use the same value.

    Raises:
        ValueError: a bad detector spec, job type, key name or planned steps.
    """

    def __init__(
        self,
        base: TrialScheduler | None = None,
        *,
        metric: str = "eval_score",
        step_attr: str = "step",
        scores_attr: str | None = "eval_scores",
        detector: str | Mapping[str, Any] | None = None,
        job_type: str = "rlhf",
        persist: bool = True,
        planned_steps: int | None = None,
    ) -> None:
        super().__init__()
        if base is not None and not isinstance(base, TrialScheduler):
            raise TypeError(f"base must be a ray.tune TrialScheduler, got {type(base).__name__}")
        for name, value in (("metric", metric), ("step_attr", step_attr)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty result key, got {value!r}")
        if scores_attr is not None and (not isinstance(scores_attr, str) or not scores_attr):
            raise ValueError(f"scores_attr must be a non-empty result key or None, got {scores_attr!r}")
        self.base: TrialScheduler = base if base is not None else FIFOScheduler()
        self.eval_metric = metric
        self.step_attr = step_attr
        self.scores_attr = scores_attr
        self.detector_spec: dict[str, Any] = detector_from_spec(
            detector
        ).spec()  # None: the default; a bad spec fails here
        self.job_type = check_job_type(job_type)
        self.persist = bool(persist)
        self.planned_steps = check_planned_steps(planned_steps)  # its refusal is a ValueError
        self._monitors: dict[str, JobMonitor] = {}
        # The evals each trial reported (step, score, per-example scores), to rebuild a monitor when a trial goes back.
        self._history: dict[str, list[tuple[int, float, list[float] | None]]] = {}
        self._plans: dict[str, int] = {}  # the planned steps a trial's own results carried (PLANNED_KEY)
        self._stops: dict[str, Decision] = {}
        self._finished: dict[str, str] = {}
        self._warned_missing: set[str] = set()
        self._state_dir: str | None = None
        self._restore_checked: set[str] = set()

    # -- what Tune asks of a scheduler, forwarded to the base ------------------------------------------------------

    @property
    def metric(self) -> str | None:
        # Tune checks that every result holds the scheduler's metric; that is the base's business. EvalStop itself
        # tolerates results without its eval score (they go to the base alone).
        return self.base.metric

    @property
    def supports_buffered_results(self) -> bool:
        return self.base.supports_buffered_results

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        return self.base.set_search_properties(metric, mode, **spec)

    def on_trial_add(self, tune_controller: Any, trial: Trial) -> None:
        self._maybe_restore(trial)
        self.base.on_trial_add(tune_controller, trial)

    def on_trial_error(self, tune_controller: Any, trial: Trial) -> None:
        self._finished[trial.trial_id] = "error"
        self.base.on_trial_error(tune_controller, trial)

    def on_trial_complete(self, tune_controller: Any, trial: Trial, result: dict) -> None:
        self._finished[trial.trial_id] = "stopped" if trial.trial_id in self._stops else "completed"
        self.base.on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller: Any, trial: Trial) -> None:
        self.base.on_trial_remove(tune_controller, trial)

    def choose_trial_to_run(self, tune_controller: Any) -> Trial | None:
        return self.base.choose_trial_to_run(tune_controller)

    def debug_string(self) -> str:
        return (
            f"{self.base.debug_string()}\nEvalStop ({self.detector_spec['name']}): stopped {len(self._stops)} of "
            f"{len(self._monitors)} trials that reported '{self.eval_metric}'."
        )

    # -- the decision ----------------------------------------------------------------------------------------------

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: dict) -> str:
        """EvalStop's decision on this result; the base's decision when EvalStop does not stop the trial.

        Raises:
            ValueError: the result holds the eval score but no valid step, or a non-finite score (naming the trial).
        """
        if self.eval_metric not in result:
            if trial.trial_id not in self._warned_missing:
                self._warned_missing.add(trial.trial_id)
                logger.warning(
                    "EvalStop: trial %s reported a result without %r; EvalStop decides only on results that carry it",
                    trial.trial_id,
                    self.eval_metric,
                )
            return self.base.on_trial_result(tune_controller, trial, result)
        decision = self.observe(trial.trial_id, result)
        if decision.should_stop:
            # The base is not consulted: a PBT or HyperBand step on a trial that is being stopped would act on the
            # controller for nothing. It hears of the trial again in on_trial_complete.
            return TrialScheduler.STOP
        return self.base.on_trial_result(tune_controller, trial, result)

    def observe(self, trial_id: str, result: Mapping[str, Any], *, log: bool = True) -> Decision:
        """Feed the boundary fields of one result of ``trial_id`` to its monitor and return the core's decision.

        Raises:
            ValueError: no valid step, or a bad score (the core's message, naming the trial).
        """
        if self.step_attr not in result:
            raise ValueError(
                f"EvalStop: trial {trial_id} reported {self.eval_metric!r} without the step key "
                f"{self.step_attr!r}; report it, or build the scheduler with "
                "step_attr='training_iteration'"
            )
        step, score = result[self.step_attr], result[self.eval_metric]
        scores = result.get(self.scores_attr) if self.scores_attr is not None else None
        own_plan = result.get(PLANNED_KEY)
        plan = self._plans.get(trial_id, self.planned_steps) if own_plan is None else own_plan
        monitor = self._monitors.get(trial_id)
        if monitor is None:
            monitor = self._monitors[trial_id] = self._new_monitor(trial_id)
            self._history[trial_id] = []
        try:
            try:
                decision = monitor.observe(step, score, scores, planned_steps=plan)
            except ConflictError:
                monitor = self._rewind(trial_id, int(step))
                decision = monitor.observe(step, score, scores, planned_steps=plan)
        except InvalidReportError as exc:
            raise ValueError(f"EvalStop: trial {trial_id}: {exc}") from None
        if own_plan is not None:
            self._plans[trial_id] = int(own_plan)  # checked by the monitor
        if scores is not None:
            scores = [float(v) for v in scores]  # validated by the monitor: finite numbers
        if log:
            own = {} if own_plan is None else {PLANNED_KEY: int(own_plan)}
            self._log({"trial": trial_id, "step": int(step), "score": float(score), "scores": scores, **own})
        history = self._history[trial_id]
        if not history or history[-1][0] < monitor.steps[-1]:
            history.append((monitor.steps[-1], monitor.scores[-1], scores))
        if decision.should_stop and trial_id not in self._stops:
            self._stops[trial_id] = decision
            logger.info(
                "EvalStop: stopping trial %s at step %s (%s); best step %s, score %s",
                trial_id,
                monitor.stopped_at,
                decision.reason,
                decision.best_step,
                decision.best_score,
            )
        elif not decision.should_stop and trial_id in self._stops:
            del self._stops[trial_id]  # rewound to before its stop
        return decision

    def _new_monitor(self, trial_id: str) -> JobMonitor:
        return JobMonitor(job_id=trial_id, job_type=self.job_type, detector=detector_from_spec(self.detector_spec))

    def _rewind(self, trial_id: str, step: int) -> JobMonitor:
        """Rebuild the trial's monitor from its evals before ``step`` (the trial went back to an older checkpoint)."""
        kept = [h for h in self._history[trial_id] if h[0] < step]
        logger.info(
            "EvalStop: trial %s went back to step %s; its history restarts from %d evals", trial_id, step, len(kept)
        )
        monitor = self._new_monitor(trial_id)
        plan = self._plans.get(trial_id, self.planned_steps)
        for s, v, per in kept:
            monitor.observe(s, v, per, planned_steps=plan)
        self._monitors[trial_id] = monitor
        self._history[trial_id] = list(kept)
        return monitor

    # -- what the experiment did -------------------------------------------------------------------------------------

    def monitor(self, trial_id: str) -> JobMonitor:
        """The core's view of one trial (read it, do not mutate it). Raises ``KeyError`` for an unknown trial."""
        return self._monitors[trial_id]

    @property
    def stopped_trials(self) -> dict[str, Decision]:
        """Trials EvalStop stopped: trial id -> the stop decision (its best step and score included)."""
        return dict(self._stops)

    def best(self, trial_id: str) -> tuple[int | None, float | None]:
        """``(best_step, best_score)`` of a trial: the checkpoint to keep (highest score, earliest on ties)."""
        m = self._monitors[trial_id]
        return m.best_step, m.best_score

    # -- persistence -----------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The whole state as plain JSON-serializable data."""
        return {
            "format": STATE_FORMAT,
            "detector": self.detector_spec,
            "job_type": self.job_type,
            **self._plan_field(),
            "trials": {
                tid: {
                    "monitor": m.state_dict(),
                    "history": [list(h) for h in self._history[tid]],
                    "finished": self._finished.get(tid),
                    **({PLANNED_KEY: self._plans[tid]} if tid in self._plans else {}),
                }
                for tid, m in self._monitors.items()
            },
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output.

        Raises:
            ValueError: another format, or a state written with another detector or job type.
        """
        if state.get("format") != STATE_FORMAT:
            raise ValueError(
                f"not an EvalStopScheduler state (format {state.get('format')!r}, expected {STATE_FORMAT!r})"
            )
        if state["detector"] != self.detector_spec or state["job_type"] != self.job_type:
            raise ValueError(
                f"the saved EvalStop state uses detector {state['detector']} for {state['job_type']} "
                f"jobs; this scheduler uses {self.detector_spec} for {self.job_type}: resume with the "
                "same detector"
            )
        self._check_plan(state, "the saved EvalStop state")
        self._monitors, self._history, self._stops, self._finished, self._plans = {}, {}, {}, {}, {}
        for tid, t in state["trials"].items():
            m = JobMonitor.from_state_dict(t["monitor"])
            self._monitors[tid] = m
            self._history[tid] = [(int(s), float(v), per) for s, v, per in t["history"]]
            if m.stopped:
                if m.last_decision is None:
                    raise ValueError(f"the saved EvalStop state of trial {tid!r} is stopped but has no decisions")
                self._stops[tid] = m.last_decision
            if t.get("finished"):
                self._finished[tid] = t["finished"]
            if t.get(PLANNED_KEY) is not None:
                self._plans[tid] = int(t[PLANNED_KEY])

    def _plan_field(self) -> dict[str, int]:
        """``planned_steps`` for a state or log header, only when set (states written without one are unchanged)."""
        return {} if self.planned_steps is None else {PLANNED_KEY: self.planned_steps}

    def _check_plan(self, saved: Mapping[str, Any], what: str) -> None:
        """Refuse a state or log written with other planned steps: its decisions were taken under another test."""
        if saved.get(PLANNED_KEY) != self.planned_steps:
            raise ValueError(
                f"{what} was written with planned_steps={saved.get('planned_steps')!r}; this scheduler has "
                f"planned_steps={self.planned_steps!r}: resume with the same planned steps"
            )

    def save(self, checkpoint_path: str) -> None:
        """Write the state to ``checkpoint_path`` (JSON), atomically."""
        folder = os.path.dirname(os.path.abspath(checkpoint_path))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".evalstop-", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(self.state_dict(), fh)
        os.replace(tmp, checkpoint_path)

    def restore(self, checkpoint_path: str) -> None:
        """Read a state written by :meth:`save`."""
        with open(checkpoint_path, encoding="utf-8") as fh:
            self.load_state_dict(json.load(fh))

    def _log(self, record: Mapping[str, Any]) -> None:
        if not self.persist or self._state_dir is None:
            return
        path = os.path.join(self._state_dir, LOG_FILE)
        new = not os.path.exists(path)
        with open(path, "a", encoding="utf-8") as fh:
            if new:
                fh.write(
                    json.dumps(
                        {
                            "format": LOG_FORMAT,
                            "detector": self.detector_spec,
                            "job_type": self.job_type,
                            **self._plan_field(),
                        }
                    )
                    + "\n"
                )
            fh.write(json.dumps(record) + "\n")

    def replay_log(self, path: str) -> None:
        """Rebuild the state from a log written by this scheduler class (see the module docstring).

        Raises:
            ValueError: not a log of this format, or a log written with another detector or job type.
        """
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
        if not lines:
            return
        header = json.loads(lines[0])
        if header.get("format") != LOG_FORMAT:
            raise ValueError(f"{path} is not an EvalStopScheduler log (format {header.get('format')!r})")
        if header["detector"] != self.detector_spec or header["job_type"] != self.job_type:
            raise ValueError(
                f"{path} was written with detector {header['detector']} for {header['job_type']} jobs; "
                f"this scheduler uses {self.detector_spec} for {self.job_type}: resume with the same "
                "detector"
            )
        self._check_plan(header, path)
        for no, raw in enumerate(lines[1:], 2):
            try:
                rec = json.loads(raw)
            except json.JSONDecodeError:
                if no == len(lines):  # a last line cut short by an interruption: that eval is re-reported
                    break
                raise ValueError(f"{path}:{no}: not valid JSON") from None
            result = {self.step_attr: rec["step"], self.eval_metric: rec["score"]}
            if rec.get("scores") is not None and self.scores_attr is not None:
                result[self.scores_attr] = rec["scores"]
            if rec.get(PLANNED_KEY) is not None:
                result[PLANNED_KEY] = rec[PLANNED_KEY]
            self.observe(rec["trial"], result, log=False)

    def _maybe_restore(self, trial: Trial) -> None:
        # Tune keeps per-experiment files in the driver's staging folder and syncs it with every experiment
        # checkpoint; on Tuner.restore it copies them back before it re-adds the trials, so the first trial added
        # finds the log of the interrupted run there.
        folder = getattr(getattr(trial, "storage", None), "experiment_driver_staging_path", None)
        if not self.persist or folder is None:
            return
        self._state_dir = folder
        if folder in self._restore_checked:
            return
        self._restore_checked.add(folder)
        path = os.path.join(folder, LOG_FILE)
        if not self._monitors and os.path.exists(path):
            self.replay_log(path)
            logger.info(
                "EvalStop: resumed the scheduler state of %d trials (%d stopped) from %s",
                len(self._monitors),
                len(self._stops),
                path,
            )
