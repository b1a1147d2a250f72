"""Writing traces: the line builders, :class:`TraceWriter` (line by line, flushed), :func:`write_trace` (a whole trace,
atomically) and :func:`update_header`. The format is in :mod:`platform_sim.trace_format`."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from .reader import parse_trace, read_trace
from .schema import (
    EVAL_OPTIONAL,
    TRACE_FORMAT,
    TraceError,
    check_end,
    check_eval,
    check_header,
    check_non_finite,
)

# -- writing ----------------------------------------------------------------------------------------------------


def _num(value: Any) -> Any:
    """A number as float (so JSON shows ``1.0``), anything else unchanged for the checks to reject."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def make_header(job_id: str, job_type: str, **fields: Any) -> dict[str, Any]:
    """A validated header line; ``None`` fields are left out.

    Raises:
        TraceError: an unknown or bad field.
    """
    line: dict[str, Any] = {"kind": "header", "format": TRACE_FORMAT, "job_id": job_id, "job_type": job_type}
    line.update({k: v for k, v in fields.items() if v is not None})
    return check_header(line)


def make_eval(step: int, eval_score: float, prev_step: int | None = None, **fields: Any) -> dict[str, Any]:
    """A validated eval line (numbers as floats, ``None`` fields left out, optional fields in name order).

    Raises:
        TraceError: an unknown or bad field, or ``step`` not after ``prev_step``.
    """
    line: dict[str, Any] = {"kind": "eval", "step": step, "eval_score": _num(eval_score)}
    for name in sorted(fields):
        value = fields[name]
        if value is None:
            continue
        if name == "eval_scores" and isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
            value = [_num(v) for v in value]
        elif name not in ("eval_scores", "eval_n"):  # eval_n stays an integer
            value = _num(value)
        line[name] = value
    return check_eval(line, prev_step)


def make_non_finite(step: int, what: str, prev_step: int | None = None) -> dict[str, Any]:
    """A validated non_finite line: the evaluation of ``step`` was NaN or inf (``what``: e.g. ``"eval score nan"``).

    Raises:
        TraceError: a bad field, or ``step`` not after ``prev_step``.
    """
    return check_non_finite({"kind": "non_finite", "step": step, "what": str(what)}, prev_step)


def make_end(
    reason: str, best_step: int | None = None, best_score: float | None = None, stopped_at: int | None = None
) -> dict[str, Any]:
    """A validated end line (``stopped_at`` only when given)."""
    line: dict[str, Any] = {"kind": "end", "reason": str(reason)}
    if stopped_at is not None:
        line["stopped_at"] = stopped_at
    line["best_step"] = best_step
    line["best_score"] = None if best_score is None else _num(best_score)
    return check_end(line)


def dumps_line(line: Mapping[str, Any]) -> str:
    """One trace line as JSON text with its newline (non-finite numbers are refused)."""
    return json.dumps(line, allow_nan=False) + "\n"


