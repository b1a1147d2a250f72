"""One keeper of the best checkpoints: the K best by eval score, each out of reach of the framework's rotation.

Every entry point that keeps a best checkpoint (the callback, ``evalstop watch``, the verl adapter) keeps it here, the
same way and under the same name: ``<root>/evalstop-best-<step>``. Frameworks delete their own old checkpoints
(transformers' ``save_total_limit``, verl's ``max_actor_ckpt_to_keep``, OpenRLHF's ``--ckpt.max_num``), and none of
them looks at a folder of that name: transformers rotates ``checkpoint-*`` only, verl ``global_step_*`` (and only the
folders it saved itself in this process), OpenRLHF and NeMo-RL their own step folders. The name is never
``checkpoint-<step>`` on purpose: ``resume_from_checkpoint=True`` picks the newest ``checkpoint-*`` folder, which must
be a full checkpoint.

A protected folder is either written there directly (the callback's weights-only save) or mirrored from the
framework's own folder: every file hard-linked (no copy of the bytes, and the files outlive the framework's delete)
or, where the file system refuses links (another device), copied. A mirror is built beside its place and renamed in,
so a reader never sees half of one, and topped up later when its source gains files (a framework may write a
checkpoint after logging the step's evaluation).

Ranking: by score, higher is better (the core's convention: callers negate a lower-is-better metric first), ties to
the earliest step, as the core picks its best step. Each protected folder holds ``EVALSTOP_BEST.json`` (its step,
score, source and how it was made), so a restarted process adopts the folders it made before (:meth:`adopt`); the
keeper's :meth:`~BestCheckpoints.state_dict` carries the same for a resume that saves state itself.

Deleting: :meth:`~BestCheckpoints.delete` is the one path that removes anything, and it removes only folders named
``evalstop-best-<step>`` under the keeper's root, or, with ``prune_others``, the framework's own checkpoint folders
(:func:`checkpoint_steps`) that are neither kept nor the newest (the one a resume starts from).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

BEST_PREFIX = "evalstop-best"
MARKER = "EVALSTOP_BEST.json"
CHECKPOINT_NAME = re.compile(r"^(?:checkpoint-|global_step_?|best_global_step|step_)(\d+)$")
"""The frameworks' checkpoint folder names (the step is the number): verl's ``global_step_<N>``, transformers' (and
TRL's) ``checkpoint-<N>``, OpenRLHF's ``global_step<N>`` and its ``best_global_step<N>``, NeMo-RL's ``step_<N>``
(never its unfinished ``tmp_step_<N>``)."""
PROTECTED_NAME = re.compile(rf"^{BEST_PREFIX}-(\d+)$")


def checkpoint_steps(folder: str | os.PathLike[str]) -> dict[int, Path]:
    """The framework's checkpoint folders under ``folder`` by step (a ``best_`` folder only where no plain one has the
    step); ``evalstop-best-*`` folders are not among them."""
    found: dict[int, Path] = {}
    try:
        entries = list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return found
    for entry in sorted(entries, key=lambda e: e.name.startswith("best_")):
        match = CHECKPOINT_NAME.match(entry.name)
        if match and entry.is_dir():
            found.setdefault(int(match.group(1)), Path(entry.path))
    return found


def protected_dir(root: str | os.PathLike[str], step: int) -> Path:
    """Where the best checkpoint of ``step`` is kept: ``<root>/evalstop-best-<step>``."""
    return Path(root) / f"{BEST_PREFIX}-{int(step)}"


def link_tree(source: Path, target: Path) -> set[str]:
    """Hard-link (else copy) every file of ``source`` that ``target`` lacks; the methods used (``"hard-linked"``,
    ``"copied"``)."""
    methods: set[str] = set()
    for where, _dirs, files in os.walk(source):
        rel = Path(where).relative_to(source)
        (target / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            src, dst = Path(where) / name, target / rel / name
            if dst.exists() or (rel == Path(".") and name == MARKER):
                continue
            try:
                os.link(src, dst)
                methods.add("hard-linked")
            except FileNotFoundError:  # deleted by the framework between the walk and the link
                continue
            except OSError:  # another file system, or links not allowed there
                shutil.copy2(src, dst)
                methods.add("copied")
    return methods


def method_name(methods: Iterable[str]) -> str:
    """One word for how a mirror was made: ``"hard-linked"``, ``"copied"`` or ``"hard-linked and copied"``."""
    got = set(methods)
    if got == {"copied"}:
        return "copied"
    return "hard-linked and copied" if "copied" in got else "hard-linked"


def _methods_of(method: str) -> set[str]:
    return {"hard-linked", "copied"} if " and " in method else {method}


@dataclass(frozen=True)
class Kept:
    """One protected best checkpoint.

    Args:
        step: The evaluation's step.
        score: Its score in the core's convention (higher is better).
        path: The protected folder, ``<root>/evalstop-best-<step>``.
        source: The framework's folder it mirrors, or None when it was written there directly.
        method: ``"hard-linked"``, ``"copied"``, ``"hard-linked and copied"`` (a mirror) or ``"saved"`` (written
            there).
    """

    step: int
    score: float
    path: str
    source: str | None = None
    method: str = "saved"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Kept:
        return cls(int(data["step"]), float(data["score"]), str(data["path"]), data.get("source"), data["method"])


class BestCheckpoints:
    """The ``keep`` best checkpoints by eval score, protected as ``<root>/evalstop-best-<step>``.

    Args:
        root: Where the protected folders go (transformers' ``output_dir``, verl's ``default_local_dir``, or a
            folder outside a framework that deletes unknown folders in its own, as OpenRLHF does).
        keep: How many to keep (K >= 1). A checkpoint that falls out of the K best loses its protected folder.
        writer: Whether this process touches the disk (False on the other ranks of a distributed run, which keep
            the same book without writing).
        prune_others: Also delete the framework's checkpoint folders under ``checkpoints`` that are neither kept
            nor the newest one (:meth:`prune`).
        checkpoints: The framework's checkpoint folder that ``prune_others`` prunes (default: ``root``).

    Raises:
        ValueError: ``keep`` is not an integer >= 1.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        keep: int = 1,
        *,
        writer: bool = True,
        prune_others: bool = False,
        checkpoints: str | os.PathLike[str] | None = None,
    ) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep_best must be an integer >= 1, got {keep!r}")
        self.root = Path(root)
        self.keep = keep
        self.writer = writer
        self.prune_others = prune_others
        self.checkpoints = Path(checkpoints) if checkpoints is not None else self.root
        self.kept: list[Kept] = []  # best first
        self.pruned: list[str] = []  # every folder deleted, in order

    # ---- ranking ----

    @staticmethod
    def _rank(step: int, score: float) -> tuple[float, int]:
        return (-score, step)  # higher score first, the earliest step on ties

    def ranks(self, step: int, score: float) -> bool:
        """Whether an evaluation of ``score`` at ``step`` would be among the K best (or already is)."""
        if any(k.step == step for k in self.kept):
            return True
        if len(self.kept) < self.keep:
            return True
        return self._rank(step, score) < self._rank(self.kept[-1].step, self.kept[-1].score)

    @property
    def best(self) -> Kept | None:
        """The best kept checkpoint, or None."""
        return self.kept[0] if self.kept else None

    def get(self, step: int) -> Kept | None:
        """The kept checkpoint of ``step``, or None."""
        return next((k for k in self.kept if k.step == step), None)

    # ---- adding ----

    def protect(self, step: int, score: float, source: str | os.PathLike[str]) -> Kept | None:
        """Mirror the framework's folder ``source`` of ``step`` into ``<root>/evalstop-best-<step>`` if it ranks.

        A step already kept is topped up with the files ``source`` gained since (no new ranking).

        Returns:
            The kept entry, or None when the step does not rank among the K best (or ``source`` is gone).
        """
        source = Path(source)
        held = self.get(step)
        target = protected_dir(self.root, step)
        if held is not None:
            if self.writer and source.is_dir() and target.is_dir():
                methods = link_tree(source, target)
                merged = method_name(methods | _methods_of(held.method)) if methods else held.method
                if merged != held.method:
                    held = self._replace(replace(held, method=merged))
            return held
        if not self.ranks(step, score):
            if self.prune_others:
                self.prune()  # a newer checkpoint appeared: the older unkept ones may go now
            return None
        if self.writer and not source.is_dir():
            logger.warning(
                "evalstop: the checkpoint %s of step %d is not there (rotated away?); not kept", source, step
            )
            return None
        method = "hard-linked"
        if self.writer:
            self.root.mkdir(parents=True, exist_ok=True)
            staging = target.with_name(f".{target.name}.staging")
            shutil.rmtree(staging, ignore_errors=True)
            method = method_name(link_tree(source, staging))
            kept = Kept(step, float(score), str(target), str(source), method)
            self._write_marker(staging, kept)
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)
            logger.info("evalstop: best checkpoint of step %d %s from %s into %s", step, method, source, target)
        return self._insert(Kept(step, float(score), str(target), str(source), method))

    def add(self, step: int, score: float, path: str | os.PathLike[str] | None = None) -> Kept | None:
        """Take a folder already written at ``<root>/evalstop-best-<step>`` (or ``path``) as a kept checkpoint.

        Returns:
            The kept entry, or None when the step does not rank (the folder is then deleted, as any that falls out).
        """
        folder = Path(path) if path is not None else protected_dir(self.root, step)
        if self.get(step) is not None:
            return self.get(step)
        kept = Kept(step, float(score), str(folder), None, "saved")
        if not self.ranks(step, score):
            self.delete(kept)
            return None
        if self.writer and folder.is_dir():
            self._write_marker(folder, kept)
        return self._insert(kept)

    def _replace(self, kept: Kept) -> Kept:
        self.kept = [kept if k.step == kept.step else k for k in self.kept]
        if self.writer:
            self._write_marker(Path(kept.path), kept)
        return kept

    def _insert(self, kept: Kept) -> Kept:
        self.kept.append(kept)
        self.kept.sort(key=lambda k: self._rank(k.step, k.score))
        for dropped in self.kept[self.keep :]:
            self.delete(dropped)
        self.kept = self.kept[: self.keep]
        if self.prune_others:
            self.prune()
        return kept

    def _write_marker(self, folder: Path, kept: Kept) -> None:
        """Write ``EVALSTOP_BEST.json``; its paths absolute, so that the file says where the weights are whatever
        folder it is read from (a run started with a relative ``output_dir`` would name them relative to its own)."""
        data = kept.to_dict()
        data["path"] = os.path.abspath(kept.path)
        data["source"] = None if kept.source is None else os.path.abspath(kept.source)
        tmp = folder / f".{MARKER}.tmp"
        tmp.write_text(json.dumps(data) + "\n")
        os.replace(tmp, folder / MARKER)

    # ---- deleting ----

    def delete(self, item: Kept | str | os.PathLike[str]) -> bool:
        """Delete a protected folder (a :class:`Kept` or its path): the one path by which anything is deleted.

        Only ``evalstop-best-<step>`` folders under the keeper's root, and (from :meth:`prune`) the framework's own
        checkpoint folders under ``checkpoints``, are ever removed; anything else is refused with a warning.

        Returns:
            Whether a folder was removed.
        """
        path = Path(item.path if isinstance(item, Kept) else item)
        self.kept = [k for k in self.kept if Path(k.path) != path]
        ours = PROTECTED_NAME.match(path.name) and path.parent.resolve() == self.root.resolve()
        theirs = CHECKPOINT_NAME.match(path.name) and path.parent.resolve() == self.checkpoints.resolve()
        if not (ours or theirs):
            logger.warning("evalstop: refused to delete %s (not a checkpoint folder EvalStop may delete)", path)
            return False
        if not self.writer or not path.is_dir():
            return False
        shutil.rmtree(path, ignore_errors=True)
        self.pruned.append(str(path))
        logger.info("evalstop: deleted %s (not among the %d best)", path, self.keep)
        return True

    def prune(self) -> list[str]:
        """Delete the framework's checkpoint folders that are not kept and not the newest one (a resume's start).

        Returns:
            The folders deleted by this call.
        """
        steps = checkpoint_steps(self.checkpoints)
        if not steps:
            return []
        newest = max(steps)
        sources = {Path(k.source).resolve() for k in self.kept if k.source}
        kept_steps = {k.step for k in self.kept}
        gone = []
        for step, folder in sorted(steps.items()):
            if step == newest or step in kept_steps or folder.resolve() in sources:
                continue
            if self.delete(folder):
                gone.append(str(folder))
        return gone

    # ---- resume ----

    def adopt(self) -> list[Kept]:
        """Take over the ``evalstop-best-<step>`` folders a previous process left under the root (their markers
        name step and score), ranked as if offered now; folders beyond the K best are deleted.

        Returns:
            The kept entries after adopting.
        """
        try:
            entries = sorted(os.scandir(self.root), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            return list(self.kept)
        for entry in entries:
            match = PROTECTED_NAME.match(entry.name)
            if not match or not entry.is_dir() or self.get(int(match.group(1))) is not None:
                continue
            try:
                held = Kept.from_dict(json.loads(Path(entry.path, MARKER).read_text()))
            except (OSError, ValueError, KeyError, TypeError):
                logger.warning("evalstop: %s has no readable %s; left alone", entry.path, MARKER)
                continue
            held = Kept(int(match.group(1)), held.score, entry.path, held.source, held.method)
            if self.ranks(held.step, held.score):
                self._insert(held)
            else:
                self.delete(held)
        return list(self.kept)

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON data: the keeper's K and its kept checkpoints."""
        return {"keep": self.keep, "kept": [k.to_dict() for k in self.kept], "pruned": list(self.pruned)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue a saved keeper; entries whose folder is gone are dropped with a warning."""
        kept = []
        for raw in state.get("kept") or []:
            item = Kept.from_dict(raw)
            if self.writer and not Path(item.path).is_dir():
                logger.warning("evalstop: the kept checkpoint %s of step %d is gone", item.path, item.step)
                continue
            kept.append(item)
        self.kept = sorted(kept, key=lambda k: self._rank(k.step, k.score))[: self.keep]
        self.pruned = list(state.get("pruned") or [])

    def listing(self) -> list[dict[str, Any]]:
        """The kept checkpoints for a result file: ``[{"step", "score", "path", "source", "method"}]``, best first."""
        return [k.to_dict() for k in self.kept]
