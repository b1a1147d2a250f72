"""Per-example scores from verl's validation dump (``trainer.validation_data_dir``).

verl writes one ``<step>.jsonl`` per validation, one line per generated sample with its ``input`` (the prompt),
``output``, ``score`` and ``step``. The detectors that use per-example scores need the same examples in the same order
at every evaluation, so samples are paired across steps by their input: the first dump read fixes the order of the
inputs, every sample's score is averaged per input (verl repeats an input ``val_kwargs.n`` times), and a later dump is
read in that order. A dump that lacks one of those inputs cannot be paired: that evaluation goes on its mean alone,
with a warning.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from .records import WatchError, scalar

logger = logging.getLogger(__name__)


def _key(value: object) -> str:
    """A sample's input as a dict key (verl's inputs are text; anything else is keyed by its JSON)."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


class ExampleDumps:
    """Reads ``<step>.jsonl`` files of one validation dump folder and pairs them by input.

    Args:
        folder: verl's ``trainer.validation_data_dir``.
        negate: Negate every score (``--lower-is-better``).
    """

    def __init__(self, folder: Path, negate: bool = False) -> None:
        if folder.exists() and not folder.is_dir():
            raise WatchError(f"--examples {folder}: not a folder (verl's trainer.validation_data_dir is one)")
        self.folder = folder
        self.negate = negate
        self.order: list[str] | None = None  # the inputs of the first dump, in their first order

    def path(self, step: int) -> Path:
        return self.folder / f"{step}.jsonl"

    def _read(self, step: int) -> dict[str, float] | None:
        """Mean score per input of the dump of ``step``; None while it is absent or still being written."""
        path = self.path(step)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        if not data.endswith(b"\n"):  # verl writes the whole file at once, ending in a newline: not done yet
            return None
        sums: dict[str, list[float]] = {}
        for line_no, raw in enumerate(data.splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                sample = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise WatchError(f"{path}:{line_no}: not a JSON line (verl's validation dump)") from None
            if not isinstance(sample, dict) or "input" not in sample or "score" not in sample:
                raise WatchError(f"{path}:{line_no}: a sample needs 'input' and 'score' (verl's validation dump)")
            score = scalar(sample["score"])
            if score is None:  # a NaN or inf is a number: the non-finite policy takes the evaluation (watcher.py)
                raise WatchError(f"{path}:{line_no}: score {sample['score']!r} is not a number")
            sums.setdefault(_key(sample["input"]), []).append(-score if self.negate else score)
        if not sums:
            raise WatchError(f"{path}: an empty validation dump")
        return {key: sum(v) / len(v) for key, v in sums.items()}

    def ready(self, step: int) -> bool:
        """Whether the dump of ``step`` is there and complete."""
        return self._read(step) is not None

    def scores(self, step: int) -> list[float] | None:
        """The per-example scores of ``step`` in the paired order, or None (absent, or cannot be paired).

        Raises:
            WatchError: The dump is not a verl validation dump (a line without input or score, a bad score).
        """
        means = self._read(step)
        if means is None:
            return None
        if self.order is None:
            self.order = list(means)
            logger.info("evalstop watch: %d examples per evaluation, paired by input across steps", len(self.order))
        missing = [key for key in self.order if key not in means]
        if missing:
            logger.warning(
                "evalstop watch: %s lacks %d of the %d inputs of the first dump: step %d goes on its mean alone",
                self.path(step),
                len(missing),
                len(self.order),
                step,
            )
            return None
        return [means[key] for key in self.order]
