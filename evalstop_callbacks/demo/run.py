"""``evalstop demo``: real reward hacking on CPU, stopped by EvalStop, then the platform fed by real traces.

1. Build the overoptimization environment (:mod:`evalstop_callbacks.demo.overopt`; cached after the first build).
2. Train one real GRPO job against the learned proxy with no KL penalty (it hacks), with
   :class:`~evalstop_callbacks.EvalStopCallback` in enforce mode and the scheduler core embedded, printing proxy and
   gold side by side at each eval. EvalStop stops it after ``k`` declines of the held-out gold score, and the best
   checkpoint is restored into the live model.
3. Re-evaluate the restored model and check that its gold score is the best one observed.
4. Replay the shipped corpus of real traces on the simulated 64-GPU platform and print the main table.

Everything lands in ``--out``: ``trace.jsonl`` (the job's trace), ``proxy_vs_gold.png``, ``summary.json`` and the
trainer's checkpoints.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .overopt import EnvConfig, OveroptEnv, build_env
from .training import grpo_trainer


def _say(ns: argparse.Namespace, text: str = "") -> None:
    if not ns.json:
        print(text, flush=True)


def _plot(trace_rows: list[dict[str, Any]], stop_step: int | None, best_step: int | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in trace_rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [r["gold"] for r in trace_rows], "o-", color="tab:green", label="gold (held-out world score)")
    ax2 = ax.twinx()
    ax2.plot(steps, [r["proxy"] for r in trace_rows], "s--", color="tab:orange", label="proxy (learned reward)")
    if best_step is not None:
        ax.axvline(best_step, color="tab:blue", linestyle=":", label=f"best checkpoint (step {best_step})")
    if stop_step is not None:
        ax.axvline(stop_step, color="tab:red", linestyle="-", label=f"EvalStop stop (step {stop_step})")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("gold")
    ax2.set_ylabel("proxy")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper left", fontsize=8)
    ax.set_title("GRPO against a learned proxy: the proxy rises, gold peaks and falls")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@dataclass
class _Training:
    """What the GRPO run of part 2 left: the callback (stop, best step, history), the trainer (its live model), the
    printed eval rows and the training time."""

    callback: Any
    trainer: Any
    rows: list[dict[str, Any]]
    train_s: float


def run_demo(ns: argparse.Namespace) -> int:
    """The demo; ``ns`` holds the parsed ``evalstop demo`` flags. Returns the exit code (1 if the restored model's
    gold is not the best one observed)."""
    with warnings.catch_warnings():
        t_start = time.perf_counter()
        _quiet_libraries()
        out = Path(ns.out)
        out.mkdir(parents=True, exist_ok=True)
        ckpt_dir = out / "checkpoints"
        if ckpt_dir.exists():
            shutil.rmtree(ckpt_dir)  # a previous demo's checkpoints would be mistaken for this run's

        _say(ns, "== 1. The environment: a tiny GPT-2 world, a gold score and a learned proxy ==")
        t0 = time.perf_counter()
        env = build_env(EnvConfig(seed=ns.seed))
        _say(
            ns,
            f"reference policy pretrained, proxy fitted on {int(env.proxy_fit['n'])} gold-labelled samples: "
            f"corr(proxy, gold) = {env.proxy_fit['corr_check']:.2f} in distribution; reference gold "
            f"{env.reference_gold:.2f} on {len(env.heldout_prompts)} held-out prompts ({time.perf_counter() - t0:.1f} s)",
        )

        detector = getattr(ns, "detector_spec", None) or {
            "name": "k-decline",
            "params": {"k": ns.k, "min_delta": ns.min_delta, "warmup": ns.warmup},
        }
        run = _train(ns, env, detector, out)
        summary, match = _restored(ns, env, run, detector, out)
        if not ns.no_sim:
            _say(ns, "\n== 4. The simulated 64-GPU platform fed by the shipped real traces ==")
            summary["platform"] = _platform(ns)
        summary["wall_s"] = round(time.perf_counter() - t_start, 1)
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        if ns.json:
            print(json.dumps(summary, indent=2))
        else:
            print(f"\ndone in {summary['wall_s']:.0f} s; summary: {out / 'summary.json'}")
        return 0 if match else 1


def _quiet_libraries() -> None:
    """One torch thread, and the training libraries' logs and warnings silenced (call under ``catch_warnings``)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    # One thread: with two, any other busy process on the second core slows a step down by 40x (measured on a 2-core machine).
    torch.set_num_threads(int(os.environ.get("EVALSTOP_THREADS", "1")))
    for name in ("transformers", "trl", "accelerate", "datasets"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # The libraries' own warnings (deprecations, CPU hints) would bury the demo's output; only theirs are silenced,
    # and only while the demo runs.
    warnings.filterwarnings("ignore", module=r"(transformers|trl|accelerate|datasets|torch|peft)(\.|$)")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def _train(ns: argparse.Namespace, env: OveroptEnv, detector: dict[str, Any], out: Path) -> _Training:
    """Part 2: GRPO against the proxy with :class:`~evalstop_callbacks.EvalStopCallback` (enforce mode, embedded
    core), printing proxy and gold at each eval, until EvalStop stops it or it ends."""
    from transformers import TrainerCallback

    from .. import EvalStopCallback  # transformers: loaded when the demo runs, not when the CLI starts

    rule = " ".join(
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in detector["params"].items() if v is not None
    )
    _say(
        ns,
        f"\n== 2. GRPO against the proxy (no KL), EvalStop {detector['name']} {rule}, "
        f"eval every {ns.eval_steps} steps ==",
    )
    evaluator = env.evaluator()
    cb = EvalStopCallback(
        evaluator,
        eval_steps=ns.eval_steps,
        k=ns.k,
        min_delta=ns.min_delta,
        job_id="demo-grpo",
        job_type="rlhf",
        mode="enforce",
        trace_path=str(out / "trace.jsonl"),
        detector=detector,
        trace_extras=evaluator.trace_extras,
    )
    rows: list[dict[str, Any]] = []

    class _Printer(TrainerCallback):
        # Runs after EvalStopCallback (later in the callback list): prints the eval it just reported.
        def on_step_end(self, args, state, control, **kwargs):
            if (
                cb.history
                and cb.history[-1]["step"] == state.global_step
                and (not rows or rows[-1]["step"] != state.global_step)
            ):
                h = cb.history[-1]
                rows.append(
                    {
                        "step": h["step"],
                        "gold": h["eval_score"],
                        "proxy": evaluator.last_proxy,
                        "declines": h["declines"],
                        "action": h["action"],
                    }
                )
                mark = "  <- best so far" if h["step"] == cb.best_step else ""
                if h["action"] == "stop":
                    mark = "  <- STOP"
                _say(
                    ns,
                    f"step {h['step']:4d}   proxy {evaluator.last_proxy:6.2f}   gold {h['eval_score']:6.2f}   "
                    f"declines {h['declines']}{mark}",
                )
            return control

    t0 = time.perf_counter()
    # Against the learned proxy, no KL penalty: the policy is free to hack it.
    trainer = grpo_trainer(
        env,
        [cb, _Printer()],
        str(out / "checkpoints"),
        steps=ns.steps,
        eval_steps=ns.eval_steps,
        reward=env.proxy,
        kl=0.0,
        seed=ns.seed,
        save=True,
        save_total_limit=1,
    )
    trainer.train()
    train_s = time.perf_counter() - t0
    if cb.stopped_at is None:
        _say(ns, f"EvalStop did not stop the job: it ran all {ns.steps} steps ({train_s:.0f} s)")
    else:
        stop_step = cb.stopped_at
        _say(
            ns,
            f"EvalStop stopped the job at step {stop_step} of {ns.steps} ({train_s:.0f} s); "
            f"{ns.steps - stop_step} steps ({100 * (ns.steps - stop_step) / ns.steps:.0f}% of the job) not run",
        )
    return _Training(cb, trainer, rows, train_s)


def _restored(
    ns: argparse.Namespace, env: OveroptEnv, run: _Training, detector: dict[str, Any], out: Path
) -> tuple[dict[str, Any], bool]:
    """Part 3: re-evaluate the live model (the restored best checkpoint), draw the plot; ``(summary, gold matches)``."""
    cb, rows = run.callback, run.rows
    stop_step, best_step, best_gold = cb.stopped_at, cb.best_step, cb.best_score
    _say(ns, "\n== 3. The restored model ==")
    restored_gold, _, restored_proxy = env.evaluate(run.trainer.model)
    match = best_gold is not None and math.isclose(restored_gold, best_gold, rel_tol=0, abs_tol=1e-9)
    _say(ns, f"best checkpoint: step {best_step} (gold {best_gold:.3f}); restored from {cb.restored_from or '-'}")
    _say(
        ns,
        f"live model after training: gold {restored_gold:.3f}, proxy {restored_proxy:.2f} -> "
        f"{'equals the best gold' if match else 'DIFFERS from the best gold'}",
    )
    plot_path = out / "proxy_vs_gold.png"
    _plot(rows, stop_step, best_step, plot_path)
    _say(ns, f"plot: {plot_path}   trace: {out / 'trace.jsonl'}")
    summary: dict[str, Any] = {
        "stop_step": stop_step,
        "best_step": best_step,
        "best_gold": best_gold,
        "restored_gold": restored_gold,
        "restored_equals_best": bool(match),
        "proxy_at_stop": rows[-1]["proxy"] if rows else None,
        "planned_steps": ns.steps,
        "evals": rows,
        "detector": detector,
        "k": ns.k,
        "min_delta": ns.min_delta,
        "warmup": ns.warmup,
        "train_s": round(run.train_s, 1),
        "proxy_corr_in_distribution": env.proxy_fit["corr_check"],
        "plot": str(plot_path),
        "trace": str(out / "trace.jsonl"),
    }
    return summary, bool(match)


def _platform(ns: argparse.Namespace) -> dict[str, Any]:
    from platform_sim.sim.corpora import corpus_dir
    from platform_sim.sim.report import markdown_table
    from platform_sim.sim.traces import load_traces
    from platform_sim.sim.workload import WorkloadConfig
    from platform_sim.studies.replay import replay
    from platform_sim.studies.replay_report import summary_line
    from platform_sim.studies.trace_detection import corpus_scale

    folder = Path(ns.traces) if ns.traces else corpus_dir("real")
    traces = load_traces(folder)
    scale = corpus_scale(traces)
    # The demo's tolerance is in gold points; the platform's scores are on 0-1 (corpus min..max).
    det = getattr(ns, "detector_spec", None) or {
        "name": "k-decline",
        "params": {"k": ns.k, "min_delta": ns.min_delta / scale.span, "warmup": ns.warmup},
    }
    results = replay(traces, WorkloadConfig(), det, ns.sim_seeds)
    s = results["trace_summary"]
    where = folder if ns.traces else "the shipped corpus (platform_sim/data/corpora/real)"
    _say(
        ns,
        f"{len(traces)} real traces from {where} ({s['hacking']} hacking, {s['healthy']} healthy), "
        f"as the RLHF jobs of a 200-job workload with synthetic LoRA/DPO jobs, {ns.sim_seeds} seeds",
    )
    _say(ns, "per trace: " + summary_line(s))
    _say(ns, "")
    _say(ns, markdown_table(results["main"], with_ci=False))
    main = {
        r["stop"]: {k: r.get(k) for k in ("precision", "recall", "fpr", "jct_gain_pct", "wasted_reduction_pct")}
        for r in results["main"]
    }
    return {"traces": len(traces), "seeds": ns.sim_seeds, "detector": det, "trace_summary": s, "main": main}
