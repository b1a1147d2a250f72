"""Shared pieces of the framework integration tests (Axolotl, LLaMA-Factory): a tiny model folder, training data,
running a framework's command on a YAML file, and reading back what the run decided.

Not a test module (no ``test_`` prefix). The frameworks run in a child process, as a user runs them; the child
imports the tests' world evaluator (``_callback_helpers:world_evaluator``) from this folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

#: The evaluator the YAML files name: gold (+1 per positive word, -1 per negative) on the held-out prompts.
EVALUATOR = "_callback_helpers:world_evaluator"


def save_tiny_model(folder: Path) -> Path:
    """The tests' pretrained tiny GPT-2 and its tokenizer, saved with ``save_pretrained`` (what a framework loads)."""
    from _callback_helpers import policy, tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    policy().save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    return folder


def split_sentence(sentence: str) -> tuple[str, str]:
    """``"the cat is bad and sad ."`` -> ``("the cat is", "bad and sad .")``: a prompt and its completion."""
    subject, rest = sentence.split(" is ", 1)
    return f"{subject} is", rest


def preference_rows(n: int = 48) -> list[dict[str, str]]:
    """Prompts with a negative completion chosen over a positive one: DPO on them makes the world score decline."""
    from _callback_helpers import sentences

    rows = []
    for bad, good in zip(sentences("negative", n), sentences("positive", n, seed=1)):
        prompt, chosen = split_sentence(bad)
        rows.append({"prompt": prompt, "chosen": chosen, "rejected": split_sentence(good)[1]})
    return rows


def run_framework(argv: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run a framework's command in a child process on one CPU thread, with this checkout and the tests importable.

    Raises:
        AssertionError: The command failed (its output's tail is the message).
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(TESTS), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(
        OMP_NUM_THREADS="1",
        EVALSTOP_TEST_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
        WANDB_MODE="disabled",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        DO_NOT_TRACK="1",  # Axolotl's telemetry
        AXOLOTL_DO_NOT_TRACK="1",
    )
    proc = subprocess.run(
        [sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-6000:]}"
    return proc


def read_trace(path: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The eval lines and the end line of an evalstop JSONL trace."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    evals = [line for line in lines if line["kind"] == "eval"]
    ends = [line for line in lines if line["kind"] == "end"]
    assert len(ends) == 1, lines
    return evals, ends[0]


def same_weights(folder_a: Path, folder_b: Path) -> bool:
    """Whether two ``save_pretrained`` folders hold the same tensors (names and values)."""
    import torch
    from safetensors.torch import load_file

    a, b = load_file(str(folder_a / "model.safetensors")), load_file(str(folder_b / "model.safetensors"))
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def assert_stopped_at_decline_with_best_saved(trace: Path, out: Path) -> None:
    """The run stopped at the k=2 decline of its trace, and the model the framework saved in ``out`` is the best."""
    from _callback_helpers import first_k_decline_step, tokenizer, world_evaluator

    evals, end = read_trace(trace)
    history = [{"step": e["step"], "eval_score": e["eval_score"]} for e in evals]
    stop = first_k_decline_step(history, 2)
    assert stop is not None and end["reason"] == "stopped" and end["stopped_at"] == stop, (history, end)
    assert evals[-1]["step"] == stop  # nothing was evaluated (or trained on) after the stop
    best = max(history, key=lambda h: h["eval_score"])  # ties: the earliest, as max keeps the first
    assert (end["best_step"], end["best_score"]) == (best["step"], best["eval_score"])
    # The model the framework saved at the end holds the best step's weights, not the stop step's, and scores the best.
    assert same_weights(out, out / f"evalstop-best-{best['step']}")
    assert not same_weights(out, out / f"checkpoint-{stop}")
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(out)
    assert world_evaluator().evaluate(saved, tokenizer()).score == best["eval_score"]
