"""What EvalStopCallback costs a training run.

Two figures:

``overhead``: the callback's own cost per evaluation, excluding the evaluator (target: < 5 ms with the embedded core).
    The callback's real ``on_step_end`` runs with real ``TrainingArguments``/``TrainerState``/``TrainerControl`` and an
    evaluator that returns a precomputed result (48 per-example scores) instantly, so everything measured is the
    callback: report validation, the embedded scheduler core, best-checkpoint bookkeeping, the rank broadcast (a
    no-op with one process), trace writing. Timed from outside around ``on_step_end`` (plus the ``on_log`` and next
    ``on_step_end`` that write the trace line), and by the callback's own ``overhead_seconds``.

``share``: the evaluator's cost as a share of training time for the example configurations (``examples/``), in
    observe mode so that the run has a fixed length: GRPO (in .venv) or PPO (in .venv-ppo, TRL 1.12).

``ranks``: the time of one distributed evaluation (every rank generates and scores its batches, the scores are
    gathered) with 1, 2, ... processes under torchrun (gloo, CPU, one thread each), against the 1-process run of the
    same command as the peer. Each evaluation is timed on every rank between two barriers; the figure is the slowest
    rank's (the time the training step waits). The gathered mean is checked equal across process counts.

    .venv/bin/python benchmarks/bench_callback.py overhead --evals 3000
    .venv/bin/python benchmarks/bench_callback.py share --trainer grpo --steps 100
    .venv-ppo/bin/python benchmarks/bench_callback.py share --trainer ppo --steps 40
    .venv/bin/python benchmarks/bench_callback.py ranks --nprocs 1 2 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def overhead(evals: int, trace: bool) -> dict:
    import random

    from transformers import TrainerControl, TrainerState, TrainingArguments

    from evalstop_callbacks import EvalResult, EvalStopCallback, Evaluator

    rng = random.Random(0)

    class Instant(Evaluator):
        """Returns precomputed results: the evaluator's own cost is zero, what remains is the callback's."""

        def __init__(self) -> None:
            # An up-down pattern that never has two declines in a row: the run is never stopped.
            self.results = [
                EvalResult(float(i // 2 * 2 + (i % 2) * 0.5), tuple(rng.random() for _ in range(48)))
                for i in range(evals)
            ]
            self.i = 0

        def evaluate(self, model, tokenizer=None):
            r = self.results[self.i]
            self.i += 1
            return r

    tmp = tempfile.mkdtemp(prefix="evalstop-bench-")
    cb = EvalStopCallback(
        Instant(), eval_steps=1, k=2, trace_path=os.path.join(tmp, "t.jsonl") if trace else None, eval_on_start=False
    )
    args = TrainingArguments(output_dir=tmp, report_to="none", use_cpu=True)
    state, control = TrainerState(), TrainerControl()
    state.max_steps = evals + 1
    cb.on_train_begin(args, state, control, model=None)
    outer: list[float] = []
    for step in range(1, evals + 1):
        state.global_step = step
        t0 = time.perf_counter()
        cb.on_step_end(args, state, control, model=None)
        cb.on_log(args, state, control, logs={"loss": 0.1, "reward": 1.0})
        outer.append(time.perf_counter() - t0)
        control.should_save = False
    cb.on_train_end(args, state, control, model=None)
    inner = cb.overhead_seconds
    assert cb.stopped_at is None and len(inner) == evals
    return {
        "evals": evals,
        "trace": trace,
        "outer_median_ms": 1000 * statistics.median(outer),
        "outer_p95_ms": 1000 * _pct(outer, 0.95),
        "outer_max_ms": 1000 * max(outer),
        "own_median_ms": 1000 * statistics.median(inner),
        "own_p95_ms": 1000 * _pct(inner, 0.95),
    }


def share(trainer_name: str, steps: int, eval_steps: int) -> dict:
    from datasets import Dataset
    from transformers import PrinterCallback
    from transformers.utils import logging as hf_logging

    from evalstop_callbacks import EvalStopCallback
    from evalstop_callbacks.demo.overopt import EnvConfig, build_env

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    env = build_env(EnvConfig(seed=0))
    ev = env.evaluator()
    cb = EvalStopCallback(ev, eval_steps=eval_steps, mode="observe")
    out = tempfile.mkdtemp(prefix="evalstop-bench-")
    if trainer_name == "grpo":  # the configuration of examples/grpo_evalstop.py
        from trl import GRPOConfig, GRPOTrainer

        config = GRPOConfig(
            output_dir=out,
            max_steps=steps,
            per_device_train_batch_size=32,
            num_generations=8,
            max_completion_length=env.config.max_new_tokens,
            learning_rate=5e-4,
            beta=0.0,
            seed=0,
            use_cpu=True,
            bf16=False,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
        )
        trainer = GRPOTrainer(
            model=env.reference_policy(),
            # TRL types a reward function as returning list[float | None]; the proxy returns list[float] (a list is
            # invariant, so mypy refuses what TRL accepts).
            reward_funcs=env.proxy,  # type: ignore[arg-type]
            args=config,
            processing_class=env.tokenizer,
            train_dataset=Dataset.from_dict({"prompt": env.train_prompts * 40}),
            callbacks=[cb],
        )
    else:  # the configuration of examples/ppo_evalstop.py
        from trl.experimental.ppo import PPOConfig, PPOTrainer

        from evalstop_callbacks.demo.tiny import build_scalar_model

        tok = env.tokenizer
        config = PPOConfig(
            output_dir=out,
            per_device_train_batch_size=32,
            num_mini_batches=1,
            num_ppo_epochs=4,
            total_episodes=32 * steps,
            response_length=env.config.max_new_tokens,
            learning_rate=5e-4,
            kl_coef=0.0,
            stop_token="eos",
            seed=0,
            use_cpu=True,
            bf16=False,
            report_to="none",
            num_sample_generations=0,
            save_strategy="no",
            disable_tqdm=True,
        )
        train = Dataset.from_dict({"input_ids": [tok(p)["input_ids"] for p in env.train_prompts * 40]})
        trainer = PPOTrainer(
            args=config,
            processing_class=tok,
            model=env.reference_policy(),
            ref_model=env.reference_policy(),
            reward_model=env.proxy_model(),
            value_model=build_scalar_model(tok),
            train_dataset=train,
            callbacks=[cb],
        )
    trainer.remove_callback(PrinterCallback)
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    eval_s = sum(cb.eval_seconds)
    return {
        "trainer": trainer_name,
        "steps": steps,
        "eval_steps": eval_steps,
        "evals": len(cb.eval_seconds),
        "eval_examples": len(ev.prompts),
        "train_s": train_s,
        "eval_s": eval_s,
        "eval_share": eval_s / train_s,
        "eval_ms_each": 1000 * eval_s / max(1, len(cb.eval_seconds)),
        "own_ms_each": 1000 * statistics.median(cb.overhead_seconds) if cb.overhead_seconds else None,
    }


def ranks_worker(out: str, prompts: int, tokens: int, batch: int, repeats: int) -> None:
    """One torchrun process of ``ranks``: time ``repeats`` distributed evaluations, write rank-<r>.json to ``out``."""
    import torch.distributed as dist

    from evalstop_callbacks import RewardFunctionEvaluator
    from evalstop_callbacks.demo.tiny import VOCAB, build_policy, build_tokenizer

    dist.init_process_group("gloo")
    positive = set(VOCAB.positive)

    def gold(prompts, completions, **kwargs):
        return [float(sum(w in positive for w in c.split())) for c in completions]

    tok = build_tokenizer()
    model = build_policy(tok, n_layer=4, n_embd=128, n_head=4)
    nouns = list(VOCAB.heldout_nouns)
    heldout = [f"the {nouns[i % len(nouns)]} is" for i in range(prompts)]
    ev = RewardFunctionEvaluator(heldout, gold, tokenizer=tok, max_new_tokens=tokens, batch_size=batch)
    ev.evaluate(model)  # warm-up (lazy imports, allocator)
    times, score = [], None
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        score = ev.evaluate(model).score
        dist.barrier()
        times.append(time.perf_counter() - t0)
    rank = dist.get_rank()
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as fh:
        json.dump({"rank": rank, "times": times, "score": score}, fh)
    dist.destroy_process_group()


def ranks(nprocs: list[int], prompts: int, tokens: int, batch: int, repeats: int) -> list[dict]:
    import socket
    import subprocess

    rows = []
    for n in nprocs:
        out = tempfile.mkdtemp(prefix=f"evalstop-ranks-{n}-")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(n),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(port),
            os.path.abspath(__file__),
            "ranks-worker",
            "--out",
            out,
            "--prompts",
            str(prompts),
            "--tokens",
            str(tokens),
            "--batch",
            str(batch),
            "--repeats",
            str(repeats),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=1200)
        per_rank = [json.load(open(os.path.join(out, f"rank-{r}.json"))) for r in range(n)]
        slowest = [max(r["times"][i] for r in per_rank) for i in range(repeats)]
        rows.append(
            {
                "nprocs": n,
                "median_s": statistics.median(slowest),
                "min_s": min(slowest),
                "score": per_rank[0]["score"],
                "scores_equal_across_ranks": len({r["score"] for r in per_rank}) == 1,
            }
        )
    base = rows[0]["median_s"]
    for r in rows:
        r["speedup"] = base / r["median_s"]
        r["score_equals_first"] = r["score"] == rows[0]["score"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description="EvalStopCallback cost: own overhead per eval, evaluator share")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p1 = sub.add_parser("overhead", help="the callback's own cost per eval, evaluator excluded")
    p1.add_argument("--evals", type=int, default=3000)
    p2 = sub.add_parser("share", help="evaluator time as a share of training time (example configs)")
    p2.add_argument("--trainer", choices=("grpo", "ppo"), default="grpo")
    p2.add_argument("--steps", type=int, default=100)
    p2.add_argument("--eval-steps", type=int, default=None, help="default: 10 for grpo, 4 for ppo (the examples')")
    p3 = sub.add_parser("ranks", help="distributed evaluation time with 1, 2, ... processes (torchrun, gloo, CPU)")
    p3.add_argument("--nprocs", type=int, nargs="+", default=[1, 2, 3])
    pw = sub.add_parser("ranks-worker", help=argparse.SUPPRESS)
    pw.add_argument("--out", required=True)
    for p in (p3, pw):
        p.add_argument("--prompts", type=int, default=96, help="held-out prompts (default 96)")
        p.add_argument("--tokens", type=int, default=16, help="tokens generated per completion (default 16)")
        p.add_argument("--batch", type=int, default=16, help="prompts per generate call (default 16)")
        p.add_argument("--repeats", type=int, default=5, help="timed evaluations (default 5)")
    for p in (p1, p2, p3, pw):
        p.add_argument("--json", action="store_true", help="print machine-readable JSON only")
        p.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    if args.cmd == "ranks-worker":
        ranks_worker(args.out, args.prompts, args.tokens, args.batch, args.repeats)
        return
    if args.cmd == "ranks":
        if not args.nprocs or min(args.nprocs) < 1:
            parser.error("--nprocs takes process counts >= 1")
        rows = ranks(args.nprocs, args.prompts, args.tokens, args.batch, args.repeats)
        if args.json:
            print(json.dumps(rows, indent=1))
            return
        print(
            f"one evaluation: {args.prompts} prompts x {args.tokens} tokens, batches of {args.batch}, GPT-2 4x128, "
            f"slowest rank, median of {args.repeats}"
        )
        print("procs  median    min       speedup  gathered score (same as 1 proc?)")
        for r in rows:
            print(
                f"{r['nprocs']:>5}  {r['median_s']:.3f} s  {r['min_s']:.3f} s  {r['speedup']:.2f}x    "
                f"{r['score']:.4f} ({'yes' if r['score_equals_first'] and r['scores_equal_across_ranks'] else 'NO'})"
            )
        return
    if args.cmd == "overhead":
        if args.evals < 10:
            parser.error("--evals must be >= 10")
        rows = [overhead(args.evals, trace=False), overhead(args.evals, trace=True)]
        if args.json:
            print(json.dumps(rows, indent=1))
            return
        print(f"callback's own cost per eval, {args.evals} evals, embedded core, evaluator excluded (target < 5 ms)")
        print("trace   median    p95      max      (own timer: median  p95)")
        for r in rows:
            print(
                f"{'on ' if r['trace'] else 'off':<6}  {r['outer_median_ms']:.3f} ms  {r['outer_p95_ms']:.3f} ms  "
                f"{r['outer_max_ms']:.2f} ms  ({r['own_median_ms']:.3f} ms  {r['own_p95_ms']:.3f} ms)"
            )
    else:
        if args.steps < 1:
            parser.error("--steps must be >= 1")
        eval_steps = args.eval_steps or (10 if args.trainer == "grpo" else 4)
        r = share(args.trainer, args.steps, eval_steps)
        if args.json:
            print(json.dumps(r, indent=1))
            return
        print(
            f"{r['trainer']}: {r['steps']} steps, eval every {r['eval_steps']} ({r['evals']} evals of "
            f"{r['eval_examples']} completions)"
        )
        print(
            f"training {r['train_s']:.1f} s, evaluation {r['eval_s']:.2f} s = {100 * r['eval_share']:.1f}% "
            f"({r['eval_ms_each']:.0f} ms per eval); callback's own cost {r['own_ms_each']:.2f} ms per eval"
        )


if __name__ == "__main__":
    main()
