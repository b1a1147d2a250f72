"""The pure scheduler core: decline detectors, per-job monitors, the information boundary and scheduling policies.

No I/O, no torch, no HTTP: everything else imports this package, and it imports nothing of theirs.
"""

from .boundary import (
    JOB_TYPES,
    Action,
    BoundaryError,
    ConflictError,
    Decision,
    EvidenceMode,
    InvalidReportError,
    Report,
)
from .cadence import CADENCES, CadencePolicy, EvalBudget, cadence_from_spec
from .checks import check_int
from .detectors import (  # importing the package registers every detector by name
    DETECTORS,
    CusumDetector,
    Detector,
    EvidenceDetector,
    KDeclineDetector,
    KDeclineSEDetector,
    PairedTestDetector,
    ShapeDetector,
    TrendDetector,
    Verdict,
    default_spec,
    detector_from_spec,
    make_detector,
    paper_spec,
    register_detector,
    shape_sens_spec,
    spec_plan_matters,
)
from .monitor import JobMonitor

__all__ = [
    "JOB_TYPES",
    "Action",
    "BoundaryError",
    "CADENCES",
    "CadencePolicy",
    "ConflictError",
    "CusumDetector",
    "DETECTORS",
    "Decision",
    "Detector",
    "EvalBudget",
    "EvidenceDetector",
    "EvidenceMode",
    "InvalidReportError",
    "JobMonitor",
    "KDeclineDetector",
    "KDeclineSEDetector",
    "PairedTestDetector",
    "Report",
    "ShapeDetector",
    "TrendDetector",
    "Verdict",
    "cadence_from_spec",
    "check_int",
    "default_spec",
    "detector_from_spec",
    "paper_spec",
    "make_detector",
    "register_detector",
    "shape_sens_spec",
    "spec_plan_matters",
]
