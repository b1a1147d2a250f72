"""The best step's checkpoint folder: found by the frameworks' names, and kept out of their rotation.

Names read (the step is the number): verl's ``global_step_<N>``, transformers' (and TRL's) ``checkpoint-<N>``,
OpenRLHF's ``global_step<N>`` and its ``best_global_step<N>``, NeMo-RL's ``step_<N>`` (never its unfinished
``tmp_step_<N>``). Frameworks delete old checkpoints (transformers'
``save_total_limit``, verl's ``max_actor_ckpt_to_keep``, OpenRLHF's ``--ckpt.max_num``), so the best one is mirrored
into an ``evalstop-best`` folder: every file hard-linked (no copy of the bytes, and the files outlive the framework's
delete) or, where the file system refuses links (another device), copied. The mirror is rebuilt when the best step
moves and topped up when its checkpoint gains files (a framework may write it after logging the evaluation).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

CHECKPOINT_NAME = re.compile(r"^(?:checkpoint-|global_step_?|best_global_step|step_)(\d+)$")
MARKER = "EVALSTOP_BEST.json"  # written into the mirror: which step and folder it holds


def checkpoint_steps(folder: Path) -> dict[int, Path]:
    """Checkpoint folders under ``folder`` by step (a ``best_`` folder only where no plain one has the step)."""
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


@dataclass(frozen=True)
class Protected:
    """Where the best step's checkpoint stands.

    Args:
        checkpoint: The framework's folder of the best step, or None if that step has none.
        mirror: The ``evalstop-best`` folder holding a protected copy, or None (nothing to protect yet).
        method: ``"hard-linked"``, ``"copied"`` or ``"hard-linked and copied"``; None without a mirror.
        note: A sentence for the result when the best step has no checkpoint (names the nearest one before it).
        source: The folder mirrored (the best step's, else the nearest before it).
    """

    checkpoint: Path | None
    mirror: Path | None
    method: str | None
    note: str | None
    source: Path | None


def _mirror_tree(source: Path, target: Path) -> set[str]:
    """Hard-link (else copy) every file of ``source`` missing from ``target``; the methods used."""
    methods: set[str] = set()
    for root, _dirs, files in os.walk(source):
        rel = Path(root).relative_to(source)
        (target / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            src, dst = Path(root) / name, target / rel / name
            if dst.exists():
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


def _method(methods: set[str]) -> str:
    if methods == {"copied"}:
        return "copied"
    return "hard-linked and copied" if "copied" in methods else "hard-linked"


class CheckpointKeeper:
    """Finds the best step's checkpoint and keeps a protected mirror of it.

    Args:
        folder: The framework's checkpoint folder (verl ``trainer.default_local_dir``, transformers ``output_dir``,
            OpenRLHF ``<ckpt.path>/_actor``).
        mirror: The protected folder (default ``<folder>/evalstop-best``; OpenRLHF deletes any folder in its
            checkpoint folder past ``--ckpt.max_num``, so give it one outside).
    """

    def __init__(self, folder: Path, mirror: Path | None = None) -> None:
        self.folder = folder
        self.mirror = mirror if mirror is not None else folder / "evalstop-best"
        self._source: Path | None = None  # the folder mirrored, and its step
        self._step: int | None = None
        self._methods: set[str] = set()
        try:  # a restarted watcher takes over the mirror it made before (its source may be rotated away by now)
            held = json.loads((self.mirror / MARKER).read_text())
            self._source, self._step, self._methods = Path(held["checkpoint"]), int(held["step"]), {held["method"]}
        except (OSError, ValueError, KeyError, TypeError):
            pass

    def _swap_in(self, source: Path, step: int) -> None:
        """Build a new mirror of ``source`` beside the old one, then replace it."""
        staging = self.mirror.with_name(self.mirror.name + ".staging")
        shutil.rmtree(staging, ignore_errors=True)
        self._methods = _mirror_tree(source, staging)
        marker = {"step": step, "checkpoint": str(source), "method": _method(self._methods)}
        (staging / MARKER).write_text(json.dumps(marker) + "\n")
        old = self.mirror.with_name(self.mirror.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if self.mirror.exists():
            self.mirror.rename(old)
        staging.rename(self.mirror)
        shutil.rmtree(old, ignore_errors=True)
        self._source = source
        logger.info("evalstop watch: checkpoint %s %s into %s", source, _method(self._methods), self.mirror)

    def update(self, best_step: int | None) -> Protected:
        """Mirror the checkpoint of ``best_step`` (else the nearest one before it) unless the mirror holds it."""
        if best_step is None:
            return Protected(None, None, None, None, None)
        steps = checkpoint_steps(self.folder)
        if best_step not in steps and self._step == best_step and self._source is not None:
            # Mirrored while it existed, deleted by the framework's rotation since: the mirror is all that is left.
            gone = f"{self._source} was removed by the framework since; {self.mirror} holds it"
            return Protected(self._source, self.mirror, _method(self._methods), gone, self._source)
        before = [s for s in steps if s < best_step]
        source_step = best_step if best_step in steps else (max(before) if before else None)
        if source_step is None or (self._step is not None and self._step < best_step and self._step > source_step):
            source_step = self._step  # the mirror holds a later one before the best step than what is left
        exact = source_step == best_step
        source = None if source_step is None else steps.get(source_step, self._source)
        note: str | None = None
        if not exact:
            nearest = "there is none before it" if source is None else f"the nearest one before it is {source}"
            note = f"step {best_step} has no checkpoint in {self.folder}; {nearest}"
        if source_step is None or source is None:
            return Protected(None, None, None, note, None)
        if source_step != self._step:
            self._swap_in(source, source_step)
            self._step = source_step
        elif source.exists():  # the framework may still be writing it: add what is new
            self._methods |= _mirror_tree(source, self.mirror)
        return Protected(source if exact else None, self.mirror, _method(self._methods), note, source)
