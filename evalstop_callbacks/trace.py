"""The JSONL trace of one training job (DESIGN.md section 4), written by the trainer side, read by the simulator.

One ``header`` line, one ``eval`` line per evaluation, one ``end`` line. Lines are flushed as they are written, so a
crashed run leaves a readable prefix. The recorder is local research data: it may hold proxy reward, training loss,
KL and timing, which the boundary client never sends to the scheduler.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

logger = logging.getLogger(__name__)

TRACE_FORMAT = "evalstop-trace/1"

#: Optional fields of an ``eval`` line besides ``step`` and ``eval_score``.
EVAL_OPTIONAL_FIELDS: frozenset[str] = frozenset({"eval_scores", "proxy_reward", "train_loss", "kl", "wall_s", "gpu_s"})
#: Optional fields of the header besides ``format``, ``job_id`` and ``job_type``.
HEADER_OPTIONAL_FIELDS: frozenset[str] = frozenset({"trainer", "model", "planned_steps", "world_size", "config"})


class TraceError(ValueError):
    """A trace line that would break the format (unknown field, non-finite number, steps going back)."""


def _finite(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TraceError(f"trace field {name} must be a finite number, got {value!r}")
    return float(value)


class TraceRecorder:
    """Writes one job's trace as JSONL.

    Args:
        path: File to write. Parent folders are created. An existing file is replaced (one trace per file).
        job_id: The job's id (as registered with the scheduler).
        job_type: The job's type (``rlhf``, ``dpo``, ``lora``, ``sft``, ``other``).
        **header: Optional header fields: ``trainer``, ``model``, ``planned_steps``, ``world_size``, ``config``.

    Example::

        rec = TraceRecorder("run.jsonl", job_id="grpo-1", job_type="rlhf", trainer="GRPOTrainer", planned_steps=300)
        rec.eval(10, 1.25, eval_scores=[1.0, 1.5], proxy_reward=0.8, train_loss=0.02, wall_s=4.1)
        rec.end("stopped", stopped_at=30, best_step=10, best_score=1.25)
    """

    def __init__(self, path: str | os.PathLike[str], job_id: str, job_type: str, **header: Any) -> None:
        unknown = sorted(set(header) - HEADER_OPTIONAL_FIELDS)
        if unknown:
            raise TraceError(f"unknown trace header field(s): {', '.join(unknown)}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._last_step: int | None = None
        self._ended = False
        self._fh = open(self.path, "w", encoding="utf-8")
        line: dict[str, Any] = {"kind": "header", "format": TRACE_FORMAT, "job_id": job_id, "job_type": job_type}
        line.update({k: v for k, v in header.items() if v is not None})
        self._write(line)

    @property
    def last_step(self) -> int | None:
        return self._last_step

    @property
    def closed(self) -> bool:
        return self._fh.closed

    def _write(self, line: Mapping[str, Any]) -> None:
        if self._fh.closed:
            raise TraceError(f"trace {self.path} is closed")
        self._fh.write(json.dumps(line, allow_nan=False) + "\n")
        self._fh.flush()

    def eval(self, step: int, eval_score: float, **fields: Any) -> None:
        """Append one evaluation.

        Args:
            step: Training step; strictly greater than the previous eval line's.
            eval_score: Mean world-feedback score (finite).
            **fields: Optional ``eval_scores`` (list of finite numbers), ``proxy_reward``, ``train_loss``, ``kl``,
                ``wall_s`` (seconds since training began), ``gpu_s`` (accelerator-seconds since training began).
                ``None`` values are left out.
        """
        if self._ended:
            raise TraceError(f"trace {self.path} already has its end line")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise TraceError(f"trace step must be an integer >= 0, got {step!r}")
        if self._last_step is not None and step <= self._last_step:
            raise TraceError(f"trace steps must increase: step {step} after {self._last_step}")
        unknown = sorted(set(fields) - EVAL_OPTIONAL_FIELDS)
        if unknown:
            raise TraceError(
                f"unknown trace eval field(s): {', '.join(unknown)}; allowed: {', '.join(sorted(EVAL_OPTIONAL_FIELDS))}"
            )
        line: dict[str, Any] = {"kind": "eval", "step": step, "eval_score": _finite("eval_score", eval_score)}
        for name in sorted(fields):
            value = fields[name]
            if value is None:
                continue
            if name == "eval_scores":
                if not isinstance(value, Sequence) or isinstance(value, (str, bytes)) or not value:
                    raise TraceError("trace field eval_scores must be a non-empty list of numbers")
                line[name] = [_finite("eval_scores[]", v) for v in value]
            else:
                line[name] = _finite(name, value)
        self._write(line)
        self._last_step = step

    def append_raw(self, lines: Sequence[Mapping[str, Any]]) -> None:
        """Append eval lines read from another trace (e.g. the prefix a resumed run keeps), validating each."""
        for obj in lines:
            fields = {k: obj[k] for k in EVAL_OPTIONAL_FIELDS if k in obj}
            self.eval(obj["step"], obj["eval_score"], **fields)

    def end(self, reason: str, best_step: int | None, best_score: float | None, stopped_at: int | None = None) -> None:
        """Write the end line and close the file. Calling it again is a no-op (the first end wins)."""
        if self._ended:
            return
        line: dict[str, Any] = {"kind": "end", "reason": str(reason)}
        if stopped_at is not None:
            line["stopped_at"] = int(stopped_at)
        line["best_step"] = best_step
        line["best_score"] = None if best_score is None else _finite("best_score", best_score)
        self._write(line)
        self._ended = True
        self.close()

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()

    def __enter__(self) -> "TraceRecorder":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_trace(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a trace written by :class:`TraceRecorder` (or another tool), checking the format.

    Raises:
        TraceError: with the file name and line number of the first bad line.
    """
    path = Path(path)
    lines: list[dict[str, Any]] = []
    last_step: int | None = None
    with open(path, encoding="utf-8") as fh:
        for no, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{path}:{no}: not JSON ({exc.msg})") from None
            kind = obj.get("kind") if isinstance(obj, dict) else None
            if no == 1 and (kind != "header" or obj.get("format") != TRACE_FORMAT
                            or not obj.get("job_id") or not obj.get("job_type")):
                raise TraceError(f"{path}:{no}: the first line must be a {TRACE_FORMAT} header with job_id and job_type")
            if kind == "eval":
                step = obj.get("step")
                if not isinstance(step, int) or (last_step is not None and step <= last_step):
                    raise TraceError(f"{path}:{no}: eval steps must be increasing integers, got {step!r}")
                last_step = step
            elif kind not in ("header", "end"):
                raise TraceError(f"{path}:{no}: unknown line kind {kind!r}")
            lines.append(obj)
    if not lines:
        raise TraceError(f"{path}:1: empty trace")
    return lines
