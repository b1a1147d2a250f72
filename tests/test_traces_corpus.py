"""The shipped corpus of real traces (platform_sim/data/corpora/real): what it must hold.

Read line by line as JSON here, so that these checks are about the corpus itself (its size, environments, splits,
per-example scores), whatever the trace reader accepts; how detectors do on it is the replay study's business.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest

from lab import envs
from platform_sim.sim.corpora import corpus_dir
from platform_sim.sim.traces import RealTrace, label_of


@pytest.fixture(scope="module")
def corpus() -> dict[str, list[dict]]:
    folder = Path(corpus_dir("real"))
    return {
        p.stem: [json.loads(x) for x in p.read_text(encoding="utf-8").splitlines() if x.strip()]
        for p in sorted(folder.glob("*.jsonl"))
    }


def _header(lines):
    return lines[0]


def _evals(lines):
    return [x for x in lines if x["kind"] == "eval"]


def test_at_least_120_traces_from_at_least_5_environments_in_both_splits(corpus):
    assert len(corpus) >= 120
    by_env = Counter(_header(t)["environment"] for t in corpus.values())
    assert len(by_env) >= 5 and all(n >= 20 for n in by_env.values()), by_env
    splits = {_header(t)["environment"]: _header(t)["split"] for t in corpus.values()}
    assert sum(s == "tune" for s in splits.values()) >= 3 and sum(s == "test" for s in splits.values()) >= 2


def test_every_header_names_its_registered_environment_and_split_and_the_file_is_prefixed(corpus):
    for name, lines in corpus.items():
        h = _header(lines)
        assert h["kind"] == "header" and h["job_id"] == name
        env = envs.get(h["environment"])
        assert h["split"] == env.split, name  # the split is the environment's, fixed in the registry
        assert name.startswith(env.name + "-"), name
        assert h["job_type"] == env.job_type, name


def test_every_eval_has_per_example_scores_and_every_run_is_complete(corpus):
    for name, lines in corpus.items():
        evals = _evals(lines)
        assert len(evals) >= 15, name
        steps = [e["step"] for e in evals]
        assert steps == sorted(set(steps)), name
        for e in evals:
            per = e["eval_scores"]
            assert per and all(math.isfinite(v) for v in per), name
            # both kept to 4 significant digits
            assert e["eval_score"] == pytest.approx(sum(per) / len(per), rel=1e-3, abs=1e-3), (name, e["step"])
        assert lines[-1]["kind"] == "end" and lines[-1]["reason"] == "completed", name  # observe mode, full length


def test_two_model_shapes_and_at_least_three_trainers(corpus):
    models = {_header(t)["model"].split("-")[0] for t in corpus.values()}
    trainers = Counter(_header(t)["trainer"] for t in corpus.values())
    assert {"gpt2", "llama"} <= models
    assert len(trainers) >= 3 and "GRPOTrainer" in trainers, trainers


def test_every_environment_has_runs_that_overoptimize_and_runs_that_do_not(corpus):
    labels: dict[str, Counter] = {}
    for lines in corpus.values():
        scores = [e["eval_score"] for e in _evals(lines)]
        labels.setdefault(_header(lines)["environment"], Counter())[label_of(scores) == "hacking"] += 1
    for env, count in labels.items():
        assert count[True] >= 4 and count[False] >= 4, (env, count)


def test_the_corpus_stays_small_on_disk():
    folder = Path(corpus_dir("real"))
    sizes = [p.stat().st_size for p in folder.glob("*.jsonl")]
    assert sum(sizes) < 4 * 2**20 and max(sizes) < 2**20


# -- the dense traces (platform_sim/data/corpora/dense) ----------------------------------------------------------------


def test_dense_traces_hold_an_eval_at_every_step_in_both_splits():
    from platform_sim.sim.corpora import corpus_dir
    from platform_sim.sim.traces import load_traces

    traces = load_traces(corpus_dir("dense"))
    assert len(traces) >= 30
    assert {t.split for t in traces} == {"tune", "test"}
    for t in traces:
        assert t.name.endswith("-every1") and t.header["config"]["eval_steps"] == 1, t.name
        steps = [s for s in t.steps if s > 0]
        assert steps == list(range(1, steps[-1] + 1)), t.name  # every step, none missing
        assert t.has_examples, t.name
        # the regular name of the same run is in the regular corpus: a dense trace never replaces it
        assert (corpus_dir("real") / f"{t.name.removesuffix('-every1')}.jsonl").exists(), t.name
    for split in ("tune", "test"):
        labels = Counter(t.label for t in traces if t.split == split)
        assert labels["hacking"] >= 5 and labels["healthy"] >= 5, (split, labels)


def test_the_second_dense_corpus_holds_other_runs_than_the_first():
    from platform_sim.sim.corpora import corpus_dir
    from platform_sim.sim.traces import load_traces

    folder = corpus_dir("dense-more")
    assert sum(p.stat().st_size for p in folder.glob("*.jsonl")) < 4 * 2**20
    traces = load_traces(folder)
    first = {t.name for t in load_traces(corpus_dir("dense"))}
    assert not first & {t.name for t in traces}  # fresh runs: a choice made on the first corpus never saw them
    seeds = Counter((t.environment, t.name.removesuffix("-every1").rsplit("-s", 1)[1]) for t in traces)
    assert seeds == {
        ("length", "2"): 8,
        ("length", "3"): 8,
        ("keyword", "2"): 8,
        ("format", "0"): 8,
        ("format", "1"): 8,
    }
    for t in traces:
        assert t.name.endswith("-every1") and t.header["config"]["eval_steps"] == 1, t.name
        assert t.steps == tuple(range(1, 151)) and t.has_examples, t.name
        assert t.split == ("tune" if t.environment == "length" else "test"), t.name
    for split in ("tune", "test"):
        labels = Counter(t.label for t in traces if t.split == split)
        assert labels["hacking"] >= 5 and labels["healthy"] >= 5, (split, labels)


def _load_x8(folder: Path) -> list[RealTrace]:
    """The traces of an x8 corpus, after checking it stays small and that every run is complete, at every step, with
    8 completions of each of the 24 held-out prompts (192 per eval)."""
    from platform_sim.sim.traces import load_traces

    assert sum(p.stat().st_size for p in folder.glob("*.jsonl")) < 8 * 2**20
    traces = load_traces(folder)
    for t in traces:
        assert t.header["config"]["run"]["eval_samples"] == 8 and "x 8 samples" in t.header["config"]["eval"], t.name
        assert t.steps == tuple(range(1, 151)), t.name
        assert all(e is not None and len(e) == 192 for e in t.examples), t.name
    return traces


def test_the_x8_dense_traces_are_the_same_grid_with_a_four_times_larger_eval_set():
    from platform_sim.sim.traces import (
        load_traces,
        sub_evals,
    )

    traces = _load_x8(corpus_dir("dense-x8"))
    dense = {t.name for t in load_traces(corpus_dir("dense"))}
    assert {t.name.removesuffix("-x8") for t in traces} == dense  # the same runs, one each
    for split in ("tune", "test"):
        labels = Counter(t.label for t in traces if t.split == split)
        assert labels["hacking"] >= 5 and labels["healthy"] >= 5, (split, labels)
    # four sub-evals of the default size, whose mean is the recorded eval score (to its 4 recorded digits)
    subs = sub_evals(traces[0])
    assert len(subs) == 4 and all(len(s.examples[0]) == 48 for s in subs)
    for i in (0, 74, 149):
        assert sum(s.scores[i] for s in subs) / 4 == pytest.approx(traces[0].scores[i], abs=1e-3)


def test_the_fresh_x8_dense_traces_are_other_keyword_runs_with_the_larger_eval_set():
    from platform_sim.sim.traces import (
        load_traces,
    )

    traces = _load_x8(corpus_dir("dense-x8-more"))
    earlier = {t.name for d in (corpus_dir("dense"), corpus_dir("dense-more")) for t in load_traces(d)}
    # fresh runs: no choice made on the earlier corpora (or the x8 recording of the first) saw them
    assert not earlier & {t.name.removesuffix("-x8") for t in traces}
    seeds = Counter((t.environment, t.name.removesuffix("-every1-x8").rsplit("-s", 1)[1]) for t in traces)
    assert seeds == {("keyword", str(s)): 8 for s in (4, 5, 6, 7)}
    assert {t.split for t in traces} == {"test"}
    labels = Counter(t.label for t in traces)
    assert labels["hacking"] >= 10 and labels["healthy"] >= 10, labels


def test_the_second_fresh_x8_dense_traces_are_yet_other_keyword_runs():
    from platform_sim.sim.traces import (
        load_traces,
    )

    traces = _load_x8(corpus_dir("dense-x8-more2"))
    earlier = {t.name for d in (corpus_dir("dense-x8"), corpus_dir("dense-x8-more")) for t in load_traces(d)}
    assert not earlier & {t.name for t in traces}
    seeds = Counter((t.environment, t.name.removesuffix("-every1-x8").rsplit("-s", 1)[1]) for t in traces)
    assert seeds == {("keyword", str(s)): 8 for s in (8, 9, 10, 11)}
    assert {t.split for t in traces} == {"test"}
    labels = Counter(t.label for t in traces)
    assert labels["hacking"] >= 10 and labels["healthy"] >= 10, labels


def test_the_more_x8_tune_traces_are_other_length_runs_with_the_larger_eval_set():
    from platform_sim.sim.traces import (
        load_traces,
    )

    traces = _load_x8(corpus_dir("dense-x8-tune-more"))
    assert not {t.name for t in load_traces(corpus_dir("dense-x8"))} & {t.name for t in traces}
    seeds = Counter((t.environment, t.name.removesuffix("-every1-x8").rsplit("-s", 1)[1]) for t in traces)
    assert seeds == {("length", "2"): 8, ("length", "3"): 8}
    assert {t.split for t in traces} == {"tune"}
    labels = Counter(t.label for t in traces)
    assert labels["hacking"] >= 5 and labels["healthy"] >= 5, labels


def test_on_the_dense_test_traces_the_default_hint_stops_no_healthy_run_more():
    from platform_sim.core import default_spec
    from platform_sim.sim.corpora import corpus_dir
    from platform_sim.sim.traces import load_traces
    from platform_sim.studies.dense_replay import dense_cadence_study

    test = [t for t in load_traces(corpus_dir("dense")) if t.split == "test"]
    # The default as the traces' planned steps make it decide (per run) and its per-look test (no plan, or
    # means_test="window"): a hint never costs a healthy run or a hacking stop; per look it shortens the median
    # delay (16 to 13 steps), per run it does not (an extra look spends only the progress since the last regular
    # one: 2 of the 27 dense stops come sooner, docs/results/cadence-dense-traces.md).
    per_look = {**default_spec(), "params": {**default_spec()["params"], "means_test": "window"}}
    for spec, shorter in ((default_spec(), False), (per_look, True)):
        res = dense_cadence_study(test, spec, [("fixed", None), ("adaptive", "adaptive")], every=5)
        fixed, adaptive = res["summaries"]["fixed"], res["summaries"]["adaptive"]
        assert adaptive["healthy_stopped"] <= fixed["healthy_stopped"]
        assert adaptive["hacking_stopped"] >= fixed["hacking_stopped"]
        assert adaptive["extra_evals"] > 0 and adaptive["median_delay_steps"] <= fixed["median_delay_steps"]
        assert (adaptive["median_delay_steps"] < fixed["median_delay_steps"]) is shorter, (spec, fixed, adaptive)
        for row in res["rows"]["adaptive"]:
            assert all(s % 5 for s in row["extra_steps"]), row  # extra evals fall between the regular ones


def test_on_every_dense_trace_a_hint_of_the_default_brings_its_stop_sooner_never_later():
    # Extra evals are looks that the default detector forgets (platform_sim.core.monitor): every trace the fixed
    # cadence stops is stopped at the same regular eval or sooner. Before, on the format runs, hints filled trend's
    # window with evals a step apart and three hacking runs that the fixed cadence stops were never stopped.
    from platform_sim.core import default_spec
    from platform_sim.sim.corpora import corpus_dir
    from platform_sim.sim.traces import load_traces
    from platform_sim.studies.dense_replay import dense_cadence_study

    traces = [t for d in (corpus_dir("dense"), corpus_dir("dense-more")) for t in load_traces(d)]
    res = dense_cadence_study(traces, default_spec(), [("fixed", None), ("adaptive", "adaptive")], every=5)
    sooner = 0
    for fixed, hinted in zip(res["rows"]["fixed"], res["rows"]["adaptive"]):
        if fixed["stopped"]:
            assert hinted["stopped"] and hinted["stop_step"] <= fixed["stop_step"], (fixed, hinted)
            sooner += hinted["stop_step"] < fixed["stop_step"]
    # and the hint does bring some sooner: 2 of 27 with the default's per-run test (the traces carry their planned
    # steps), against at least 5 with its per-look test before it
    assert sooner >= 2


# -- the manifest (platform_sim/data/corpora/manifest.json) ------------------------------------------------------------


def test_the_manifest_lists_every_corpus_folder_and_each_holds_what_it_states():
    import json

    from platform_sim.sim.corpora import corpora, load_corpus

    root = Path(corpus_dir("real")).parent
    listed = corpora()
    assert {c.folder for c in listed.values()} == {d.name for d in root.iterdir() if d.is_dir()}
    assert [name for name, c in listed.items() if c.in_wheel] == ["real"]
    for name, entry in listed.items():
        traces = load_corpus(name)
        assert len(traces) == entry.traces == sum(e["traces"] for e in entry.environments.values()), name
        assert {t.environment for t in traces} == set(entry.environments), name
        for t in traces:
            env = entry.environments[t.environment]
            assert t.split == env["split"], (name, t.name)
            assert t.header["config"]["eval_steps"] in env["eval_every_steps"], (name, t.name)
            assert len(t.examples[0] or ()) == entry.eval_samples, (name, t.name)
        assert entry.recorded_for and all(cmd.startswith("python -m lab traces record") for cmd in entry.recorded_with)
    raw = json.loads((root / "manifest.json").read_text())
    assert [c["name"] for c in raw["corpora"]] == list(listed)


def test_an_unknown_corpus_is_named_in_the_error():
    with pytest.raises(ValueError, match="unknown corpus 'nope'; choose one of real, dense"):
        corpus_dir("nope")
