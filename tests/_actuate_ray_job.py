"""A Ray job that does not cooperate: it reports a rising-then-falling eval score to an evalstop-server every 0.3 s
and ignores every decision, so that only its scheduler can end it (``test_actuate_ray.py``).

Usage: python _actuate_ray_job.py URL TOKEN JOB_ID SUBMISSION_ID STEPS_FILE

It registers its Ray submission id as its scheduler handle through ``PlatformClient(scheduler_handle=...)`` and
appends each reported step to STEPS_FILE.
"""

from __future__ import annotations

import sys
import time

from evalstop_callbacks.platform_client import PlatformClient
from platform_sim.core import Report

CURVE = [0.30, 0.42, 0.50, 0.55, 0.57, 0.56, 0.52, 0.47, 0.41, 0.35, 0.30, 0.25]
N_REPORTS = 400  # two minutes at 0.3 s: far more than the test needs for the stop to end it


def main() -> None:
    url, token, job_id, submission_id, steps_file = sys.argv[1:6]
    with PlatformClient(url, token, scheduler_handle=("ray", submission_id), max_retries=0) as client:
        client.register("rlhf", job_id=job_id)
        for i in range(N_REPORTS):
            step = 10 * (i + 1)
            client.report(Report(job_id, "rlhf", step, CURVE[i] if i < len(CURVE) else 0.2))
            with open(steps_file, "a", encoding="utf-8") as f:
                f.write(f"{step}\n")
            time.sleep(0.3)


if __name__ == "__main__":
    main()
