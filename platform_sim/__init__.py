"""evalstop's platform side: the scheduler core, the discrete-event simulator and the scheduler service.

- :mod:`platform_sim.core`: pure detectors, per-job monitors, the information boundary and cadence hints (no I/O).
- :mod:`platform_sim.sim`: the simulator engine and its commands (``run``, ``paper``, ``sweep``), the scheduling
  policies only it uses (:mod:`platform_sim.sim.policies`), recorded traces and the corpora by name.
- :mod:`platform_sim.studies`: studies built on the engine (replay, benchmark, detector, cadence and Tune studies).
- :mod:`platform_sim.integrations`: Ray Tune and Optuna adapters.
- :mod:`platform_sim.service`: the scheduler service (``evalstop-server``).
- :mod:`platform_sim.trace_format`: the JSONL trace format (schema, reader, writer).
- :mod:`platform_sim.cli`: ``evalstop-sim``.
"""

# The version of the `evalstop` distribution, in this one place: pyproject.toml reads it from here
# ([tool.setuptools.dynamic]) and evalstop_callbacks re-exports it. Bump it with a section of CHANGELOG.md.
__version__ = "0.2.0.dev0"
