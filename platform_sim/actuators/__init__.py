"""Scheduler actuators: end or suspend a stopped job through the scheduler that runs it (see :mod:`.base`).

:func:`make_actuator` builds one by its kind. Each scheduler has one module here (``slurm``, ``kubernetes``,
``ray``) exposing ``build(options) -> Actuator``; a module is imported only when its kind is asked for, so that a
deployment without the Kubernetes client or Ray never imports them.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from .base import ActionResult, Actuator, HandleError, HandleRefused, SchedulerHandle, TenantScope

__all__ = [
    "KINDS",
    "ActionResult",
    "Actuator",
    "ActuatorUnavailable",
    "HandleError",
    "HandleRefused",
    "SchedulerHandle",
    "TenantScope",
    "make_actuator",
]

KINDS = {"slurm": "slurm", "kubernetes": "kubernetes", "ray": "ray"}
"""Each actuator kind and the module of this package that builds it."""


class ActuatorUnavailable(ValueError):
    """An actuator that cannot be built: an unknown kind, its module or a dependency missing, or bad options."""


def make_actuator(kind: str, options: Mapping[str, str] | None = None) -> Actuator:
    """Build the actuator of scheduler ``kind``.

    Args:
        kind: ``"slurm"``, ``"kubernetes"`` or ``"ray"``.
        options: Its configuration, ``key -> value`` as given on the command line (``--actuator-option
            address=http://...``); each module documents and checks its own keys.

    Raises:
        ActuatorUnavailable: ``kind`` is unknown, its module or one of its dependencies is not installed, or an
            option is refused; the message names which.
    """
    module_name = KINDS.get(kind)
    if module_name is None:
        raise ActuatorUnavailable(f"unknown actuator kind {kind!r}: choose from {', '.join(KINDS)}")
    try:
        module = importlib.import_module(f"{__name__}.{module_name}")
    except ImportError as exc:
        raise ActuatorUnavailable(
            f"the {kind} actuator cannot be loaded: {exc} (is its module or dependency installed?)"
        ) from exc
    build = getattr(module, "build", None)
    if build is None:
        raise ActuatorUnavailable(f"the {kind} actuator module {module.__name__} has no build(options)")
    try:
        return build(dict(options or {}))  # type: ignore[no-any-return]
    except ImportError as exc:
        raise ActuatorUnavailable(f"the {kind} actuator needs a dependency that is missing: {exc}") from exc
    except (ValueError, TypeError) as exc:
        raise ActuatorUnavailable(f"the {kind} actuator refused its options: {exc}") from exc
