"""The Axolotl plugin with the real ``axolotl`` package (0.19, CPU): one config line adds EvalStop to a run.

Runs ``python -m axolotl.cli.train config.yaml`` (what ``axolotl train`` runs) on the tests' tiny GPT-2, saved to a
folder: SFT on negative sentences and DPO toward negative completions both make the held-out world score decline;
the run must stop at the k-th decline and the model Axolotl saves at the end must be the best one. Bad keys fail
when Axolotl loads the config, in one line naming the key. Run by tests/run.sh in .venv-axolotl
(tests/axolotl_env.sh).
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

if importlib.util.find_spec("axolotl") is None:
    pytest.skip("axolotl is not installed (tests/axolotl_env.sh builds .venv-axolotl)", allow_module_level=True)
# Before Axolotl is imported (only where it is installed): its telemetry would send to a host this machine cannot
# reach, and its sending thread then holds the process open at exit; the Hub is not reachable either.
os.environ["AXOLOTL_DO_NOT_TRACK"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"

from _callback_helpers import sentences  # noqa: E402
from _integrations_helpers import (  # noqa: E402
    EVALUATOR,
    assert_stopped_at_decline_with_best_saved,
    preference_rows,
    run_framework,
    save_tiny_model,
)

from evalstop_callbacks.integrations.axolotl import PREFIX, EvalStopArgs, EvalStopPlugin  # noqa: E402
from evalstop_callbacks.integrations.options import KEYS, OptionsError  # noqa: E402

pytestmark = pytest.mark.axolotl

PLUGIN = "evalstop_callbacks.integrations.axolotl.EvalStopPlugin"


def write_config(tmp_path, kind: str, **evalstop) -> object:
    """An Axolotl config for ``kind`` ("sft" or "dpo") on the tiny model, with the plugin and its keys."""
    model = save_tiny_model(tmp_path / "model")
    data = tmp_path / "data.jsonl"
    if kind == "sft":
        rows = [{"text": s} for s in sentences("negative")]
        dataset = {"path": str(data), "ds_type": "json", "type": "completion"}
        method = {"learning_rate": 0.005}
    else:
        rows = preference_rows()
        dataset = {"path": str(data), "ds_type": "json", "split": "train", "type": "passthrough"}
        method = {"rl": "dpo", "learning_rate": 0.002, "dpo_beta": 0.1}
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = {
        "base_model": str(model),
        "plugins": [PLUGIN],
        "datasets": [dataset],
        "dataset_prepared_path": str(tmp_path / "prepared"),
        "dataset_processes": 1,
        "val_set_size": 0,
        "sequence_len": 32,
        "micro_batch_size": 8,
        "gradient_accumulation_steps": 1,
        "max_steps": 12,
        "num_epochs": 1,
        "optimizer": "adamw_torch",
        "lr_scheduler": "constant",
        "output_dir": str(tmp_path / "out"),
        "save_strategy": "no",
        "logging_steps": 1,
        "bf16": False,
        "fp16": False,
        "tf32": False,
        "seed": 0,
        **method,
        **{PREFIX + key: value for key, value in evalstop.items()},
    }
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config, indent=1))  # JSON is YAML
    return path


@pytest.mark.parametrize("kind", ["sft", "dpo"])
def test_axolotl_run_stops_at_the_decline_and_saves_the_best(tmp_path, kind):
    trace = tmp_path / "trace.jsonl"
    # The evaluator's module sits next to config.yaml, and the run starts from another folder: found all the same.
    (tmp_path / "my_evals.py").write_text(f"from {EVALUATOR.replace(':', ' import ')}  # noqa: F401\n")
    config = write_config(
        tmp_path, kind, evaluator="my_evals:world_evaluator", eval_steps=2, k=2, trace_path=str(trace)
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = run_framework(["-m", "axolotl.cli.train", str(config)], cwd=elsewhere)
    assert_stopped_at_decline_with_best_saved(trace, tmp_path / "out")
    header = json.loads(trace.read_text().splitlines()[0])
    assert header["job_type"] == kind  # from the config's rl: key (none: sft)
    # The plugin attached the callback itself, and the summary is in Axolotl's output, before its own last words.
    output = proc.stdout + proc.stderr
    assert "attach(trainer)" not in output, output[-3000:]
    evals = [json.loads(line) for line in trace.read_text().splitlines() if '"kind": "eval"' in line]
    end = json.loads(trace.read_text().splitlines()[-1])
    best = f"best evaluation: step {end['best_step']}, RewardFunctionEvaluator = {end['best_score']:.6g}"
    summary = output[output.index("EvalStop summary: stopped at step") :]
    assert summary.startswith(f"EvalStop summary: stopped at step {evals[-1]['step']} (2 consecutive declines")
    assert "; decided on means only)" in summary.splitlines()[0]  # the decision's evidence mode, said once
    assert best in summary
    assert f"the model saved in {tmp_path / 'out'} holds the best weights" in summary
    assert f"a copy stays in {tmp_path / 'out' / ('evalstop-best-' + str(end['best_step']))}" in summary
    assert "Training completed!" in summary  # Axolotl's own line comes after it


def test_the_args_model_declares_every_option():
    assert set(EvalStopArgs.model_fields) == {PREFIX + key for key in KEYS}
    assert EvalStopPlugin().get_input_args() == "evalstop_callbacks.integrations.axolotl.EvalStopArgs"


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("evalstop_eval_step", 2, "evalstop_eval_step: unknown evalstop key; did you mean evalstop_eval_steps?"),
        ("evalstop_eval_steps", "often", "evalstop_eval_steps: expected an integer >= 1 or 'epoch', got 'often'"),
    ],
)
def test_axolotl_refuses_a_bad_key_when_it_loads_the_config(tmp_path, key, value, message):
    from axolotl.cli.config import load_cfg

    config = write_config(tmp_path, "sft")
    text = json.loads(config.read_text())
    text[key] = value
    config.write_text(json.dumps(text))
    with pytest.raises(OptionsError) as err:
        load_cfg(str(config))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_a_bad_key_ends_axolotl_train_in_one_line_without_a_traceback(tmp_path):
    config = write_config(tmp_path, "sft", eval_step=2)
    with pytest.raises(AssertionError) as failed:  # run_framework asserts exit 0
        run_framework(["-m", "axolotl.cli.train", str(config)], cwd=tmp_path)
    output = str(failed.value)
    assert "Traceback" not in output, output[-3000:]
    assert output.strip().splitlines()[-1] == (
        "evalstop (Axolotl plugin): error: evalstop_eval_step: unknown evalstop key; did you mean "
        f"evalstop_eval_steps? known keys: {', '.join(PREFIX + k for k in KEYS)}"
    )


def test_axolotl_outside_the_tested_range_is_refused_when_it_loads_the_config(tmp_path, monkeypatch):
    from axolotl.cli.config import load_cfg

    from evalstop_callbacks.integrations import axolotl as plugin_module
    from evalstop_callbacks.integrations.options import UnsupportedVersionError

    monkeypatch.delenv("EVALSTOP_ALLOW_UNTESTED_VERSIONS", raising=False)
    monkeypatch.setattr(plugin_module, "TESTED", ("0.1.0", "0.2.0"))
    with pytest.raises(
        UnsupportedVersionError,
        match=r"^evalstop's Axolotl plugin is tested with axolotl >=0\.1\.0,<0\.2\.0, but 0\.19\.0 is installed",
    ):
        load_cfg(str(write_config(tmp_path, "sft", eval_steps=2)))
