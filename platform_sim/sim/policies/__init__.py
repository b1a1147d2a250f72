"""The simulator's GPU-scheduling policies: what to run next and when to stop a job.

Only the simulator (and the studies built on it) schedules GPUs, so this code lives beside the engine rather than in
the pure core; it builds on the core's detectors, monitors and information boundary.

- :mod:`.views`: the :class:`JobView` a policy may read (observable fields only).
- :mod:`.policies`: the base policies ordering the queue (FIFO, SJF, SRTF, loss-aware, ...).
- :mod:`.stop_policies`: stop policies layered on a base policy (EvalStop, oracle, fleet choice, ...).
- :mod:`.fleet`: the fleet-level choice between a conservative and an aggressive detector.
"""
