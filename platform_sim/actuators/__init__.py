"""Scheduler actuators: end or suspend a stopped job through the scheduler that runs it (see :mod:`.base`)."""

from .base import ActionResult, Actuator, HandleError, HandleRefused, SchedulerHandle, TenantScope

__all__ = ["ActionResult", "Actuator", "HandleError", "HandleRefused", "SchedulerHandle", "TenantScope"]
