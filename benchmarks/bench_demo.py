"""Wall time of `evalstop demo` as a user meets it the first time: empty environment cache, default flags.

Runs the installed ``evalstop`` command in a child process with ``EVALSTOP_CACHE`` pointing at a fresh empty folder
(so the environment is built from scratch: tokenizer, pretraining, proxy fit) and prints the wall time, the child's
CPU time, the load average before and after, and the demo's own summary figures.

    python benchmarks/bench_demo.py [--reps 1] [-- extra demo flags]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--warm", action="store_true", help="reuse one cache across reps (second and later runs warm)")
    ap.add_argument("extra", nargs="*", help="extra flags for evalstop demo")
    ns = ap.parse_args(argv)
    exe = shutil.which("evalstop") or str(Path(sys.executable).with_name("evalstop"))
    shared_cache = tempfile.mkdtemp(prefix="evalstop-bench-cache-")
    for rep in range(ns.reps):
        cache = shared_cache if ns.warm else tempfile.mkdtemp(prefix="evalstop-bench-cache-")
        out = tempfile.mkdtemp(prefix="evalstop-bench-demo-")
        env = dict(os.environ, EVALSTOP_CACHE=cache)
        load0 = os.getloadavg()[0]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run([exe, "demo", "--out", out, "--json", *ns.extra], capture_output=True, text=True, env=env)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            print(f"rep {rep}: exit {proc.returncode}")
            return 1
        s = json.loads(proc.stdout)
        print(
            f"rep {rep}: wall {wall:.1f} s, CPU {cpu:.1f} s, load {load0:.1f} -> {os.getloadavg()[0]:.1f}; "
            f"stop_step {s['stop_step']}, best_step {s['best_step']}, best_gold {s['best_gold']:.3f}, "
            f"restored_gold {s['restored_gold']:.3f}, proxy_at_stop {s['proxy_at_stop']:.2f}, "
            f"train {s['train_s']} s, demo's own wall {s['wall_s']} s"
        )
        shutil.rmtree(out, ignore_errors=True)
        if not ns.warm:
            shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(shared_cache, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
