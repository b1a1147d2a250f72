"""Which series of a log is the watched metric: a name or a glob, and never two series at once."""

from __future__ import annotations

import difflib
import fnmatch
import logging
import math
import re

from ..evaluators.metric import spread_siblings
from .records import Point, WatchError

logger = logging.getLogger(__name__)

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


class SpreadSeries:
    """The spread of the watched metric: the standard deviation (or standard error) series beside it, and the count.

    The series is ``--std-metric`` when given, else the first of the chosen metric's automatic siblings that the log
    holds (:func:`~evalstop_callbacks.evaluators.metric.spread_siblings`: ``.../mean`` -> ``.../std``, ``X`` ->
    ``X_std``, ``X_stderr``), as ``MetricEvaluator`` reads a trainer's metrics; a name ending in ``stderr`` is a
    standard error, turned into a standard deviation with the count (``std = stderr * sqrt(n)``). The count is
    ``--n``: a log does not say how many examples an evaluation averaged. Without both, evaluations go on their means
    alone; the first evaluation logs once which evidence the detector gets and why.

    Args:
        std_metric: The spread's series name (``--std-metric``), or None for the automatic siblings.
        n: The count of each evaluation's example scores (``--n``, >= 2), or None.

    Raises:
        WatchError: ``std_metric`` empty, or ``n`` not an integer >= 2.
    """

    def __init__(self, std_metric: str | None = None, n: int | None = None) -> None:
        if std_metric is not None and not std_metric:
            raise WatchError("--std-metric: empty name")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 2):
            raise WatchError(f"--n must be an integer >= 2 (a spread needs two scores), got {n!r}")
        self.std_metric = std_metric
        self.n = n
        self.values: dict[str, dict[int, float]] = {}
        self._told = False
        self._warned = False

    def take(self, points: list[Point], chosen: str | None) -> None:
        """Keep the points of every series that may be the spread of ``chosen`` (the metric's series, or None)."""
        names = self.candidates(chosen)
        for point in points:
            for name in (point.series, point.alias):
                if name is not None and name in names:
                    self.values.setdefault(name, {})[point.step] = point.value

    def candidates(self, chosen: str | None) -> list[str]:
        """The series names that may hold the spread of ``chosen``, in the order they are tried."""
        if self.std_metric is not None:
            return [self.std_metric]
        return [] if chosen is None else [name for name, _ in spread_siblings(chosen)]

    def at(self, step: int, chosen: str) -> tuple[float | None, int | None]:
        """The ``(std, n)`` of the evaluation at ``step``, or ``(None, None)``: no spread logged at that step, no
        count, or a value that is not a finite number >= 0 (warned once: the mean still decides)."""
        found = next(
            ((name, v[step]) for name in self.candidates(chosen) if step in (v := self.values.get(name, {}))), None
        )
        if found is None or self.n is None:
            self._tell(chosen, None if found is None else found[0])
            return None, None
        name, value = found
        if not math.isfinite(value) or value < 0:
            if not self._warned:
                self._warned = True
                logger.warning(
                    "evalstop watch: %s is %r at step %d, not a finite standard deviation >= 0: that evaluation "
                    "(and any other such) goes on its mean alone",
                    name,
                    value,
                    step,
                )
            return None, None
        self._tell(chosen, name)
        return (value * math.sqrt(self.n) if name.endswith("stderr") else value), self.n

    def _tell(self, chosen: str, name: str | None) -> None:
        if self._told:
            return
        self._told = True
        if name is not None and self.n is not None:
            logger.info(
                "evalstop watch: %s is reported with its spread (%s, n=%d): the detector decides in mean-and-spread "
                "mode",
                chosen,
                name,
                self.n,
            )
        elif name is not None:
            logger.info("evalstop watch: %s has a spread (%s) but no --n: means only; pass --n N", chosen, name)
        else:
            logger.info(
                "evalstop watch: no spread of %s in the log (looked for %s): means only; pass --std-metric NAME --n N "
                "when it is logged under another name",
                chosen,
                ", ".join(self.candidates(chosen)),
            )
