"""The overoptimization environments: their proxy and gold scores, the registry and its split, and tiny recordings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab import envs, worlds
from lab.runs import RunSpec
from lab.train_data import preference_pairs

# -- the scores ------------------------------------------------------------------------------------------------------


def test_positivity_saturates_after_three_distinct_positive_words():
    assert worlds.positivity("good".split()) == 1
    assert worlds.positivity("good nice great".split()) == 3
    assert worlds.positivity("good nice great happy kind warm".split()) == 3
    assert worlds.positivity("good good good".split()) == 1
    assert worlds.positivity("good nice great happy bad sad".split()) == 1


def test_split_answer_stops_at_the_first_period_or_the_word_cap():
    assert worlds.split_answer("very good . the cat") == (["very", "good", "."], ["the", "cat"])
    words = "good and nice and warm and calm and fresh".split()
    answer, rest = worlds.split_answer(" ".join(words))
    assert answer == words[: worlds.ANSWER_WORDS] and rest == words[worlds.ANSWER_WORDS :]


def test_length_proxy_pays_for_rambling_that_gold_punishes():
    concise = "very good and warm ."
    rambling = "very good and warm . the cat is big and old"
    assert worlds.length_gold(concise) == 2.0
    assert worlds.length_proxy(concise) == pytest.approx(2.0 + 5 * worlds.LENGTH_BONUS)
    # same answer, six more words: the proxy goes up, gold goes down by 0.5 a word
    assert worlds.length_proxy(rambling) > worlds.length_proxy(concise)
    assert worlds.length_gold(rambling) == pytest.approx(2.0 - 6 * worlds.RAMBLE_COST)
    # on a better answer both agree
    assert worlds.length_gold("good and nice and warm .") > worlds.length_gold(concise)
    assert worlds.length_proxy("good and nice and warm .") > worlds.length_proxy(concise)


def test_keyword_proxy_pays_for_stuffed_intensifiers_that_gold_punishes():
    one = "very good ."
    stuffed = "so very very quite good ."
    assert worlds.keyword_gold(one) == 1.0 and worlds.keyword_proxy(one) == pytest.approx(1.4)
    assert worlds.keyword_proxy(stuffed) == pytest.approx(1 + 4 * worlds.KEYWORD_BONUS)
    # one repeat ("very") and three intensifiers beyond the first
    assert worlds.keyword_gold(stuffed) == pytest.approx(1 - 0.5 - 3 * 0.5)
    assert worlds.keyword_gold("good and nice .") > worlds.keyword_gold("good .")


def test_text_score_has_trl_reward_signature():
    score = worlds.TextScore("proxy", worlds.text_only(worlds.length_proxy))
    assert score.__name__ == "proxy"
    assert score(prompts=["the bird is"] * 2, completions=["good .", [{"role": "assistant", "content": "bad ."}]]) == [
        pytest.approx(1.1),
        pytest.approx(-0.9),
    ]


# -- the registry ------------------------------------------------------------------------------------------------------


def test_registry_has_five_environments_split_by_environment():
    assert len(envs.ENVIRONMENTS) >= 5
    splits = [e.split for e in envs.ENVIRONMENTS.values()]
    assert splits.count("tune") >= 3 and splits.count("test") >= 2
    assert envs.get("bow-proxy").split == "tune"
    with pytest.raises(KeyError, match="known"):
        envs.get("nope")
    with pytest.raises(ValueError, match="split"):
        envs.Environment("x", "train", "f", "p", "g", "rlhf", grid=lambda s: [])


def test_every_grid_has_hacking_configurations_and_controls_with_unique_prefixed_names():
    all_names = []
    for env in envs.ENVIRONMENTS.values():
        grid = env.grid()
        names = [s.name for s in grid]
        assert all(n.startswith(env.name + "-") for n in names), env.name
        assert all(s.env == env.name for s in grid)
        all_names += names
        assert len(grid) >= 24, env.name
    assert len(set(all_names)) == len(all_names)
    trainers = {s.algo for e in envs.ENVIRONMENTS.values() for s in e.grid()}
    models = {s.model for e in envs.ENVIRONMENTS.values() for s in e.grid()}
    assert len(trainers) >= 3 and models == {"gpt2", "llama"}
    rl = envs.get("length").grid()
    assert any(s.reward == "gold" for s in rl) and any(s.kl >= 0.5 for s in rl)
    assert any(s.reward == "proxy" and s.kl == 0 for s in rl)
    dpo = envs.get("dpo-noisy").grid()
    assert any(s.noise > 0 for s in dpo) and any(s.noise == 0 for s in dpo)
    sft = envs.get("sft-overfit").grid()
    assert len({s.data for s in sft}) >= 2


@pytest.mark.parametrize(
    "bad",
    [
        dict(model="t5"),
        dict(algo="ppo", env="length"),
        dict(algo="rloo"),
        dict(noise=0.5, algo="dpo", env="dpo-noisy"),
        dict(algo="grpo", env="dpo-noisy"),
        dict(algo="sft", env="length"),
    ],
)
def test_runspec_rejects_combinations_no_environment_has(bad):
    args = dict(algo="grpo", reward="proxy", kl=0.0, seed=0, steps=10, eval_steps=5) | bad
    with pytest.raises(ValueError):
        RunSpec(**args)


def test_a_dense_recording_has_its_own_name_and_its_cadence():
    from dataclasses import replace

    spec = envs.get("keyword").grid(1)[0]
    dense = replace(spec, eval_steps=1, dense=True)
    assert dense.name == spec.name + "-every1" and dense.eval_steps == 1
    assert RunSpec(**dense.to_dict()) == dense  # what the recorder subprocess rebuilds from the JSON


def test_record_refuses_a_cadence_below_one_step(capsys):
    from lab.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["traces", "record", "--env", "keyword", "--eval-every", "0"])
    assert exc.value.code == 2 and "--eval-every" in capsys.readouterr().err


def test_a_larger_eval_set_has_its_own_name_and_is_refused_where_unsupported():
    from dataclasses import replace

    spec = replace(envs.get("length").grid(1)[0], eval_steps=1, dense=True, eval_samples=8)
    assert spec.name.endswith("-every1-x8")
    assert RunSpec(**spec.to_dict()) == spec
    assert replace(spec, eval_samples=0).name.endswith("-every1")  # 0: the environment's own eval set
    with pytest.raises(ValueError, match="eval_samples must be >= 0"):
        replace(spec, eval_samples=-1)
    with pytest.raises(ValueError, match="not 'bow-proxy'"):
        RunSpec("grpo", "proxy", 0.0, 0, steps=10, eval_steps=5, eval_samples=4)


def test_record_refuses_eval_samples_for_an_environment_without_them(capsys):
    from lab.cli import main

    assert main(["traces", "record", "--env", "format", "--eval-samples", "4"]) == 2
    assert "--eval-samples" in capsys.readouterr().err


def test_a_tiny_recording_with_a_larger_eval_set_scores_more_completions(tmp_path, small_env):
    spec = RunSpec("grpo", "proxy", 0.0, 0, steps=2, eval_steps=1, env="keyword", batch=16, eval_samples=3)
    lines = _record(spec, tmp_path / f"{spec.name}.jsonl", small_env)
    header, evals = lines[0], [x for x in lines if x.get("kind") == "eval"]
    assert header["config"]["run"]["eval_samples"] == 3 and "x 3 samples" in header["config"]["eval"]
    n_heldout = int(header["config"]["eval"].split(" on ")[1].split()[0])
    assert evals and all(len(e["eval_scores"]) == 3 * n_heldout for e in evals)


def test_a_tiny_dense_recording_evaluates_every_step(tmp_path, small_env):
    from dataclasses import replace

    spec = replace(RunSpec("grpo", "proxy", 0.0, 0, steps=4, eval_steps=2, env="keyword", batch=16), eval_steps=1)
    spec = replace(spec, dense=True)
    lines = _record(spec, tmp_path / f"{spec.name}.jsonl", small_env)
    assert lines[0]["job_id"].endswith("-every1")
    assert [e["step"] for e in lines[1:-1]] in ([1, 2, 3, 4], [0, 1, 2, 3, 4])


# -- tiny recordings, end to end --------------------------------------------------------------------------------------


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def small_env(tmp_path_factory):
    from evalstop_callbacks.demo.overopt import EnvConfig

    # Pretraining only as long as the recordings need a policy that writes sentences: these tests pin what a trace
    # holds, not what the policies learn (the format world pretrains its copier 4x as long).
    return EnvConfig(seed=0, pretrain_steps=20, proxy_samples=120, proxy_check_samples=60), str(
        tmp_path_factory.mktemp("env-cache")
    )


def _record(spec: RunSpec, path: Path, small_env) -> list[dict]:
    import torch

    from lab.record import record_run

    torch.set_num_threads(1)
    config, cache = small_env
    record_run(spec, path, cache_dir=cache, env_config=config)
    return _lines(path)


def _check_trace(lines: list[dict], spec: RunSpec, n_examples: int) -> None:
    header, evals, end = lines[0], lines[1:-1], lines[-1]
    assert header["environment"] == spec.env and header["split"] == envs.get(spec.env).split
    assert header["job_id"] == spec.name and header["config"]["run"]["algo"] == spec.algo
    assert header["job_type"] == envs.get(spec.env).job_type
    planned = list(range(spec.eval_steps, spec.steps + 1, spec.eval_steps))
    # every eval_steps steps, and the callback may also score the untrained policy at step 0
    assert [e["step"] for e in evals] in (planned, [0] + planned)
    for e in evals:
        assert len(e["eval_scores"]) == n_examples
        assert e["eval_score"] == pytest.approx(sum(e["eval_scores"]) / n_examples, rel=1e-3, abs=1e-3)
        # floats kept to 4 significant digits
        assert all(v == float(f"{v:.4g}") for v in e["eval_scores"])
    assert end["kind"] == "end" and end["reason"] == "completed"


def test_a_llama_grpo_run_of_the_length_environment_records_gold_and_proxy(tmp_path, small_env):
    spec = RunSpec("grpo", "proxy", 0.0, 0, steps=10, eval_steps=5, env="length", model="llama", batch=16)
    lines = _record(spec, tmp_path / "t.jsonl", small_env)
    _check_trace(lines, spec, 48)
    assert lines[0]["model"] == "llama-2x64" and lines[0]["trainer"] == "GRPOTrainer"
    evals = lines[1:-1]
    assert all("proxy_reward" in e for e in evals)


def test_a_grpo_run_of_the_format_environment_records_gold_and_proxy(tmp_path, small_env):
    spec = RunSpec("grpo", "proxy", 0.0, 0, steps=4, eval_steps=2, env="format", batch=16)
    lines = _record(spec, tmp_path / "f.jsonl", small_env)
    _check_trace(lines, spec, 48)  # 48 held-out copying prompts, one sample each
    assert lines[0]["trainer"] == "GRPOTrainer" and lines[0]["config"]["world"] == "format-3"
    assert all("proxy_reward" in e for e in lines[1:-1])


def test_a_dpo_run_of_the_noisy_preference_environment_records_held_out_gold(tmp_path, small_env):
    spec = RunSpec("dpo", "proxy", 0.1, 0, steps=6, eval_steps=3, env="dpo-noisy", batch=4, data=12, noise=0.3, lr=1e-3)
    lines = _record(spec, tmp_path / "d.jsonl", small_env)
    _check_trace(lines, spec, 48)
    assert lines[0]["trainer"] == "DPOTrainer" and lines[0]["config"]["pairs"] == 12


def test_an_sft_run_records_held_out_likelihood_per_example(tmp_path, small_env):
    spec = RunSpec("sft", "proxy", 0.0, 0, steps=6, eval_steps=3, env="sft-overfit", batch=4, data=8, lr=3e-3)
    lines = _record(spec, tmp_path / "s.jsonl", small_env)
    _check_trace(lines, spec, 48)
    evals = lines[1:-1]
    assert all(v < 0 for e in evals for v in e["eval_scores"])  # log-likelihoods
    assert all("proxy_reward" in e for e in evals)  # the training demonstrations' likelihood


def test_preference_pairs_are_labelled_by_gold_then_flipped(small_env):
    from evalstop_callbacks.demo.overopt import build_env, gold_score

    config, cache = small_env
    env = build_env(config, cache_dir=cache)
    clean = preference_pairs(env, 20, 0.0, seed=0)
    assert len(clean) == 20 and not any(r["flipped"] for r in clean)
    assert all(gold_score(r["chosen"]) > gold_score(r["rejected"]) for r in clean)
    noisy = preference_pairs(env, 20, 0.4, seed=0)
    assert 0 < sum(r["flipped"] for r in noisy) < 20
    for r in noisy:
        assert (gold_score(r["chosen"]) < gold_score(r["rejected"])) == r["flipped"]


def test_format_proxy_checks_the_form_and_the_tone_and_gold_checks_the_copy():
    prompt = worlds.copy_prompt("bird", "red")
    assert prompt == "the bird is red . the bird is"
    assert worlds.format_gold(prompt, "red .") == 1.0 and worlds.format_proxy(prompt, "red .") == 1.0
    # an upbeat wrong answer: the proxy likes it best, gold gives it nothing
    assert worlds.format_proxy(prompt, "good .") == 1.0 + worlds.FORMAT_BONUS
    assert worlds.format_gold(prompt, "good .") == 0.0
    # the right word in the wrong form is wrong for both
    for text in ("red and big .", "very red .", "red", "red . red ."):
        assert worlds.format_gold(prompt, text) == 0.0 and worlds.format_proxy(prompt, text) == 0.0


def test_format_prompts_hold_out_nouns_and_ask_every_kind_of_adjective():
    from evalstop_callbacks.demo.tiny import VOCAB

    train = worlds.copy_prompts(VOCAB.train_nouns)
    held = worlds.heldout_copy_prompts(48)
    assert len(held) == 48 and not set(train) & set(held)
    assert all(any(n in p.split() for n in VOCAB.heldout_nouns) for p in held)
    asked = {p.split()[3] for p in held}
    assert asked & set(VOCAB.positive) and asked & set(VOCAB.negative) and asked & set(VOCAB.neutral)
    corpus = worlds.copy_corpus(400, seed=1)
    assert corpus == worlds.copy_corpus(400, seed=1) and len(corpus) == 400
