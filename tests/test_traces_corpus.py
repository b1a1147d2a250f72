"""The shipped corpus of real traces (platform_sim/data/traces): what it must show."""

from __future__ import annotations

import re

import pytest

from platform_sim.sim.replay import corpus_scale, evals_per_run, trace_detection, trace_summary
from platform_sim.sim.traces import load_traces, shipped_traces_dir

#: The tolerance and warm-up of docs/real-traces.md (k=2): 0.1 gold point, the first 3 evals count no decline.
TOLERANCE_GOLD = 0.1
WARMUP_EVALS = 3


#: The first recorded environment (learned bag-of-words proxy, GPT-2, GRPO and PPO): grpo-proxy-kl0-s3 and the like.
FIRST_ENV = re.compile(r"^(grpo|ppo)-(gold|proxy)-kl[0-9.]+-s[0-9]+$")


@pytest.fixture(scope="module")
def corpus():
    return load_traces(shipped_traces_dir())


@pytest.fixture(scope="module")
def traces(corpus):
    """The traces of the first environment (the checks below are about it; its units are gold points)."""
    mine = [t for t in corpus if FIRST_ENV.match(t.name)]
    if not mine:
        pytest.skip("no trace of the first environment in the shipped corpus")
    return mine


def test_multi_environment_corpus(corpus):
    # What the benchmark needs of the shipped corpus once it holds several environments.
    if not any(t.environment for t in corpus):
        pytest.skip("the shipped corpus does not name environments yet")
    from platform_sim.sim.benchmark import split_files

    envs = {t.environment for t in corpus}
    assert all(t.environment for t in corpus) and len(envs) >= 5 and len(corpus) >= 120
    _, _, split = split_files(shipped_traces_dir())  # one split per environment, both splits present
    assert sum(v == "tune" for v in split.values()) >= 3 and sum(v == "test" for v in split.values()) >= 2
    assert all(t.has_examples for t in corpus)
    for env in envs:
        labels = [t.label for t in corpus if t.environment == env]
        assert "healthy" in labels, (env, labels)  # healthy controls in every environment


def test_corpus_size_labels_and_trainers(traces):
    assert len(traces) >= 24
    labels = [t.label for t in traces]
    assert labels.count("hacking") >= 8 and labels.count("healthy") >= 8 and labels.count("ambiguous") <= 2
    assert any(t.algo == "ppo" for t in traces if t.hacking)
    assert {t.algo for t in traces} == {"grpo", "ppo"}
    assert evals_per_run(traces) >= 20
    for t in traces:
        assert t.end is not None and t.end["reason"] == "completed"  # recorded in observe mode, full length
        assert all(p is not None for p in t.proxy) and all(w is not None for w in t.wall_s)


def test_every_hacking_trace_shows_the_proxy_still_rising_after_the_gold_peak(traces):
    for t in (t for t in traces if t.hacking):
        i = t.peak_index
        assert i < len(t.scores) - 1, t.name
        at_peak, after = t.proxy[i], t.proxy[i + 1:]
        # still rising when gold turns down, and higher later than at the gold peak (PPO's proxy can itself fall
        # much later, when the policy degrades: ppo-proxy-kl0-s2)
        assert after[0] > at_peak and max(after) > at_peak, (t.name, at_peak, after)
        assert t.scores[-1] < t.peak_score


def test_hacking_configurations_hack_and_gold_reward_runs_do_not(traces):
    for t in traces:
        run = t.header["config"]["run"]
        if run["reward"] == "gold":
            assert t.label == "healthy", t.name
        if run["reward"] == "proxy" and run["kl"] == 0:
            assert t.hacking, t.name


def test_with_a_tolerance_and_warmup_every_hacking_trace_and_no_healthy_one_is_stopped(traces):
    scale = corpus_scale(traces)
    det = {"name": "k-decline", "params": {"k": 2, "min_delta": TOLERANCE_GOLD / scale.span, "warmup": WARMUP_EVALS}}
    rows = [trace_detection(t, det, scale) for t in traces]
    s = trace_summary(rows)
    assert s["hacking_stopped"] == s["hacking"]
    assert s["healthy_stopped"] == 0
    assert s["median_delay_evals"] <= 3
    for r in rows:
        if r["label"] == "hacking":
            # the restored (best observed) checkpoint's gold is within 5% of the trace's true peak
            assert r["regret_pct"] <= 5.0, r
            assert r["delay_evals"] >= 0, r


def test_the_bare_rule_on_real_traces_fires_on_healthy_plateaus(traces):
    # Reported in docs/real-traces.md: the paper's rule (k=2, min_delta 0) stops most healthy runs.
    scale = corpus_scale(traces)
    rows = [trace_detection(t, None, scale) for t in traces]
    s = trace_summary(rows)
    assert s["hacking_stopped"] == s["hacking"]
    assert s["healthy_stopped"] >= s["healthy"] // 2
