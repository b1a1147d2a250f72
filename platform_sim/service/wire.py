"""The service's wire schemas (pydantic v2): the information boundary as the HTTP API sees it.

Every request model forbids unknown fields (``extra="forbid"``), so a client that sends a training loss, a proxy
reward or a checkpoint path gets a 422 naming the field instead of having it silently dropped. Scores must be finite
(``allow_inf_nan=False``). The core re-validates everything it is given: these models are the first line, not the
only one.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, get_args

from fastapi import Path
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StrictFloat,
    Tag,
    field_validator,
)

from platform_sim.core import CADENCES, JOB_TYPES

JobType = Literal["rlhf", "dpo", "lora", "sft", "other"]
assert set(JobType.__args__) == set(JOB_TYPES), "JobType must list the core's JOB_TYPES"  # type: ignore[attr-defined]

JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
"""Job ids: 1-128 characters, letters, digits and ``._:-``, starting with a letter or digit (safe in URLs and logs).
Always applied as a full match (``re.fullmatch``; pydantic's ``$`` does not accept a trailing newline either)."""

MAX_EVAL_SCORES = 10_000
"""Default most per-example scores one report may carry (``evalstop-server serve --max-eval-scores``). It bounds
what one job's detector keeps in memory (the paired detectors keep the best checkpoint's per-example scores)."""

MAX_GPUS = 65_536
"""Largest GPU count a job may declare (for the GPUs-freed and GPU-hours-reclaimed metrics)."""
MAX_PLANNED_STEPS = 10**9
"""Largest planned step count a job may declare (for the GPU-hours-reclaimed estimate)."""


def _not_bool_or_str(value: Any) -> Any:
    # JSON true/false and "4" are not numbers: pydantic's lax mode would read them as 1/0 and 4.
    if isinstance(value, (bool, str)):
        raise ValueError(f"must be a JSON number, not {'a boolean' if isinstance(value, bool) else 'a string'}")
    return value


Number = Annotated[float, BeforeValidator(_not_bool_or_str)]
"""A JSON number (integer or not), never a boolean or a string."""
Integer = Annotated[int, BeforeValidator(_not_bool_or_str)]
"""A JSON integer (``10.0`` is accepted as 10, as by the core), never a boolean or a string."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class DetectorSpec(_Strict):
    """Which stop detector decides for a job, and its parameters.

    The parameters are passed to the detector's constructor; the registry in ``platform_sim.core.detectors`` checks
    them (an unknown name or a bad parameter is a 422 naming it).
    """

    name: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        examples=["trend"],
        description="The detector's name; missing or null: the project's default detector "
        "(platform_sim.core.default_spec(), trend), with the params given here merged over its own.",
    )
    params: dict[str, Any] = Field(default_factory=dict, max_length=32, examples=[{"k": 2, "min_delta": 0.0}])

    @field_validator("params")
    @classmethod
    def _finite_params(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _finite("detector", value)


def _finite(what: str, value: dict[str, Any]) -> dict[str, Any]:
    """``value`` (a spec's parameters) if every number in it is finite; else a ValueError naming the parameter."""

    def check(v: Any, where: str) -> None:
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{what} parameter {where} must be finite, got {v}")
        if isinstance(v, dict):
            for k, item in v.items():
                check(item, f"{where}.{k}")
        elif isinstance(v, list):
            for i, item in enumerate(v):
                check(item, f"{where}[{i}]")

    for key, item in value.items():
        check(item, key)
    return value


CadenceName = Literal["fixed", "adaptive"]
"""The cadence names the service accepts (``platform_sim.core.CADENCES``), an enum in the OpenAPI schema so that a
schema-valid request is never refused for its cadence's name."""
assert set(get_args(CadenceName)) == set(CADENCES), "wire.CadenceName must list the core's cadences"


class CadenceSpec(_Strict):
    """How often the scheduler wants a job evaluated: ``fixed`` (the job's regular interval, no hints) or
    ``adaptive`` (decisions carry ``next_eval_step``, sooner than the regular interval while a decline may have
    begun), with the policy's parameters.

    The parameters are passed to the core's ``cadence_from_spec`` (``platform_sim.core.cadence``), which checks them
    (an unknown name or a bad parameter is a 422 naming it).
    """

    name: CadenceName = Field(examples=["adaptive"])
    params: dict[str, Any] = Field(default_factory=dict, max_length=32, examples=[{"fraction": 0.25}])

    @field_validator("params")
    @classmethod
    def _finite_params(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _finite("cadence", value)


def _cadence_form(value: Any) -> str:
    # A name or an object: pydantic then checks only the form given, and its message names only that form's problem.
    return "name" if isinstance(value, str) else "spec"


CadenceField = Annotated[
    Annotated[CadenceName, Tag("name")] | Annotated[CadenceSpec, Tag("spec")],
    Discriminator(_cadence_form),
]
"""A cadence as a registration gives it: a name (``"fixed"``, ``"adaptive"``) or a :class:`CadenceSpec` object."""


class JobCreate(_Strict):
    """Registration of a job.

    ``job_id`` is optional: the service makes one if it is missing. Registering an id again with the same type,
    detector, GPU count and cadence is idempotent (a retried or resumed registration) and answers 200 instead of 201;
    a different one is a 409.
    """

    job_type: JobType
    job_id: str | None = Field(None, pattern=JOB_ID_PATTERN)
    gpus: Integer | None = Field(
        None, ge=1, le=MAX_GPUS, description=f"GPUs the job holds (for GPU-hours reclaimed), at most {MAX_GPUS}."
    )
    planned_steps: Integer | None = Field(
        None,
        ge=1,
        le=MAX_PLANNED_STEPS,
        description="Planned training steps (the trainer's max_steps), at most "
        f"{MAX_PLANNED_STEPS}. The default detector bounds its false stops per run with it; without it, it tests "
        "every report on its own (per look), so a job reported more often is stopped more often. Also the "
        "GPU-hours-reclaimed estimate's.",
    )
    detector: DetectorSpec | None = Field(
        None, description="Stop detector; default: the project's default detector (platform_sim.core.default_spec())."
    )
    cadence: CadenceField | None = Field(
        None,
        description="Evaluation cadence: 'fixed' (no hints; the default), 'adaptive', or "
        "{'name': 'adaptive', 'params': {'fraction': 0.25}}. With 'adaptive' each decision may carry "
        "next_eval_step.",
        examples=["adaptive"],
    )


class ReportIn(_Strict):
    """One evaluation of a job: exactly the core's whitelisted Report, nothing else."""

    job_id: str = Field(pattern=JOB_ID_PATTERN)
    job_type: JobType
    step: Integer = Field(ge=0, le=2**62)
    eval_score: Number
    # The length limit is the server's (--max-eval-scores), checked after parsing; this is the schema's ceiling.
    # StrictFloat: JSON numbers only (no booleans, no strings), checked in pydantic's core without a Python call per
    # value (a report may carry tens of thousands).
    eval_scores: list[StrictFloat] | None = Field(None, min_length=1, max_length=1_000_000)
    # The spread, when only the mean and its spread are known; the core checks that both come together and agree
    # with eval_scores.
    eval_std: Number | None = Field(
        None,
        ge=0,
        description="Sample standard deviation (ddof=1) of the eval's example scores, finite and >= 0; with eval_n.",
    )
    eval_n: Integer | None = Field(
        None, ge=2, le=2**62, description="Count of the eval's example scores, >= 2; with eval_std."
    )


class FinishIn(_Strict):
    """The end of a job."""

    reason: str = Field("completed", min_length=1, max_length=200, examples=["completed", "stopped", "failed"])


class DecisionOut(BaseModel):
    """The scheduler's answer to a report (the core's Decision)."""

    action: Literal["continue", "stop"]
    reason: str
    declines: int
    best_step: int | None
    best_score: float | None
    next_eval_step: int | None = Field(
        None,
        description="Cadence hint from the scheduler to the job: the step at which it wants the next "
        "evaluation (sooner than the regular interval while a decline may have begun). Absent: "
        "keep the regular interval.",
    )


class JobOut(BaseModel):
    """A job as its tenant sees it."""

    job_id: str
    job_type: str
    status: Literal["running", "stopped", "finished"]
    detector: DetectorSpec = Field(
        description="The detector spec the job runs, {'name': ..., 'params': {...}} with every parameter filled in: "
        "the one the registration gave, or the service's default detector (platform_sim.core.default_spec()) when "
        "it gave none. A client's local fallback core runs exactly this spec while the service is unreachable."
    )
    cadence: CadenceSpec = Field(
        description="The job's cadence, normalized: {'name': 'fixed', 'params': {}} when it gets no hints."
    )
    gpus: int | None
    planned_steps: int | None
    created_at: float
    n_reports: int
    last_step: int | None
    last_decision: DecisionOut | None
    best_step: int | None
    best_score: float | None
    stopped_at: int | None
    finished_at: float | None
    finish_reason: str | None
    stop_reason: str | None = Field(None, description="The core's reason for the stop; null while not stopped.")
    mode: Literal["per-example", "mean-and-spread", "means only"] | None = Field(
        None,
        description="The evidence the job's detector decided on at its last report, as the decision's reason names "
        "it (per-example scores, each eval's mean with its spread, or the means alone); null before the first "
        "report or when the reason names none.",
    )
    per_run_bound: bool | None = Field(
        None,
        description="Whether the job's detector bounds its false stops over the whole run: true when it does so with "
        "the job's planned_steps (the default detector); false when it would but the job declared no planned_steps, "
        "so that it tests every report on its own (per look) and a job that reports more often is stopped more "
        "often; null for a detector whose decisions do not depend on a plan (the paper's k-decline, the baselines).",
    )
    gpu_hours_freed: float | None = Field(
        None,
        description="GPU-hours the stop gave back: gpus x the remaining planned steps at the job's measured step "
        "rate (server receive times); 0 for a job that declared both and was not stopped; null when the job never "
        "said its gpus or planned_steps.",
    )


class JobList(BaseModel):
    """A page of the tenant's jobs, ordered by id; pass ``next_after`` as ``after`` for the next page."""

    jobs: list[JobOut]
    next_after: str | None


class ErrorOut(BaseModel):
    """Every error the service answers."""

    error: str = Field(description="A short machine-readable code, e.g. not_found, conflict, invalid_request.")
    message: str = Field(description="What was wrong, for a human.")


JobIdPath = Annotated[str, Path(pattern=JOB_ID_PATTERN, description="The job's id.")]
"""The ``{job_id}`` of a route's path."""


class EvalOut(BaseModel):
    """One stored report of a job's history, with the decision it was answered."""

    step: int
    eval_score: float
    n_eval_scores: int | None = Field(description="How many per-example scores the report carried (null: none).")
    eval_std: float | None = Field(None, description="The report's eval_std (null: none).")
    eval_n: int | None = Field(None, description="The report's eval_n (null: none).")
    decision: DecisionOut
    received_at: float = Field(description="Unix time (server clock) the report was committed.")


class EvalList(BaseModel):
    """A page of a job's history; pass ``next_cursor`` as ``cursor`` (same ``order``) for the next page."""

    job_id: str
    order: Literal["newest", "step"]
    evals: list[EvalOut]
    next_cursor: int | None


class SummaryOut(BaseModel):
    """A tenant's totals."""

    running: int
    stopped: int = Field(description="Jobs stopped by the scheduler and not yet marked finished.")
    finished: int
    stopped_total: int = Field(description="Jobs the scheduler ever stopped, finished or not.")
    gpu_hours_freed: float


class EventOut(BaseModel):
    """One audit-trail event."""

    id: int = Field(description="Monotone: a later event has a larger id.")
    type: str = Field(examples=["job.stopped"])
    job_id: str | None
    time: float
    details: dict[str, Any]
    tenant: str | None = Field(None, description="The tenant's name (admin token only).")


class EventList(BaseModel):
    """A page of the audit trail; pass ``next_after`` as ``after`` to follow it."""

    events: list[EventOut]
    next_after: int
