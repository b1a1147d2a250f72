"""A stand-in trainer for the watch tests: writes a shipped real trace's eval curve as a metrics log at training pace.

Per evaluation of the trace it writes a training-metrics line, the checkpoint folder ``checkpoint-<step>`` (with
``--checkpoints``; the oldest removed past ``--keep``, like ``save_total_limit``), verl's validation dump
``<step>.jsonl`` (with ``--examples``: one sample per example, its input ``prompt-<i>`` and its score), then the eval
line, pausing ``--pace`` seconds between lines (``--nan-at STEP``: that eval is NaN, as a broken evaluation logs
it). Formats: ``verl`` (the line verl's ``FileLogger`` writes:
``{"step": N, "data": {...}}``), ``jsonl`` (``{"step": N, name: value}``) and ``tensorboard``
(``torch.utils.tensorboard.SummaryWriter``, flushed per line). It exits 0 at the end of the trace.

Usage: python tests/_watch_child.py TRACE LOG --format verl --metric NAME [--examples DIR] [--checkpoints DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("trace", type=Path)
    parser.add_argument("log", type=Path)
    parser.add_argument("--format", choices=("verl", "jsonl", "tensorboard"), required=True)
    parser.add_argument("--metric", required=True)
    parser.add_argument("--examples", type=Path)
    parser.add_argument("--checkpoints", type=Path)
    parser.add_argument("--checkpoint-every", type=int, default=1, help="a checkpoint at every n-th evaluation")
    parser.add_argument("--keep", type=int, default=0, help="checkpoints kept (0: all)")
    parser.add_argument("--pace", type=float, default=0.02)
    parser.add_argument("--start-after", type=float, default=0.0, help="seconds before the first line")
    parser.add_argument("--nan-at", type=int, action="append", default=[], help="a step whose eval is NaN")
    parser.add_argument("--pid-file", type=Path, help="where this process writes its pid first")
    args = parser.parse_args()
    if args.pid_file is not None:
        args.pid_file.write_text(f"{os.getpid()}\n")

    lines = [json.loads(line) for line in args.trace.read_text().splitlines() if line.strip()]
    evals = [line for line in lines if line.get("kind") == "eval"]
    time.sleep(args.start_after)
    writer = None
    if args.format == "tensorboard":
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(args.log))
    fh = None if writer else open(args.log, "wb", buffering=0)  # as verl's FileLogger opens its file

    def log(step: int, data: dict[str, float]) -> None:
        if writer is not None:
            for key, value in data.items():
                writer.add_scalar(key, value, step)
            writer.flush()
        else:
            assert fh is not None
            record = {"step": step, "data": data} if args.format == "verl" else {"step": step, **data}
            fh.write(json.dumps(record).encode() + b"\n")
        time.sleep(args.pace)

    saved: list[Path] = []
    for index, ev in enumerate(evals):
        step = ev["step"]
        log(step, {"train/loss": float(ev.get("train_loss") or 0.0), "train/lr": 1e-5})
        if args.checkpoints is not None and index % args.checkpoint_every == 0:
            folder = args.checkpoints / f"checkpoint-{step}"
            folder.mkdir(parents=True)
            (folder / "model.safetensors").write_text(f"weights at step {step}\n")
            saved.append(folder)
            while args.keep and len(saved) > args.keep:
                shutil.rmtree(saved.pop(0))
        if args.examples is not None:
            args.examples.mkdir(parents=True, exist_ok=True)
            samples = [
                {"input": f"prompt-{i}", "output": "...", "score": s, "step": step}
                for i, s in enumerate(ev["eval_scores"])
            ]
            (args.examples / f"{step}.jsonl").write_text("\n".join(json.dumps(s) for s in samples) + "\n")
        log(step, {args.metric: float("nan") if step in args.nan_at else float(ev["eval_score"])})
    print(f"child: wrote all {len(evals)} evaluations", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
