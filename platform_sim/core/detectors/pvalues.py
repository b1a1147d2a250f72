"""One-sided p-values from scipy, which is imported only when a detector first needs a test.

Importing scipy takes about a second; the core is imported by every client and by the server, most of which never
run a test (the paper's rule needs none), so no module of the core imports it at import time.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence
from types import ModuleType

import numpy as np

# How far (in t units) a statistic must be from the critical value before scipy's test is skipped. The statistic
# below and scipy's agree to rounding (~1e-12), so with this margin a skipped test is always one that scipy would
# also find not significant: decisions are scipy's; only the cost of clearly hopeless calls is saved.
_T_SKIP_MARGIN = 0.25


_IMPORTED: dict[str, ModuleType] = {}
"""The scipy modules whose import has finished (an import cache, as ``sys.modules`` is, never cleared)."""


def scipy_module(name: str) -> ModuleType:
    """``scipy.<name>`` (``"stats"``, ``"special"``), imported on first use, then read from a cache of finished imports
    (``importlib.import_module`` costs a few microseconds per call even for a loaded module).

    Not ``sys.modules``: a module is there from the start of its import, so a thread that looked there while another
    was still importing it got a partially initialized module (``AttributeError: ... has no attribute 'stdtr'``: the
    service's report threads did). ``import_module`` waits for another thread's import of the module to finish.
    """
    module = _IMPORTED.get(name)
    if module is None:
        module = _IMPORTED[name] = importlib.import_module(f"scipy.{name}")
    return module


def one_sided_t_p(values: np.ndarray, alpha: float, crit_cache: dict[int, float]) -> float:
    """scipy's one-sided one-sample t-test p-value of "mean < 0" for ``values``, or 1.0 when clearly not significant.

    The value is ``scipy.stats.ttest_1samp(values, 0, alternative="less").pvalue`` computed with scipy's own
    operations (its mean, its variance as the mean squared deviation times ``n / (n - 1)``, Student's t cdf
    ``scipy.special.stdtr``), so the same number to the last bit (``tests/test_detectors_robust.py`` compares them),
    without the 0.5 ms of input handling per call that made the test most of the default detector's cost in the
    simulator. When the statistic lies more than a margin above the critical value ``t.ppf(alpha, n - 1)`` (cached
    per sample size), the test cannot reach ``alpha`` and 1.0 is returned.

    Args:
        values: The sample (at least 2 values, not all equal).
        alpha: The significance level the caller compares the p-value with.
        crit_cache: Per-detector cache of critical values by sample size.
    """
    special = scipy_module("special")
    n = values.size
    crit = crit_cache.get(n)
    if crit is None:
        crit = crit_cache[n] = float(special.stdtrit(n - 1, alpha))
    # np.mean's own arithmetic (the sum over the count) without its per-call overhead: the same numbers.
    mean = values.sum() / n
    dev = values - mean
    var = (dev * dev).sum() / n * (float(n) / (n - 1))
    scale = np.sqrt(var / n)
    if scale > 0.0:
        t = mean / scale  # the same division as np.divide, without the error-state context it needs at 0
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.divide(mean, scale)
    if t > crit + _T_SKIP_MARGIN:
        return 1.0
    return float(special.stdtr(n - 1, t))


def unchanged(values: Sequence[float] | np.ndarray) -> bool:
    """Whether every value is the first (an array of rows: every row is the first row), exactly.

    A slope fitted to values that did not change is zero, but computed at steps whose centring is inexact (steps
    ``(k * 2000) // 30``, or any whose mean is not a binary fraction) it comes out as round-off of either sign,
    about 1e-18 a step (and so, on the per-look tests' centred positions, for most values that are not short binary
    fractions). The tests that treat a zero-variance fall as certain evidence (every example falling by the same
    amount; noise-free means, every spread 0 or ``se=0``) ask this first, so that such a slope is never read as a
    fall."""
    a = np.asarray(values, dtype=float)
    return bool(a.size == 0 or (a == a[0]).all())  # a[0]: the first value, or the first row


_TINY = 1.0e-20  # scipy's guard against r = +-1 in the t statistic


def slope_less_p(x: np.ndarray, y: np.ndarray) -> float:
    """``scipy.stats.linregress(x, y, alternative="less").pvalue``: the one-sided p-value of "the slope of ``y`` on
    ``x`` is negative", with the noise estimated from the residuals of the fit.

    The same floating-point operations as scipy's ``linregress`` (the covariance matrix, the correlation clipped to
    [-1, 1], the t statistic, Student's t cdf), so the same value to the last bit, without its input handling: about
    20 us instead of 200 us. A detector without per-example scores runs this at nearly every eval below its best, in
    the scheduler service's writer thread. ``tests/test_core_pvalues.py`` compares the two on many samples.

    Args:
        x: The positions, at least 2, not all equal.
        y: The scores, finite, as many as ``x``.
    """
    n = x.size
    if n == 2:
        return 1.0 if y[0] == y[1] else 0.0
    ssxm, ssxym, _, ssym = np.cov(x, y, bias=True).flat  # scipy passes bias=1: the same
    if ssxm == 0.0 or ssym == 0.0:
        r = math.nan if ssxym == 0 else 0.0
    else:
        r = ssxym / np.sqrt(ssxm * ssym)
        if r > 1.0:  # as scipy: a NaN (overflow) stays NaN
            r = 1.0
        elif r < -1.0:
            r = -1.0
    df = n - 2
    t = r * np.sqrt(df / ((1.0 - r + _TINY) * (1.0 + r + _TINY)))
    return float(scipy_module("special").stdtr(df, t))
