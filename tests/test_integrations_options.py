"""The evalstop options of the YAML integrations (Axolotl keys, LLaMA-Factory's section), without either framework.

What a user gets for a wrong file: one line naming the key as written; the framework release check; the evaluator
reference; the callback built from the options; and the LLaMA-Factory command's exit code 2 on bad input.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from importlib import metadata

import pytest

from evalstop_callbacks.integrations import llamafactory
from evalstop_callbacks.integrations.options import (
    ALLOW_UNTESTED_ENV,
    KEYS,
    EvalStopOptions,
    OptionsError,
    UnsupportedVersionError,
    build_callback,
    check_version,
    load_evaluator,
    parse_options,
)


def test_axolotl_keys_are_read_with_their_prefix_and_other_keys_left_alone():
    cfg = {"base_model": "./m", "learning_rate": 1e-3, "evalstop_eval_steps": 2, "evalstop_detector": "k-decline"}
    options = parse_options(cfg, prefix="evalstop_")
    assert options == EvalStopOptions(eval_steps=2, detector="k-decline")


def test_a_key_given_as_null_keeps_its_default():
    assert parse_options({"mode": None, "restore_best": None}) == EvalStopOptions()


def test_an_unknown_key_is_named_with_the_nearest_known_one():
    with pytest.raises(OptionsError) as err:
        parse_options({"evalstop_eval_step": 2}, prefix="evalstop_")
    message = str(err.value)
    assert message.startswith("evalstop_eval_step: unknown evalstop key; did you mean evalstop_eval_steps?")
    assert "\n" not in message


def test_a_section_key_is_named_with_its_section():
    with pytest.raises(
        OptionsError, match=r"^evalstop\.detektor: unknown evalstop key; did you mean evalstop\.detector"
    ):
        parse_options({"detektor": "trend"}, where="evalstop.")


@pytest.mark.parametrize(
    "key, value, reason",
    [
        ("eval_steps", "ten", "expected an integer >= 1 or 'epoch', got 'ten' (str)"),
        ("eval_steps", 0, "expected an integer >= 1 or 'epoch', got 0 (int)"),
        ("eval_steps", True, "expected an integer >= 1 or 'epoch', got True (bool)"),
        ("k", 2.5, "expected an integer >= 1, got 2.5 (float)"),
        ("min_delta", -0.1, "expected a finite number >= 0, got -0.1 (float)"),
        ("min_delta", float("nan"), "expected a finite number >= 0, got nan (float)"),
        ("mode", "stop", "expected one of enforce, observe, got 'stop' (str)"),
        ("job_type", "ppo", "expected one of rlhf, dpo, lora, sft, other, got 'ppo' (str)"),
        ("restore_best", "yes", "expected true or false, got 'yes' (str)"),
        ("evaluator", "my_evals.world", "expected 'module:attr' (an Evaluator or a callable returning one)"),
        ("detector", 3, "expected a name or a mapping with 'name' and 'params', got 3 (int)"),
        ("detector", "nope", "unknown detector 'nope'"),
        ("detector", {"name": "k-decline", "params": {"k": 0}}, "k must be an integer >= 1, got 0"),
        ("cadence", "sometimes", "unknown cadence 'sometimes'"),
        ("max_extra_evals", -1, "expected an integer >= 0, got -1 (int)"),
        ("max_eval_share", 1.5, "expected a number between 0 and 1, got 1.5 (float)"),
        ("trace_path", "", "expected a non-empty string, got '' (str)"),
    ],
)
def test_a_wrong_value_is_one_line_naming_the_key(key, value, reason):
    with pytest.raises(OptionsError) as err:
        parse_options({f"evalstop_{key}": value}, prefix="evalstop_")
    message = str(err.value)
    assert message.startswith(f"evalstop_{key}: "), message
    assert reason in message and "\n" not in message


def test_every_option_parses_to_its_field():
    raw = {
        "evaluator": "m:f",
        "eval_steps": "epoch",
        "detector": {"name": "k-decline", "params": {"k": 3}},
        "k": 3,
        "min_delta": 0,
        "mode": "observe",
        "job_id": "run-1",
        "job_type": "dpo",
        "restore_best": False,
        "trace_path": "t.jsonl",
        "eval_on_start": False,
        "cadence": "adaptive",
        "max_extra_evals": 0,
        "max_eval_share": 0.2,
        "server_url": "http://127.0.0.1:1",
        "max_non_finite": 5,
    }
    assert set(raw) == set(KEYS)
    options = parse_options(raw)
    assert {key: getattr(options, key) for key in KEYS} == raw


def test_a_section_that_is_no_mapping_is_refused():
    with pytest.raises(OptionsError, match=r"^evalstop: expected a mapping of options, got \[1\] \(list\)"):
        parse_options([1], where="evalstop.")  # type: ignore[arg-type]


def test_a_release_in_the_tested_range_passes():
    installed = metadata.version("pytest")
    assert check_version("pytest", installed, "10000", "X") == installed


def test_a_release_outside_the_tested_range_is_refused_at_start(monkeypatch):
    monkeypatch.delenv(ALLOW_UNTESTED_ENV, raising=False)
    installed = metadata.version("pytest")
    with pytest.raises(UnsupportedVersionError) as err:
        check_version("pytest", "1.0", "2.0", "the X plugin")
    assert str(err.value) == (
        f"the X plugin is tested with pytest >=1.0,<2.0, but {installed} is installed: install pytest==1.0, "
        f"or set {ALLOW_UNTESTED_ENV}=1 to try this release anyway"
    )


def test_the_override_turns_the_refusal_into_a_warning(monkeypatch, caplog):
    monkeypatch.setenv(ALLOW_UNTESTED_ENV, "1")
    assert check_version("pytest", "1.0", "2.0", "the X plugin") == metadata.version("pytest")
    assert "the X plugin is tested with pytest >=1.0,<2.0" in caplog.text


def test_a_framework_that_is_not_installed_is_named():
    with pytest.raises(UnsupportedVersionError, match=r"^the X plugin needs no-such-framework 1\.0 \(not installed\)$"):
        check_version("no-such-framework", "1.0", "2.0", "the X plugin")


@pytest.fixture
def eval_module(tmp_path, monkeypatch):
    """A real module on sys.path with an evaluator, a factory of one, and two things that are not evaluators."""
    (tmp_path / "my_evals.py").write_text(
        textwrap.dedent(
            """
            from evalstop_callbacks import RewardFunctionEvaluator

            def score(prompts, completions, **kwargs):
                return [1.0 for _ in completions]

            EVALUATOR = RewardFunctionEvaluator(["the bird is"], score, max_new_tokens=2)

            def factory():
                return RewardFunctionEvaluator(["the bird is"], score, max_new_tokens=2)

            NUMBER = 3

            def not_a_factory():
                return "no"
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_evals"
    sys.modules.pop("my_evals", None)


