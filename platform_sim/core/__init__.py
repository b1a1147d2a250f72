"""The pure scheduler core: decline detectors, per-job monitors, the information boundary and scheduling policies.

No I/O, no torch, no HTTP: everything else imports this package, and it imports nothing of theirs.
"""

from .boundary import (
    JOB_TYPES,
    Action,
    BoundaryError,
    ConflictError,
    Decision,
    InvalidReportError,
    Report,
)
from .detectors import DETECTORS, Detector, KDeclineDetector, detector_from_spec, make_detector, register_detector
from .monitor import JobMonitor
from .robust_detectors import (  # importing registers them by name
    CusumDetector,
    KDeclineSEDetector,
    PairedTestDetector,
    TrendDetector,
)
from .shape_detector import ShapeDetector  # importing registers it by name

__all__ = [
    "JOB_TYPES",
    "Action",
    "BoundaryError",
    "ConflictError",
    "CusumDetector",
    "DETECTORS",
    "Decision",
    "Detector",
    "InvalidReportError",
    "JobMonitor",
    "KDeclineDetector",
    "KDeclineSEDetector",
    "PairedTestDetector",
    "Report",
    "ShapeDetector",
    "TrendDetector",
    "detector_from_spec",
    "make_detector",
    "register_detector",
]
