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

After Axolotl builds its trainer, :meth:`EvalStopPlugin.add_callbacks_post_trainer` returns the
:class:`~evalstop_callbacks.EvalStopCallback` that Axolotl adds to it. Axolotl's SFT and preference (DPO, IPO,
KTO, ORPO) trainers run the transformers loop, so the callback stops the run at the decline, and the weights Axolotl
saves at the end (``output_dir``) are the best ones, which the callback restored.

Note: Axolotl skips a plugin whose module fails to import, with a logged error and no stop (its ``PluginManager``
catches the ``ImportError``): the training environment must have ``evalstop`` installed.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from axolotl.integrations.base import BasePlugin
from pydantic import BaseModel

from .options import EvalStopOptions, build_callback, check_version, parse_options

logger = logging.getLogger(__name__)

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

    def get_input_args(self) -> str:
        return f"{__name__}.EvalStopArgs"

    def register(self, cfg: dict[str, Any]) -> None:
        """Axolotl's first call, with the raw config: check the release and every ``evalstop_*`` key.

        Raises:
            UnsupportedVersionError: Axolotl is outside :data:`TESTED`.
            OptionsError: An unknown ``evalstop_*`` key or a wrong value (one line naming the key).
        """
        check_version("axolotl", *TESTED, "evalstop's Axolotl plugin")
        self.options = parse_options(cfg, prefix=PREFIX)

    def add_callbacks_post_trainer(self, cfg: Any, trainer: Any) -> list[Any]:
        """The run's callback, built from the checked keys (Axolotl adds it to ``trainer``)."""
        options = self.options if self.options is not None else parse_options(cfg, prefix=PREFIX)
        self.callback = build_callback(options, job_type=job_type_of(cfg), evaluator_key=f"{PREFIX}evaluator")
        return [self.callback]

    def post_train(self, cfg: Any, model: Any) -> None:
        cb = self.callback
        if cb is not None:
            logger.info(
                "EvalStop: stopped at %s, best step %s (score %s), restored from %s",
                cb.stopped_at,
                cb.best_step,
                cb.best_score,
                cb.restored_from,
            )
