"""Post hoc, after the choice and the held-out judgement: the real test split under every spending candidate.

The per-run spending of the default (``spend_power`` and ``evidence_run_alpha``) was chosen on tuning data only
(``benchmarks/dense_modes.py`` and ``benchmarks/dense_noisy.py``, docs/results/dense-noisy-modes.md). This script
replays the real corpus's test-split hacking and healthy traces at their normal cadence, with their planned steps,
under each candidate of that sweep, in the three evidence modes. It says which lever the held-out recall answers to;
its figures were not used to choose anything.

    python benchmarks/spend_posthoc.py
"""

from __future__ import annotations

import argparse
import logging

from dense_noisy import hacking_cell, healthy_cell, real_hacking, spec_factory  # this folder is on sys.path

from platform_sim.core.detectors import default_spec

POWERS = (1.0, 1.5, 2.0)
LEVELS = (0.1, 0.2)
MODES: tuple[str | bool, ...] = ("per-example", "mean-and-spread", False)  # False: means only


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    logging.getLogger("platform_sim").setLevel(logging.ERROR)  # the means-only fallback warns once per detector
    hacking, healthy = real_hacking("test"), real_hacking("test", "healthy")
    print("| spend_power, evidence_run_alpha | per-example | mean-and-spread | means only |")
    print("|---|---|---|---|")
    for power in POWERS:
        for level in LEVELS:
            spec = default_spec()
            spec = {**spec, "params": {**spec["params"], "spend_power": power, "evidence_run_alpha": level}}
            make = spec_factory(spec)
            cells = []
            for mode in MODES:
                h, g = hacking_cell(make, hacking, mode), healthy_cell(make, healthy, mode)
                cells.append(f"{h['stopped']}/{h['runs']}, {g['stopped']}/{g['runs']}")
            print(f"| {power:g}, {level:g} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
