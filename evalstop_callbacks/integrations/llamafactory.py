"""``evalstop llamafactory train config.yaml``: a LLaMA-Factory run with EvalStop, from LLaMA-Factory's own YAML.

The file is the one ``llamafactory-cli train`` takes, plus an ``evalstop:`` section (the keys of
:class:`~evalstop_callbacks.integrations.options.EvalStopOptions`, without Axolotl's prefix)::

    model_name_or_path: ./my-model
    stage: sft
    ...
    evalstop:
      evaluator: my_evals:world_evaluator   # module:attr of an Evaluator, or of a callable returning one
      eval_steps: 2
      detector: k-decline

The section is taken out, checked (an unknown key or a wrong value ends the command with one line naming the key,
exit code 2), the LLaMA-Factory release is checked against the tested range, and the rest of the file goes to
``llamafactory.train.tuner.run_exp(args, callbacks=[EvalStopCallback(...)])``, LLaMA-Factory's own training entry,
in this process. Its trainers (SFT, DPO, KTO, reward model, pre-training) run the transformers loop, so the callback
stops the run at the decline, and the weights LLaMA-Factory saves at the end are the best ones it restored.

``run_exp`` never hands out the trainer it builds, so the callback is attached to it when its ``train()`` starts
(:func:`attached_at_train`). An evaluator module next to the config file is found there. At the end the command
prints a summary: stopped or not, at which step, the best step and its score in the metric's own units, and where
the best weights are (``--json``: the same as one JSON object).

Run it as ``python -m evalstop_callbacks.integrations.llamafactory train config.yaml`` or through ``evalstop``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from ..outcome import run_summary, summary_text
from .options import OptionsError, UnsupportedVersionError, build_callback, check_version, parse_options

logger = logging.getLogger(__name__)

#: The LLaMA-Factory releases this entry point is tested with: ``>=TESTED[0],<TESTED[1]``. Older ones pin
#: transformers 4.x (0.9.3: <=4.52.4, 0.9.4: <=4.57.1), below the 5.0 that evalstop's callback needs.
TESTED: tuple[str, str] = ("0.9.5", "0.9.6")

#: The section of the YAML file that holds the evalstop options.
SECTION = "evalstop"

_STAGE_JOB_TYPES = {"sft": "sft", "pt": "other", "rm": "other", "ppo": "rlhf", "dpo": "dpo", "kto": "dpo"}


def job_type_of(config: Mapping[str, Any]) -> str:
    """The scheduler's job type of a LLaMA-Factory config: its ``stage``, and ``"lora"`` for a LoRA fine-tune.

    Args:
        config: LLaMA-Factory's arguments (``stage``, ``finetuning_type``, ...).
    """
    stage = str(config.get("stage", "sft"))
    if stage in ("sft", "pt") and config.get("finetuning_type", "lora") == "lora":
        return "lora"  # LLaMA-Factory's default finetuning_type is lora
    return _STAGE_JOB_TYPES.get(stage, "other")


def split_config(config: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """LLaMA-Factory's arguments and the ``evalstop:`` section of a loaded YAML file.

    Raises:
        OptionsError: The file is not a mapping, or its ``evalstop`` entry is not one.
    """
    if not isinstance(config, Mapping):
        raise OptionsError(
            f"the config file must hold a mapping of LLaMA-Factory arguments, got {type(config).__name__}"
        )
    args = dict(config)
    section = args.pop(SECTION, None)
    if section is None:
        section = {}
    if not isinstance(section, Mapping):
        raise OptionsError(f"{SECTION}: expected a mapping of evalstop options, got {type(section).__name__}")
    return args, dict(section)


@contextlib.contextmanager
def attached_at_train(callback: Any) -> Iterator[None]:
    """Within the block, a transformers ``Trainer`` whose callbacks hold ``callback`` attaches it
    (``callback.attach(trainer)``) when its ``train()`` starts: the trainer is complete then, and LLaMA-Factory's
    ``run_exp`` builds it inside and never hands it out. ``Trainer.train`` is put back when the block ends.

    Raises:
        OptionsError: The trainer cannot serve the evaluator (one line).
    """
    from transformers import Trainer

    original = Trainer.train

    @functools.wraps(original)
    def train(trainer: Any, *args: Any, **kwargs: Any) -> Any:
        if any(cb is callback for cb in trainer.callback_handler.callbacks):
            try:
                callback.attach(trainer)
            except ValueError as exc:
                raise OptionsError(f"{SECTION}.evaluator: {' '.join(str(exc).split())}") from exc
        return original(trainer, *args, **kwargs)

    Trainer.train = train  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        Trainer.train = original  # type: ignore[method-assign]


def train(config_path: str | Path) -> dict[str, Any]:
    """Run LLaMA-Factory's training on ``config_path`` with an EvalStopCallback; returns the run's
    :func:`~evalstop_callbacks.outcome.run_summary` (best score in the metric's units, paths absolute).

    Raises:
        OptionsError: The file or its ``evalstop:`` section is wrong (checked before anything is trained).
        UnsupportedVersionError: LLaMA-Factory is missing or outside :data:`TESTED`.
    """
    import yaml

    path = Path(config_path)
    try:
        loaded = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise OptionsError(f"cannot read {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise OptionsError(f"{path} is not valid YAML: {' '.join(str(exc).split())}") from None
    args, section = split_config(loaded)
    options = parse_options(section, where=f"{SECTION}.")
    check_version("llamafactory", *TESTED, "evalstop's LLaMA-Factory entry point")
    callback = build_callback(
        options, job_type=job_type_of(args), evaluator_key=f"{SECTION}.evaluator", search=path.resolve().parent
    )
    from llamafactory.train.tuner import run_exp

    with attached_at_train(callback):
        run_exp(args=args, callbacks=[callback])
    return {**run_summary(callback, args.get("output_dir")), "restore_best": callback.restore_best}


class _Parser(argparse.ArgumentParser):
    """Errors in one line with exit code 2, as every ``evalstop`` subcommand (argparse's usage first is noise)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(prog: str = "evalstop llamafactory") -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description="Run LLaMA-Factory's training with EvalStop from its own YAML file.")
    sub = parser.add_subparsers(dest="action", parser_class=_Parser, metavar="{train}")
    run = sub.add_parser("train", help="train from CONFIG (LLaMA-Factory's YAML plus an evalstop: section)")
    run.add_argument("config", help="the YAML file llamafactory-cli train takes, with an evalstop: section")
    run.add_argument("--json", action="store_true", help="print the run's decisions as one JSON object")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``evalstop llamafactory train CONFIG [--json]``; returns the exit code (2: bad input, in one line).

    Args:
        argv: The arguments after ``llamafactory`` (``["train", "config.yaml"]``); `None`: ``sys.argv[1:]``.
    """
    parser = build_parser()
    ns = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    if ns.action is None:
        parser.print_help()
        return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        result = train(ns.config)
    except (OptionsError, UnsupportedVersionError) as exc:
        print(f"evalstop llamafactory: error: {exc}", file=sys.stderr)
        return 2
    print(summary_text(result, result["restore_best"]), file=sys.stderr if ns.json else sys.stdout, flush=True)
    if ns.json:
        print(json.dumps(result, sort_keys=True))
    return 0


def add_parser(subparsers: Any) -> None:
    """``evalstop llamafactory ...`` inside the ``evalstop`` command: the rest of the line goes to :func:`main`."""
    parser = subparsers.add_parser(
        "llamafactory",
        help="run LLaMA-Factory's training with EvalStop (evalstop llamafactory train config.yaml)",
        add_help=False,
    )
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    parser.set_defaults(func=lambda ns: main(ns.rest))


if __name__ == "__main__":
    sys.exit(main())
