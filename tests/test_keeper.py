"""The one keeper of the best checkpoints (evalstop_callbacks.keeper.BestCheckpoints), on real folders: ranking and
ties, the one delete path, pruning the framework's folders, resuming from its state or from the folders it left."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalstop_callbacks.keeper import MARKER, BestCheckpoints, checkpoint_steps


def _checkpoints(root: Path, steps: list[int], name: str = "global_step_{}") -> dict[int, Path]:
    out = {}
    for step in steps:
        folder = root / name.format(step)
        (folder / "actor").mkdir(parents=True)
        (folder / "actor" / "model.pt").write_text(f"weights {step}")
        out[step] = folder
    return out


def _protected(root: Path) -> list[int]:
    return sorted(int(p.name.rsplit("-", 1)[1]) for p in root.glob("evalstop-best-*"))


def test_the_k_best_are_kept_ties_to_the_earliest_and_the_rest_lose_their_copy(tmp_path: Path) -> None:
    scores = {10: 0.1, 20: 0.5, 30: 0.5, 40: 0.3, 50: 0.9, 60: 0.2}
    folders = _checkpoints(tmp_path, list(scores))
    keeper = BestCheckpoints(tmp_path, keep=3)
    for step, score in scores.items():
        keeper.protect(step, score, folders[step])
    assert [k.step for k in keeper.kept] == [50, 20, 30]  # 0.5 twice: the earlier step ranks first
    assert _protected(tmp_path) == [20, 30, 50]
    assert keeper.pruned == [str(tmp_path / f"evalstop-best-{s}") for s in (10, 40)]
    assert keeper.ranks(70, 0.6) and not keeper.ranks(70, 0.5)  # a tie with the last kept loses to the earlier step
    assert keeper.protect(70, 0.5, folders[60]) is None
    assert sorted(checkpoint_steps(tmp_path)) == list(scores)  # the framework's folders are not touched
    marker = json.loads((tmp_path / "evalstop-best-50" / MARKER).read_text())
    assert (marker["step"], marker["score"], marker["source"]) == (50, 0.9, str(folders[50]))


def test_a_mirror_is_topped_up_when_its_checkpoint_gains_files(tmp_path: Path) -> None:
    folders = _checkpoints(tmp_path, [10])
    keeper = BestCheckpoints(tmp_path)
    keeper.protect(10, 1.0, folders[10])
    (folders[10] / "data.pt").write_text("written after the evaluation was logged")
    keeper.protect(10, 1.0, folders[10])
    assert (tmp_path / "evalstop-best-10" / "data.pt").read_text() == "written after the evaluation was logged"


def test_prune_others_deletes_the_frameworks_folders_but_the_kept_and_the_newest(tmp_path: Path) -> None:
    keeper = BestCheckpoints(tmp_path, keep=1, prune_others=True)
    for step, score in ((10, 0.2), (20, 0.8), (30, 0.4), (40, 0.1)):
        folder = _checkpoints(tmp_path, [step], name="checkpoint-{}")[step]  # saved as training goes
        keeper.protect(step, score, folder)
        assert step in checkpoint_steps(tmp_path)  # the newest is never pruned
    assert sorted(checkpoint_steps(tmp_path)) == [20, 40]  # the best one's and the newest
    assert _protected(tmp_path) == [20]


def test_the_delete_path_refuses_anything_but_its_own_folders(tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()
    keeper = BestCheckpoints(tmp_path)
    assert not keeper.delete(tmp_path / "notes") and (tmp_path / "notes").is_dir()
    assert not keeper.delete(tmp_path / "other" / "evalstop-best-3")  # not under the root


def test_a_restarted_keeper_adopts_its_folders_and_a_saved_state_resumes(tmp_path: Path) -> None:
    folders = _checkpoints(tmp_path, [10, 20, 30])
    first = BestCheckpoints(tmp_path, keep=2)
    for step, score in ((10, 0.3), (20, 0.6), (30, 0.5)):
        first.protect(step, score, folders[step])
    (tmp_path / "evalstop-best-99").mkdir()  # someone else's folder, no marker: left alone
    adopted = BestCheckpoints(tmp_path, keep=2)
    assert [(k.step, k.score) for k in adopted.adopt()] == [(20, 0.6), (30, 0.5)]
    assert (tmp_path / "evalstop-best-99").is_dir()
    smaller = BestCheckpoints(tmp_path, keep=1)
    assert [k.step for k in smaller.adopt()] == [20] and _protected(tmp_path) == [20, 99]
    resumed = BestCheckpoints(tmp_path, keep=2)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert [k.step for k in resumed.kept] == [20]  # step 30's folder went with keep=1 above: dropped, said so


def test_bad_k_is_one_line() -> None:
    with pytest.raises(ValueError, match="keep_best must be an integer >= 1, got 0"):
        BestCheckpoints("unused", keep=0)


def test_the_marker_names_absolute_paths_for_a_relative_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    folders = _checkpoints(Path("out"), [10])  # a run started with output_dir: out
    BestCheckpoints("out").protect(10, 1.0, folders[10])
    marker = json.loads((tmp_path / "out" / "evalstop-best-10" / MARKER).read_text())
    assert marker["path"] == str(tmp_path / "out" / "evalstop-best-10")
    assert marker["source"] == str(tmp_path / "out" / "global_step_10")
