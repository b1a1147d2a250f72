"""EvalStopPruner in real Optuna studies on a real SQLite file.

- recorded traces replayed as trials: exactly the traces the embedded core stops are pruned, each at the core's stop
  step, on the whole corpus (in memory) and on a part of it by two worker processes sharing a SQLite storage;
- ``Trainer.hyperparameter_search(backend="optuna")`` with the callback: the trial trained toward the wrong words is
  pruned at the eval where the callback's own core would stop it, the healthy one completes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

optuna = pytest.importorskip("optuna")

from _optuna_trace_worker import trace_objective  # noqa: E402

from platform_sim.core import default_spec, detector_from_spec, paper_spec  # noqa: E402
from platform_sim.integrations.optuna import EvalStopPruner  # noqa: E402
from platform_sim.sim.corpora import corpus_dir  # noqa: E402
from platform_sim.sim.traces import load_traces  # noqa: E402
from platform_sim.studies.trace_detection import corpus_scale, trace_detection  # noqa: E402

WORKER = Path(__file__).with_name("_optuna_trace_worker.py")


def _assert_pruned_where_the_core_stops(trials, traces) -> dict:
    """Every trace was one trial; those the embedded core stops were pruned at its stop step, the others completed;
    returns the trials by trace name."""
    scale = corpus_scale(load_traces(corpus_dir("real")))  # the scale the objective uses
    assert len(trials) == len(traces)
    by_trace = {tr.user_attrs["trace"]: tr for tr in trials}
    assert set(by_trace) == {t.name for t in traces}
    # The pruners use the default detector and see only the mean scores, without the run's planned steps (a trial
    # does not say its length): the core runs with the same spec on the same scores (no per-example ones).
    for t in traces:
        stop = trace_detection(t, default_spec(), scale, examples=[None] * len(t.scores), report_plan=False)
        stop = stop["stop_step"]
        tr = by_trace[t.name]
        if stop is None:
            assert tr.state == optuna.trial.TrialState.COMPLETE, t.name
            assert max(tr.intermediate_values) == t.steps[-1]
        else:
            assert tr.state == optuna.trial.TrialState.PRUNED, t.name
            assert max(tr.intermediate_values) == stop, t.name
    return by_trace


def test_trace_study_prunes_what_the_core_stops_on_every_trace():
    # The whole corpus in one process, in memory: the pruner decides as the core does on every recorded trace.
    traces = load_traces(corpus_dir("real"))
    names = sorted(t.name for t in traces)
    study = optuna.create_study(direction="maximize", pruner=EvalStopPruner())
    study.optimize(trace_objective(names), n_trials=len(names))
    by_trace = _assert_pruned_where_the_core_stops(study.get_trials(), traces)
    hacking = [t for t in traces if t.label == "hacking"]
    assert hacking and all(by_trace[t.name].state == optuna.trial.TrialState.PRUNED for t in hacking)


def test_trace_study_across_processes_prunes_what_the_core_stops(tmp_path):
    # Two worker processes share one SQLite study: each decision is made from the storage, so it is the core's in
    # whichever process reports. Every 12th trace of the corpus (13, pruned and completed ones; each SQLite write is
    # a commit, so the whole corpus is left to the in-memory study above).
    traces = sorted(load_traces(corpus_dir("real")), key=lambda t: t.name)[::12]
    names = [t.name for t in traces]
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="traces", storage=storage, direction="maximize")
    study.set_user_attr("traces", names)
    half = len(names) // 2
    workers = [subprocess.Popen([sys.executable, str(WORKER), storage, str(n)]) for n in (half, len(names) - half)]
    assert [w.wait(timeout=300) for w in workers] == [0, 0]

    trials = optuna.load_study(study_name="traces", storage=storage).get_trials()
    by_trace = _assert_pruned_where_the_core_stops(trials, traces)
    assert {tr.state for tr in by_trace.values()} == {optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.COMPLETE}


def test_minimize_study_negates_losses(tmp_path):
    # A loss that rises twice in a row is two declines of the score: pruned at the second rise (the paper's rule).
    study = optuna.create_study(
        storage=f"sqlite:///{tmp_path / 's.db'}", direction="minimize", pruner=EvalStopPruner(paper_spec())
    )
    seen = []

    def objective(trial):
        for step, loss in enumerate([1.0, 0.8, 0.6, 0.7, 0.9, 1.2], start=1):
            trial.report(loss, step)
            seen.append(step)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return loss

    study.optimize(objective, n_trials=1)
    assert study.trials[0].state == optuna.trial.TrialState.PRUNED and seen[-1] == 5
    decision = EvalStopPruner(paper_spec()).decision(study, study.trials[0])
    assert decision.should_stop and decision.best_step == 3 and decision.best_score == -0.6


def test_default_detector_is_the_projects_default():
    assert EvalStopPruner().detector_spec == detector_from_spec(default_spec()).spec()


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="direction"):
        EvalStopPruner(direction="up")
    with pytest.raises(ValueError, match="unknown detector"):
        EvalStopPruner("no-such-detector")


def test_hyperparameter_search_with_the_callback(tmp_path):
    from dataclasses import dataclass, field

    from _callback_helpers import policy, sentences, tokenizer
    from datasets import Dataset
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    from evalstop_callbacks import EvalStopCallback, MetricEvaluator

    tok = tokenizer()

    def encode(lines):
        return Dataset.from_dict({"text": lines}).map(lambda b: tok(b["text"]), batched=True, remove_columns=["text"])

    data = {kind: encode(sentences(kind)) for kind in ("positive", "negative")}

    @dataclass
    class KindArgs(TrainingArguments):
        # The searched parameter: which text the trial trains on ("negative" makes the held-out loss rise).
        data_kind: str = field(default="positive")

    class KindTrainer(Trainer):
        def get_train_dataloader(self):
            self.train_dataset = data[self.args.data_kind]
            return super().get_train_dataloader()

    callbacks = []

    def model_init(trial=None):
        # One EvalStopCallback serves one training run: each trial gets a fresh one (observe mode: Optuna decides).
        if trial is not None:
            if callbacks:
                trainer.remove_callback(callbacks[-1])
            callbacks.append(
                EvalStopCallback(
                    MetricEvaluator("loss", greater_is_better=False),
                    eval_steps=2,
                    k=2,
                    job_type="other",
                    mode="observe",
                    eval_on_start=False,
                )
            )
            trainer.add_callback(callbacks[-1])
        return policy()

    args = KindArgs(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        learning_rate=5e-3,
        max_steps=12,
        use_cpu=True,
        bf16=False,
        report_to="none",
        disable_tqdm=True,
        logging_steps=1,
        save_strategy="no",
        seed=0,
    )
    trainer = KindTrainer(
        model_init=model_init,
        args=args,
        train_dataset=data["positive"],
        eval_dataset=encode(sentences("positive", 32, seed=1)),
        data_collator=DataCollatorForLanguageModeling(tok, mlm=False),
    )
    storage = f"sqlite:///{tmp_path / 'hp.db'}"
    study = optuna.create_study(study_name="hp", storage=storage, direction="minimize")
    study.enqueue_trial({"data_kind": "negative"})
    study.enqueue_trial({"data_kind": "positive"})
    trainer.hyperparameter_search(
        hp_space=lambda trial: {"data_kind": trial.suggest_categorical("data_kind", ["positive", "negative"])},
        backend="optuna",
        direction="minimize",
        n_trials=2,
        pruner=EvalStopPruner(paper_spec()),
        storage=storage,
        study_name="hp",
        load_if_exists=True,
    )

    neg, pos = optuna.load_study(study_name="hp", storage=storage).get_trials()
    assert neg.params == {"data_kind": "negative"} and pos.params == {"data_kind": "positive"}
    assert neg.state == optuna.trial.TrialState.PRUNED
    assert pos.state == optuna.trial.TrialState.COMPLETE
    neg_cb, pos_cb = callbacks
    # The pruner and the callback's own core saw the same evals and decided the same.
    assert neg_cb.would_stop_at is not None and max(neg.intermediate_values) == neg_cb.would_stop_at
    assert [h["eval_score"] for h in neg_cb.history] == pytest.approx(
        [-neg.intermediate_values[s] for s in sorted(neg.intermediate_values)]
    )
    assert pos_cb.would_stop_at is None and max(pos.intermediate_values) == 12


def _healthy_values(seed: int, steps: int = 150) -> list[float]:
    """A saturating rise from 0.2 to 0.6, reported at every step with noise of a quarter of the gain."""
    rng = np.random.default_rng(seed)
    x = np.arange(1, steps + 1)
    return list(0.2 + 0.4 * (1 - np.exp(-x / (steps / 5))) + rng.normal(0, 0.1, steps))


def _pruned(pruner: EvalStopPruner, runs: list[list[float]]) -> int:
    study = optuna.create_study(direction="maximize", pruner=pruner)

    def objective(trial):
        for step, value in enumerate(runs[trial.number], start=1):
            trial.report(value, step)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return value

    study.optimize(objective, n_trials=len(runs))
    return sum(t.state == optuna.trial.TrialState.PRUNED for t in study.trials)


def test_planned_steps_bound_false_prunes_per_trial_not_per_report():
    # Healthy trials reported at every step: per look the default prunes many; told the trials' planned steps, it
    # tests per trial (the reason names planned progress) and still prunes a trial whose score falls.
    runs = [_healthy_values(seed) for seed in range(4)]
    assert _pruned(EvalStopPruner(), runs) >= 2
    assert _pruned(EvalStopPruner(planned_steps=150), runs) == 0
    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    for step in range(1, 151):  # up to step 50, then down
        trial.report(0.2 + 0.4 * min(step, 50) / 50 - 0.4 * max(0, step - 50) / 50, step)
    decision = EvalStopPruner(planned_steps=150).decision(study, study.trials[0])
    assert decision.should_stop and decision.best_step == 50
    assert "planned progress (150 planned steps" in decision.reason


@pytest.mark.parametrize("bad", [0, -1, 2.5, "300"])
def test_bad_planned_steps_are_named(bad):
    with pytest.raises(ValueError, match="planned_steps must be an integer >= 1"):
        EvalStopPruner(planned_steps=bad)
