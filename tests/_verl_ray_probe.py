"""A stand-in for verl's ``TaskRunnerV1`` for the tests: in verl's Ray worker, looks the trainer class up the way
``TaskRunnerV1.run`` does and writes its name into ``trainer.default_local_dir/trainer.txt``. Not a test module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray


@ray.remote
class TrainerLookup:
    def run(self, config: Any) -> None:
        from verl.trainer.ppo.v1 import get_trainer_cls

        cls = get_trainer_cls(config.trainer.v1.trainer_mode)
        folder = Path(config.trainer.default_local_dir)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "trainer.txt").write_text(f"{cls.__module__}.{cls.__name__}")
