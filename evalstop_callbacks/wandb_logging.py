"""wandb logging of the stop: a wandb alert and run-summary fields when EvalStop stops a run.

The per-evaluation ``evalstop/*`` values reach wandb (and every other ``report_to`` backend) through the trainer's
own logs; this module adds what a log line cannot carry. Active only when the trainer reports to wandb
(``"wandb" in args.report_to``) and a run is open (transformers'
``WandbCallback`` opens it in ``on_train_begin``, before user callbacks run).
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


def reports_to(args: Any, name: str) -> bool:
    report_to = getattr(args, "report_to", None) or []
    if isinstance(report_to, str):
        report_to = [report_to]
    return name in report_to or "all" in report_to


class WandbLogger:
    """Writes the stop into the active wandb run (summary fields and an alert).

    Args:
        enabled: Whether the trainer reports to wandb; when False every method is a no-op.
    """

    def __init__(self, enabled: bool) -> None:
        self._wandb: Any = None
        if enabled:
            try:
                import wandb
            except ImportError:
                logger.warning("report_to includes wandb but wandb is not installed; evalstop will not log to it")
            else:
                self._wandb = wandb

    @property
    def active(self) -> bool:
        return self._wandb is not None and self._wandb.run is not None

    def on_stop(self, step: int, reason: str, best_step: int | None, best_score: float | None) -> None:
        if not self.active:
            return
        run = self._wandb.run
        run.summary["evalstop/stopped_at"] = step
        run.summary["evalstop/stop_reason"] = reason
        run.summary["evalstop/best_step"] = best_step
        run.summary["evalstop/best_score"] = best_score
        try:
            self._wandb.alert(
                title="EvalStop stopped training",
                text=f"Stopped at step {step}: {reason}. Best checkpoint: step {best_step} (score {best_score}).",
                level=self._wandb.AlertLevel.WARN,
            )
        except Exception as exc:  # noqa: BLE001 - an alert failure (offline, no permission) must not kill training
            logger.warning("wandb alert failed: %s", exc)