class TraceWriter:
    """Writes one trace incrementally: the header at construction, then eval lines, then the end line.

    Every line is validated before it is written and flushed after, so a crashed run leaves a readable prefix.

    Args:
        path: File to write. Parent folders are created. An existing file is replaced (one trace per file).
        job_id: The job's id.
        job_type: The job's type (one of the platform's job types).
        **header: Optional header fields (:data:`HEADER_OPTIONAL`); ``None`` values are left out.

    Raises:
        TraceError: a bad header field (nothing is written then).
    """

    def __init__(self, path: str | os.PathLike[str], job_id: str, job_type: str, **header: Any) -> None:
        line = make_header(job_id, job_type, **header)
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._last_step: int | None = None
        self._ended = False
        self._fh: IO[str] = open(self.path, "w", encoding="utf-8")
        self._write(line)

    @property
    def last_step(self) -> int | None:
        """Step of the last eval or non_finite line written (None before the first)."""
        return self._last_step

    @property
    def closed(self) -> bool:
        return self._fh.closed

    def _write(self, line: Mapping[str, Any]) -> None:
        if self._fh.closed:
            raise TraceError(f"trace {self.path} is closed")
        self._fh.write(dumps_line(line))
        self._fh.flush()

    def eval(self, step: int, eval_score: float, **fields: Any) -> None:
        """Append one evaluation.

        Args:
            step: Training step; strictly greater than the previous eval line's.
            eval_score: Mean world-feedback score (finite).
            **fields: Optional ``eval_scores`` (list of finite numbers), ``eval_std`` and ``eval_n`` (the spread,
                together), ``proxy_reward``, ``train_loss``, ``kl``, ``wall_s``, ``gpu_s``. ``None`` values are left
                out.

        Raises:
            TraceError: a bad or unknown field, a step not after the last one, or the end line already written.
        """
        if self._ended:
            raise TraceError(f"trace {self.path} already has its end line")
        line = make_eval(step, eval_score, self._last_step, **fields)
        self._write(line)
        self._last_step = step

    def non_finite(self, step: int, what: str) -> None:
        """Append an evaluation whose score was NaN or inf (recorded, not decided on): a ``non_finite`` line.

        Raises:
            TraceError: a step not after the last one, or the end line already written.
        """
        if self._ended:
            raise TraceError(f"trace {self.path} already has its end line")
        self._write(make_non_finite(step, what, self._last_step))
        self._last_step = step

    def append_raw(self, lines: Sequence[Mapping[str, Any]]) -> None:
        """Append eval and non_finite lines read from another trace (e.g. the prefix a resumed run keeps), validating
        each."""
        for obj in lines:
            if obj.get("kind") == "non_finite":
                self.non_finite(obj["step"], obj["what"])
            else:
                self.eval(obj["step"], obj["eval_score"], **{k: obj[k] for k in EVAL_OPTIONAL if k in obj})

    def end(self, reason: str, best_step: int | None, best_score: float | None, stopped_at: int | None = None) -> None:
        """Write the end line and close the file. Calling it again is a no-op (the first end wins)."""
        if self._ended:
            return
        self._write(make_end(reason, best_step, best_score, stopped_at))
        self._ended = True
        self.close()

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _atomic_write(path: Path, text: str) -> None:
    # Write next to the target and rename, so a reader never sees half a trace.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_trace(
    path: str | os.PathLike[str],
    header: Mapping[str, Any],
    evals: Sequence[Mapping[str, Any]],
    end: Mapping[str, Any] | None = None,
) -> Path:
    """Write a whole trace at once (validated; replaces ``path`` atomically).

    Args:
        path: File to write; parent folders are created.
        header: The header line (``kind`` and ``format`` may be left out).
        evals: The eval lines (``kind`` may be left out).
        end: The end line, if any (``kind`` may be left out).

    Raises:
        TraceError: a bad line (``path:line: message``, the line it would have had); nothing is written then.
    """
    path = Path(path)
    out = [dict(header, kind="header", format=header.get("format", TRACE_FORMAT))]
    out += [dict(e, kind="eval") for e in evals]
    if end is not None:
        out.append(dict(end, kind="end"))
    text = "".join(dumps_line(line) for line in out)
    parse_trace(text.splitlines(), str(path))  # the same checks as every reader
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(path, text)
    return path


def update_header(
    path: str | os.PathLike[str], fields: Mapping[str, Any] | None = None, config: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Add to the header of an existing trace and rewrite the file (atomically); the eval and end lines are kept.

    What a recording tool uses to add what re-creates a run (its configuration, the environment, the split) after the
    trainer-side recorder wrote a generic header.

    Args:
        path: The trace.
        fields: Header fields to set (``environment``, ``split``, ``model``...); ``None`` values remove the field.
        config: Entries merged into the header's ``config`` object (created if missing).

    Returns:
        The new header.

    Raises:
        TraceError: the trace is not valid, or a field would make it invalid (the file is left unchanged).
    """
    trace = read_trace(path)
    header = dict(trace.header)
    for name, value in (fields or {}).items():
        if value is None:
            header.pop(name, None)
        else:
            header[name] = value
    if config:
        header["config"] = {**(header.get("config") or {}), **config}
    write_trace(path, header, trace.evals, trace.end)
    return header
