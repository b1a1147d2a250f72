"""Which series of a log is the watched metric: a name or a glob, and never two series at once."""

from __future__ import annotations

import difflib
import fnmatch
import re

from .records import Point, WatchError

_EVAL_NAME = re.compile(r"(^|[/_.\-])(val|valid|validation|eval|evaluation|test)([/_.\-@]|$)", re.IGNORECASE)
"""A series whose name says it is an evaluation (``val/acc``, ``eval_loss``, ``val-core/...``): seen at a few steps
without the metric, the metric is probably misspelt."""


def _is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


class SeriesSelector:
    """Picks the points of the one series that ``--metric`` names.

    A plain name matches that series only. A glob (``val-core/*/reward/mean@1``) matches any series whose name fits
    it, with ``*`` also crossing ``/``; the first matching series is taken, and a second one is refused with an error
    naming both (a glob must pick one metric: the detector cannot mix two curves). TensorBoard series carry two names
    (the tag, and ``<run folder>/<tag>``): either may match.

    Args:
        pattern: The metric's name or glob.
    """

    def __init__(self, pattern: str) -> None:
        if not pattern:
            raise WatchError("--metric: empty name")
        self.pattern = pattern
        self.glob = _is_glob(pattern)
        self.chosen: str | None = None
        self.seen: set[str] = set()
        self._eval_steps: set[int] = set()  # steps at which a series named like an evaluation was logged

    def _matches(self, point: Point) -> bool:
        names = (point.series,) if point.alias is None else (point.series, point.alias)
        if self.glob:
            return any(fnmatch.fnmatchcase(name, self.pattern) for name in names)
        return self.pattern in names

    def select(self, points: list[Point]) -> list[Point]:
        """The points of the chosen series among ``points`` (choosing it at its first match).

        Raises:
            WatchError: A second series matches the metric.
        """
        out = []
        for point in points:
            self.seen.add(point.series)
            if self.chosen is None and _EVAL_NAME.search(point.series):
                self._eval_steps.add(point.step)
            if point.series == self.chosen:
                out.append(point)
            elif self._matches(point):
                if self.chosen is None:
                    self.chosen = point.series
                    out.append(point)
                else:
                    raise WatchError(
                        f"--metric {self.pattern!r} matches several series ({self.chosen}, {point.series}): "
                        "name one of them"
                    )
        return out

    def seen_names(self, limit: int = 12) -> str:
        """The series seen so far, for an error message."""
        names = sorted(self.seen)
        if not names:
            return "none"
        more = f" and {len(names) - limit} more" if len(names) > limit else ""
        return ", ".join(names[:limit]) + more

    def eval_steps_seen(self) -> int:
        """At how many steps a series named like an evaluation was logged (counted while no series is chosen)."""
        return len(self._eval_steps)

    def closest(self) -> str | None:
        """The series seen whose name is closest to the pattern (difflib), or None."""
        found = difflib.get_close_matches(self.pattern, sorted(self.seen), n=1, cutoff=0.5)
        return found[0] if found else None

    def hint(self) -> str:
        """The series seen and the closest one, for the messages of a metric that has not appeared."""
        closest = self.closest()
        near = f"; closest: {closest!r}" if closest is not None else ""
        return f"series seen: {self.seen_names()}{near}"
