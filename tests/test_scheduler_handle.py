"""The job side's scheduler handle, read from the variables each scheduler sets (evalstop_callbacks.scheduler_handle)."""

from __future__ import annotations

import json

import pytest

from evalstop_callbacks.scheduler_handle import detect_handle

# What Ray's job supervisor sets for a `ray job submit` entrypoint (its _get_driver_env_vars): the job config JSON.
RAY_ENV = {
    "RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps(
        {"runtime_env": {}, "metadata": {"job_submission_id": "raysubmit_AbC123", "job_name": "raysubmit_AbC123"}}
    ),
    "RAY_ADDRESS": "127.0.0.1:6379",
}


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"SLURM_JOB_ID": "1234", "SLURM_JOB_NAME": "grpo"}, ("slurm", "1234")),
        ({"SLURM_JOB_ID": "1240", "SLURM_ARRAY_JOB_ID": "1234", "SLURM_ARRAY_TASK_ID": "6"}, ("slurm", "1234_6")),
        (RAY_ENV, ("ray", "raysubmit_AbC123")),
        ({"POD_NAMESPACE": "team-a", "POD_NAME": "grpo-x7k2p", "JOB_NAME": "grpo"}, ("kubernetes", "team-a/job/grpo")),
        (
            {"POD_NAMESPACE": "team-a", "JOB_NAME": "js-workers-0", "JOBSET_NAME": "js"},
            ("kubernetes", "team-a/jobset/js"),
        ),
        # A Ray job on a Ray cluster inside a Slurm allocation: the Ray job is this job, the allocation is not.
        ({**RAY_ENV, "SLURM_JOB_ID": "99"}, ("ray", "raysubmit_AbC123")),
    ],
)
def test_each_scheduler_is_read_from_its_own_variables(environ: dict[str, str], expected: tuple[str, str]) -> None:
    assert detect_handle(environ) == expected


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"HOME": "/root"},
        {"SLURM_JOB_ID": ""},
        {"SLURM_JOB_ID": "12.0"},
        {"POD_NAMESPACE": "team-a", "POD_NAME": "grpo-x7k2p"},  # a bare pod names nothing one can suspend
        {"RAY_JOB_CONFIG_JSON_ENV_VAR": "{not json"},
        {"RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps({"metadata": {}})},
        {"RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps(["x"])},
    ],
)
def test_no_handle_when_no_scheduler_names_the_job(environ: dict[str, str]) -> None:
    assert detect_handle(environ) is None


def test_a_broken_array_task_falls_back_to_the_job_id() -> None:
    assert detect_handle({"SLURM_JOB_ID": "1240", "SLURM_ARRAY_JOB_ID": "1234", "SLURM_ARRAY_TASK_ID": ""}) == (
        "slurm",
        "1240",
    )


def test_the_handle_reads_as_a_tuple_and_by_name() -> None:
    found = detect_handle({"SLURM_JOB_ID": "77"})
    assert found is not None
    kind, ref = found
    assert (kind, ref) == (found.kind, found.ref) == ("slurm", "77")
