"""``evalstop watch``: EvalStop for any training run, from the metrics log it already writes.

Python API (stable; the command is a loop around it)::

    from evalstop_callbacks.watch import Watcher, WatchResult, WatchError, StopPlan, run

    watcher = Watcher(log, metric, format="auto", greater_is_better=True, examples=None, detector=None,
                      client=None, job_id=None, job_type="rlhf", checkpoints=None, best_dir=None, keep_best=1,
                      prune_others=False, mode="enforce")
    watcher.poll() -> bool          # read what is new, report new evaluations; True if the log gained anything
    watcher.stopped -> bool         # the core decided to stop (never in mode="observe")
    watcher.finish() -> WatchResult # read the rest once the writer is done
    watcher.result() -> WatchResult # the decision so far; .to_dict() is the --result JSON
    run(watcher, StopPlan(pid=..., on_stop=..., grace=..., timeout=...), result_file) -> Outcome

Command: ``evalstop watch LOG --metric NAME ...`` (:mod:`evalstop_callbacks.watch.cli`), also
``python -m evalstop_callbacks.watch``.
"""

from .follow import Backoff
from .loop import Outcome, StopPlan, run, stop_env
from .records import FORMATS, Point, WatchError
from .watcher import Watcher, WatchResult, default_job_id

__all__ = [
    "FORMATS",
    "Backoff",
    "Outcome",
    "Point",
    "StopPlan",
    "WatchError",
    "WatchResult",
    "Watcher",
    "default_job_id",
    "run",
    "stop_env",
]
