"""The trace format's fields and the validation of one line (pure): see :mod:`platform_sim.trace_format`."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from platform_sim.core.boundary import JOB_TYPES, InvalidReportError, Report

TRACE_FORMAT = "evalstop-trace/1"
"""The ``format`` value of every header this module reads and writes."""

LINE_KINDS: tuple[str, ...] = ("header", "eval", "non_finite", "end")
SPLITS: tuple[str, ...] = ("tune", "test")
"""Values of the header's ``split``: detectors may be tuned on ``tune`` environments, only tested on ``test`` ones."""

HEADER_REQUIRED: tuple[str, ...] = ("format", "job_id", "job_type")
HEADER_OPTIONAL: frozenset[str] = frozenset(
    {"trainer", "model", "planned_steps", "world_size", "config", "environment", "split"}
)
EVAL_REQUIRED: tuple[str, ...] = ("step", "eval_score")
EVAL_NUMBERS: tuple[str, ...] = ("proxy_reward", "train_loss", "kl", "wall_s", "gpu_s")
"""Optional finite-number fields of an eval line."""
EVAL_SPREAD: tuple[str, ...] = ("eval_std", "eval_n")
"""The optional spread of an eval line, together or not at all, checked as the boundary's report checks them."""
EVAL_OPTIONAL: frozenset[str] = frozenset({"eval_scores", *EVAL_SPREAD, *EVAL_NUMBERS})
NON_FINITE_REQUIRED: tuple[str, ...] = ("step", "what")
"""The fields of a non_finite line: an evaluation whose score was NaN or inf, recorded and not decided on."""
END_REQUIRED: tuple[str, ...] = ("reason",)
END_OPTIONAL: frozenset[str] = frozenset({"stopped_at", "best_step", "best_score"})


