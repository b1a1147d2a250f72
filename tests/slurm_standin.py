"""A stand-in Slurm for the service tests that need no cluster: ``squeue``, ``scancel`` and ``scontrol`` scripts in a
folder, answering from one file per job and recording every call.

``jobs/<id>`` holds ``user|account STATE`` (what ``squeue --format=%u|%a`` and ``--format=%T`` print); a job without
a file is unknown to this "cluster". ``delay`` holds the seconds ``squeue`` sleeps before it answers (a busy
slurmctld). ``calls`` gets ``start PID ARGS`` and ``end PID`` around each ``squeue``, and one line per ``scancel`` or
``scontrol``. ``stderr``, when present, is printed to stderr by ``squeue``, which then fails (exit status 1).
"""

from __future__ import annotations

from pathlib import Path

_SQUEUE = """#!/bin/bash
D={folder}
echo "start $$ $*" >> "$D/calls"
sleep "$(cat "$D/delay" 2>/dev/null || echo 0)"
if [ -f "$D/stderr" ]; then cat "$D/stderr" >&2; echo "end $$" >> "$D/calls"; exit 1; fi
for a in "$@"; do case "$a" in --jobs=*) job="${{a#--jobs=}}";; --format=*) fmt="${{a#--format=}}";; esac; done
if [ ! -f "$D/jobs/$job" ]; then
  echo "slurm_load_jobs error: Invalid job id specified" >&2; echo "end $$" >> "$D/calls"; exit 1
fi
read -r owner state < "$D/jobs/$job"
if [ "$fmt" = "%T" ]; then echo "$state"; else echo "$owner"; fi
echo "end $$" >> "$D/calls"
"""

_RECORD = """#!/bin/bash
echo "{name} $*" >> "{folder}/calls"
"""


class SlurmStandIn:
    """The stand-in's folder (see the module docstring)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        (folder / "jobs").mkdir(parents=True)
        (folder / "calls").touch()
        (folder / "squeue").write_text(_SQUEUE.format(folder=folder))
        for name in ("scancel", "scontrol"):
            (folder / name).write_text(_RECORD.format(name=name, folder=folder))
        for name in ("squeue", "scancel", "scontrol"):
            (folder / name).chmod(0o755)

    def job(self, job_id: str, user: str, account: str, state: str = "RUNNING") -> None:
        """Make Slurm job ``job_id`` (or change it): its owner and state."""
        (self.folder / "jobs" / job_id).write_text(f"{user}|{account} {state}\n")

    def delay(self, seconds: float) -> None:
        (self.folder / "delay").write_text(f"{seconds}\n")

    def fail_with(self, stderr: str) -> None:
        (self.folder / "stderr").write_text(stderr + "\n")

    def calls(self) -> list[str]:
        return (self.folder / "calls").read_text().splitlines()

    def squeue_started(self) -> int:
        return sum(1 for line in self.calls() if line.startswith("start "))

    def squeue_ended(self) -> int:
        return sum(1 for line in self.calls() if line.startswith("end "))

    def acted(self) -> list[str]:
        """The scancel and scontrol calls, in order."""
        return [line for line in self.calls() if line.startswith(("scancel", "scontrol"))]

    def serve_args(self, timeout_s: float = 30.0) -> tuple[str, ...]:
        """The ``serve``/``actuate`` flags of a Slurm actuator on this stand-in."""
        out: list[str] = ["--actuator", "slurm", "--actuator-option", f"timeout_s={timeout_s:g}"]
        for name in ("squeue", "scancel", "scontrol"):
            out += ["--actuator-option", f"{name}={self.folder / name}"]
        return tuple(out)
