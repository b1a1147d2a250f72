"""One-sided p-values from scipy, which is imported only when a detector first needs a test.

Importing scipy takes about a second; the core is imported by every client and by the server, most of which never
run a test (the paper's rule needs none), so no module of the core imports it at import time.
"""

from __future__ import annotations

import importlib
import math
from types import ModuleType

import numpy as np

# How far (in t units) a statistic must be from the critical value before scipy's test is skipped. The statistic
# below and scipy's agree to rounding (~1e-12), so with this margin a skipped test is always one that scipy would
# also find not significant: decisions are scipy's; only the cost of clearly hopeless calls is saved.
_T_SKIP_MARGIN = 0.25


def scipy_module(name: str) -> ModuleType:
    """``scipy.<name>`` (``"stats"``, ``"special"``), imported on first use (then from ``sys.modules``)."""
    return importlib.import_module(f"scipy.{name}")


def one_sided_t_p(values: np.ndarray, alpha: float, crit_cache: dict[int, float]) -> float:
    """scipy's one-sided one-sample t-test p-value of "mean < 0" for ``values``, or 1.0 when clearly not significant.

    scipy's tests cost about a millisecond per call, most of it overhead, and a detector may run one at every eval
    of every job. The t statistic is computed first; when it lies more than a margin above scipy's critical value
    ``t.ppf(alpha, n - 1)`` (cached per sample size), the test cannot reach ``alpha`` and 1.0 is returned without
    calling it. Otherwise the p-value is ``scipy.stats.ttest_1samp(values, 0, alternative="less").pvalue``.

    Args:
        values: The sample (at least 2 values, not all equal).
        alpha: The significance level the caller compares the p-value with.
        crit_cache: Per-detector cache of critical values by sample size.
    """
    n = values.size
    crit = crit_cache.get(n)
    if crit is None:
        crit = crit_cache[n] = float(scipy_module("stats").t.ppf(alpha, n - 1))
    sd = float(values.std(ddof=1))
    if sd > 0.0 and float(values.mean()) / (sd / math.sqrt(n)) > crit + _T_SKIP_MARGIN:
        return 1.0
    return float(scipy_module("stats").ttest_1samp(values, 0.0, alternative="less").pvalue)
