"""Write ``detector_states.json``: detector states and decisions as written by the code of the day (run from the repo).

The fixture pins the state format: ``tests/test_detectors_states.py`` loads the states recorded here into today's
detectors and checks that they continue with the recorded decisions. Re-running this script with a later version of
the code must give the same file (that is what the test checks); it is kept to show how the file was made.

Usage: ``python tests/data/make_detector_states.py`` (writes next to this file).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from platform_sim.core import detector_from_spec

SPECS: list[dict] = [
    {"name": "k-decline", "params": {}},
    {"name": "k-decline", "params": {"k": 1, "min_delta": 0.01, "warmup": 3}},
    {"name": "k-decline-se", "params": {}},
    {"name": "k-decline-se", "params": {"k": 2, "z": 2.0, "warmup": 2, "se": 0.05}},
    {"name": "paired-test", "params": {}},
    {"name": "paired-test", "params": {"test": "sign", "alpha": 0.05}},
    {"name": "paired-test", "params": {"test": "t", "alpha": 0.05, "warmup": 2}},
    {"name": "cusum", "params": {}},
    {"name": "cusum", "params": {"slack": 0.0, "threshold": 2.0, "warmup": 3, "se": 0.03}},
    {"name": "trend", "params": {}},
    {"name": "trend", "params": {"window": 6, "short_window": 3, "alpha": 0.3, "level_alpha": 0.2, "warmup": 2}},
    {"name": "trend", "params": {"window": 5, "test": "wilcoxon", "se": 0.02}},
    {"name": "shape", "params": {}},
    {"name": "shape", "params": {"threshold": 0.7, "future": 1.5, "min_tau": 2.0}},
    {"name": "shape", "params": {"k": 2, "warmup": 3, "se": 0.02}},
]
#: Evals after which the state is recorded (0-based index of the last eval fed).
SPLITS = (2, 5, 9)


def curves() -> dict[str, list[dict]]:
    """Two eval streams: a rise then a fall with per-example scores, and a noisy plateau with means only."""
    rng = np.random.default_rng(13)
    peak = [0.1, 0.25, 0.38, 0.48, 0.55, 0.6, 0.62, 0.63, 0.6, 0.55, 0.5, 0.44, 0.38, 0.32]
    difficulty = rng.normal(0.0, 0.2, 8)
    hack = []
    for i, m in enumerate(peak):
        scores = [round(float(v), 6) for v in m + difficulty + rng.normal(0.0, 0.02, difficulty.size)]
        hack.append({"step": 10 * (i + 1), "score": float(np.mean(scores)), "scores": scores})
    plateau = [
        {"step": 5 * i, "score": round(0.5 + float(rng.normal(0.0, 0.03)), 6), "scores": None} for i in range(12)
    ]
    return {"hack-per-example": hack, "plateau-means": plateau}


def record() -> dict:
    out: dict = {"splits": list(SPLITS), "curves": curves(), "runs": []}
    for spec in SPECS:
        for curve, evals in out["curves"].items():
            det = detector_from_spec(spec)
            outcomes, states = [], {}
            for i, ev in enumerate(evals):
                stop = det.update(ev["step"], ev["score"], ev["scores"])
                outcomes.append({"stop": stop, "declines": det.declines, "reason": det.reason() if stop else None})
                if i in SPLITS or i == len(evals) - 1:
                    states[str(i)] = det.state_dict()
            out["runs"].append({"spec": det.spec(), "curve": curve, "outcomes": outcomes, "states": states})
    return out


if __name__ == "__main__":
    logging.basicConfig(level=logging.ERROR)
    path = Path(__file__).with_name("detector_states.json")
    data = record()
    runs = ",\n".join(json.dumps(run, sort_keys=True) for run in data.pop("runs"))  # one run per line: small diffs
    path.write_text(json.dumps(data, sort_keys=True)[:-1] + ', "runs": [\n' + runs + "\n]}\n")
    print(f"wrote {path}")
