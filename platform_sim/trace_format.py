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
  per-example scores, the same examples at every eval), and the finite numbers ``proxy_reward``, ``train_loss``,
  ``kl``, ``wall_s`` (seconds since training began) and ``gpu_s`` (accelerator-seconds since training began).
- At most one **end** line, last: ``{"kind": "end", "reason", "stopped_at"?, "best_step"?, "best_score"?}``.

A trace without an end line is valid (a run that crashed leaves a readable prefix: the writer flushes every line).
Fields outside these sets are errors, because a replay built on a silently misread trace reports wrong numbers; the
reader names the file and the line of the first problem (``path:line: message``). Traces of one corpus may differ
in length, eval cadence, planned steps, trainer and model; nothing here requires them to agree.

Validation is pure (:func:`check_header`, :func:`check_eval`, :func:`check_end`, :func:`parse_trace` on text lines);
the file functions (:func:`read_trace_file`, :func:`read_header`, :func:`eval_prefix`, :func:`trace_complete`,
:func:`write_trace`, :func:`update_header`, :class:`TraceWriter`) are thin wrappers around it.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from platform_sim.core.boundary import JOB_TYPES

TRACE_FORMAT = "evalstop-trace/1"
"""The ``format`` value of every header this module reads and writes."""

LINE_KINDS: tuple[str, ...] = ("header", "eval", "end")
SPLITS: tuple[str, ...] = ("tune", "test")
"""Values of the header's ``split``: detectors may be tuned on ``tune`` environments, only tested on ``test`` ones."""

HEADER_REQUIRED: tuple[str, ...] = ("format", "job_id", "job_type")
HEADER_OPTIONAL: frozenset[str] = frozenset(
    {"trainer", "model", "planned_steps", "world_size", "config", "environment", "split"}
)
EVAL_REQUIRED: tuple[str, ...] = ("step", "eval_score")
EVAL_NUMBERS: tuple[str, ...] = ("proxy_reward", "train_loss", "kl", "wall_s", "gpu_s")
"""Optional finite-number fields of an eval line."""
EVAL_OPTIONAL: frozenset[str] = frozenset({"eval_scores", *EVAL_NUMBERS})
END_REQUIRED: tuple[str, ...] = ("reason",)
END_OPTIONAL: frozenset[str] = frozenset({"stopped_at", "best_step", "best_score"})


class TraceFormatError(ValueError):
    """A trace (or a line about to be written) that breaks the format. Read errors start with ``file:line:``."""


# -- validation of one line (pure) ------------------------------------------------------------------------------


