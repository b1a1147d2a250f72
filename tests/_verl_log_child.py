"""A stand-in verl run for the watch tests: replays a shipped real trace through verl's own logger, at training pace.

Not a test module. Run as ``python tests/_verl_log_child.py TRACE CKPT_DIR VAL_DIR PACE`` with
``VERL_FILE_LOGGER_PATH`` set: every training step it logs training metrics through ``verl.utils.tracking.Tracking``
(the ``file`` backend, i.e. verl's ``FileLogger``), every eval step of the trace also the validation metrics verl
logs (``val-core/<source>/reward/mean@1``) and verl's validation dump (``VAL_DIR/<step>.jsonl``, one line per sample
with its ``input`` and ``score``), and every 20 steps a ``global_step_<N>`` checkpoint folder, keeping the newest two
as verl's ``max_actor_ckpt_to_keep=2`` does. PACE is seconds per eval interval.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _verl_helpers import METRIC, load_curve  # noqa: E402
from verl.utils.tracking import Tracking  # noqa: E402

SAVE_EVERY = 20
KEEP = 2


def main() -> None:
    name, ckpt_dir, val_dir, pace = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4])
    curve = load_curve(name)
    tracking = Tracking(project_name="evalstop-watch", experiment_name=name, default_backend=["file"])
    val_dir.mkdir(parents=True, exist_ok=True)
    saved: list[Path] = []
    for step in range(1, curve.steps[-1] + 1):
        time.sleep(pace / curve.every)
        data: dict[str, float] = {"actor/pg_loss": 0.01 * step, "critic/score/mean": 0.5}
        if step % SAVE_EVERY == 0:
            folder = ckpt_dir / f"global_step_{step}"
            (folder / "actor").mkdir(parents=True)
            (folder / "actor" / "model.pt").write_text(f"weights of step {step}")
            saved.append(folder)
            while len(saved) > KEEP:
                shutil.rmtree(saved.pop(0))
        if step in curve.steps:
            mean, per = curve.at(step)
            lines = [json.dumps({"input": f"held-out prompt {i:03d}", "score": s}) for i, s in enumerate(per)]
            (val_dir / f"{step}.jsonl").write_text("\n".join(lines) + "\n")
            data[METRIC] = mean
        tracking.log(data=data, step=step)
    tracking.finish()


if __name__ == "__main__":
    main()
