"""The attributes a user reads off an :class:`~evalstop_callbacks.EvalStopCallback`, each kept by one of its parts.

The callback's state lives in its parts (the checked arguments, the run record, the best step's follower, the
schedule, the job at the scheduler); :class:`CallbackAttributes` names it where users and tools look for it
(``cb.history``, ``cb.best_step``, ``cb.detector_spec``, ...). Every one is read-only, except through its part.
"""

from __future__ import annotations

from typing import Any


def _from(part: str, name: str) -> Any:
    """A read-only attribute of the callback kept by its part ``part``."""
    return property(lambda self: getattr(getattr(self, part), name), doc=f"``{part}.{name}``.")


class CallbackAttributes:
    """The callback's public attributes.

    Attributes:
        eval_steps, k, min_delta, job_type, mode, restore_best, trace_path, trace_extras, eval_on_start: The checked
            arguments (:class:`~evalstop_callbacks.settings.CallbackSettings`).
        detector_spec, cadence_spec, eval_budget: The detector spec the job runs, the cadence policy's spec (None:
            fixed), the budget of hinted evaluations (``max_extra_evals``, ``max_eval_share``).
        job_id (`str` or `None`): The job's id at the scheduler (chosen by the client at registration when not given).
        history (`list[dict]`): One entry per evaluation: `step`, `eval_score`, `declines`, `action`.
        stopped_at, would_stop_at (`int` or `None`): Enforce mode's stop step; the scheduler's first stop (both modes).
        stop_reason, last_decision: The stop decision's reason; the last decision.
        restored_from (`str` or `None`): Checkpoint folder whose weights were loaded into the model.
        best_step, best_score, best_checkpoint: Best evaluation so far and the folder of its weights
            (``<output_dir>/evalstop-best-<step>``, kept by :attr:`keeper`).
        keeper (:class:`~evalstop_callbacks.keeper.BestCheckpoints` or `None`): The keeper of the best checkpoint
            (from ``on_train_begin``).
        extra_eval_steps (`list[int]`): Steps of the evaluations made at a hint (`"extra"` in `history`).
        eval_seconds, overhead_seconds, save_seconds (`list[float]`): Per evaluation, the evaluator's time on this
            process and the callback's own time on the main process; the time of each weights-only best save.
    """

    eval_steps = _from("settings", "eval_steps")
    k = _from("settings", "k")
    min_delta = _from("settings", "min_delta")
    job_type = _from("settings", "job_type")
    mode = _from("settings", "mode")
    restore_best = _from("settings", "restore_best")
    trace_path = _from("settings", "trace_path")
    trace_extras = _from("settings", "trace_extras")
    eval_on_start = _from("settings", "eval_on_start")
    detector_spec = _from("settings", "detector_spec")
    cadence_spec = _from("settings", "cadence_spec")
    eval_budget = _from("settings", "eval_budget")
    max_extra_evals = _from("eval_budget", "max_extra_evals")
    max_eval_share = _from("eval_budget", "max_eval_share")
    job_id = _from("job", "job_id")
    history = _from("record", "history")
    stopped_at = _from("record", "stopped_at")
    would_stop_at = _from("record", "would_stop_at")
    stop_reason = _from("record", "stop_reason")
    last_decision = _from("record", "last_decision")
    restored_from = _from("record", "restored_from")
    overhead_seconds = _from("record", "overhead_seconds")
    best_step = _from("best", "best_step")
    best_score = _from("best", "best_score")
    best_checkpoint = _from("best", "best_checkpoint")
    keeper = _from("best", "keeper")
    save_seconds = _from("best", "save_seconds")
    extra_eval_steps = _from("schedule", "extra_eval_steps")
    eval_seconds = _from("schedule", "eval_seconds")
