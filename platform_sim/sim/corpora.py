"""The recorded trace corpora by name: one manifest (``platform_sim/data/corpora/manifest.json``), one loader.

Every corpus is a folder ``platform_sim/data/corpora/<name>/`` of trace files (one run each); the manifest says per
corpus its environments with their split and eval interval, the per-example scores of an eval, what it was recorded
for and the commands that recorded it. ``real`` (the corpus the demo and every study read by default) ships in the
wheel; the research corpora (``dense``, ``dense-more``, ``dense-x8``, ...) are in the repository for the studies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from .traces import RealTrace, load_traces

__all__ = ["DEFAULT_CORPUS", "Corpus", "corpora", "corpus", "corpus_dir", "load_corpus"]

DEFAULT_CORPUS = "real"
"""The corpus a study reads when given no ``--traces`` folder nor ``--corpus`` name."""


@dataclass(frozen=True)
class Corpus:
    """One corpus as the manifest describes it.

    Attributes:
        name: Its name (``real``, ``dense``, ...).
        folder: Its folder under ``platform_sim/data/corpora``.
        traces: How many trace files it holds.
        environments: Per environment: ``split``, ``traces`` and ``eval_every_steps`` (the eval intervals in steps).
        eval_samples: Per-example scores in each eval line.
        in_wheel: Whether it ships in the wheel.
        recorded_for: What it was recorded for.
        recorded_with: The commands that recorded it.
    """

    name: str
    folder: str
    traces: int
    environments: dict[str, dict[str, Any]]
    eval_samples: int
    in_wheel: bool
    recorded_for: str
    recorded_with: tuple[str, ...]


def _root() -> Path:
    return Path(str(resources.files("platform_sim") / "data" / "corpora"))


def corpora() -> dict[str, Corpus]:
    """Every corpus of the manifest, by name, in manifest order."""
    data = json.loads((_root() / "manifest.json").read_text(encoding="utf-8"))
    return {
        c["name"]: Corpus(
            name=c["name"],
            folder=c["folder"],
            traces=c["traces"],
            environments=c["environments"],
            eval_samples=c["eval_samples"],
            in_wheel=c["in_wheel"],
            recorded_for=c["recorded_for"],
            recorded_with=tuple(c["recorded_with"]),
        )
        for c in data["corpora"]
    }


def corpus(name: str) -> Corpus:
    """The manifest's entry of corpus ``name``.

    Raises:
        ValueError: No corpus of that name (the message lists the names).
    """
    known = corpora()
    if name not in known:
        raise ValueError(f"unknown corpus {name!r}; choose one of {', '.join(known)}")
    return known[name]


def corpus_dir(name: str = DEFAULT_CORPUS) -> Path:
    """The folder of corpus ``name``.

    Raises:
        ValueError: No corpus of that name.
        FileNotFoundError: A research corpus not installed (they are in the repository, not in the wheel).
    """
    entry = corpus(name)
    folder = _root() / entry.folder
    if not folder.is_dir():
        raise FileNotFoundError(
            f"corpus {name!r} is not installed at {folder} (only {DEFAULT_CORPUS!r} ships in the wheel; the research "
            "corpora are in the repository)"
        )
    return folder


def load_corpus(name: str = DEFAULT_CORPUS) -> list[RealTrace]:
    """Every trace of corpus ``name``, read and validated (:func:`~platform_sim.sim.traces.load_traces`).

    Raises:
        ValueError, FileNotFoundError: As :func:`corpus_dir`.
        TraceError: A bad trace (file and line named).
    """
    return load_traces(corpus_dir(name))
