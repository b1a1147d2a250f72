"""EvalStop inside the cluster schedulers people already run: a Ray Tune trial scheduler and an Optuna pruner.

Both put the same scheduler core (:class:`~platform_sim.core.JobMonitor` with a detector spec) between a training
job's reported eval scores and the scheduler's decision:

- :class:`platform_sim.integrations.ray_tune.EvalStopScheduler` wraps any Ray Tune ``TrialScheduler`` (FIFO by
  default, ASHA, HyperBand, PBT) and stops a trial whose eval score declines (needs the ``ray`` extra).
- :class:`platform_sim.integrations.optuna.EvalStopPruner` is an Optuna pruner deciding from a trial's intermediate
  values (needs ``optuna``).

Importing this package imports neither Ray nor Optuna; each module imports its own library.
"""
