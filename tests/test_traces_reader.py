"""Reading recorded traces: strict validation with file and line, the label rule, and replay's input errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from platform_sim.cli import main as sim_main
from platform_sim.sim.traces import TraceError, load_trace, load_traces


def write_trace(path: Path, scores, job_type="rlhf", end=True, extra_eval=None, header=None) -> Path:
    lines = [
        header
        or {
            "kind": "header",
            "format": "evalstop-trace/1",
            "job_id": path.stem,
            "job_type": job_type,
            "planned_steps": 10 * len(scores),
        }
    ]
    for i, s in enumerate(scores, 1):
        line = {"kind": "eval", "step": 10 * i, "eval_score": s, "proxy_reward": float(i)}
        line.update(extra_eval or {})
        lines.append(line)
    if end:
        lines.append({"kind": "end", "reason": "completed", "best_step": 10, "best_score": max(scores)})
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_reads_a_valid_trace(tmp_path):
    t = load_trace(write_trace(tmp_path / "a.jsonl", [1.0, 3.0, 2.0, 0.5]))
    assert t.name == "a" and t.steps == (10, 20, 30, 40) and t.scores == (1.0, 3.0, 2.0, 0.5)
    assert t.peak_step == 20 and t.proxy == (1.0, 2.0, 3.0, 4.0)
    assert t.progress() == (0.25, 0.5, 0.75, 1.0)


def test_only_required_fields_are_required(tmp_path):
    p = tmp_path / "minimal.jsonl"
    p.write_text(
        '{"kind": "header", "format": "evalstop-trace/1", "job_id": "x", "job_type": "dpo"}\n'
        '{"kind": "eval", "step": 0, "eval_score": 1}\n{"kind": "eval", "step": 5, "eval_score": 2}\n'
    )
    t = load_trace(p)
    assert t.planned_steps == 5 and t.end is None and t.proxy == (None, None)


@pytest.mark.parametrize(
    "mutate, line, words",
    [
        (lambda ls: ls.__setitem__(2, "{not json"), 3, "not valid JSON"),
        (
            lambda ls: ls.__setitem__(3, json.dumps({"kind": "eval", "step": 10, "eval_score": 1.0})),
            4,
            "steps must increase",
        ),
        (lambda ls: ls.__setitem__(2, '{"kind": "eval", "step": 20, "eval_score": NaN}'), 3, "finite"),
        (lambda ls: ls.__setitem__(2, json.dumps({"kind": "eval", "step": 20})), 3, "without eval_score"),
        (
            lambda ls: ls.__setitem__(2, json.dumps({"kind": "eval", "step": 20, "eval_score": 1, "loss": 2})),
            3,
            "unknown",
        ),
        (lambda ls: ls.__setitem__(2, json.dumps({"kind": "metrics", "step": 20})), 3, "unknown line kind"),
        (
            lambda ls: ls.__setitem__(
                0, json.dumps({"kind": "header", "format": "other/2", "job_id": "a", "job_type": "rlhf"})
            ),
            1,
            "format",
        ),
        (
            lambda ls: ls.__setitem__(
                0, json.dumps({"kind": "header", "format": "evalstop-trace/1", "job_id": "a", "job_type": "chat"})
            ),
            1,
            "job_type",
        ),
        (lambda ls: ls.pop(0), 1, "first line must be the header"),
        (lambda ls: ls.append(json.dumps({"kind": "eval", "step": 99, "eval_score": 1})), 7, "after the end line"),
        (
            lambda ls: ls.__setitem__(
                2, json.dumps({"kind": "eval", "step": 20, "eval_score": 1, "eval_scores": [1, None]})
            ),
            3,
            "eval_scores",
        ),
    ],
)
def test_rejects_bad_files_with_file_and_line(tmp_path, mutate, line, words):
    p = write_trace(tmp_path / "bad.jsonl", [1.0, 2.0, 3.0, 2.0])
    lines = p.read_text().splitlines()
    mutate(lines)
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError) as exc:
        load_trace(p)
    msg = str(exc.value)
    assert msg.startswith(f"{p}:{line}:"), msg
    assert words in msg


def test_rejects_empty_and_too_short_traces(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(TraceError, match="empty.jsonl:1: empty trace"):
        load_trace(tmp_path / "empty.jsonl")
    with pytest.raises(TraceError, match="at least 2 eval lines"):
        load_trace(write_trace(tmp_path / "one.jsonl", [1.0]))


def test_load_traces_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_traces(tmp_path / "nope")
    with pytest.raises(TraceError, match=r"no traces \(\*\.jsonl files\)"):
        load_traces(tmp_path)


def test_replay_cli_rejects_empty_dir_and_bad_trace_with_exit_2(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert sim_main(["replay", "--traces", str(empty), "--seeds", "1", "--backend", "serial"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--traces" in err and "no traces" in err and str(empty) in err and len(err.splitlines()) == 1

    bad = tmp_path / "bad"
    bad.mkdir()
    write_trace(bad / "ok.jsonl", [1.0, 2.0, 3.0])
    p = write_trace(bad / "broken.jsonl", [1.0, 2.0, 3.0])
    lines = p.read_text().splitlines()
    lines[2] = lines[2].replace('"step": 20', '"step": 5')
    p.write_text("\n".join(lines) + "\n")
    assert sim_main(["replay", "--traces", str(bad), "--seeds", "1", "--backend", "serial"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{p}:3:" in err and len(err.splitlines()) == 1


# -- sub-evals of a trace recorded with a larger eval set -------------------------------------------------------------


def _x4_trace(tmp_path: Path, examples: list[list[float]]) -> Path:
    header = {
        "kind": "header",
        "format": "evalstop-trace/1",
        "job_id": "x4",
        "job_type": "rlhf",
        "config": {"run": {"eval_samples": 4}},
    }
    lines = [header] + [
        {"kind": "eval", "step": i, "eval_score": sum(e) / len(e), "eval_scores": e} for i, e in enumerate(examples, 1)
    ]
    path = tmp_path / "x4.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_sub_evals_take_the_same_samples_of_every_prompt(tmp_path):
    from platform_sim.sim.traces import eval_samples_of, sub_evals

    # two held-out prompts x 4 samples, prompt-major: prompt 0's samples, then prompt 1's
    t = load_trace(_x4_trace(tmp_path, [[1, 2, 3, 4, 10, 20, 30, 40], [0, 0, 8, 8, 1, 1, 5, 5]]))
    assert eval_samples_of(t) == 4
    first, second = sub_evals(t)
    assert first.name == "x4-sub0" and second.name == "x4-sub1"
    from platform_sim.service.wire import JOB_ID_PATTERN

    assert re.fullmatch(JOB_ID_PATTERN, first.name)  # a sub-eval can be a job on the service or the platform
    assert first.examples == ((1.0, 2.0, 10.0, 20.0), (0.0, 0.0, 1.0, 1.0))
    assert second.examples == ((3.0, 4.0, 30.0, 40.0), (8.0, 8.0, 5.0, 5.0))
    assert first.scores == (8.25, 0.5) and second.scores == (19.25, 6.5)
    assert first.steps == t.steps and first.header == t.header
    # one sample per prompt: four sub-evals, which together hold every example once
    singles = sub_evals(t, per=1)
    assert len(singles) == 4 and sorted(v for s in singles for v in s.examples[0]) == sorted(t.examples[0])


def test_sub_evals_refuse_what_cannot_be_split(tmp_path):
    from platform_sim.sim.traces import sub_evals

    t = load_trace(_x4_trace(tmp_path, [[1, 2, 3, 4], [1, 2, 3, 4]]))
    with pytest.raises(ValueError, match="4 samples per held-out prompt cannot be split into evals of 3"):
        sub_evals(t, per=3)
    with pytest.raises(ValueError, match="cannot be split into evals of 4"):
        sub_evals(t, per=4)  # a single sub-eval would be the trace itself
    with pytest.raises(ValueError, match="per must be >= 1"):
        sub_evals(t, per=0)
    odd = load_trace(_x4_trace(tmp_path, [[1, 2, 3, 4], [1, 2, 3]]))
    with pytest.raises(ValueError, match="step 2 has 3 per-example scores, not a multiple of 4"):
        sub_evals(odd)
    plain = load_trace(write_trace(tmp_path / "plain.jsonl", [1.0, 2.0]))
    with pytest.raises(ValueError, match="2 samples per held-out prompt"):
        sub_evals(plain)  # a trace that does not say has the environments' own 2


def test_several_folders_are_read_together_and_a_run_in_two_is_refused_by_name(tmp_path):
    from platform_sim.sim.traces import load_trace_folders

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    write_trace(a / "run-one.jsonl", [0.1, 0.2, 0.3])
    write_trace(b / "run-two.jsonl", [0.3, 0.2, 0.1])
    assert [t.name for t in load_trace_folders([a, b])] == ["run-one", "run-two"]
    write_trace(b / "run-one.jsonl", [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="a run is in more than one folder: run-one$"):
        load_trace_folders([a, b])
