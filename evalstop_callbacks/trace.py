"""The JSONL trace of one training job, written by the trainer side and read by the simulator's replay.

One ``header`` line, one ``eval`` line per evaluation, one ``end`` line; the format, its checks, the reader and the
writer live in :mod:`platform_sim.trace_format` (one definition for every part). Lines are flushed as they are
written, so a crashed run leaves a readable prefix. The recorder is local research data: it may hold proxy reward,
training loss, KL and timing, which the boundary client never sends to the scheduler.
"""

from __future__ import annotations

from platform_sim.trace_format import (
    EVAL_OPTIONAL,
    HEADER_OPTIONAL,
    TRACE_FORMAT,
    TraceError,
    TraceWriter,
    eval_prefix,
)

__all__ = [
    "EVAL_OPTIONAL_FIELDS",
    "HEADER_OPTIONAL_FIELDS",
    "TRACE_FORMAT",
    "TraceError",
    "TraceRecorder",
    "eval_prefix",
]

#: Optional fields of an ``eval`` line besides ``step`` and ``eval_score``.
EVAL_OPTIONAL_FIELDS: frozenset[str] = EVAL_OPTIONAL
#: Optional fields of the header besides ``format``, ``job_id`` and ``job_type``.
HEADER_OPTIONAL_FIELDS: frozenset[str] = HEADER_OPTIONAL


class TraceRecorder(TraceWriter):
    """Writes one job's trace as JSONL (what ``EvalStopCallback(trace_path=...)`` uses).

    Args:
        path: File to write. Parent folders are created. An existing file is replaced (one trace per file).
        job_id: The job's id (as registered with the scheduler).
        job_type: The job's type (``rlhf``, ``dpo``, ``lora``, ``sft``, ``other``).
        **header: Optional header fields: ``trainer``, ``model``, ``planned_steps``, ``world_size``, ``config``,
            ``environment``, ``split``.

    Example::

        rec = TraceRecorder("run.jsonl", job_id="grpo-1", job_type="rlhf", trainer="GRPOTrainer", planned_steps=300)
        rec.eval(10, 1.25, eval_scores=[1.0, 1.5], proxy_reward=0.8, train_loss=0.02, wall_s=4.1)
        rec.end("stopped", stopped_at=30, best_step=10, best_score=1.25)
    """

    def __enter__(self) -> TraceRecorder:
        return self
