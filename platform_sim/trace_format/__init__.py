"""The JSONL trace of one training job: its fields, their validation, one strict reader and one writer.

A trace is what a real training run leaves behind for research and for the simulator's replay. It is written by the
trainer side (:class:`evalstop_callbacks.trace.TraceRecorder`, a :class:`TraceWriter`) and read by the simulator
(:mod:`platform_sim.sim.traces`), the callback when a run resumes, and the recording tools. This module is the only
place that knows the format; it imports nothing from the simulator, so the trainer-side library can use it.

The format, one JSON object per line:

- First line, the **header**: ``{"kind": "header", "format": "evalstop-trace/1", "job_id", "job_type", ...}``.
  Required: ``format``, ``job_id`` (non-empty string) and ``job_type`` (one of the platform's job types). Optional
  (:data:`HEADER_OPTIONAL`): ``trainer``, ``model`` (strings), ``planned_steps``, ``world_size`` (integers: planned steps >= 0, 0 when not known; world size >= 1),
  ``config`` (an object: how the run was configured), ``environment`` (a non-empty string naming the
  overoptimization environment that produced the run) and ``split`` (``tune`` or ``test``: whether a benchmark may
  tune detectors on the run's environment or only test on it).
- One **eval** line per evaluation: ``{"kind": "eval", "step", "eval_score", ...}``. Required: ``step`` (integer
  >= 0, strictly greater than the previous eval line's) and ``eval_score`` (finite number: the mean world-feedback
  score, higher is better). Optional (:data:`EVAL_OPTIONAL`): ``eval_scores`` (non-empty list of finite numbers: the
  per-example scores, the same examples at every eval), ``eval_std`` and ``eval_n`` (the eval's spread when only
  its mean is known: the sample standard deviation of its example scores, finite and >= 0, and their count, an
  integer >= 2; both or neither, and agreeing with ``eval_scores`` when both are there, as the boundary's report
  requires), and the finite numbers ``proxy_reward``, ``train_loss``, ``kl``, ``wall_s`` (seconds since training
  began) and ``gpu_s`` (accelerator-seconds since training began).
- One **non_finite** line per evaluation whose score was NaN or inf (recorded by the trainer side, never decided on):
  ``{"kind": "non_finite", "step", "what"}`` (``what``: a non-empty string such as ``"eval score nan"``). Its step
  takes its place among the eval lines' steps: all evaluation steps strictly increase. Readers that replay a trace
  use its eval lines; the non_finite lines are :attr:`TraceLines.non_finite`.
- At most one **end** line, last: ``{"kind": "end", "reason", "stopped_at"?, "best_step"?, "best_score"?}``.

A trace without an end line is valid (a run that crashed leaves a readable prefix: the writer flushes every line).
Fields outside these sets are errors, because a replay built on a silently misread trace reports wrong numbers; the
reader names the file and the line of the first problem (``path:line: message``). Traces of one corpus may differ
in length, eval interval, planned steps, trainer and model; nothing here requires them to agree.

Validation is pure (:func:`check_header`, :func:`check_eval`, :func:`check_end`, :func:`parse_trace` on text lines);
the file functions (:func:`read_trace`, :func:`read_header`, :func:`eval_prefix`, :func:`trace_complete`,
:func:`write_trace`, :func:`update_header`, :class:`TraceWriter`) are thin wrappers around it. Every problem is a
:class:`TraceError`.

Modules: :mod:`.schema` (fields and line checks), :mod:`.reader`, :mod:`.writer`.
"""

from __future__ import annotations

from .reader import TraceLines, eval_prefix, parse_trace, read_header, read_trace, trace_complete
from .schema import (
    END_OPTIONAL,
    END_REQUIRED,
    EVAL_NUMBERS,
    EVAL_OPTIONAL,
    EVAL_REQUIRED,
    HEADER_OPTIONAL,
    HEADER_REQUIRED,
    LINE_KINDS,
    SPLITS,
    TRACE_FORMAT,
    TraceError,
    check_end,
    check_eval,
    check_header,
    check_non_finite,
)
from .writer import (
    TraceWriter,
    dumps_line,
    make_end,
    make_eval,
    make_header,
    make_non_finite,
    update_header,
    write_trace,
)

__all__ = [
    "END_OPTIONAL",
    "END_REQUIRED",
    "EVAL_NUMBERS",
    "EVAL_OPTIONAL",
    "EVAL_REQUIRED",
    "HEADER_OPTIONAL",
    "HEADER_REQUIRED",
    "LINE_KINDS",
    "SPLITS",
    "TRACE_FORMAT",
    "TraceError",
    "TraceLines",
    "TraceWriter",
    "check_end",
    "check_eval",
    "check_header",
    "check_non_finite",
    "dumps_line",
    "eval_prefix",
    "make_end",
    "make_eval",
    "make_header",
    "make_non_finite",
    "parse_trace",
    "read_header",
    "read_trace",
    "trace_complete",
    "update_header",
    "write_trace",
]
