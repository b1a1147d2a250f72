"""Studies built on the simulator: what the engine (:mod:`platform_sim.sim`) and the core measure on real traces.

- :mod:`.replay`: the platform fed by recorded real traces (``evalstop-sim replay``).
- :mod:`.benchmark`: detectors tuned on one set of environments, judged on another (``evalstop-sim benchmark``).
- :mod:`.detector_study`: every stop detector on the same workloads and seeds (``evalstop-sim detectors``).
- :mod:`.cadence_study`: fixed against adaptive cadence.
- :mod:`.dense_replay`: cadence hints replayed on densely recorded traces.
- :mod:`.tune_replay`: recorded traces as the trials of a real Ray Tune experiment (``evalstop-sim tune``).
- :mod:`.cli`: the commands above.

The studies import the engine and the core; the engine never imports a study.
"""
