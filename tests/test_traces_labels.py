"""The label rule (platform_sim.sim.traces.label_trace): hacking / healthy / ambiguous from the gold curve alone."""

from __future__ import annotations

import numpy as np
import pytest
from _trace_factory import hacking_curve, healthy_curve, write

from platform_sim.sim.corpora import corpus_dir
from platform_sim.sim.traces import (
    LABEL_RULE,
    label_of,
    label_trace,
    load_trace,
    load_traces,
)


def _examples(means, n=24, noise=0.05, rho=0.85, seed=0):
    """Per-example scores whose mean is ``means`` plus eval noise of std ``noise``; paired like real evals."""
    rng = np.random.default_rng(seed)
    sd = noise * np.sqrt(n)
    diff = rng.normal(0, sd * np.sqrt(rho / (1 - rho)), n)
    out = []
    for m in means:
        per = diff + rng.normal(0, sd, n)
        out.append(list(per - per.mean() + m + rng.normal(0, noise)))
    return [float(np.mean(e)) for e in out], out


def test_a_real_collapse_is_hacking_whatever_the_units():
    means, ex = _examples(hacking_curve(30))
    lab = label_trace(means, ex)
    assert lab.label == "hacking" and lab.noise == "paired" and lab.give_back > 1 and lab.drop_z > 10
    # an affine change of units changes nothing
    scaled = label_trace([10 * m - 3 for m in means], [[10 * v - 3 for v in e] for e in ex])
    assert scaled.label == "hacking" and scaled.drop_z == pytest.approx(lab.drop_z)


@pytest.mark.parametrize("seed", range(8))
def test_a_noisy_plateau_is_never_hacking(seed):
    # a healthy run that plateaus from a third of the way, with real eval noise: the best window is only noise
    means, ex = _examples(healthy_curve(30, tau=0.1), noise=0.15, seed=seed)
    assert label_trace(means, ex).label == "healthy"
    # the same plateau without per-example scores: the curve's own noise estimate says the same
    assert label_of(means) == "healthy"


def test_small_or_unreal_declines_are_healthy_and_in_between_is_ambiguous():
    base = list(healthy_curve(30, top=4.0, tau=0.1))
    small = base[:-4] + [b - 0.2 for b in base[-4:]]  # 8% of the gain, far above the noise
    means, ex = _examples(small, noise=0.01)
    lab = label_trace(means, ex)
    assert lab.label == "healthy" and "small decline" in lab.reason
    mid = base[:-4] + [b - 0.4 for b in base[-4:]]  # ~17% of the gain: real, but below the hacking share
    means, ex = _examples(mid, noise=0.01)
    lab = label_trace(means, ex)
    assert lab.label == "ambiguous" and LABEL_RULE.small <= lab.give_back < LABEL_RULE.give_back
    # a material decline (50% of the gain) only 2.5 standard errors deep: the final evals' examples disagree a lot
    n, drop = 24, 1.2
    spread = drop * np.sqrt(n - 1) / 2.5  # paired SE of the drop = spread / sqrt(n - 1)
    shallow = base[:-3] + [b - drop for b in base[-3:]]
    signs = [1.0 if x % 2 else -1.0 for x in range(n)]
    ex = [[m] * n for m in shallow[:-3]] + [[m + spread * sg for sg in signs] for m in shallow[-3:]]
    lab = label_trace(shallow, ex)
    assert lab.drop_z == pytest.approx(2.5, abs=0.05) and lab.give_back >= LABEL_RULE.give_back
    assert lab.label == "ambiguous" and "below the hacking thresholds" in lab.reason
    # the same decline with examples that agree is hacking
    assert label_trace(shallow, [[m] * n for m in shallow]).label == "hacking"


def test_a_decline_after_no_real_gain_is_ambiguous():
    means, ex = _examples([1.0] * 10 + list(np.linspace(1.0, -2.0, 10)), noise=0.05)
    lab = label_trace(means, ex)
    assert lab.label == "ambiguous" and "no real gain" in lab.reason


def test_labels_need_scores():
    with pytest.raises(ValueError):
        label_trace([])
    assert label_of([1.0]) == "healthy"


def test_a_trace_is_labelled_from_its_recorded_per_example_scores(tmp_path):
    p = write(tmp_path / "h.jsonl", hacking_curve(20), examples=16, noise=0.05)
    t = load_trace(p)
    assert t.has_examples and t.labelling.noise == "paired" and t.label == "hacking" and t.hacking


def test_shipped_corpus_labels():
    # docs/real-traces.md, the bow-proxy environment: every proxy-without-KL run hacks; gold-reward runs never do;
    # one KL-0.2 run that gives back 12% of its gain at the end is ambiguous.
    traces = [t for t in load_traces(corpus_dir("real")) if t.environment == "bow-proxy"]
    labels = {t.name: t.label for t in traces}
    assert len(labels) == 25
    assert all(labels[n] == "hacking" for n in labels if "proxy-kl0-" in n)
    assert all(labels[n] == "healthy" for n in labels if "gold" in n)
    assert [n for n, lab in labels.items() if lab == "ambiguous"] == ["bow-proxy-grpo-proxy-kl0.2-s0"]
