"""Decline detectors: the one place where "should this job stop?" is computed from its eval history.

Every consumer (the trainer callback's embedded client, the HTTP service, the simulator) builds detectors through
:func:`make_detector` (or :func:`detector_from_spec`) and feeds them through
:class:`~platform_sim.core.monitor.JobMonitor`, so there is exactly one implementation of each rule. Detectors assume
validated input (finite scores, strictly increasing steps); the monitor does the validation.

A detector's whole state is a plain dict (:meth:`Detector.state_dict`) so that the service can persist it and a
trainer can resume it from a checkpoint.

Layout: :mod:`.base` (the interface, :class:`Verdict`, and :class:`EvidenceDetector`, which owns the warm-up, the
count of consecutive evals with evidence and the common state), :mod:`.registry` (names, factory, specs),
:mod:`.noise` (noise estimates), :mod:`.pvalues` (scipy's tests, imported on first use), and one module per detector
holding its evidence rule: :mod:`.kdecline`, :mod:`.kdecline_se`, :mod:`.paired_test`, :mod:`.cusum`, :mod:`.trend`,
:mod:`.shape` (with the ``shape-sens`` preset). Importing the package registers every detector by name.
"""

from .base import Detector, EvidenceDetector, Spread, Verdict
from .bounds import PARAM_BOUNDS, check_param_bounds
from .cusum import CusumDetector
from .kdecline import KDeclineDetector
from .kdecline_se import KDeclineSEDetector
from .noise import MIN_HISTORY_FOR_SE, mean_noise, paired_difference_var, se_from_history, standard_error
from .paired_test import PAIRED_TESTS, PairedTestDetector
from .pvalues import one_sided_t_p
from .registry import (
    DEFAULT_DETECTOR,
    DEFAULT_SPEC,
    DETECTORS,
    PAPER_SPEC,
    DetectorFactory,
    default_spec,
    detector_from_spec,
    make_detector,
    paper_spec,
    parse_detector_param,
    register_detector,
    spec_plan_matters,
)
from .shape import GAMMAS, PEAKS_PER_DECADE, SHAPE_SENS_PARAMS, TAUS, ShapeDetector, shape_sens_spec
from .trend import TREND_TESTS, TrendDetector

__all__ = [
    "DEFAULT_DETECTOR",
    "DEFAULT_SPEC",
    "PAPER_SPEC",
    "PARAM_BOUNDS",
    "check_param_bounds",
    "default_spec",
    "paper_spec",
    "DETECTORS",
    "GAMMAS",
    "MIN_HISTORY_FOR_SE",
    "PAIRED_TESTS",
    "PEAKS_PER_DECADE",
    "SHAPE_SENS_PARAMS",
    "TAUS",
    "TREND_TESTS",
    "CusumDetector",
    "Detector",
    "DetectorFactory",
    "EvidenceDetector",
    "KDeclineDetector",
    "KDeclineSEDetector",
    "PairedTestDetector",
    "ShapeDetector",
    "Spread",
    "TrendDetector",
    "Verdict",
    "detector_from_spec",
    "make_detector",
    "mean_noise",
    "one_sided_t_p",
    "paired_difference_var",
    "parse_detector_param",
    "register_detector",
    "spec_plan_matters",
    "se_from_history",
    "shape_sens_spec",
    "standard_error",
]
