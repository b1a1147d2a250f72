"""``evalstop watch`` reads the watched metric's spread where the log holds it (the sibling series, or
``--std-metric``) with the count ``--n``, and hands it to the core with each evaluation; without both, means only,
said once; a bad spread value never ends the watch."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
from _watch_helpers import last_json, watch

from evalstop_callbacks.client import EmbeddedClient
from evalstop_callbacks.watch import Watcher
from platform_sim.core import Decision, EvidenceMode, Report

MEANS = [0.20, 0.35, 0.46, 0.52, 0.55, 0.50, 0.44, 0.37, 0.30, 0.24, 0.18, 0.12]
LOGGER = "evalstop_callbacks.watch.series"


class Recording(EmbeddedClient):
    """The embedded core, keeping every report it is given (what crossed the boundary)."""

    def __init__(self) -> None:
        super().__init__()
        self.reports: list[Report] = []

    def report(self, report: Report) -> Decision:
        self.reports.append(report)
        return super().report(report)


def _log(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _trl_log(path: Path) -> Path:
    """A JSONL log as TRL's GRPO evaluation writes it: the reward's mean and std at each eval step."""
    rows = [
        {"step": 10 * (i + 1), "eval/rewards/gold/mean": m, "eval/rewards/gold/std": 0.2 + 0.01 * i, "loss": 0.1}
        for i, m in enumerate(MEANS)
    ]
    return _log(path, rows)


def test_the_sibling_std_and_n_reach_the_core_with_every_eval(tmp_path: Path, caplog) -> None:
    client = Recording()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        result = Watcher(
            _trl_log(tmp_path / "log.jsonl"), "eval/rewards/gold/mean", n=64, client=client, warm_up=False
        ).finish()
    assert [(r.eval_std, r.eval_n) for r in client.reports] == [
        (pytest.approx(0.2 + 0.01 * i), 64) for i in range(len(client.reports))
    ]
    assert all(r.mode is EvidenceMode.MEAN_AND_SPREAD for r in client.reports)
    told = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(told) == 1 and "eval/rewards/gold/std, n=64" in told[0] and "mean-and-spread" in told[0]
    # Nothing the watch says at start contradicts it (it once warned "means alone" before the spread was found).
    said = [r.getMessage() for r in caplog.records if r.name.startswith("evalstop_callbacks.watch")]
    assert not any("means alone" in m for m in said)
    mode = EvidenceMode.of_reason(result.reason)
    assert result.evidence == (None if mode is None else mode.value)


def test_lm_eval_stderr_with_n_becomes_a_standard_deviation_and_an_explicit_name_wins(tmp_path: Path) -> None:
    rows = [{"step": s, "acc": 0.5, "acc_stderr": 0.025, "acc_spread": 0.3} for s in (1, 2, 3)]
    log = _log(tmp_path / "lm.jsonl", rows)
    client = Recording()
    Watcher(log, "acc", n=400, client=client, warm_up=False).finish()
    assert [r.eval_std for r in client.reports] == [pytest.approx(0.025 * 20)] * 3
    client = Recording()
    Watcher(log, "acc", n=400, std_metric="acc_spread", client=client, warm_up=False).finish()
    assert [r.eval_std for r in client.reports] == [0.3] * 3


def test_means_only_without_n_or_without_a_spread_said_once(tmp_path: Path, caplog) -> None:
    log = _trl_log(tmp_path / "log.jsonl")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        client = Recording()
        Watcher(log, "eval/rewards/gold/mean", client=client, warm_up=False).finish()
        assert all(r.eval_std is None for r in client.reports)
        other = Recording()
        Watcher(log, "loss", n=10, client=other, warm_up=False).finish()
        assert all(r.eval_std is None for r in other.reports)
    told = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(told) == 2 and "but no --n" in told[0] and "no spread of loss" in told[1]


def test_a_nan_or_negative_spread_leaves_that_eval_on_its_mean(tmp_path: Path, caplog) -> None:
    rows = [{"step": s, "r": 0.5, "r_std": v} for s, v in ((1, 0.1), (2, math.nan), (3, -1.0), (4, 0.2))]
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(row) + "\n" for row in rows))  # json writes NaN, as many loggers do
    client = Recording()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        Watcher(log, "r", n=8, client=client, warm_up=False).finish()
    assert [r.eval_std for r in client.reports] == [0.1, None, None, 0.2]
    assert len([r for r in caplog.records if r.name == LOGGER]) == 1


def test_the_command_takes_std_metric_and_n_and_refuses_a_bad_n(tmp_path: Path) -> None:
    log = _trl_log(tmp_path / "log.jsonl")
    done = watch(str(log), "--metric", "eval/rewards/gold/mean", "--n", "64", "--result", str(tmp_path / "r.json"))
    assert done.returncode in (0, 1), done.stderr  # continue or stop: both are answers
    result = last_json(done.stdout)
    assert "mean-and-spread" in done.stderr and "evidence" in result
    for args, says in (
        (("--n", "1"), "--n must be an integer >= 2"),
        (("--std-metric", "", "--n", "5"), "--std-metric: empty name"),
    ):
        done = watch(str(log), "--metric", "eval/rewards/gold/mean", *args)
        assert done.returncode == 2 and says in done.stderr.strip().splitlines()[-1], done.stderr
