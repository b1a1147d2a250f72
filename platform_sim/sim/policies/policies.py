"""Base scheduling policies: who gets the GPUs. Pure ranking rules over read-only :class:`JobView` objects.

A base policy ranks jobs by a *key* (lower runs first). The owner of the cluster (the simulator engine) does the
mechanics: gang allocation of a pooled GPU count, greedy start in key order with backfill (a job that fits starts even
if a better-ranked one does not), and preemption where the policy asks for it. Keeping the policies to a key and two
flags is what lets the engine rank incrementally (heaps instead of a full re-sort at every event) and what lets the
EvalStop wrapper compose with any of them.

Policies:

- ``fifo``: submit order, non-preemptive.
- ``sjf-est``: shortest user *estimate* first, non-preemptive.
- ``srtf-est``: shortest estimated remaining time (estimate x (1 - progress)) first; preemptive when a job arrives
  (a running job with a longer estimated remainder yields its GPUs; resuming costs the preemption cost, 2 minutes).
- ``loss-aware``: SLAQ-like; jobs with the largest recent normalized loss reduction per unit of progress first, jobs
  with no loss history yet before all others (in submit order); preemptive at a running job's eval, when a waiting
  job ranks better and fits in the GPUs it would free.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from platform_sim.core.checks import check_nonneg

from .views import JobView

PREEMPTION_COST_H: float = 2.0 / 60.0
"""Preemption and resume cost (docs/design.md section 5): a resumed job holds its GPUs this long before it progresses."""


class BasePolicy(ABC):
    """Interface of a base scheduling policy.

    Subclasses set :attr:`name`, :attr:`preempt_on_arrival` and :attr:`preempt_on_eval` and implement :meth:`key`.
    A key must not change while a job waits (the engine keeps waiting jobs in heaps); for a running job of a policy
    with ``preempt_on_arrival`` it may only decrease over time (the engine keeps running jobs in a lazy max-heap of
    upper bounds).
    """

    name: ClassVar[str]
    preempt_on_arrival: ClassVar[bool] = False
    preempt_on_eval: ClassVar[bool] = False

    @abstractmethod
    def key(self, job: JobView) -> float:
        """Rank of ``job`` (lower runs first), from its observable state as of its last update."""

    def should_yield(self, running_key: float, waiting_key: float) -> bool:
        """At an eval of a running job (policies with :attr:`preempt_on_eval`): whether it yields its GPUs.

        Args:
            running_key: The running job's key.
            waiting_key: The key of the best-ranked waiting job that would fit in the GPUs it frees.

        Returns:
            False here (a running job keeps its GPUs); policies that preempt at evals override it.
        """
        return False

    def params(self) -> dict[str, Any]:
        return {}

    def describe(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class FIFO(BasePolicy):
    """First in, first out (with backfill), non-preemptive."""

    name: ClassVar[str] = "fifo"

    def key(self, job: JobView) -> float:
        return job.submit_time


class SJFEst(BasePolicy):
    """Shortest job first by the user's duration estimate, non-preemptive."""

    name: ClassVar[str] = "sjf-est"

    def key(self, job: JobView) -> float:
        return job.est_duration_h


class SRTFEst(BasePolicy):
    """Shortest estimated remaining time first, preemptive on arrival.

    The key ``est_duration_h * (1 - progress)`` is constant while a job waits and only falls while it runs, which is
    what makes incremental ranking exact.
    """

    name: ClassVar[str] = "srtf-est"
    preempt_on_arrival: ClassVar[bool] = True

    def key(self, job: JobView) -> float:
        return job.est_duration_h * (1.0 - job.progress)


class LossAware(BasePolicy):
    """SLAQ-like quality-driven scheduling on the recent normalized training-loss reduction.

    The reduction is ``(loss[-2] - loss[-1]) / loss[0]`` divided by the progress between the two evals; a job with
    fewer than two losses has not shown its slope yet and ranks before all others (key ``-inf``; ties by the engine's
    submit order), as SLAQ gives new jobs resources first.

    Args:
        margin: Relative margin a waiting job's reduction must exceed a running job's by to preempt it at its eval
            (hysteresis against thrashing). Finite, >= 0.
    """

    name: ClassVar[str] = "loss-aware"
    preempt_on_eval: ClassVar[bool] = True

    def __init__(self, margin: float = 0.25) -> None:
        self.margin = check_nonneg("margin", margin)

    def reduction(self, job: JobView) -> float | None:
        history = job.loss_history
        if len(history) < 2 or job.n_evals < 2:
            return None
        losses, first = history[-2:], history[0]
        steps = job.eval_steps[-2:]
        dp = (steps[1] - steps[0]) / max(job.planned_steps, 1)
        if first <= 0 or dp <= 0:
            return 0.0
        return (losses[0] - losses[1]) / first / dp

    def key(self, job: JobView) -> float:
        r = self.reduction(job)
        return -math.inf if r is None else -r

    def should_yield(self, running_key: float, waiting_key: float) -> bool:
        """Whether a running job with ``running_key`` yields to a waiting job with ``waiting_key``.

        Args:
            running_key: The running job's key.
            waiting_key: The best-ranked waiting job's key.
        """
        if waiting_key == -math.inf:
            return running_key > -math.inf
        # keys are negative reductions: the waiting job must reduce more than (1 + margin) x the running one.
        return -waiting_key > -running_key * (1.0 + self.margin) and waiting_key < running_key

    def params(self) -> dict[str, Any]:
        return {"margin": self.margin}


BASE_POLICIES: dict[str, type[BasePolicy]] = {cls.name: cls for cls in (FIFO, SJFEst, SRTFEst, LossAware)}


def make_base_policy(name: str, **params: Any) -> BasePolicy:
    """Build a base policy by name (``fifo``, ``sjf-est``, ``srtf-est``, ``loss-aware``)."""
    try:
        cls = BASE_POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown base scheduler {name!r}; choose one of {', '.join(BASE_POLICIES)}") from None
    return cls(**params)