class TraceError(ValueError):
    """A trace (or a line about to be written) that breaks the format, or a bad trace file. Read errors start with
    ``file:line:``. The one error type of traces (the simulator and the trainer side raise it too)."""


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
        TraceError: naming the first bad field (no file or line: the caller adds them).
    """
    if not isinstance(obj, dict) or obj.get("kind") != "header":
        got = obj.get("kind") if isinstance(obj, dict) else type(obj).__name__
        raise TraceError(f"the first line must be the header (kind 'header'), got kind {got!r}")
    if obj.get("format") != TRACE_FORMAT:
        raise TraceError(f"unsupported format {obj.get('format')!r}; expected {TRACE_FORMAT!r}")
    if not isinstance(obj.get("job_id"), str) or not obj["job_id"]:
        raise TraceError("header field job_id must be a non-empty string")
    if obj.get("job_type") not in JOB_TYPES:
        raise TraceError(f"header field job_type must be one of {', '.join(JOB_TYPES)}, got {obj.get('job_type')!r}")
    unknown = _unknown(obj, (*HEADER_REQUIRED, *HEADER_OPTIONAL))
    if unknown:
        raise TraceError(
            f"unknown trace header field(s): {', '.join(unknown)}; allowed besides "
            f"{', '.join(HEADER_REQUIRED)}: {', '.join(sorted(HEADER_OPTIONAL))}"
        )
    for name in ("trainer", "model"):
        if obj.get(name) is not None and not isinstance(obj[name], str):
            raise TraceError(f"header field {name} must be a string, got {obj[name]!r}")
    # planned_steps 0 means "not known" (a trainer without max_steps).
    for name, minimum in (("planned_steps", 0), ("world_size", 1)):
        if obj.get(name) is not None and not _is_int(obj[name], minimum):
            raise TraceError(f"header field {name} must be an integer >= {minimum}, got {obj[name]!r}")
    if obj.get("config") is not None and not isinstance(obj["config"], dict):
        raise TraceError(f"header field config must be an object, got {type(obj['config']).__name__}")
    if "environment" in obj and (not isinstance(obj["environment"], str) or not obj["environment"].strip()):
        raise TraceError(f"header field environment must be a non-empty string, got {obj['environment']!r}")
    if "split" in obj and obj["split"] not in SPLITS:
        raise TraceError(f"header field split must be one of {', '.join(SPLITS)}, got {obj['split']!r}")
    return obj


def check_eval(obj: Any, prev_step: int | None = None) -> dict[str, Any]:
    """Validate an eval line (already parsed) that follows an eval at ``prev_step``; return it unchanged.

    Raises:
        TraceError: naming the first bad field.
    """
    if not isinstance(obj, dict) or obj.get("kind") != "eval":
        raise TraceError("not an eval line")
    unknown = _unknown(obj, (*EVAL_REQUIRED, *EVAL_OPTIONAL))
    if unknown:
        raise TraceError(
            f"unknown trace eval field(s): {', '.join(unknown)}; allowed besides step and "
            f"eval_score: {', '.join(sorted(EVAL_OPTIONAL))}"
        )
    step = obj.get("step")
    if not isinstance(step, int) or not _is_int(step, 0):
        raise TraceError(f"eval step must be an integer >= 0, got {step!r}")
    if prev_step is not None and step <= prev_step:
        raise TraceError(f"eval steps must be increasing integers (steps must increase: step {step} after {prev_step})")
    if "eval_score" not in obj:
        raise TraceError("eval line without eval_score")
    if not _is_finite(obj["eval_score"]):
        raise TraceError(f"eval_score must be a finite number, got {obj['eval_score']!r}")
    per = obj.get("eval_scores")
    if per is not None and (not isinstance(per, list) or not per or not all(_is_finite(v) for v in per)):
        raise TraceError("eval_scores must be a non-empty list of finite numbers")
    for name in EVAL_NUMBERS:
        if obj.get(name) is not None and not _is_finite(obj[name]):
            raise TraceError(f"{name} must be a finite number, got {obj[name]!r}")
    if any(obj.get(name) is not None for name in EVAL_SPREAD):
        _check_spread(obj)
    return obj


def _check_spread(obj: Mapping[str, Any]) -> None:
    """The eval line's ``eval_std``/``eval_n`` as a report would carry them: the boundary's rule (both or neither,
    ``eval_std`` finite >= 0, ``eval_n`` an integer >= 2, agreeing with ``eval_scores`` when both are there)."""
    try:
        Report(
            "trace",
            "other",
            obj["step"],
            obj["eval_score"],
            obj.get("eval_scores"),
            obj.get("eval_std"),
            obj.get("eval_n"),
        )
    except InvalidReportError as exc:
        raise TraceError(str(exc)) from None


def check_non_finite(obj: Any, prev_step: int | None) -> dict[str, Any]:
    """Validate a non_finite line (an evaluation whose score was NaN or inf) after an evaluation at ``prev_step``;
    return it unchanged. Its step takes its place among the eval lines' steps (they all increase).

    Raises:
        TraceError: naming the first bad field.
    """
    if not isinstance(obj, dict) or obj.get("kind") != "non_finite":
        raise TraceError("not a non_finite line")
    unknown = _unknown(obj, NON_FINITE_REQUIRED)
    if unknown:
        raise TraceError(f"unknown trace non_finite field(s): {', '.join(unknown)}; allowed: step, what")
    step = obj.get("step")
    if not isinstance(step, int) or not _is_int(step, 0):
        raise TraceError(f"non_finite step must be an integer >= 0, got {step!r}")
    if prev_step is not None and step <= prev_step:
        raise TraceError(f"evaluation steps must increase: non_finite step {step} after {prev_step}")
    if not isinstance(obj.get("what"), str) or not obj["what"]:
        raise TraceError(f"non_finite field what must be a non-empty string, got {obj.get('what')!r}")
    return obj


def check_end(obj: Any) -> dict[str, Any]:
    """Validate an end line (already parsed); return it unchanged.

    Raises:
        TraceError: naming the first bad field.
    """
    if not isinstance(obj, dict) or obj.get("kind") != "end":
        raise TraceError("not an end line")
    unknown = _unknown(obj, (*END_REQUIRED, *END_OPTIONAL))
    if unknown:
        raise TraceError(f"unknown trace end field(s): {', '.join(unknown)}")
    if not isinstance(obj.get("reason"), str) or not obj["reason"]:
        raise TraceError(f"end field reason must be a non-empty string, got {obj.get('reason')!r}")
    for name in ("stopped_at", "best_step"):
        if obj.get(name) is not None and not _is_int(obj[name], 0):
            raise TraceError(f"end field {name} must be an integer >= 0, got {obj[name]!r}")
    if obj.get("best_score") is not None and not _is_finite(obj["best_score"]):
        raise TraceError(f"end field best_score must be a finite number, got {obj['best_score']!r}")
    return obj


# -- reading (pure parsing, then the file functions) ------------------------------------------------------------
