"""The LLaMA-Factory entry point with the real ``llamafactory`` package (0.9.5, CPU).

Runs ``python -m evalstop_callbacks.integrations.llamafactory train config.yaml --json`` (what
``evalstop llamafactory train`` runs) on LLaMA-Factory's own YAML with an ``evalstop:`` section, on the tests' tiny
GPT-2 saved to a folder and a local dataset registered in ``dataset_info.json``: SFT on negative sentences and DPO
toward negative completions both make the held-out world score decline; the run must stop at the k-th decline and
the model LLaMA-Factory saves at the end must be the best one. Run by tests/run.sh in .venv-llamafactory
(tests/llamafactory_env.sh).
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("llamafactory")

from _callback_helpers import sentences  # noqa: E402
from _integrations_helpers import (  # noqa: E402
    EVALUATOR,
    assert_stopped_at_decline_with_best_saved,
    preference_rows,
    run_framework,
    save_tiny_model,
    split_sentence,
)

from evalstop_callbacks.integrations import llamafactory  # noqa: E402

pytestmark = pytest.mark.llamafactory


def write_config(tmp_path, stage: str, **evalstop) -> object:
    """LLaMA-Factory's YAML for ``stage`` ("sft" or "dpo") on the tiny model, with an ``evalstop:`` section."""
    model = save_tiny_model(tmp_path / "model")
    data = tmp_path / "data"
    data.mkdir()
    if stage == "sft":
        rows = [{"instruction": p, "input": "", "output": o} for p, o in map(split_sentence, sentences("negative"))]
        info: dict = {"tiny": {"file_name": "tiny.json"}}
        method: dict = {"learning_rate": 0.005}
    else:
        rows = preference_rows()
        columns = {"prompt": "prompt", "chosen": "chosen", "rejected": "rejected"}
        info = {"tiny": {"file_name": "tiny.json", "ranking": True, "columns": columns}}
        method = {"learning_rate": 0.002, "pref_beta": 0.1}
    (data / "tiny.json").write_text(json.dumps(rows))
    (data / "dataset_info.json").write_text(json.dumps(info))
    config = {
        "model_name_or_path": str(model),
        "stage": stage,
        "do_train": True,
        "finetuning_type": "full",
        "dataset": "tiny",
        "dataset_dir": str(data),
        "template": "empty",
        "cutoff_len": 32,
        "overwrite_cache": True,
        "output_dir": str(tmp_path / "out"),
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "per_device_train_batch_size": 8,
        "max_steps": 12,
        "lr_scheduler_type": "constant",
        "seed": 0,
        **method,
        "evalstop": evalstop,
    }
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config, indent=1))  # JSON is YAML
    return path


@pytest.mark.parametrize("stage", ["sft", "dpo"])
def test_llamafactory_run_stops_at_the_decline_and_saves_the_best(tmp_path, stage):
    trace = tmp_path / "trace.jsonl"
    # The evaluator's module sits next to config.yaml, and the command runs from another folder: found all the same.
    (tmp_path / "my_evals.py").write_text(f"from {EVALUATOR.replace(':', ' import ')}  # noqa: F401\n")
    config = write_config(
        tmp_path, stage, evaluator="my_evals:world_evaluator", eval_steps=2, k=2, trace_path=str(trace)
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = run_framework(
        ["-m", "evalstop_callbacks.integrations.llamafactory", "train", str(config), "--json"], elsewhere
    )
    assert_stopped_at_decline_with_best_saved(trace, tmp_path / "out")
    result = json.loads(proc.stdout.strip().splitlines()[-1])  # --json: the last line is the run's decisions
    evals = [json.loads(line) for line in trace.read_text().splitlines()[1:-1]]
    assert result["stopped_at"] == evals[-1]["step"] and result["restored_from"] == result["best_checkpoint"]
    assert result["best_checkpoint"] == str(tmp_path / "out" / f"evalstop-best-{result['best_step']}")
    assert result["output_dir"] == str(tmp_path / "out") and result["non_finite"] == []
    assert "attach(trainer)" not in proc.stdout + proc.stderr  # the entry point attached the callback itself
    summary = proc.stderr[proc.stderr.index("EvalStop summary: stopped at step") :]
    assert f"the model saved in {tmp_path / 'out'} holds the best weights" in summary
    assert [h["step"] for h in result["history"]] == [e["step"] for e in evals]
    assert json.loads(trace.read_text().splitlines()[0])["job_type"] == stage  # from stage and finetuning_type


def test_a_release_outside_the_tested_range_is_refused_before_training(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("EVALSTOP_ALLOW_UNTESTED_VERSIONS", raising=False)
    monkeypatch.setattr(llamafactory, "TESTED", ("0.1.0", "0.2.0"))
    config = write_config(tmp_path, "sft", eval_steps=2)
    capsys.readouterr()  # what saving the tiny model printed
    assert llamafactory.main(["train", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("evalstop llamafactory: error: evalstop's LLaMA-Factory entry point is tested with ")
    assert err.count("\n") == 1 and not (tmp_path / "out").exists()
