"""The watcher's core loop step: read what a metrics log gained, hand each new evaluation to the scheduler core.

:class:`Watcher` is the Python API of ``evalstop watch`` (the command adds the polling loop, the stop actions and the
result file, :mod:`evalstop_callbacks.watch.loop`)::

    from evalstop_callbacks.watch import Watcher

    watcher = Watcher("run/metrics.jsonl", "val-core/*/reward/mean@1", examples="run/val_dumps")
    while not watcher.stopped:
        watcher.poll()          # reads only what is new; returns True if the log gained anything
        time.sleep(0.5)
    print(watcher.result().to_dict())

Only the whitelisted report (job id and type, step, score, per-example scores) reaches the client, whether it is the
embedded core (default) or a ``PlatformClient``. The watcher holds no state beyond what it read, so a restarted
watcher reads the log from its start and reaches the same decisions.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from platform_sim.core import Decision, EvidenceMode, InvalidReportError, Report, default_spec, detector_from_spec
from platform_sim.core.boundary import check_planned_steps

from ..client import BoundaryClient, EmbeddedClient, make_report
from ..keeper import BestCheckpoints, checkpoint_steps
from ..nonfinite import DEFAULT_MAX_CONSECUTIVE, NonFinitePolicy
from ..outcome import worded
from .examples import ExampleDumps
from .formats import Source, detect, open_source
from .records import FORMATS, Point, WatchError
from .series import SeriesSelector, SpreadSeries

logger = logging.getLogger(__name__)

EXAMPLES_WAIT_S = 10.0
"""How long an evaluation waits for its validation dump before it goes on its mean alone (verl writes the dump before
the log line, so a dump that is late by this much is not coming); a later evaluation ends the wait at once."""


def _quiet(record: logging.LogRecord) -> bool:
    return False


def _warm(spec: dict[str, Any]) -> None:
    """Run the detector once on a made-up falling curve, in a throwaway embedded core, and forget it.

    Why: detectors load their statistics code (scipy) at their first full window, about a second of CPU. Paid at
    the watcher's start it no longer delays the first real decision, which matters when many watchers reach that
    window at once (benchmarks/bench_watch.py). The real job's state is untouched, and the made-up job's warnings
    (a means-only curve) are not shown.
    """
    # A logger's filter sees only its own records, so every logger of the core gets one (they exist once imported).
    names = [n for n in logging.root.manager.loggerDict if n == "platform_sim" or n.startswith("platform_sim.")]
    core_loggers = [logging.getLogger(n) for n in names]
    for core_logger in core_loggers:
        core_logger.addFilter(_quiet)
    try:
        for per_example in (False, True):
            client = EmbeddedClient(warn_without_plan=False)  # a warm-up: no run of the user's to warn about
            job = client.register("other", detector=spec, job_id="warm-up")
            for i in range(24):
                score = 1.0 - 0.05 * i + 0.03 * (i % 2)  # falling, with noise: a real test, not a zero variance
                scores = (score, score - 0.1, score + 0.1, score) if per_example else None
                if client.report(Report(job, "other", i, score, scores)).should_stop:
                    break
    finally:
        for core_logger in core_loggers:
            core_logger.removeFilter(_quiet)


def default_job_id(log: Path) -> str:
    """A job id stable across restarts of the watcher: the log's name and a hash of its absolute path."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", log.name)[:48].strip("-") or "log"
    digest = hashlib.sha1(str(log.resolve()).encode()).hexdigest()[:8]
    return f"watch-{stem}-{digest}"


