"""A model-based stop detector: which curve shape explains the eval history, overoptimization or a healthy rise?

The rules ``k-decline-se``, ``paired-test``, ``cusum`` and ``trend`` look only at drops (of the mean, or against the
best checkpoint). At high eval noise a drop is small against the noise for several evals after the true peak, so they
must wait. But the *shape* of the whole history is informative too: under reward overoptimization the gold score follows
Gao et al.'s (2023) RL form ``R(d) = d (a - b ln d)``, which rises, flattens, peaks and falls, while a healthy run
rises and saturates (it may plateau, but it does not turn down). :class:`ShapeDetector` compares the two families on
the history of eval means by Bayesian model comparison and stops when the posterior probability that the run is
overoptimizing *and already past its peak* is high.

The model, on the history ``(s_i, y_i)`` of steps and means up to the current eval ``s_t`` (steps are rescaled to
``u = s / s_t``, so nothing depends on the run's length, which the detector does not know):

- *overoptimization*: ``y = a + h z (1 - ln z)`` with ``z = (u / u_peak) ** gamma``, ``h > 0``; Gao's form with
  ``d`` growing as a power of the step. ``u_peak`` on a log grid from the first eval to ``future`` times the current
  step (peaks not reached yet are part of this family), ``gamma`` on :data:`GAMMAS`.
- *healthy*: ``y = a + g (1 - exp(-(u / tau) ** beta))``, ``g >= 0``: saturating (``beta = 1``) or S-shaped
  (``beta > 1``: slow start, fast rise, saturation, as the real GRPO runs on gold) rises; ``tau`` on a log grid from
  0.02 (converged at once, then flat) to 20 (linear), ``beta`` on :data:`GAMMAS` (the same flexibility at the start
  as the overoptimization family).
- Gaussian noise of known standard deviation on each mean (below). The linear coefficients ``(a, h)`` or ``(a, g)``
  are fitted by least squares for each grid point (both families have two, so profiling them favours neither); the
  grid points are averaged with equal prior weight within each family, and the families have equal prior weight.

The posterior of "overoptimizing, with the curve's peak at or before the previous eval" must exceed ``threshold`` at
``k`` consecutive evals, and the current mean must be below the best mean so far (so a score that never falls below
its best never stops a job, whatever its shape).

**Noise.** The likelihood needs the standard error of one eval mean *as it varies from checkpoint to checkpoint*. With
per-example scores it is the paired one: the per-example differences between consecutive evals, ``var(d) / (2 n)``,
pooled over the history (the examples' fixed difficulty cancels; the plain standard error of one eval would overstate
it). Without them, the ``se`` parameter, else the estimate from the history of means
(:func:`~platform_sim.core.detectors.noise.se_from_history`), with a warning once per detector; while the noise is
unknown an eval decides nothing.

**When not to use it.** Its power comes from the shapes: a run whose healthy curve turns down a little (a real,
small decline) is "overoptimizing" to this model. The comparison with the other detectors, on synthetic and on the
recorded real traces, is in ``docs/results/detectors-synthetic.md`` and ``docs/results/detector-selection.md``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np

from ..checks import check_int, check_nonneg, check_optional_nonneg, check_prob
from .base import EvidenceDetector, Spread
from .noise import mean_noise, paired_difference_var
from .pvalues import scipy_module
from .registry import register_detector

#: Growth exponents of Gao's ``d`` in the step that the overoptimization family spans.
GAMMAS: tuple[float, ...] = (1.0, 1.5, 2.0, 3.0, 4.0)
#: Saturation constants (in units of the current step) that the healthy family spans.
TAUS: tuple[float, ...] = tuple(float(t) for t in np.geomspace(0.02, 20.0, 31))
#: Peak positions per decade of the overoptimization family's log grid.
PEAKS_PER_DECADE = 24

#: Parameters of ``shape-sens``, the sensitive calibration of ``shape`` (docs/results/detectors-synthetic.md): it takes a flattening
#: curve for a peak, right where healthy runs keep rising until the end, wrong where they plateau.
SHAPE_SENS_PARAMS: Mapping[str, Any] = MappingProxyType({"threshold": 0.7, "future": 1.5, "min_tau": 2.0})


def shape_sens_spec() -> dict[str, Any]:
    """The detector spec of ``shape-sens`` (a new dict at each call, so a caller may change it freely)."""
    return {"name": "shape", "params": dict(SHAPE_SENS_PARAMS)}


def _fit_rss(y: np.ndarray, basis: np.ndarray) -> np.ndarray:
    """Residual sum of squares of ``y ~ a + c * basis[j]`` for every row ``j`` of ``basis``, with ``c >= 0``.

    Closed-form least squares per row; where the unconstrained slope is negative the fit is ``c = 0`` (a constant).
    """
    yc = y - y.mean()
    bc = basis - basis.mean(axis=1, keepdims=True)
    sxx = np.einsum("ij,ij->i", bc, bc)
    sxy = bc @ yc
    syy = float(yc @ yc)
    with np.errstate(divide="ignore", invalid="ignore"):
        gain = np.where((sxx > 1e-300) & (sxy > 0.0), sxy * sxy / sxx, 0.0)
    return np.maximum(syy - gain, 0.0)


@register_detector
class ShapeDetector(EvidenceDetector):
    """Stop when the eval history is better explained by an overoptimization curve past its peak than by a healthy rise.

    See the module docstring for the model. Each eval refits the whole history: about 450 two-parameter least-squares
    fits, vectorized (0.4 ms per eval on average over a 20-eval run, 0.7 ms over 100 evals; ``docs/benchmarks.md``).

    Args:
        threshold: Posterior probability of "overoptimizing and past the peak" that counts as evidence, strictly
            between 0 and 1.
        k: Consecutive evals with evidence that stop the job. Integer >= 1.
        min_evals: Evals needed before the models are compared (a shape needs a few points). Integer >= 3.
        future: How far beyond the current step the overoptimization family's peak may lie, as a multiple of the
            current step (> 1).
        min_tau: Smallest saturation constant of the healthy family, in units of the current step (default: the
            grid's smallest, 0.02: healthy runs may converge at once and stay flat). Larger values assume that
            healthy runs are still rising, which makes a flattening curve evidence of overoptimization: more power
            at high noise, false stops on healthy plateaus. At most 20.
        se: Standard error of one eval mean to use when evals have no per-example scores. None: estimate it from the
            history of means. Finite, >= 0.
        warmup: The first ``warmup`` evals never count as evidence (0: none), as ``k-decline``'s ``warmup``.
            Integer >= 0.
        behind: The overoptimization curve's peak counts as passed when it lies at or before the eval ``behind``
            evals back: 1 (the default), the previous eval; 0, the current one. With 0 the shapes alone can place
            the peak behind the current eval, so a job can stop at its first eval below its best, one eval sooner;
            it suits low noise, where the rise's curvature pins the peak. Integer 0 or 1.
    """

    name: ClassVar[str] = "shape"
    uses_example_scores: ClassVar[bool] = True
    keeps_extra_evals: ClassVar[bool] = True  # each eval is a point of the curve at its own step: more is evidence

    def __init__(
        self,
        threshold: float = 0.95,
        k: int = 1,
        min_evals: int = 5,
        future: float = 3.0,
        min_tau: float = TAUS[0],
        se: float | None = None,
        warmup: int = 0,
        behind: int = 1,
    ) -> None:
        self.threshold = check_prob("threshold", threshold)
        super().__init__(k, warmup)
        self.min_evals = check_int("min_evals", min_evals, 3)
        self.future = check_nonneg("future", future)
        if not self.future > 1.0 or not math.isfinite(self.future):
            raise ValueError(f"future must be a finite number > 1, got {future!r}")
        self.min_tau = check_nonneg("min_tau", min_tau)
        if not self.min_tau <= TAUS[-1]:
            raise ValueError(f"min_tau must be at most {TAUS[-1]:g}, got {min_tau!r}")
        self.se = check_optional_nonneg("se", se)
        self.behind = check_int("behind", behind, 0)
        if self.behind > 1:
            raise ValueError(f"behind must be 0 (the current eval) or 1 (the previous one), got {behind!r}")
        self.steps: list[int] = []
        self.means: list[float] = []
        self.prev_scores: list[float] | None = None
        self.paired_var_sum = 0.0  # sum over consecutive pairs of var(per-example difference) / (2 n)
        self.paired_pairs = 0
        self.last_posterior: float | None = None  # the last eval's posterior (None: too few evals or unknown noise)

    # -- noise ---------------------------------------------------------------------------------------------------

    def _update_noise(self, scores: Sequence[float] | None) -> None:
        cur = None if scores is None or len(scores) < 2 else [float(s) for s in scores]
        if cur is not None and self.prev_scores is not None and len(self.prev_scores) == len(cur):
            self.paired_var_sum += paired_difference_var(cur, self.prev_scores) / (2.0 * len(cur))
            self.paired_pairs += 1
        elif self.means:
            why = (
                "no per-example eval scores"
                if cur is None or self.prev_scores is None
                else "the number of per-example eval scores changed, so they cannot be paired"
            )
            self._warn_fallback(why, "noise from the se parameter or the history of means; ")
        self.prev_scores = cur

    def noise_sd(self) -> float | None:
        """Standard deviation of one eval mean from checkpoint to checkpoint (None while unknown)."""
        if self.paired_pairs:
            return math.sqrt(self.paired_var_sum / self.paired_pairs)
        return mean_noise(self.se, self.means)

    # -- the model comparison -------------------------------------------------------------------------------------

    def posterior_past_peak(self) -> float | None:
        """P(overoptimizing and past the peak | history), or None with too few evals or an unknown noise."""
        n = len(self.means)
        sd = self.noise_sd()
        if n < self.min_evals or sd is None:
            return None
        y = np.asarray(self.means, dtype=float)
        steps = np.asarray(self.steps, dtype=float)
        if steps[0] <= 0:  # both families start at step 0; an eval at step 0 moves the origin one interval back
            steps = steps - steps[0] + (steps[1] - steps[0])
        u = steps / steps[-1]
        var = max(sd * sd, 1e-12 * max(1.0, float(np.abs(y).max())) ** 2)  # a zero noise estimate: near-exact fits
        # Healthy: saturating (beta = 1) or S-shaped (beta > 1) rises.
        taus = np.asarray([t for t in TAUS if t >= self.min_tau] or [TAUS[-1]])[:, None, None]
        betas = np.asarray(GAMMAS)[None, :, None]
        rise = 1.0 - np.exp(-((u[None, None, :] / taus) ** betas))
        healthy = -0.5 * _fit_rss(y, rise.reshape(-1, n)) / var
        # Overoptimization: Gao's form over (u_peak, gamma).
        lo = math.log10(float(u[0]))
        count = max(2, int(round((math.log10(self.future) - lo) * PEAKS_PER_DECADE)) + 1)
        peaks = np.logspace(lo, math.log10(self.future), count)
        gam = np.asarray(GAMMAS)
        z = (u[None, None, :] / peaks[:, None, None]) ** gam[None, :, None]
        shape = z * (1.0 - np.log(z))
        hack = -0.5 * _fit_rss(y, shape.reshape(-1, n)).reshape(peaks.size, gam.size) / var
        passed = peaks <= u[-1 - self.behind]  # the curve's peak lies at or before that eval: it is behind us
        # log P(family) + log mean likelihood over its grid; the two families have equal prior weight.
        if not passed.any():
            return 0.0
        logsumexp = scipy_module("special").logsumexp
        log_h = float(logsumexp(healthy)) - math.log(healthy.size)
        log_o = float(logsumexp(hack)) - math.log(hack.size)
        log_o_passed = float(logsumexp(hack[passed])) - math.log(hack.size)
        return math.exp(log_o_passed - float(np.logaddexp(log_h, log_o)))

    def _evidence(
        self, step: int, score: float, scores: Sequence[float] | None, counts: bool, spread: Spread | None = None
    ) -> bool:
        self._update_noise(scores)
        below_best = bool(self.means) and score < max(self.means)
        self.steps.append(int(step))
        self.means.append(float(score))
        self.last_posterior = self.posterior_past_peak()
        return self.last_posterior is not None and self.last_posterior > self.threshold and below_best

    def doubt(self) -> float | None:
        """One minus the last posterior that the job overoptimizes and is past its peak (None before one)."""
        return None if self.last_posterior is None else 1.0 - self.last_posterior

    def reason(self) -> str:
        post = "n/a" if self.last_posterior is None else f"{self.last_posterior:.3f}"
        return (
            f"overoptimization past its peak at posterior {post} > {self.threshold:g} "
            f"for {self.declines} consecutive evals (k={self.k})"
        )

    def params(self) -> dict[str, Any]:
        params = {
            "threshold": self.threshold,
            "k": self.k,
            "min_evals": self.min_evals,
            "future": self.future,
            "min_tau": self.min_tau,
            "se": self.se,
            "warmup": self.warmup,
        }
        if self.behind != 1:  # only when not the default, so that specs written before it existed read the same
            params["behind"] = self.behind
        return params

    def _rule_state(self) -> dict[str, Any]:
        return {
            "steps": list(self.steps),
            "means": list(self.means),
            "prev_scores": None if self.prev_scores is None else list(self.prev_scores),
            "paired_var_sum": self.paired_var_sum,
            "paired_pairs": self.paired_pairs,
            "last_posterior": self.last_posterior,
        }

    def _load_rule_state(self, state: Mapping[str, Any]) -> None:
        self.steps = [int(s) for s in state["steps"]]
        self.means = [float(m) for m in state["means"]]
        self.prev_scores = None if state["prev_scores"] is None else [float(v) for v in state["prev_scores"]]
        self.paired_var_sum = float(state["paired_var_sum"])
        self.paired_pairs = int(state["paired_pairs"])
        self.last_posterior = None if state["last_posterior"] is None else float(state["last_posterior"])

    def _records_seen(self) -> bool:
        return False  # one mean per eval seen: the history tells it

    def _seen_from_state(self, state: Mapping[str, Any]) -> int:
        return len(state["means"])