def _is_finite(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _is_int(value: Any, minimum: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= minimum


def _unknown(obj: Mapping[str, Any], allowed: Iterable[str]) -> list[str]:
    return sorted(set(obj) - {"kind", *allowed})


def check_header(obj: Any) -> dict[str, Any]:
    """Validate a header line (already parsed from JSON) and return it unchanged.

    Raises:
        TraceFormatError: naming the first bad field (no file or line: the caller adds them).
    """
    if not isinstance(obj, dict) or obj.get("kind") != "header":
        got = obj.get("kind") if isinstance(obj, dict) else type(obj).__name__
        raise TraceFormatError(f"the first line must be the header (kind 'header'), got kind {got!r}")
    if obj.get("format") != TRACE_FORMAT:
        raise TraceFormatError(f"unsupported format {obj.get('format')!r}; expected {TRACE_FORMAT!r}")
    if not isinstance(obj.get("job_id"), str) or not obj["job_id"]:
        raise TraceFormatError("header field job_id must be a non-empty string")
    if obj.get("job_type") not in JOB_TYPES:
        raise TraceFormatError(
            f"header field job_type must be one of {', '.join(JOB_TYPES)}, got {obj.get('job_type')!r}"
        )
    unknown = _unknown(obj, (*HEADER_REQUIRED, *HEADER_OPTIONAL))
    if unknown:
        raise TraceFormatError(
            f"unknown trace header field(s): {', '.join(unknown)}; allowed besides "
            f"{', '.join(HEADER_REQUIRED)}: {', '.join(sorted(HEADER_OPTIONAL))}"
        )
    for name in ("trainer", "model"):
        if obj.get(name) is not None and not isinstance(obj[name], str):
            raise TraceFormatError(f"header field {name} must be a string, got {obj[name]!r}")
    # planned_steps 0 means "not known" (a trainer without max_steps).
    for name, minimum in (("planned_steps", 0), ("world_size", 1)):
        if obj.get(name) is not None and not _is_int(obj[name], minimum):
            raise TraceFormatError(f"header field {name} must be an integer >= {minimum}, got {obj[name]!r}")
    if obj.get("config") is not None and not isinstance(obj["config"], dict):
        raise TraceFormatError(f"header field config must be an object, got {type(obj['config']).__name__}")
    if "environment" in obj and (not isinstance(obj["environment"], str) or not obj["environment"].strip()):
        raise TraceFormatError(f"header field environment must be a non-empty string, got {obj['environment']!r}")
    if "split" in obj and obj["split"] not in SPLITS:
        raise TraceFormatError(f"header field split must be one of {', '.join(SPLITS)}, got {obj['split']!r}")
    return obj


def check_eval(obj: Any, prev_step: int | None = None) -> dict[str, Any]:
    """Validate an eval line (already parsed) that follows an eval at ``prev_step``; return it unchanged.

    Raises:
        TraceFormatError: naming the first bad field.
    """
    if not isinstance(obj, dict) or obj.get("kind") != "eval":
        raise TraceFormatError("not an eval line")
    unknown = _unknown(obj, (*EVAL_REQUIRED, *EVAL_OPTIONAL))
    if unknown:
        raise TraceFormatError(
            f"unknown trace eval field(s): {', '.join(unknown)}; allowed besides step and "
            f"eval_score: {', '.join(sorted(EVAL_OPTIONAL))}"
        )
    step = obj.get("step")
    if not isinstance(step, int) or not _is_int(step, 0):
        raise TraceFormatError(f"eval step must be an integer >= 0, got {step!r}")
    if prev_step is not None and step <= prev_step:
        raise TraceFormatError(
            f"eval steps must be increasing integers (steps must increase: step {step} after {prev_step})"
        )
    if "eval_score" not in obj:
        raise TraceFormatError("eval line without eval_score")
    if not _is_finite(obj["eval_score"]):
        raise TraceFormatError(f"eval_score must be a finite number, got {obj['eval_score']!r}")
    per = obj.get("eval_scores")
    if per is not None and (not isinstance(per, list) or not per or not all(_is_finite(v) for v in per)):
        raise TraceFormatError("eval_scores must be a non-empty list of finite numbers")
    for name in EVAL_NUMBERS:
        if obj.get(name) is not None and not _is_finite(obj[name]):
            raise TraceFormatError(f"{name} must be a finite number, got {obj[name]!r}")
    return obj


def check_end(obj: Any) -> dict[str, Any]:
    """Validate an end line (already parsed); return it unchanged.

    Raises:
        TraceFormatError: naming the first bad field.
    """
    if not isinstance(obj, dict) or obj.get("kind") != "end":
        raise TraceFormatError("not an end line")
    unknown = _unknown(obj, (*END_REQUIRED, *END_OPTIONAL))
    if unknown:
        raise TraceFormatError(f"unknown trace end field(s): {', '.join(unknown)}")
    if not isinstance(obj.get("reason"), str) or not obj["reason"]:
        raise TraceFormatError(f"end field reason must be a non-empty string, got {obj.get('reason')!r}")
    for name in ("stopped_at", "best_step"):
        if obj.get(name) is not None and not _is_int(obj[name], 0):
            raise TraceFormatError(f"end field {name} must be an integer >= 0, got {obj[name]!r}")
    if obj.get("best_score") is not None and not _is_finite(obj["best_score"]):
        raise TraceFormatError(f"end field best_score must be a finite number, got {obj['best_score']!r}")
    return obj


# -- reading (pure parsing, then the file functions) ------------------------------------------------------------


@dataclass(frozen=True)
class TraceLines:
    """A validated trace, as its parsed lines.

    Attributes:
        source: Where it came from (the file name in error messages).
        header: The header line.
        evals: The eval lines in step order.
        end: The end line, or None (a run that did not finish writing).
        eval_line_numbers: The 1-based line number of each eval line (for messages about one eval).
    """

    source: str
    header: dict[str, Any]
    evals: tuple[dict[str, Any], ...]
    end: dict[str, Any] | None
    eval_line_numbers: tuple[int, ...]

    def lines(self) -> list[dict[str, Any]]:
        """Header, evals and end (if any) as one list, in file order."""
        return [self.header, *self.evals, *([self.end] if self.end is not None else [])]


def parse_trace(
    lines: Iterable[str], source: str = "<trace>", *, min_evals: int = 0, truncated_ok: bool = False
) -> TraceLines:
    """Validate the text lines of one trace.

    Args:
        lines: The file's lines (blank lines are skipped; line numbers count them).
        source: Name used in error messages (``source:line: message``).
        min_evals: Fewest eval lines accepted (the simulator needs 2; a trace being resumed may have none).
        truncated_ok: Accept a last line that is not valid JSON and drop it: what a run that crashed while writing
            leaves. Any other bad line is still an error.

    Raises:
        TraceFormatError: ``source:line: message`` for the first problem (bad JSON, missing or bad header, an unknown
            line kind or field, a non-finite or missing score, steps not strictly increasing, a line after the end
            line, a second header, fewer than ``min_evals`` evals).
    """
    numbered = [(no, raw) for no, raw in enumerate(lines, 1) if raw.strip()]
    header: dict[str, Any] | None = None
    end: dict[str, Any] | None = None
    evals: list[dict[str, Any]] = []
    numbers: list[int] = []
    last_no = 0
    for pos, (no, raw) in enumerate(numbered):
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            if truncated_ok and pos == len(numbered) - 1 and header is not None:
                break
            raise TraceFormatError(f"{source}:{no}: not valid JSON ({exc.msg})") from None
        last_no = no
        try:
            if header is None:
                header = check_header(obj)
                continue
            if not isinstance(obj, dict):
                raise TraceFormatError("a line must be a JSON object")
            if end is not None:
                raise TraceFormatError("line after the end line")
            kind = obj.get("kind")
            if kind == "header":
                raise TraceFormatError("a second header line")
            if kind == "eval":
                evals.append(check_eval(obj, evals[-1]["step"] if evals else None))
                numbers.append(no)
            elif kind == "end":
                end = check_end(obj)
            else:
                raise TraceFormatError(f"unknown line kind {kind!r} (expected {', '.join(LINE_KINDS)})")
        except TraceFormatError as exc:
            raise TraceFormatError(f"{source}:{no}: {exc}") from None
    if header is None:
        raise TraceFormatError(f"{source}:1: empty trace (no header line)")
    if len(evals) < min_evals:
        raise TraceFormatError(f"{source}:{last_no}: a trace needs at least {min_evals} eval lines, found {len(evals)}")
    return TraceLines(source, header, tuple(evals), end, tuple(numbers))


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise TraceFormatError(f"{path}:1: not UTF-8 text ({exc.reason})") from None


def read_trace_file(path: str | os.PathLike[str], *, min_evals: int = 0, truncated_ok: bool = False) -> TraceLines:
    """Read and validate one trace file (:func:`parse_trace` on its lines, named by its path).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        TraceFormatError: ``path:line: message`` for the first problem.
    """
    path = Path(path)
    return parse_trace(_read_lines(path), str(path), min_evals=min_evals, truncated_ok=truncated_ok)


def read_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The validated header of a trace file, reading only up to its first non-blank line.

    A benchmark uses it to sort traces by ``environment`` and ``split`` without reading the evals of a trace it is
    not allowed to look at yet.

    Raises:
        TraceFormatError: ``path:line: message`` when that line is not a valid header, or the file is empty.
    """
    path = Path(path)
    with open(path, encoding="utf-8") as fh:
        for no, raw in enumerate(fh, 1):
            if raw.strip():
                try:
                    return check_header(json.loads(raw))
                except json.JSONDecodeError as exc:
                    raise TraceFormatError(f"{path}:{no}: not valid JSON ({exc.msg})") from None
                except TraceFormatError as exc:
                    raise TraceFormatError(f"{path}:{no}: {exc}") from None
    raise TraceFormatError(f"{path}:1: empty trace (no header line)")


def eval_prefix(path: str | os.PathLike[str] | None, upto_step: int) -> list[dict[str, Any]]:
    """The eval lines of an existing trace up to and including ``upto_step`` (what a resumed run keeps).

    A missing file (or ``path`` None) has no prefix. The last line may be cut off (the run crashed while writing it).

    Raises:
        TraceFormatError: the file is otherwise not a valid trace (``path:line: message``).
    """
    if path is None or not os.path.exists(path):
        return []
    trace = read_trace_file(path, truncated_ok=True)
    return [e for e in trace.evals if e["step"] <= upto_step]


def trace_complete(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a valid trace with its end line (a recording that finished)."""
    try:
        return read_trace_file(path).end is not None
    except (OSError, TraceFormatError):
        return False


# -- writing ----------------------------------------------------------------------------------------------------


def _num(value: Any) -> Any:
    """A number as float (so JSON shows ``1.0``), anything else unchanged for the checks to reject."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def make_header(job_id: str, job_type: str, **fields: Any) -> dict[str, Any]:
    """A validated header line; ``None`` fields are left out.

    Raises:
        TraceFormatError: an unknown or bad field.
    """
    line: dict[str, Any] = {"kind": "header", "format": TRACE_FORMAT, "job_id": job_id, "job_type": job_type}
    line.update({k: v for k, v in fields.items() if v is not None})
    return check_header(line)


def make_eval(step: int, eval_score: float, prev_step: int | None = None, **fields: Any) -> dict[str, Any]:
    """A validated eval line (numbers as floats, ``None`` fields left out, optional fields in name order).

    Raises:
        TraceFormatError: an unknown or bad field, or ``step`` not after ``prev_step``.
    """
    line: dict[str, Any] = {"kind": "eval", "step": step, "eval_score": _num(eval_score)}
    for name in sorted(fields):
        value = fields[name]
        if value is None:
            continue
        if name == "eval_scores" and isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
            value = [_num(v) for v in value]
        elif name != "eval_scores":
            value = _num(value)
        line[name] = value
    return check_eval(line, prev_step)


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
        TraceFormatError: a bad header field (nothing is written then).
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
        """Step of the last eval line written (None before the first)."""
        return self._last_step

    @property
    def closed(self) -> bool:
        return self._fh.closed

    def _write(self, line: Mapping[str, Any]) -> None:
        if self._fh.closed:
            raise TraceFormatError(f"trace {self.path} is closed")
        self._fh.write(dumps_line(line))
        self._fh.flush()

    def eval(self, step: int, eval_score: float, **fields: Any) -> None:
        """Append one evaluation.

        Args:
            step: Training step; strictly greater than the previous eval line's.
            eval_score: Mean world-feedback score (finite).
            **fields: Optional ``eval_scores`` (list of finite numbers), ``proxy_reward``, ``train_loss``, ``kl``,
                ``wall_s``, ``gpu_s``. ``None`` values are left out.

        Raises:
            TraceFormatError: a bad or unknown field, a step not after the last one, or the end line already written.
        """
        if self._ended:
            raise TraceFormatError(f"trace {self.path} already has its end line")
        line = make_eval(step, eval_score, self._last_step, **fields)
        self._write(line)
        self._last_step = step

    def append_raw(self, lines: Sequence[Mapping[str, Any]]) -> None:
        """Append eval lines read from another trace (e.g. the prefix a resumed run keeps), validating each."""
        for obj in lines:
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
        TraceFormatError: a bad line (``path:line: message``, the line it would have had); nothing is written then.
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
        TraceFormatError: the trace is not valid, or a field would make it invalid (the file is left unchanged).
    """
    trace = read_trace_file(path)
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