@dataclass
class WatchResult:
    """What a watch decided; ``to_dict()`` is the ``--result`` JSON.

    Args:
        decision: ``"stop"`` or ``"continue"``.
        stop_step: The step whose evaluation decided the stop, or None.
        best_step: The best evaluation's step (the best up to the stop), or None before any evaluation.
        best_score: Its score, in the metric's own units (not negated by ``--lower-is-better``).
        best_checkpoint: The framework's checkpoint folder of the best step, or None (no ``--checkpoints``, or the
            step has none: ``checkpoint_note`` then says so and names the nearest one before it).
        detector: The detector spec that decided.
        evals: Every ``[step, score]`` handed to the core, scores in the metric's own units.
        metric: The series the metric name or glob chose (None if none was seen).
        format: The log's format (None if the log never appeared).
        reason: The core's reason for its last decision.
        per_example: Whether per-example scores (``--examples``) reached the detector.
        protected_checkpoint: The best step's ``evalstop-best-<step>`` mirror, or None.
        protection: How the mirror was made: ``"hard-linked"``, ``"copied"`` or ``"hard-linked and copied"``.
        checkpoint_note: Why ``best_checkpoint`` is None although ``--checkpoints`` was given.
        job_id: The job id the reports carried.
        ended: Why the watch ended (filled in by the command's loop).
        mode: ``"enforce"`` (stop the run) or ``"observe"`` (never stop; ``would_stop_step`` says where).
        would_stop_step: The step at which the core first said stop (in both modes), or None.
        keep_best: How many best checkpoints are kept (``--keep-best``).
        kept: The kept checkpoints, best first: ``{"step", "score", "path", "source", "method"}`` (score in the
            metric's own units, ``path`` the ``evalstop-best-<step>`` folder, ``source`` the framework's folder).
        pruned: Every folder the keeper deleted (copies that fell out of the K best, and with ``--prune-others``
            the framework's checkpoints that were neither kept nor the newest).
        evidence: The evidence mode the detector's last decision names (``"per-example"``, ``"mean-and-spread"``,
            ``"means only"``), or None before any decision or when its reason names none.
        non_finite: Every evaluation of the metric that was NaN or inf: ``[step, "eval score nan"]`` (in words: JSON
            has no NaN). Not handed to the core, not decided on (:mod:`evalstop_callbacks.nonfinite`).
    """

    decision: str
    stop_step: int | None
    best_step: int | None
    best_score: float | None
    best_checkpoint: str | None
    detector: dict[str, Any]
    evals: list[list[float]]
    metric: str | None = None
    format: str | None = None
    reason: str = ""
    per_example: bool = False
    protected_checkpoint: str | None = None
    protection: str | None = None
    checkpoint_note: str | None = None
    job_id: str = ""
    ended: str | None = None
    mode: str = "enforce"
    would_stop_step: int | None = None
    keep_best: int = 1
    kept: list[dict[str, Any]] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    evidence: str | None = None
    non_finite: list[list[Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Pending:
    point: Point
    read_at: float = field(default_factory=time.monotonic)


class Watcher:
    """Follows one metrics log and feeds its evaluations of one metric to a boundary client.

    Args:
        log: The log: a verl file-logger or plain JSONL file, or a TensorBoard event file or folder. It may not exist
            yet.
        metric: The metric's name or a glob matching exactly one series (``val-core/*/reward/mean@1``).
        format: ``auto`` (default: told from the log's first content, and said which), ``verl``,
            ``tensorboard`` or ``jsonl``.
        greater_is_better: True (default) if a higher metric is better; False for a loss or error, which the
            detector then sees negated.
        examples: verl's validation dump folder (``trainer.validation_data_dir``) for per-example scores, or None
            (the detector then decides on each eval's mean, with its spread where the log has one; the watcher
            says so once).
        detector: Detector spec (a name or ``{"name": ..., "params": {...}}``); None: ``default_spec()``.
        client: The boundary client (default: a new :class:`~evalstop_callbacks.client.EmbeddedClient`); a
            ``PlatformClient`` sends the reports to an ``evalstop-server``.
        job_id: The job's id; default: from the log's path (:func:`default_job_id`), stable across restarts.
        job_type: The job's type (``rlhf``, ``dpo``, ``sft``, ``lora``, ``other``).
        checkpoints: The framework's checkpoint folder, to name and protect the best steps' checkpoints, or None.
        best_dir: Where the protected mirrors ``evalstop-best-<step>`` go (default ``checkpoints``).
        keep_best: How many best checkpoints to keep protected (K >= 1; :class:`~evalstop_callbacks.keeper.
            BestCheckpoints`).
        prune_others: Also delete the framework's checkpoints that are neither among the K best nor the newest.
        mode: ``"enforce"`` (the watch ends at a stop, for the command to act) or ``"observe"`` (never stops: follows
            the log to its end, keeping the best checkpoints all the same).
        warm_up: Run the detector once on a made-up curve first (see :func:`_warm`), so that its first real decision
            is not delayed by loading its statistics code.
        std_metric: The series of the metric's standard deviation (or, named ``...stderr``, standard error), or None
            for the automatic siblings (:class:`~evalstop_callbacks.watch.series.SpreadSeries`).
        n: The count of each evaluation's example scores, which the spread needs (None: means only).
        max_non_finite: How many NaN or inf evaluations of the metric in a row stop the run (the one non-finite
            policy, :class:`~evalstop_callbacks.nonfinite.NonFinitePolicy`; fewer are recorded and skipped).
        planned_steps: The run's planned training steps (``--planned-steps``), carried by every report so that the
            default detector bounds its false stops per run rather than per eval; None: unknown (per look).

    Raises:
        WatchError: A bad format name, detector spec or job type.
    """

    def __init__(
        self,
        log: str | os.PathLike[str],
        metric: str,
        *,
        format: str = "auto",
        greater_is_better: bool = True,
        examples: str | os.PathLike[str] | None = None,
        detector: str | dict[str, Any] | None = None,
        client: BoundaryClient | None = None,
        job_id: str | None = None,
        job_type: str = "rlhf",
        checkpoints: str | os.PathLike[str] | None = None,
        best_dir: str | os.PathLike[str] | None = None,
        keep_best: int = 1,
        prune_others: bool = False,
        mode: str = "enforce",
        warm_up: bool = True,
        std_metric: str | None = None,
        n: int | None = None,
        max_non_finite: int = DEFAULT_MAX_CONSECUTIVE,
        planned_steps: int | None = None,
    ) -> None:
        if format not in FORMATS:
            raise WatchError(f"--format must be one of {', '.join(FORMATS)}, got {format!r}")
        try:
            self.spec = detector_from_spec(default_spec() if detector is None else detector).spec()
        except ValueError as exc:
            raise WatchError(f"--detector: {exc}") from None
        if mode not in ("enforce", "observe"):
            raise WatchError(f"--mode must be enforce or observe, got {mode!r}")
        if isinstance(keep_best, bool) or not isinstance(keep_best, int) or keep_best < 1:
            raise WatchError(f"--keep-best must be an integer >= 1, got {keep_best!r}")
        if (prune_others or keep_best != 1) and checkpoints is None:
            raise WatchError(f"{'--prune-others' if prune_others else '--keep-best'} needs --checkpoints")
        self.mode = mode
        try:
            self.planned_steps = check_planned_steps(planned_steps)
        except InvalidReportError as exc:
            raise WatchError(f"--planned-steps: {exc}") from None
        try:
            self.non_finite = NonFinitePolicy(max_non_finite, where="evalstop watch")
        except ValueError as exc:
            raise WatchError(f"--max-non-finite: {exc}") from None
        self.non_finite_evals: list[list[Any]] = []
        self.stop_reason = ""  # the reason of a stop the core did not decide (a broken evaluation)
        if warm_up:
            _warm(self.spec)
        self.log = Path(log)
        self.format = format
        self.sign = 1.0 if greater_is_better else -1.0
        self.selector = SeriesSelector(metric)
        self.spread = SpreadSeries(std_metric, n)
        self.examples = None if examples is None else ExampleDumps(Path(examples), negate=not greater_is_better)
        self.checkpoints = None if checkpoints is None else Path(checkpoints)
        self.keep_best = keep_best
        self.keeper: BestCheckpoints | None = None
        if self.checkpoints is not None:
            root = self.checkpoints if best_dir is None else Path(best_dir)
            self.keeper = BestCheckpoints(root, keep_best, prune_others=prune_others, checkpoints=self.checkpoints)
            self.keeper.adopt()  # a restarted watcher takes over the mirrors it made before
        # The watcher warns without a plan in its own terms (--planned-steps), once, at start.
        self.client: BoundaryClient = client if client is not None else EmbeddedClient(warn_without_plan=False)
        self.job_type = job_type
        try:
            self.job_id = self.client.register(job_type, detector=self.spec, job_id=job_id or default_job_id(self.log))
        except ValueError as exc:
            raise WatchError(f"registering the job: {exc}") from None
        self.source: Source | None = None
        self.decision: Decision | None = None
        self.stop_step: int | None = None
        self.would_stop_step: int | None = None
        self.evals: list[list[float]] = []
        self.per_example = False
        self._pending: list[_Pending] = []
        self._last_step: int | None = None
        self._repeats: dict[int, float] = {}
        #: time.monotonic() of the last evaluation handed to the core (the command's --timeout counts from it).
        self.last_eval_at: float | None = None
        if self.planned_steps is None and detector_from_spec(self.spec).plan_matters:
            logger.warning(
                "evalstop watch: no --planned-steps: the detector tests at every eval on its own (per look), so a "
                "log with many evals stops healthy runs more often; give the run's max_steps to bound its false "
                "stops per run"
            )
        if self.examples is None:
            logger.warning(
                "evalstop watch: no --examples: the detector decides on each eval's mean, with its spread where "
                "the log has one and --n is given (per-example scores make the default detector far less likely "
                "to stop a healthy run)"
            )

    @property
    def stopped(self) -> bool:
        """Whether the core decided to stop (the watcher reads nothing more after that)."""
        return self.stop_step is not None

    def _open(self) -> bool:
        if self.source is not None:
            return True
        if self.format == "auto":
            found = detect(self.log)
            if found is None:
                return False
            kind, why = found
            logger.info("evalstop watch: format %s chosen for %s: %s", kind, self.log, why)
        else:
            if not self.log.exists():
                return False
            kind = self.format
        self.source = open_source(self.log, kind)
        return True

    def _queue(self, points: list[Point]) -> None:
        selected = self.selector.select(points)
        self.spread.take(points, self.selector.chosen)
        for point in selected:
            if self._last_step is not None and point.step <= self._last_step:
                # A resumed trainer logs steps again, a replaced event file is read again: the first value stands.
                if self._repeats.get(point.step, point.value) != point.value:
                    logger.warning(
                        "evalstop watch: step %d logged again with another value (a resumed run?): kept the first",
                        point.step,
                    )
                continue
            self._repeats[point.step] = point.value
            self._last_step = point.step
            self._pending.append(_Pending(point))

    def _report(self, finishing: bool) -> int:
        handled = 0
        while self._pending and not self.stopped:
            head = self._pending[0]
            step, value = head.point.step, head.point.value
            scores = None
            if self.examples is not None:
                waited = time.monotonic() - head.read_at
                if not self.examples.ready(step):
                    if not finishing and len(self._pending) == 1 and waited < EXAMPLES_WAIT_S:
                        break  # verl may still be writing the dump; a later evaluation or the wait ends this
                    logger.warning(
                        "evalstop watch: no complete %s: step %d goes on its mean alone", self.examples.path(step), step
                    )
                else:
                    scores = self.examples.scores(step)
            self._pending.pop(0)
            handled += 1
            if not self.non_finite.check(step, value, scores, metric=self.selector.chosen):
                self._skip_non_finite(step, value)
                continue
            std, n = (None, None) if scores is not None else self.spread.at(step, self.selector.chosen or "")
            report = make_report(
                self.job_id, self.job_type, step, self.sign * value, scores, WatchError, std, n, self.planned_steps
            )
            try:
                self.decision = self.client.report(report)
            except ValueError as exc:  # the core refused it (e.g. per-example scores of another length)
                raise WatchError(f"step {step}: the core refused the evaluation: {exc}") from None
            self.per_example = self.per_example or scores is not None
            self.evals.append([step, value])
            self.last_eval_at = time.monotonic()
            if self.decision.should_stop and self.would_stop_step is None:
                self._stop_at(step, self.decision.reason)
        if handled:
            self._keep()
        return handled

    def _skip_non_finite(self, step: int, value: float) -> None:
        """A NaN or inf evaluation: recorded in the result, not decided on; the last one a run may take stops it."""
        self.non_finite_evals.append([step, self.non_finite.last or str(value)])
        self.last_eval_at = time.monotonic()  # the metric is there: --timeout counts from it all the same
        if self.non_finite.exhausted and self.would_stop_step is None:
            self._stop_at(step, self.non_finite.reason(self.selector.chosen))

    def _stop_at(self, step: int, reason: str) -> None:
        """The first stop (the core's, or a broken evaluation's): enforce mode ends the watch; observe notes it."""
        self.would_stop_step = step
        self.stop_reason = reason
        if self.mode == "enforce":
            self.stop_step = step
            logger.warning("evalstop watch: STOP at step %d: %s", step, reason)
        else:
            logger.warning("evalstop watch (observe): would stop at step %d: %s", step, reason)

    def _keep(self) -> None:
        """Offer every evaluated step whose checkpoint folder exists to the keeper (it keeps the K best, and tops
        up a mirror whose checkpoint gained files since)."""
        if self.keeper is None or self.checkpoints is None:
            return
        folders = checkpoint_steps(self.checkpoints)
        for step, value in self.evals:
            folder = folders.get(int(step))
            if folder is not None:
                self.keeper.protect(int(step), self.sign * value, folder)

    def poll(self) -> bool:
        """Read what the log gained since the last poll and report its new evaluations.

        Returns:
            True if the log gained any point (of any series), for the caller's poll interval.

        Raises:
            WatchError: The log is not of its format, a glob matches several series, or a dump is malformed.
        """
        if self.stopped or not self._open():
            return False
        assert self.source is not None
        points = self.source.poll()
        self._queue(points)
        self._report(finishing=False)
        return bool(points)

    def finish(self) -> WatchResult:
        """Read the rest of the log (a last line without its newline included), report it and return the result.

        Call it once the writer is done (its process ended, or the watch timed out).
        """
        if not self.stopped and self._open():
            assert self.source is not None
            self._queue(self.source.finish())
            self._report(finishing=True)
        self._keep()  # tops up a checkpoint written late
        if self.source is not None:
            self.source.close()
        return self.result()

    def result(self) -> WatchResult:
        """The decision so far."""
        d = self.decision
        best_score = None if d is None or d.best_score is None else self.sign * d.best_score
        best_step = None if d is None else d.best_step
        kept = None if self.keeper is None or best_step is None else self.keeper.get(best_step)
        best_checkpoint, note = self._best_folder(best_step, kept)
        return WatchResult(
            decision="stop" if self.stopped else "continue",
            stop_step=self.stop_step,
            best_step=best_step,
            best_score=best_score,
            best_checkpoint=best_checkpoint,
            detector=self.spec,
            evals=list(self.evals),
            metric=self.selector.chosen,
            format=None if self.source is None else self.source.kind,
            reason=worded(self.stop_reason or ("" if d is None else d.reason), self.mode),
            per_example=self.per_example,
            protected_checkpoint=None if kept is None else kept.path,
            protection=None if kept is None else kept.method,
            checkpoint_note=note,
            job_id=self.job_id,
            mode=self.mode,
            would_stop_step=self.would_stop_step,
            keep_best=self.keep_best,
            kept=[] if self.keeper is None else [{**k, "score": self.sign * k["score"]} for k in self.keeper.listing()],
            pruned=[] if self.keeper is None else list(self.keeper.pruned),
            evidence=None if d is None or (m := EvidenceMode.of_reason(d.reason)) is None else m.value,
            non_finite=[list(e) for e in self.non_finite_evals],
        )

    def _best_folder(self, best_step: int | None, kept: Any) -> tuple[str | None, str | None]:
        """The framework's folder of the best step (the one mirrored, even if rotated away since) and, when there is
        none, a note naming the nearest one before it."""
        if self.checkpoints is None or best_step is None:
            return None, None
        if kept is not None and kept.source is not None:
            return kept.source, None
        folders = checkpoint_steps(self.checkpoints)
        if best_step in folders:
            return str(folders[best_step]), None
        before = [s for s in folders if s < best_step]
        nearest = f"the nearest one before it is {folders[max(before)]}" if before else "there is none before it"
        return None, f"step {best_step} has no checkpoint in {self.checkpoints}; {nearest}"

    def metrics_seen(self) -> str:
        """The series the log showed so far, for the error when the metric never appears."""
        return self.selector.seen_names()