def test_an_evaluator_is_loaded_as_is_or_from_its_factory(eval_module):
    from evalstop_callbacks import RewardFunctionEvaluator

    module = importlib.import_module(eval_module)
    assert load_evaluator(f"{eval_module}:EVALUATOR", "k") is module.EVALUATOR
    assert isinstance(load_evaluator(f"{eval_module}:factory", "k"), RewardFunctionEvaluator)


@pytest.mark.parametrize(
    "reference, message",
    [
        ("no_such_module_x:f", r"^evalstop\.evaluator: cannot import 'no_such_module_x' \(No module named"),
        ("my_evals:missing", r"^evalstop\.evaluator: module 'my_evals' has no attribute 'missing'$"),
        ("my_evals:NUMBER", r"^evalstop\.evaluator: my_evals:NUMBER is neither an Evaluator nor a callable"),
        ("my_evals:not_a_factory", r"^evalstop\.evaluator: my_evals:not_a_factory\(\) returned str, not an Evaluator$"),
    ],
)
def test_a_bad_evaluator_reference_names_the_key(eval_module, reference, message):
    with pytest.raises(OptionsError, match=message):
        load_evaluator(reference, "evalstop.evaluator")


def test_the_callback_gets_every_option(eval_module, tmp_path):
    options = parse_options(
        {
            "evaluator": f"{eval_module}:factory",
            "eval_steps": 3,
            "detector": "k-decline",
            "mode": "observe",
            "job_id": "lf-1",
            "trace_path": str(tmp_path / "t.jsonl"),
            "restore_best": False,
            "max_extra_evals": 1,
            "max_non_finite": 5,
        }
    )
    cb = build_callback(options, job_type="dpo", evaluator_key="evalstop.evaluator")
    assert (cb.eval_steps, cb.mode, cb.job_id, cb.job_type, cb.restore_best) == (3, "observe", "lf-1", "dpo", False)
    assert cb.max_non_finite == 5
    assert cb.detector_spec["name"] == "k-decline" and cb.max_extra_evals == 1
    assert cb.trace_path == str(tmp_path / "t.jsonl")
    assert build_callback(parse_options({"job_type": "sft"}), job_type="dpo", evaluator_key="e").job_type == "sft"


def test_a_server_url_without_a_token_is_refused(monkeypatch):
    monkeypatch.delenv("EVALSTOP_TOKEN", raising=False)
    with pytest.raises(OptionsError, match=r"^server_url is set but EVALSTOP_TOKEN holds no token"):
        build_callback(parse_options({"server_url": "http://127.0.0.1:9"}), job_type="sft", evaluator_key="e")


