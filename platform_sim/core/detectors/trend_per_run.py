"""``trend``'s per-run tests: which one runs for a job, how it is fed, its reason, parameters and state.

:class:`~.trend.TrendDetector` tests per look at a fixed window of evals unless a per-run test applies
(``means_test``): the anytime test of the means (:class:`~.progress.ProgressSlope`, ``"progress"``), or, with
``"auto"`` once the reports carry the run's ``planned_steps``, the planned-progress tests of every evidence mode
(:class:`~.progress.PlannedEvidence`). :class:`PerRunTests` holds that choice, so the detector keeps only the per-look
window tests and the mode bookkeeping; the tests' statistics themselves live in :mod:`.progress`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ..boundary import EvidenceMode
from .progress import PlannedEvidence, PlannedSlope, ProgressSlope

#: The per-run tests' parameters by default (the planned design chosen on tuning data, docs/reference/detectors.md).
PROGRESS_DEFAULTS: dict[str, float] = {
    "run_alpha": 0.05,
    "frac": 0.2,
    "rel_drop": 0.2,
    # The per-example and mean-and-spread tests' own (chosen on tuning data by benchmarks/dense_modes.py).
    "evidence_run_alpha": 0.1,
    "evidence_rel_drop": 0.0,
    # The spending shape p**spend_power of every mode's planned test (re-examined on tuning data with runs that peak
    # early, benchmarks/dense_modes.py and dense_noisy.py: 2 kept).
    "spend_power": 2.0,
}


class PerRunTests:
    """The per-run test of one ``trend`` detector, fed at every eval (whatever the mode, so it is ready when the
    mode it decides in comes up).

    The planned test is fed lazily: most evals run no test (one runs only when the mean fell below the best), so
    :meth:`feed` keeps each eval's ``add_evidence`` arguments and they are handed on, in order, when the test is
    read (:attr:`test`, :attr:`planned`, :meth:`reason`, :meth:`state_into`) or when :attr:`MAX_PENDING` are held.
    The test then sees the same calls in the same order as if fed at once: the same state and decisions, and an eval
    after a job's last test costs nothing (12% of the evals in ``evalstop-sim run --gpus 1024 --jobs 10000``: most jobs
    end at, or soon after, a test).

    Args:
        means_test: The detector's ``means_test``: ``"auto"`` (the planned tests once a plan arrives), ``"window"``
            (none) or ``"progress"`` (the anytime test of the means, from the first eval).
        run_alpha, frac, rel_drop: The means' per-run test (:class:`~.progress.ProgressSlope`).
        min_evals: The fewest evals in a progress window (the detector's ``window``).
        evidence_run_alpha, evidence_rel_drop: The per-example and mean-and-spread planned tests' level and
            materiality (:class:`~.progress.PlannedEvidence`).
        spend_power: The planned tests' spending shape ``p**spend_power`` (:func:`~.progress.spent`).
    """

    #: The most evals held unfed (a bound on the memory of a long run that never falls below its best).
    MAX_PENDING: ClassVar[int] = 64

    def __init__(
        self,
        means_test: str,
        run_alpha: float,
        frac: float,
        min_evals: int,
        rel_drop: float,
        evidence_run_alpha: float,
        evidence_rel_drop: float,
        spend_power: float = PROGRESS_DEFAULTS["spend_power"],
    ) -> None:
        self.means_test = means_test
        self.run_alpha = run_alpha
        self.frac = frac
        self.min_evals = min_evals
        self.rel_drop = rel_drop
        self.evidence_run_alpha = evidence_run_alpha
        self.evidence_rel_drop = evidence_rel_drop
        self.spend_power = spend_power
        self.anytime = ProgressSlope(run_alpha, frac, min_evals, rel_drop) if means_test == "progress" else None
        # The planned-progress test (means_test "auto"), made at the first eval whose report carries planned_steps.
        self._planned: PlannedEvidence | None = None
        # Its evals not yet handed on: (step, score, plan, row, var), the arguments of add_evidence, in order.
        self._pending: list[tuple[int, float, int | None, Sequence[float] | None, float | None]] = []
        self._plan: int | None = None  # the planned steps handed to plan() for the next eval (derived, not state)

    @property
    def planned(self) -> PlannedEvidence | None:
        """The planned-progress test (None: no plan arrived yet), fed every eval so far."""
        if self._pending:
            self._flush()
        return self._planned

    @property
    def test(self) -> ProgressSlope | None:
        """The per-run test in use: the anytime one, the planned one once a plan arrived, or None (per look); fed
        every eval so far."""
        return self.anytime or self.planned

    def _flush(self) -> None:
        """Hand the pending evals to the planned test, in the order they came."""
        assert self._planned is not None
        add, pending = self._planned.add_evidence, self._pending
        self._pending = []
        for step, score, plan, row, var in pending:
            add(step, score, plan, row, var)

    def plan(self, planned_steps: int | None) -> None:
        """Take the run's planned steps for the next eval (None: not given, the last plan given stays)."""
        self._plan = planned_steps

    def feed(
        self, step: int, score: float, first: bool, row: Sequence[float] | None, spread: Sequence[float] | None
    ) -> bool:
        """Feed the eval (``first``: the run's first eval; ``row``: its per-example scores; ``spread``: ``[std, n]``)
        and say whether a per-run test applies now (then read it from :attr:`test`)."""
        if self.anytime is not None:
            self.anytime.add(step, score)
            return True
        plan, self._plan = self._plan, None
        if self.means_test != "auto" or (plan is None and self._planned is None):
            return False
        if self._planned is None:
            assert plan is not None
            # From the run's start if this is its first eval; a plan that arrives mid-run spends from here on.
            self._planned = self._new_planned(plan, 0 if first else step)
        var = None if spread is None else spread[0] * spread[0] / spread[1]
        self._pending.append((step, score, plan, row, var))  # handed on when the test is read (class docstring)
        if len(self._pending) >= self.MAX_PENDING:
            self._flush()
        return True

    def _new_planned(self, plan: int, start: int) -> PlannedEvidence:
        """The per-run tests by planned progress, in every mode, with the detector's parameters."""
        return PlannedEvidence(
            self.run_alpha,
            self.frac,
            self.min_evals,
            self.rel_drop,
            plan,
            start,
            evidence_alpha=self.evidence_run_alpha,
            evidence_drop=self.evidence_rel_drop,
            power=self.spend_power,
        )

    def decides(self, mode: EvidenceMode) -> bool:
        """Whether the last eval's decision in ``mode`` was (or would be) a per-run test's."""
        if self.anytime is not None:
            return mode is EvidenceMode.MEANS_ONLY
        return self._planned is not None  # which test decides, not its state: nothing pending is fed here

    def reason(self, mode: EvidenceMode, p: str, slope: str, declines: int, k: int) -> str:
        """The reason of a decision by :meth:`decides`'s test (planned progress in any mode, or the anytime one)."""
        progress = self.test
        assert progress is not None
        if isinstance(progress, PlannedSlope):
            where = (
                f"the last {self.frac:.0%} of planned progress ({progress.planned_steps} planned steps, now at "
                f"{progress.progress():.0%}; level spent by progress^{progress.power:g})"
            )
        else:
            where = f"the last {self.frac:.0%} of the steps so far (level spent over epochs of steps)"
        test, level, run_alpha, rel_drop = "pooled-noise t", progress.look_alpha(), self.run_alpha, self.rel_drop
        if isinstance(progress, PlannedEvidence) and mode is not EvidenceMode.MEANS_ONLY:
            test = "paired t" if mode is EvidenceMode.PER_EXAMPLE else "known-variance z"
            level, run_alpha, rel_drop = progress.evidence_level(), self.evidence_run_alpha, self.evidence_rel_drop
        return (
            f"score falling over {where} ({len(progress.steps)} evals, slope {slope} per step, {test} test "
            f"p={p}, alpha={level:.3g} of run_alpha={run_alpha:g}, rel_drop={rel_drop:g}, "
            f"{declines} consecutive, k={k})"
        )

    def params(self) -> dict[str, Any]:
        """The per-run tests' parameters: with ``"progress"`` all three; with ``"auto"`` those off their defaults (so
        the default's spec, and every spec written before the planned test, is unchanged)."""
        own = {
            "run_alpha": self.run_alpha,
            "frac": self.frac,
            "rel_drop": self.rel_drop,
            "evidence_run_alpha": self.evidence_run_alpha,
            "evidence_rel_drop": self.evidence_rel_drop,
            "spend_power": self.spend_power,
        }
        if self.means_test == "progress":
            return {k: own[k] for k in ("run_alpha", "frac", "rel_drop")}
        if self.means_test == "auto":
            return {k: v for k, v in own.items() if v != PROGRESS_DEFAULTS[k]}
        return {}

    def state_into(self, state: dict[str, Any]) -> None:
        """Add the tests' state to the detector's (``progress``/``planned``, each only when that test exists)."""
        if self.anytime is not None:
            state["progress"] = self.anytime.state_dict()
        if self.planned is not None:  # only once a plan arrived: states of runs without one are unchanged
            state["planned"] = self.planned.state_dict()

    def load(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_into` wrote."""
        if self.anytime is not None:
            self.anytime.load_state_dict(state["progress"])
        planned = state.get("planned")
        self._planned, self._pending = None, []
        if planned is not None:
            self._planned = self._new_planned(1, 0)
            self._planned.load_state_dict(planned)
        self._plan = None
