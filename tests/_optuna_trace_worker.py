"""Recorded traces as the trials of an Optuna study pruned by EvalStopPruner (used by tests/test_integrations_optuna.py).

Run as a script, it is one worker process of a study kept in an RDB storage: ``python _optuna_trace_worker.py STORAGE
N`` runs N trials of the study named ``traces``, whose user attribute ``traces`` lists the trace names of the real
corpus that its trials replay (trial number i replays the i-th name).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import optuna

from platform_sim.integrations.optuna import EvalStopPruner
from platform_sim.sim.corpora import corpus_dir
from platform_sim.sim.traces import load_traces
from platform_sim.studies.trace_detection import corpus_scale


def trace_objective(names: Sequence[str]) -> Callable[[optuna.Trial], float]:
    """The objective whose trial number i reports the i-th named trace's evals, on the corpus-wide 0-1 scale."""
    traces = {t.name: t for t in load_traces(corpus_dir("real"))}
    scale = corpus_scale(list(traces.values()))  # the whole corpus's scale, whichever traces the study replays

    def objective(trial: optuna.Trial) -> float:
        # trial.number is unique across processes (two SQLite workers never take the same number).
        t = traces[names[trial.number]]
        trial.set_user_attr("trace", t.name)
        for step, score in zip(t.steps, t.scores):
            trial.report(scale(score), step)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return scale(t.scores[-1])

    return objective


def main(storage: str, n_trials: int) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="traces", storage=storage, pruner=EvalStopPruner())
    study.optimize(trace_objective(study.user_attrs["traces"]), n_trials=n_trials)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
