"""A tiny job run inside a real Slurm batch job by tests/test_slurm_e2e.py: it reports eval scores to an
``evalstop-server`` through the real PlatformClient, registering its SLURM_JOB_ID as its scheduler handle.

It does not cooperate with a stop: after a stop decision it keeps running (``--linger`` seconds), and with
``--ignore-term`` it ignores SIGTERM too, so only the scheduler (through the service's actuator) can end it. It
writes what happened into ``--marks`` (one line per event), which the test reads.

Usage: python tests/_slurm_job.py --url URL --job-id ID --scores 0.1,0.3,... --marks FILE [--interval S]
       [--linger S] [--ignore-term]      (the tenant's token in $EVALSTOP_TOKEN)
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from evalstop_callbacks.platform_client import PlatformClient
from platform_sim.core import Action, Report


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--job-id", required=True)
    p.add_argument("--scores", required=True)
    p.add_argument("--marks", type=Path, required=True)
    p.add_argument("--interval", type=float, default=0.2)
    p.add_argument("--linger", type=float, default=120.0)
    p.add_argument("--ignore-term", action="store_true")
    args = p.parse_args()

    def mark(text: str) -> None:
        with args.marks.open("a") as f:
            f.write(text + "\n")

    def on_term(signum: int, frame: object) -> None:
        mark("term")
        if not args.ignore_term:
            sys.exit(143)

    signal.signal(signal.SIGTERM, on_term)
    mark(f"start {os.environ.get('SLURM_JOB_ID')}")
    client = PlatformClient(args.url, os.environ["EVALSTOP_TOKEN"], scheduler_handle="auto", max_retries=1)
    client.register("rlhf", detector={"name": "k-decline", "params": {"k": 2}}, job_id=args.job_id)
    for i, score in enumerate(float(s) for s in args.scores.split(",")):
        decision = client.report(Report(args.job_id, "rlhf", 10 * (i + 1), score))
        if decision.action is Action.STOP:
            mark(f"stopped {10 * (i + 1)} best {decision.best_step}")
            # Not cooperating: the job goes on as if it had not heard, until the scheduler ends it.
            deadline = time.monotonic() + args.linger
            while time.monotonic() < deadline:
                time.sleep(0.1)
            mark("lingered to the end")
            return 0
        time.sleep(args.interval)
    client.finish(args.job_id)
    mark("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
