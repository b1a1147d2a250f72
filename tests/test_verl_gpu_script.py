"""The prepared GPU benchmark (benchmarks/verl_gpu_grpo.py) checked on CPU: its model folder, data and reward, and its
hydra overrides composed with verl's shipped config and passed through verl's own ``validate_config``, its
``HFModelConfig`` and its ``RLHFDataset``. The GPU run itself (Ray workers, vLLM rollouts, FSDP updates) is not run here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl.trainer.ppo.v1", reason="needs verl (the .venv-verl environment)")

pytestmark = pytest.mark.verl

REPO = Path(__file__).resolve().parents[1]


def test_the_gpu_scripts_configuration_is_one_verl_accepts(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "verl_gpu_grpo.py"), "--dry-run", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "dry run: verl accepts the configuration; 32 validation prompts" in run.stdout
    assert (tmp_path / "model" / "config.json").exists() and (tmp_path / "model" / "tokenizer.json").exists()
    assert (tmp_path / "train.parquet").exists() and (tmp_path / "val.parquet").exists()
