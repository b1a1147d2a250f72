"""The detector interface and the base class of the built-in detectors.

:class:`Detector` is the interface every consumer uses (the monitor, the stop policies, the service): one eval in,
whether to stop out (:meth:`~Detector.update`; :meth:`~Detector.judge` adds why, as a :class:`Verdict`), and the
whole state as plain data. :class:`EvidenceDetector` is what the built-in detectors share: it owns the warm-up, the
count of consecutive evals with evidence, the stop after ``k`` of them, the state's common fields and the verdict
with its reason; a subclass supplies only its evidence rule (:meth:`~EvidenceDetector._evidence`) and its own state
fields.

**Evidence modes.** An eval reaches a detector as its mean, with, when the report carries them, the per-example scores
or the mean's :class:`Spread` (the sample standard deviation of the example scores and their count). Each detector
decides on the richest of these it can use and says which (:meth:`Detector.mode`, an
:class:`~platform_sim.core.boundary.EvidenceMode`); the monitor names that mode in every decision's reason. A detector
that cannot use a kind of evidence decides in the next mode it can use: the paper's rule always on the means alone.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, NamedTuple

from ..boundary import EvidenceMode
from ..checks import check_int

logger = logging.getLogger(__name__)


class Verdict(NamedTuple):
    """A detector's answer to one eval, as ``(stop, reason)``.

    Args:
        stop: Whether the job should stop now.
        reason: Why it should stop (for logs and the decision); empty when ``stop`` is False.
    """

    stop: bool
    reason: str


_CONTINUE = Verdict(False, "")


class Spread(NamedTuple):
    """The spread of one eval's example scores, as a report carries it (``eval_std``, ``eval_n``).

    Args:
        std: Sample standard deviation (``ddof=1``) of the example scores; finite, >= 0.
        n: How many example scores; >= 2.
    """

    std: float
    n: int

    @property
    def var_of_mean(self) -> float:
        """The variance of the eval's mean as an estimate of the model's expected score: ``std**2 / n``."""
        return self.std * self.std / self.n


class Detector(ABC):
    """Interface of a stop detector.

    Subclasses set :attr:`name`, validate their parameters in ``__init__`` (raising ``ValueError`` that names the
    parameter) and implement :meth:`update`, :meth:`params`, :meth:`state_dict` and :meth:`load_state_dict`; the
    built-in detectors do it through :class:`EvidenceDetector`.
    """

    name: ClassVar[str]
    #: Whether the detector reads per-example eval scores when they are reported (simulators generate them only for
    #: such detectors; others get the mean alone).
    uses_example_scores: ClassVar[bool] = False

    #: Whether :meth:`update` takes the ``spread`` argument. False for a detector written before spreads were
    #: reported: :meth:`judge` then never passes one, and the detector decides on what it read before.
    takes_spread: ClassVar[bool] = False

    #: Whether an extra evaluation (one a cadence hint asked for) stays in the detector's history after it was judged.
    #: False (the default): the monitor restores the detector's state after an extra eval that did not stop the job,
    #: so the rule runs on the regular interval it was built for (a window of the last evals, consecutive declines) and
    #: a hint can only bring a stop sooner (:mod:`~platform_sim.core.monitor`). True for a model of the whole curve
    #: against the step (``shape``), for which an extra eval is one more point of evidence.
    keeps_extra_evals: ClassVar[bool] = False

    #: Whether :meth:`update` takes per-example scores as a read-only one-dimensional float64 ``numpy`` array (the
    #: simulator's rows, checked by :func:`~platform_sim.core.boundary.check_finite_score_array`) as well as a
    #: tuple. False: the monitor hands such an array on as a tuple of floats, as every detector got before.
    takes_score_arrays: ClassVar[bool] = False

    #: Current evidence count towards a stop (for the k-decline rule: consecutive declines).
    declines: int = 0

    @abstractmethod
    def update(
        self, step: int, score: float, scores: Sequence[float] | None = None, spread: Spread | None = None
    ) -> bool:
        """Take one evaluation; return True if the job should stop now (why: :meth:`reason`).

        Args:
            step: Training step of the evaluation; strictly greater than every step observed before.
            score: Finite mean score of the evaluation (higher is better).
            scores: Optional per-example scores of the evaluation (same examples at every eval).
            spread: Optional spread of the evaluation's example scores (when the report carries ``eval_std`` and
                ``eval_n``; a detector derives it from ``scores`` itself where it needs it).
        """

    def judge(
        self, step: int, score: float, scores: Sequence[float] | None = None, spread: Spread | None = None
    ) -> Verdict:
        """:meth:`update`, answered as a :class:`Verdict` that carries the reason of a stop (same arguments).

        ``spread`` is passed on only to a detector that :attr:`takes_spread`, so one written before spreads existed
        (an ``update`` without the argument) keeps working, on the means, whatever the reports carry."""
        if spread is not None and self.takes_spread:
            stop = self.update(step, score, scores, spread)
        else:
            stop = self.update(step, score, scores)
        return Verdict(True, self.reason()) if stop else _CONTINUE

    def plan(self, planned_steps: int | None) -> None:
        """Take the run's planned number of training steps (a report's ``planned_steps``: the trainer's
        ``max_steps``), for the next :meth:`update`; None: that report carried none. Called by the monitor before
        every eval. A detector that measures nothing in training progress ignores it (this base does)."""

    @property
    def plan_matters(self) -> bool:
        """Whether :meth:`plan`'s planned steps change how this detector decides, so that an entry point that lacks
        them can say what the user gives up (:meth:`plan_matters_for` of its parameters)."""
        return self.plan_matters_for(self.params())

    @classmethod
    def plan_matters_for(cls, params: Mapping[str, Any]) -> bool:
        """:attr:`plan_matters` of a detector of this class built with ``params`` (a spec's, valid), without building
        it: the service asks it of every job it lists. This base: never."""
        del params
        return False

    def mode(self) -> EvidenceMode:
        """The evidence the last evaluation was judged on (:class:`~platform_sim.core.boundary.EvidenceMode`); read
        right after :meth:`update`. This base answers means only: a detector that reads more says so."""
        return EvidenceMode.MEANS_ONLY

    @abstractmethod
    def params(self) -> dict[str, Any]:
        """The constructor parameters, so that ``make_detector(d.name, **d.params())`` rebuilds an equal detector."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The mutable state as JSON-serializable plain data."""

    @abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the state written by :meth:`state_dict`."""

    def reason(self) -> str:
        """Why the detector stops (meaningful once :meth:`update` returned True)."""
        return f"{self.name} fired"

    def doubt(self) -> float | None:
        """How far the last evaluation's evidence for a stop is from certain, in [0, 1] (small: strong evidence):
        the p-value of a detector's test, or one minus a Bayesian detector's posterior that the job overoptimizes
        and is past its peak. None: this detector has no such number, or the last evaluation gave none. Read right
        after :meth:`update` by the cadence policy: a small doubt that does not yet stop the job is evidence
        building up."""
        return None

    def spec(self) -> dict[str, Any]:
        """``{"name": ..., "params": {...}}``: what :func:`~platform_sim.core.detectors.detector_from_spec` takes."""
        return {"name": self.name, "params": self.params()}


class EvidenceDetector(Detector):
    """A detector that stops after ``k`` consecutive evals with evidence; the first ``warmup`` evals never count.

    Real RL runs can dip at the very start, before the policy improves at all; a warm-up keeps a rule from taking
    that dip for overoptimization. The evidence count is :attr:`declines`; any eval without evidence resets it.

    Subclasses implement :meth:`_evidence` (the rule), :meth:`_rule_state` / :meth:`_load_rule_state` (their own
    state fields) and :meth:`reason`, and may override :meth:`_fires` (when the stop is not "``k`` in a row") and
    the two hooks that say how the number of evals seen is persisted.

    Args:
        k: Consecutive evals with evidence that stop the job. Integer >= 1.
        warmup: The first ``warmup`` evals never count as evidence (0: none). Integer >= 0.
    """

    takes_spread: ClassVar[bool] = True

    def __init__(self, k: int, warmup: int) -> None:
        self.k = check_int("k", k, 1)
        self.warmup = check_int("warmup", warmup, 0)
        self.seen = 0  # evals observed, for the warm-up
        self.declines = 0
        self._warned = False  # the once-per-detector fallback warning (not state: a restored detector warns again)
        # The mode of the last eval (derived, not state: the monitor reads it right after the eval it describes).
        self._mode = EvidenceMode.MEANS_ONLY

    def update(
        self, step: int, score: float, scores: Sequence[float] | None = None, spread: Spread | None = None
    ) -> bool:
        # The simulator's hot path (about 10^6 calls per experiment): the verdict without building its reason.
        counts = self.seen >= self.warmup  # this eval is number seen + 1, past the first `warmup`
        # A rule that reads per-example scores decides on them when the eval has them; a rule that reads spreads
        # (trend) sets its own mode in _evidence.
        has_scores = scores is not None and len(scores) > 0  # (an array has no truth value)
        self._mode = EvidenceMode.PER_EXAMPLE if self.uses_example_scores and has_scores else EvidenceMode.MEANS_ONLY
        # The rule runs first: it may reject the eval (InvalidReportError), and then nothing here has changed.
        evidence = self._evidence(step, score, scores, counts, spread) and counts
        self.seen += 1
        self.declines = self.declines + 1 if evidence else 0
        return self._fires()

    def mode(self) -> EvidenceMode:
        return self._mode

    @abstractmethod
    def _evidence(
        self, step: int, score: float, scores: Sequence[float] | None, counts: bool, spread: Spread | None = None
    ) -> bool:
        """Apply one eval to the rule's state and return whether it is evidence for a stop.

        Args:
            step: Training step of the evaluation (validated by the monitor).
            score: Mean score of the evaluation.
            scores: Per-example scores of the evaluation, or None.
            counts: Whether this eval is past the warm-up. The base ignores evidence before it anyway; a rule that
                accumulates evidence (CUSUM) uses it to leave the warm-up evals out.
            spread: The eval's spread when its report carried one, or None. Only a rule that reads it sets
                :attr:`_mode` to mean-and-spread; the others decide on the means (or per-example scores) as before.
        """

    def _fires(self) -> bool:
        """Whether the job stops now, once :attr:`declines` is updated: ``k`` consecutive evals with evidence."""
        return self.declines >= self.k

    @abstractmethod
    def _rule_state(self) -> dict[str, Any]:
        """The rule's own state fields (plain data); the base adds ``declines`` and, where recorded, ``seen``."""

    @abstractmethod
    def _load_rule_state(self, state: Mapping[str, Any]) -> None:
        """Restore the fields written by :meth:`_rule_state`."""

    def _records_seen(self) -> bool:
        """Whether the state has a ``seen`` field (False where the rule's history already tells it)."""
        return True

    def _seen_from_state(self, state: Mapping[str, Any]) -> int:
        """The number of evals seen, for a state without a ``seen`` field (written so, or by an earlier version)."""
        return 0

    def state_dict(self) -> dict[str, Any]:
        state = self._rule_state()
        state["declines"] = self.declines
        if self._records_seen():
            state["seen"] = self.seen
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._load_rule_state(state)
        self.declines = int(state["declines"])
        self.seen = int(state["seen"]) if "seen" in state else self._seen_from_state(state)

    def _warn_fallback(self, why: str, how: str = "") -> None:
        """Warn, once per detector, that an eval is judged on the mean score alone.

        Args:
            why: What is missing (e.g. "no per-example eval scores").
            how: Optional note on where the noise then comes from, ending with "; ".
        """
        if not self._warned:
            self._warned = True
            logger.warning(
                "detector %s: %s; falling back to the mean score (%swarned once per detector)", self.name, why, how
            )
