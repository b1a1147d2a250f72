"""Which cluster scheduler's job this process runs as, read from the environment the scheduler sets.

A job registers this handle with the service (``PlatformClient(scheduler_handle="auto")``), so that a stop decision
can end the job through its scheduler even when the job does not cooperate. Pure: the environment is an argument.

What is read, most specific first (a Ray job may run on a Ray cluster that a Slurm allocation or a pod holds; ending
the Ray job, not the allocation, is what stops this job and only it):

- **Ray Jobs**: Ray's job supervisor starts the entrypoint with ``RAY_JOB_CONFIG_JSON_ENV_VAR``, a JSON object whose
  ``metadata.job_submission_id`` is the submission id (``ray job submit``'s ``raysubmit_...``). Ray sets no
  variable of its own for the submission id; a plain ``ray.init()`` driver has none and gets no handle.
- **Kubernetes**: the pod's namespace and the name of the Job or JobSet that owns it, which the pod gets only if its
  spec exposes them through the downward API::

      env:
      - name: POD_NAMESPACE
        valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
      - name: JOB_NAME          # a batch/v1 Job's pods carry this label
        valueFrom: {fieldRef: {fieldPath: "metadata.labels['batch.kubernetes.io/job-name']"}}
      # or, for a JobSet:
      - name: JOBSET_NAME
        valueFrom: {fieldRef: {fieldPath: "metadata.labels['jobset.sigs.k8s.io/jobset-name']"}}

  giving ``namespace/job/name`` or ``namespace/jobset/name``. ``POD_NAME`` alone names no object the scheduler can
  suspend (a Job's controller would only recreate the pod), so it gives no handle.
- **Slurm**: ``SLURM_ARRAY_JOB_ID`` and ``SLURM_ARRAY_TASK_ID`` for a task of a job array (``1234_5``), else
  ``SLURM_JOB_ID``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import NamedTuple


class DetectedHandle(NamedTuple):
    """A detected ``(kind, ref)``: a plain tuple, also readable as ``.kind`` and ``.ref`` like a
    :class:`~platform_sim.actuators.base.SchedulerHandle` (this module does not import the platform side)."""

    kind: str
    ref: str


_SLURM_ID = re.compile(r"[1-9][0-9]*")
_SLURM_TASK = re.compile(r"[0-9]+")


def detect_handle(environ: Mapping[str, str]) -> DetectedHandle | None:
    """The ``(kind, ref)`` of the scheduler job the environment describes, or ``None`` when it names none.

    Args:
        environ: The process environment (``os.environ``) or any mapping like it.

    Returns:
        A :class:`DetectedHandle` (a ``(kind, ref)`` tuple): ``("ray", submission_id)``, ``("kubernetes", "namespace/job/name")`` (or ``.../jobset/...``),
        ``("slurm", "1234")`` or ``("slurm", "1234_5")``; ``None`` when no scheduler's variables are set or they do
        not parse (a handle that cannot name the job is worse than none: the service would refuse it).
    """
    return _ray(environ) or _kubernetes(environ) or _slurm(environ)


def _ray(environ: Mapping[str, str]) -> DetectedHandle | None:
    raw = environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    if not raw:
        return None
    try:
        config = json.loads(raw)
    except ValueError:
        return None
    metadata = config.get("metadata") if isinstance(config, dict) else None
    submission = metadata.get("job_submission_id") if isinstance(metadata, dict) else None
    return DetectedHandle("ray", submission) if isinstance(submission, str) and submission.strip() else None


def _kubernetes(environ: Mapping[str, str]) -> DetectedHandle | None:
    namespace = environ.get("POD_NAMESPACE", "").strip()
    if not namespace:
        return None
    for variable, kind in (("JOBSET_NAME", "jobset"), ("JOB_NAME", "job")):
        name = environ.get(variable, "").strip()
        if name:
            return DetectedHandle("kubernetes", f"{namespace}/{kind}/{name}")
    return None


def _slurm(environ: Mapping[str, str]) -> DetectedHandle | None:
    array_job = environ.get("SLURM_ARRAY_JOB_ID", "").strip()
    task = environ.get("SLURM_ARRAY_TASK_ID", "").strip()
    if _SLURM_ID.fullmatch(array_job) and _SLURM_TASK.fullmatch(task):
        return DetectedHandle("slurm", f"{array_job}_{task}")
    job = environ.get("SLURM_JOB_ID", "").strip()
    return DetectedHandle("slurm", job) if _SLURM_ID.fullmatch(job) else None
