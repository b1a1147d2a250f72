"""Reading traces: :func:`read_trace` (one file, validated), :func:`parse_trace` (text lines), :func:`read_header`,
:func:`eval_prefix` and :func:`trace_complete`. The format is in :mod:`platform_sim.trace_format`."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .schema import LINE_KINDS, TraceError, check_end, check_eval, check_header, check_non_finite


@dataclass(frozen=True)
class TraceLines:
    """A validated trace, as its parsed lines.

    Attributes:
        source: Where it came from (the file name in error messages).
        header: The header line.
        evals: The eval lines in step order.
        end: The end line, or None (a run that did not finish writing).
        eval_line_numbers: The 1-based line number of each eval line (for messages about one eval).
        non_finite: The non_finite lines (evaluations whose score was NaN or inf, not decided on) in step order.
    """

    source: str
    header: dict[str, Any]
    evals: tuple[dict[str, Any], ...]
    end: dict[str, Any] | None
    eval_line_numbers: tuple[int, ...]
    non_finite: tuple[dict[str, Any], ...] = ()

    def lines(self) -> list[dict[str, Any]]:
        """Header, evals and non_finite lines (in step order) and end (if any) as one list, in file order."""
        steps = sorted([*self.evals, *self.non_finite], key=lambda line: int(line["step"]))
        return [self.header, *steps, *([self.end] if self.end is not None else [])]


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
        TraceError: ``source:line: message`` for the first problem (bad JSON, missing or bad header, an unknown
            line kind or field, a non-finite or missing score, steps not strictly increasing, a line after the end
            line, a second header, fewer than ``min_evals`` evals).
    """
    numbered = [(no, raw) for no, raw in enumerate(lines, 1) if raw.strip()]
    header: dict[str, Any] | None = None
    end: dict[str, Any] | None = None
    evals: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    last_step: int | None = None  # of the last eval or non_finite line: evaluation steps increase across both
    numbers: list[int] = []
    last_no = 0
    for pos, (no, raw) in enumerate(numbered):
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            if truncated_ok and pos == len(numbered) - 1 and header is not None:
                break
            raise TraceError(f"{source}:{no}: not valid JSON ({exc.msg})") from None
        last_no = no
        try:
            if header is None:
                header = check_header(obj)
                continue
            if not isinstance(obj, dict):
                raise TraceError("a line must be a JSON object")
            if end is not None:
                raise TraceError("line after the end line")
            kind = obj.get("kind")
            if kind == "header":
                raise TraceError("a second header line")
            if kind == "eval":
                evals.append(check_eval(obj, last_step))
                numbers.append(no)
                last_step = obj["step"]
            elif kind == "non_finite":
                skipped.append(check_non_finite(obj, last_step))
                last_step = obj["step"]
            elif kind == "end":
                end = check_end(obj)
            else:
                raise TraceError(f"unknown line kind {kind!r} (expected {', '.join(LINE_KINDS)})")
        except TraceError as exc:
            raise TraceError(f"{source}:{no}: {exc}") from None
    if header is None:
        raise TraceError(f"{source}:1: empty trace (no header line)")
    if len(evals) < min_evals:
        raise TraceError(f"{source}:{last_no}: a trace needs at least {min_evals} eval lines, found {len(evals)}")
    return TraceLines(source, header, tuple(evals), end, tuple(numbers), tuple(skipped))


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}:1: not UTF-8 text ({exc.reason})") from None


def read_trace(path: str | os.PathLike[str], *, min_evals: int = 0, truncated_ok: bool = False) -> TraceLines:
    """Read and validate one trace file (:func:`parse_trace` on its lines, named by its path): the one trace reader.

    Args:
        path: The trace file.
        min_evals: Fewest eval lines accepted.
        truncated_ok: Accept (and drop) a cut-off last line, as a crashed run leaves.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        TraceError: ``path:line: message`` for the first problem.
    """
    path = Path(path)
    return parse_trace(_read_lines(path), str(path), min_evals=min_evals, truncated_ok=truncated_ok)


def read_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The validated header of a trace file, reading only up to its first non-blank line.

    A benchmark uses it to sort traces by ``environment`` and ``split`` without reading the evals of a trace it is
    not allowed to look at yet.

    Raises:
        TraceError: ``path:line: message`` when that line is not a valid header, or the file is empty.
    """
    path = Path(path)
    with open(path, encoding="utf-8") as fh:
        for no, raw in enumerate(fh, 1):
            if raw.strip():
                try:
                    return check_header(json.loads(raw))
                except json.JSONDecodeError as exc:
                    raise TraceError(f"{path}:{no}: not valid JSON ({exc.msg})") from None
                except TraceError as exc:
                    raise TraceError(f"{path}:{no}: {exc}") from None
    raise TraceError(f"{path}:1: empty trace (no header line)")


def eval_prefix(path: str | os.PathLike[str] | None, upto_step: int) -> list[dict[str, Any]]:
    """The eval and non_finite lines of an existing trace up to and including ``upto_step``, in step order (what a
    resumed run keeps).

    A missing file (or ``path`` None) has no prefix. The last line may be cut off (the run crashed while writing it).

    Raises:
        TraceError: the file is otherwise not a valid trace (``path:line: message``).
    """
    if path is None or not os.path.exists(path):
        return []
    trace = read_trace(path, truncated_ok=True)
    return [line for line in trace.lines()[1:] if line.get("kind") != "end" and line["step"] <= upto_step]


def trace_complete(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a valid trace with its end line (a recording that finished)."""
    try:
        return read_trace(path).end is not None
    except (OSError, TraceError):
        return False
