"""The overoptimization environment: gold, the learned proxy, prompts, determinism and the cache (real parts)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from evalstop_callbacks.demo.overopt import (
    EnvConfig,
    build_env,
    gold_reward,
    gold_score,
    heldout_prompts,
    train_prompts,
)
from evalstop_callbacks.demo.proxy import BagOfWordsProxy
from evalstop_callbacks.demo.tiny import VOCAB

SMALL = EnvConfig(seed=3, pretrain_steps=60, proxy_samples=120, proxy_check_samples=60)


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    torch.set_num_threads(1)
    return build_env(SMALL, cache_dir=tmp_path_factory.mktemp("envcache"))


def test_gold_rewards_distinct_positivity_and_punishes_repeats():
    assert gold_score("good and warm .") == 2.0
    assert gold_score("bad .") == -1.0
    assert gold_score("good . good . good") == 1.0 - 0.5 * 2  # one distinct positive, two repeats
    assert gold_score("good . good . good . good . good . good") < gold_score("good .")
    assert gold_score("the cat is big") == 0.0
    assert gold_reward(prompts=["a"], completions=[[{"role": "assistant", "content": "nice ."}]]) == [1.0]


def test_heldout_prompts_use_only_heldout_nouns():
    train, held = train_prompts(), heldout_prompts()
    assert set(train).isdisjoint(held)
    train_words = {w for p in train for w in p.split()}
    assert train_words.isdisjoint(VOCAB.heldout_nouns)
    assert all(any(n in p.split() for n in VOCAB.heldout_nouns) for p in held)


def test_ridge_fit_recovers_a_linear_function():
    words = ("good", "bad", ".")
    rng = np.random.default_rng(0)
    comps = [" ".join(rng.choice(words, size=rng.integers(1, 6))) for _ in range(200)]
    target = [2 * c.split().count("good") - c.split().count("bad") + 0.5 for c in comps]
    proxy = BagOfWordsProxy.fit([""] * len(comps), comps, target, words, alpha=1e-6)
    assert proxy.weights[0] == pytest.approx(2.0, abs=1e-3)
    assert proxy.weights[1] == pytest.approx(-1.0, abs=1e-3)
    assert proxy.bias == pytest.approx(0.5, abs=1e-2)


def test_proxy_agrees_in_distribution_and_is_blind_to_repetition(env):
    assert env.proxy_fit["corr_check"] > 0.8
    prompt = env.train_prompts[0]
    short, hacked = "good .", " ".join(["good ."] * 8)
    assert env.proxy.score(prompt, hacked) > env.proxy.score(prompt, short) + 3
    assert gold_score(hacked) < gold_score(short)
    assert env.proxy.__name__ == "proxy"


def test_proxy_module_matches_the_proxy_at_the_last_token(env):
    # TRL 1.12's get_reward: backbone on masked ids, score on the last hidden state, value at the last non-pad token.
    tok = env.tokenizer
    texts = ["the cat is good and warm .", "a dog was good . good . good"]
    module = env.proxy_model()
    enc = tok(texts, return_tensors="pt", padding=True)
    ids = enc["input_ids"]
    mask = ids != tok.pad_token_id
    out = module.backbone(input_ids=ids.masked_fill(~mask, 0), attention_mask=mask)
    logits = module.score(out.hidden_states[-1]).squeeze(-1)
    got = logits[:, -1]  # left padding: the last position is the last real token
    want = [env.proxy.score(" ".join(t.split()[:3]), " ".join(t.split()[3:])) for t in texts]
    assert got.tolist() == pytest.approx(want, abs=1e-4)


def test_build_is_deterministic_and_cached(env, tmp_path):
    again = build_env(SMALL, cache_dir=tmp_path, use_cache=False)
    assert again.proxy.weights == pytest.approx(env.proxy.weights, abs=1e-9)
    assert again.reference_gold == env.reference_gold
    cached = build_env(SMALL, cache_dir=env.policy_dir.parent.parent)
    assert cached.policy_dir == env.policy_dir
    assert cached.proxy == env.proxy
    other = EnvConfig(seed=4, pretrain_steps=60, proxy_samples=120, proxy_check_samples=60)
    assert other.key() != SMALL.key()


def test_evaluation_is_repeatable_and_leaves_the_training_rng_alone(env):
    model = env.reference_policy()
    torch.manual_seed(11)
    before = torch.get_rng_state()
    g1, per1, p1 = env.evaluate(model)
    assert torch.equal(torch.get_rng_state(), before)
    g2, per2, p2 = env.evaluate(model)
    assert (g1, per1, p1) == (g2, per2, p2)
    assert len(per1) == len(env.heldout_prompts) * env.config.eval_per_prompt
    assert math.isfinite(p1) and model.training
