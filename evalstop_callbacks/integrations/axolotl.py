"""``EvalStopPlugin``: EvalStop in an Axolotl run, from its YAML config.

Add the plugin to the config's ``plugins:`` list and set ``evalstop_*`` keys next to Axolotl's own::

    plugins:
      - evalstop_callbacks.integrations.axolotl.EvalStopPlugin
    evalstop_evaluator: my_evals:world_evaluator   # module:attr of an Evaluator, or of a callable returning one
    evalstop_eval_steps: 2
    evalstop_detector: k-decline

The keys are those of :class:`~evalstop_callbacks.integrations.options.EvalStopOptions` with the ``evalstop_``
prefix. Axolotl's config model takes them through :class:`EvalStopArgs` (the plugin's ``get_input_args``); the plugin
checks them itself when Axolotl registers it, before any model is loaded, because Axolotl's model drops keys it does
not know: a misspelt ``evalstop_*`` key or a wrong value ends the run there with one line naming the key. The
installed Axolotl release is checked then too.

After Axolotl builds its trainer, :meth:`EvalStopPlugin.add_callbacks_post_trainer` attaches the
:class:`~evalstop_callbacks.EvalStopCallback` to it (``cb.attach(trainer)``: the callback joins the trainer's
callbacks, its ``evalstop/*`` values reach every ``report_to`` backend, and the evaluator is checked against the
trainer now). Axolotl's SFT and preference (DPO, IPO, KTO, ORPO) trainers run the transformers loop, so the callback
stops the run at the decline, and the weights Axolotl saves at the end (``output_dir``) are the best ones, which the
callback restored. At the end of training the plugin logs a summary (stopped or not, at which step, the best step
and its score in the metric's units, where the best weights are) through the ``axolotl.integrations.evalstop``
logger, which Axolotl's log filter shows at INFO (it drops other packages' INFO lines).

An evaluator module that sits next to the config file is found there (``evalstop_evaluator: my_evals:evaluator``
with ``my_evals.py`` beside ``config.yaml``). A wrong ``evalstop_*`` key ends the run with one line, no traceback.

Note: Axolotl skips a plugin whose module fails to import, with a logged error and no stop (its ``PluginManager``
catches the ``ImportError``): the training environment must have ``evalstop`` installed.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

from axolotl.integrations.base import BasePlugin
from pydantic import BaseModel

from ..outcome import run_summary, summary_text
from .options import EvalStopOptions, OptionsError, build_callback, check_version, exit_in_one_line, parse_options

logger = logging.getLogger(__name__)

#: The summary's logger: under ``axolotl.``, the one namespace whose INFO lines Axolotl's log filter lets through.
summary_logger = logging.getLogger("axolotl.integrations.evalstop")

#: The Axolotl releases this plugin is tested with: ``>=TESTED[0],<TESTED[1]``. 0.19 is the newest release that runs
#: on Python 3.11 (0.20 needs 3.12).
TESTED: tuple[str, str] = ("0.19.0", "0.20")

#: What the plugin's keys start with in Axolotl's config.
PREFIX = "evalstop_"

_RL_JOB_TYPES = {"dpo": "dpo", "ipo": "dpo", "simpo": "dpo", "kto": "dpo", "orpo": "dpo", "grpo": "rlhf", "ppo": "rlhf"}


class EvalStopArgs(BaseModel):
    """The plugin's keys in Axolotl's config model (each one as in
    :class:`~evalstop_callbacks.integrations.options.EvalStopOptions`; unset keys keep the callback's defaults)."""

    evalstop_evaluator: str | None = None
    evalstop_eval_steps: int | Literal["epoch"] | None = None
    evalstop_detector: str | dict[str, Any] | None = None
    evalstop_k: int | None = None
    evalstop_min_delta: float | None = None
    evalstop_mode: Literal["enforce", "observe"] | None = None
    evalstop_job_id: str | None = None
    evalstop_job_type: Literal["rlhf", "dpo", "lora", "sft", "other"] | None = None
    evalstop_restore_best: bool | None = None
    evalstop_trace_path: str | None = None
    evalstop_eval_on_start: bool | None = None
    evalstop_cadence: str | dict[str, Any] | None = None
    evalstop_max_extra_evals: int | None = None
    evalstop_max_eval_share: float | None = None
    evalstop_server_url: str | None = None
    evalstop_max_non_finite: int | None = None


def job_type_of(cfg: Any) -> str:
    """The scheduler's job type of an Axolotl config: its ``rl`` method, else ``"lora"`` with an adapter, else
    ``"sft"``."""
    rl = cfg.get("rl")
    if rl:
        return _RL_JOB_TYPES.get(str(getattr(rl, "value", rl)), "other")
    return "lora" if cfg.get("adapter") in ("lora", "qlora") else "sft"


class EvalStopPlugin(BasePlugin):
    """An Axolotl plugin that adds an :class:`~evalstop_callbacks.EvalStopCallback` to the run's trainer.

    Attributes:
        options (`EvalStopOptions` or `None`): The checked ``evalstop_*`` keys, once Axolotl registered the plugin.
        callback (`EvalStopCallback` or `None`): The callback of the run, once the trainer was built (its
            `history`, `stopped_at`, `best_step`, `restored_from` tell what happened).
    """

    def __init__(self) -> None:
        super().__init__()
        self.options: EvalStopOptions | None = None
        self.callback: Any = None
        self.config_dir: Path | None = None
        self.summary: dict[str, Any] | None = None

    def get_input_args(self) -> str:
        return f"{__name__}.EvalStopArgs"

    def register(self, cfg: dict[str, Any]) -> None:
        """Axolotl's first call, with the raw config: check the release and every ``evalstop_*`` key.

        Raises:
            UnsupportedVersionError: Axolotl is outside :data:`TESTED`.
            OptionsError: An unknown ``evalstop_*`` key or a wrong value (one line naming the key; uncaught, it ends
                the process with that line alone: :func:`~.options.exit_in_one_line`).
        """
        exit_in_one_line("evalstop (Axolotl plugin)")
        check_version("axolotl", *TESTED, "evalstop's Axolotl plugin")
        self.options = parse_options(cfg, prefix=PREFIX)
        path = cfg.get("axolotl_config_path")
        self.config_dir = Path(str(path)).resolve().parent if path else None

    def add_callbacks_post_trainer(self, cfg: Any, trainer: Any) -> list[Any]:
        """Build the run's callback from the checked keys and attach it to ``trainer`` (which adds it among the
        trainer's callbacks: nothing is returned for Axolotl to add a second time).

        Raises:
            OptionsError: The evaluator cannot be loaded or the trainer cannot serve it (one line).
        """
        options = self.options if self.options is not None else parse_options(cfg, prefix=PREFIX)
        if self.config_dir is None and cfg.get("axolotl_config_path"):
            self.config_dir = Path(str(cfg.get("axolotl_config_path"))).resolve().parent
        self.callback = build_callback(
            options, job_type=job_type_of(cfg), evaluator_key=f"{PREFIX}evaluator", search=self.config_dir
        )
        try:
            self.callback.attach(trainer)
        except ValueError as exc:
            raise OptionsError(f"{PREFIX}evaluator: {' '.join(str(exc).split())}") from exc
        return []

    def post_train(self, cfg: Any, model: Any) -> None:
        """Log the run's summary once (Axolotl calls this hook after training, and again after saving)."""
        cb = self.callback
        if cb is None or self.summary is not None:
            return
        self.summary = run_summary(cb, cfg.get("output_dir"))
        summary_logger.info("%s", summary_text(self.summary, cb.restore_best))
