"""The three log formats ``evalstop watch`` reads, and telling them apart.

- ``verl``: verl's file logger (``VERL_FILE_LOGGER_PATH``): one ``{"step": N, "data": {name: value, ...}}`` per line.
- ``jsonl``: plain JSON lines, ``{"step": N, name: value, ...}``; nested objects are named with ``/``
  (``{"eval": {"reward": 1}}`` is the series ``eval/reward``).
- ``tensorboard``: TensorBoard event files (``events.out.tfevents.*``), read with the ``tensorboard`` package's own
  event file loader (the ``watch`` extra), never with a hand-written protobuf parser. A folder is searched for event
  files at every poll, so runs that start later and writers that open a new file after a restart are followed.

Every source has ``poll() -> list[Point]`` (what is new), ``finish() -> list[Point]`` (what is left once the writer is
done: an unterminated last line) and ``kind`` (the format it reads).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from .follow import LineTail
from .records import Point, WatchError, integral_step, scalar

logger = logging.getLogger(__name__)

EVENT_FILE_MARK = "tfevents"  # every TensorBoard writer names its files events.out.tfevents.<time>.<host>...


class Source(Protocol):
    """A followed log."""

    kind: str

    def poll(self) -> list[Point]:
        """Points written since the last poll."""

    def finish(self) -> list[Point]:
        """Points left once the writer is done (a last line without its newline)."""

    def close(self) -> None:
        """Release open files."""


def _flatten(data: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _flatten(value, f"{name}/")
        else:
            yield name, value


def jsonl_kind(obj: object) -> str | None:
    """``"verl"`` or ``"jsonl"`` for a parsed first line, None if it is neither (no integral ``step``)."""
    if not isinstance(obj, dict) or integral_step(obj.get("step")) is None:
        return None
    if set(obj) == {"step", "data"} and isinstance(obj["data"], dict):
        return "verl"
    return "jsonl"


class JsonlSource:
    """A verl file-logger log or a plain JSONL log, followed line by line.

    Args:
        path: The log file.
        kind: ``"verl"`` or ``"jsonl"``.
    """

    def __init__(self, path: Path, kind: str) -> None:
        if kind not in ("verl", "jsonl"):
            raise ValueError(f"kind must be verl or jsonl, got {kind!r}")
        self.kind = kind
        self.path = path
        self._tail = LineTail(path)
        self._line_no = 0
        self._restarts = 0

    def _points(self, raw: bytes) -> list[Point]:
        self._line_no += 1
        if not raw.strip():
            return []
        where = f"{self.path}:{self._line_no}"
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            if self._line_no == 1:
                raise WatchError(f"{where}: not a JSON line ({exc.msg if hasattr(exc, 'msg') else exc})") from None
            logger.warning("evalstop watch: %s: not a JSON line, skipped", where)
            return []
        step = integral_step(obj.get("step")) if isinstance(obj, dict) else None
        if step is None:
            logger.warning("evalstop watch: %s: no integral step >= 0, line skipped", where)
            return []
        if self.kind == "verl":
            data = obj.get("data")
            if not isinstance(data, dict):
                logger.warning("evalstop watch: %s: no 'data' object (verl format), line skipped", where)
                return []
        else:
            data = {k: v for k, v in obj.items() if k != "step"}
        points = []
        for name, value in _flatten(data):
            number = scalar(value)
            if number is not None:
                points.append(Point(name, step, number))
        return points

    def poll(self) -> list[Point]:
        lines = self._tail.read_lines()
        if self._tail.restarts != self._restarts:  # rotated or rewritten: line numbers start again
            self._restarts = self._tail.restarts
            self._line_no = 0
        return [p for raw in lines for p in self._points(raw)]

    def finish(self) -> list[Point]:
        points = self.poll()
        rest = self._tail.rest()
        if rest.strip():
            try:
                json.loads(rest)
            except (json.JSONDecodeError, UnicodeDecodeError):  # really half-written: the writer died mid-line
                logger.warning("evalstop watch: %s ends in a half-written line, ignored", self.path)
                return points
            points += self._points(rest)
        return points

    def close(self) -> None:
        self._tail.close()


def event_files(path: Path) -> list[Path]:
    """TensorBoard event files at ``path`` (a file, or a folder searched recursively), sorted by folder then name
    (the name starts with the creation time, so a writer's later files come later)."""
    if path.is_file():
        return [path]
    found = []
    for root, _dirs, files in os.walk(path):
        for name in files:
            if EVENT_FILE_MARK in name and not name.endswith(".evalstop.json"):
                found.append(Path(root) / name)
    return sorted(found, key=lambda p: (str(p.parent), p.name))


class TensorBoardSource:
    """TensorBoard event files under a folder (or one event file), read with ``tensorboard``'s event file loader.

    Series are named by tag; a tag of an event file in a sub-folder is also named ``<sub-folder>/<tag>`` so that two
    runs under one folder are two series (the metric glob matches either name).

    Args:
        path: An event file or a folder holding event files (at any depth).

    Raises:
        WatchError: The ``tensorboard`` package is not installed.
    """

    kind = "tensorboard"

    def __init__(self, path: Path) -> None:
        try:
            from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
            from tensorboard.util import tensor_util
        except ImportError:
            raise WatchError(
                "reading TensorBoard event files needs the tensorboard package: pip install 'evalstop[watch]'"
            ) from None
        self._loader_cls = EventFileLoader
        self._make_ndarray = tensor_util.make_ndarray
        self.path = path
        self._loaders: dict[Path, Any] = {}
        self._sizes: dict[Path, tuple[int, int]] = {}

    def _point(self, file: Path, tag: str, step: int, value: float) -> Point:
        rel = "." if self.path.is_file() else file.parent.relative_to(self.path).as_posix()
        if rel == ".":
            return Point(tag, step, value)
        return Point(f"{rel}/{tag}", step, value, alias=tag)

    def _value(self, value: Any) -> float | None:
        if value.HasField("simple_value"):
            return scalar(value.simple_value)
        if value.HasField("tensor") and value.metadata.plugin_data.plugin_name == "scalars":
            array = self._make_ndarray(value.tensor)
            return scalar(array.item()) if array.size == 1 else None
        return None

    def poll(self) -> list[Point]:
        points = []
        for file in event_files(self.path):
            try:
                st = file.stat()
            except FileNotFoundError:
                continue
            ident, seen = (st.st_dev, st.st_ino), self._sizes.get(file)
            if file not in self._loaders or (seen is not None and (seen[0] != st.st_ino or seen[1] > st.st_size)):
                if file in self._loaders:
                    logger.info("evalstop watch: %s was replaced or truncated; reading it again", file)
                self._loaders[file] = self._loader_cls(str(file))
            self._sizes[file] = (ident[1], st.st_size)
            for event in self._loaders[file].Load():
                if not event.HasField("summary"):
                    continue
                for value in event.summary.value:
                    number = self._value(value)
                    if number is not None and event.step >= 0:
                        points.append(self._point(file, value.tag, int(event.step), number))
        return points

    def finish(self) -> list[Point]:
        return self.poll()

    def close(self) -> None:
        self._loaders.clear()


def _peek_line(path: Path) -> bytes | None:
    """The file's first complete line, or None while there is none."""
    with open(path, "rb") as fh:
        head = fh.read(1 << 16)
    if b"\n" not in head:
        return None
    return head.split(b"\n", 1)[0]


def detect(path: Path) -> tuple[str, str] | None:
    """The format of the log at ``path`` and why, or None while it cannot be told yet (no file, no first line).

    Raises:
        WatchError: The log has content but is none of the formats.
    """
    if path.is_dir():
        files = event_files(path)
        return ("tensorboard", f"event file {files[0].name} in the folder") if files else None
    if not path.exists():
        return None
    if EVENT_FILE_MARK in path.name:
        return "tensorboard", "the file is named like a TensorBoard event file"
    first = _peek_line(path)
    if first is None:
        return None
    try:
        kind = jsonl_kind(json.loads(first))
    except (json.JSONDecodeError, UnicodeDecodeError):
        kind = None
    if kind == "verl":
        return "verl", 'its lines are {"step": N, "data": {...}} (verl file logger)'
    if kind == "jsonl":
        return "jsonl", 'its lines are {"step": N, name: value, ...} (plain JSONL)'
    raise WatchError(
        f"{path}: first line is not a JSON object with an integral 'step', and the name is not a TensorBoard "
        "event file's: pass --format"
    )


def open_source(path: Path, kind: str) -> Source:
    """A source of format ``kind`` (not ``auto``) at ``path``."""
    if kind == "tensorboard":
        return TensorBoardSource(path)
    if path.is_dir():
        raise WatchError(f"{path} is a folder: a {kind} log is one file (a folder is read as TensorBoard event files)")
    return JsonlSource(path, kind)
