"""Two processes (torchrun, gloo on CPU): the stop and the best step are the same on every rank, and the run exits 0.

Only rank 0 evaluates and reports; the decision reaches rank 1 through a broadcast at the same step. Without it the
ranks would stop at different steps and the run would crash in mismatched collectives. An evaluation error on rank 0
is broadcast the same way and raised on both ranks.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from _callback_helpers import policy, tokenizer

from evalstop_callbacks import read_trace


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_stop_at_the_same_step(tmp_path):
    model_dir = tmp_path / "model"
    policy().save_pretrained(model_dir)
    tokenizer().save_pretrained(model_dir)
    script = Path(__file__).with_name("_callback_ddp_script.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), str(script), str(model_dir), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r0, r1 = (json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1))
    assert r0["world_size"] == r1["world_size"] == 2
    assert r0["stopped_at"] is not None and r0["stopped_at"] < 16
    for key in ("stopped_at", "global_step", "best_step", "best_score", "history", "restored_from"):
        assert r0[key] == r1[key], key
    assert r0["global_step"] == r0["stopped_at"]
    assert r0["probe"] == r1["probe"]  # both ranks restored the same (best) weights
    assert (r0["evaluated"], r1["evaluated"]) == (len(r0["history"]), 0)  # evaluation on the main process only
    # an evaluation error on rank 0 reaches every rank at the same step: both raise, neither hangs
    assert "non-finite eval score nan at step 2" in r0["broken_error"], r0["broken_error"]
    assert "EvalStop evaluation failed on the main process at step 2" in r1["broken_error"], r1["broken_error"]
    assert r0["broken_step"] == r1["broken_step"] == 2
    trace = read_trace(tmp_path / "trace.jsonl")  # written once, by rank 0
    assert trace[0]["world_size"] == 2 and trace[-1]["stopped_at"] == r0["stopped_at"]