@pytest.mark.parametrize(
    "config, job_type",
    [
        ({"stage": "sft", "finetuning_type": "full"}, "sft"),
        ({"stage": "sft"}, "lora"),  # LLaMA-Factory's default finetuning_type
        ({"stage": "dpo", "finetuning_type": "full"}, "dpo"),
        ({"stage": "kto", "finetuning_type": "lora"}, "dpo"),
        ({"stage": "ppo"}, "rlhf"),
        ({"stage": "rm", "finetuning_type": "full"}, "other"),
    ],
)
def test_llamafactory_job_type_follows_the_stage(config, job_type):
    assert llamafactory.job_type_of(config) == job_type


def run_main(tmp_path, capsys, text: str) -> tuple[int, str]:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    code = llamafactory.main(["train", str(path)])
    return code, capsys.readouterr().err


def test_llamafactory_bad_section_key_exits_2_in_one_line(tmp_path, capsys):
    code, err = run_main(tmp_path, capsys, "stage: sft\nevalstop:\n  eval_steps: 2\n  modee: observe\n")
    assert code == 2
    assert err.startswith(
        "evalstop llamafactory: error: evalstop.modee: unknown evalstop key; did you mean evalstop.mode?"
    )
    assert err.count("\n") == 1


def test_llamafactory_wrong_type_exits_2_in_one_line(tmp_path, capsys):
    code, err = run_main(tmp_path, capsys, "stage: sft\nevalstop:\n  eval_steps: every\n")
    assert (code, err) == (
        2,
        "evalstop llamafactory: error: evalstop.eval_steps: expected an integer >= 1 or 'epoch', got 'every' (str)\n",
    )


def test_llamafactory_section_that_is_no_mapping_exits_2(tmp_path, capsys):
    code, err = run_main(tmp_path, capsys, "stage: sft\nevalstop: 3\n")
    assert (code, err) == (
        2,
        "evalstop llamafactory: error: evalstop: expected a mapping of evalstop options, got int\n",
    )


def test_llamafactory_missing_file_exits_2(tmp_path, capsys):
    code = llamafactory.main(["train", str(tmp_path / "none.yaml")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("evalstop llamafactory: error: cannot read ") and err.count("\n") == 1


@pytest.mark.skipif(importlib.util.find_spec("llamafactory") is not None, reason="llamafactory is installed here")
def test_llamafactory_not_installed_is_said_at_start(tmp_path, capsys):
    code, err = run_main(tmp_path, capsys, "stage: sft\nevalstop:\n  eval_steps: 2\n")
    assert (code, err) == (
        2,
        "evalstop llamafactory: error: evalstop's LLaMA-Factory entry point needs llamafactory 0.9.5 (not installed)\n",
    )


def test_the_evalstop_command_hands_llamafactory_its_arguments(tmp_path, capsys):
    from evalstop_callbacks import cli

    path = tmp_path / "config.yaml"
    path.write_text("stage: sft\nevalstop:\n  k: zero\n")
    assert cli.main(["llamafactory", "train", str(path)]) == 2
    assert capsys.readouterr().err == (
        "evalstop llamafactory: error: evalstop.k: expected an integer >= 1, got 'zero' (str)\n"
    )


def test_llamafactory_without_a_config_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        llamafactory.main(["train"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        "evalstop llamafactory train: error: the following arguments are required: config\n"
    )


def test_an_evaluator_next_to_the_config_file_is_found_there(tmp_path, monkeypatch):
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "evals_beside.py").write_text(
        "from evalstop_callbacks import RewardFunctionEvaluator\n"
        "EVALUATOR = RewardFunctionEvaluator(['the bird is'], lambda prompts, completions, **k: [1.0] * len(completions), max_new_tokens=2)\n"
    )
    monkeypatch.setattr(sys, "path", list(sys.path))  # the folder added below goes when the test ends
    try:
        with pytest.raises(OptionsError) as err:  # not on the import path, and no config folder given
            load_evaluator("evals_beside:EVALUATOR", "evalstop.evaluator")
        assert str(err.value) == (
            "evalstop.evaluator: cannot import 'evals_beside' (No module named 'evals_beside'): put evals_beside.py "
            "in a folder on PYTHONPATH (or install it)"
        )
        with pytest.raises(OptionsError) as err:  # a config folder without the module: named in the error
            load_evaluator("evals_beside:EVALUATOR", "evalstop.evaluator", search=tmp_path)
        assert f"put evals_beside.py in the config file's folder {tmp_path.resolve()} or a folder on" in str(err.value)
        evaluator = load_evaluator("evals_beside:EVALUATOR", "evalstop.evaluator", search=folder)
        assert type(evaluator).__name__ == "RewardFunctionEvaluator" and sys.path[-1] == str(folder.resolve())
    finally:
        sys.modules.pop("evals_beside", None)
