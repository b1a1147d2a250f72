"""The options that the framework integrations read from a training YAML, checked before any training starts.

Axolotl takes them as top-level keys with an ``evalstop_`` prefix (``evalstop_eval_steps: 2``); the LLaMA-Factory
entry point takes them from an ``evalstop:`` section without the prefix (``eval_steps: 2``). Both go through
:func:`parse_options`, which knows every key (:data:`KEYS`), so that an unknown key or a value of the wrong type
fails at start with one line naming the key as the user wrote it, and :func:`check_version`, which refuses a framework
release outside the range the integration was tested with, also at start.

Nothing here imports torch or transformers: :func:`build_callback` imports the callback only when it is called, in
the framework's own environment.
"""

from __future__ import annotations

import difflib
import importlib
import logging
import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from importlib import metadata
from pathlib import Path
from typing import Any

from platform_sim.core import JOB_TYPES, cadence_from_spec, detector_from_spec

from ..nonfinite import DEFAULT_MAX_CONSECUTIVE

logger = logging.getLogger(__name__)

#: Set to ``1`` to run a framework release outside the tested range (with a warning instead of the refusal).
ALLOW_UNTESTED_ENV = "EVALSTOP_ALLOW_UNTESTED_VERSIONS"

MODES: tuple[str, ...] = ("enforce", "observe")  # the callback's modes (evalstop_callbacks.settings.MODES)


class OptionsError(ValueError):
    """A training YAML's evalstop options are wrong; the message is one line and starts with the key's name."""


class UnsupportedVersionError(RuntimeError):
    """The installed framework release is outside the range this integration was tested with (or not installed)."""


@dataclass(frozen=True)
class EvalStopOptions:
    """The checked evalstop options of one training run (the arguments of
    :class:`~evalstop_callbacks.EvalStopCallback` that a YAML file can spell).

    Args:
        evaluator (`str`, *optional*):
            ``"module:attr"`` of an [`Evaluator`] or of a callable with no arguments that returns one (a factory,
            called once at start); the module must be importable by the training process. `None`: a
            [`MetricEvaluator`] of the trainer's own evaluation metric (its eval loss unless the trainer names
            another), which needs an evaluation set in the framework's config.
        eval_steps (`int` or `"epoch"`, *optional*):
            Evaluate every `eval_steps` optimizer steps (and at the last step), or at every epoch end. `None`: the
            trainer's own evaluation cadence.
        detector (`str` or `dict`, *optional*):
            A detector name (``"k-decline"``, ``"trend"``, ...) or spec ``{"name": ..., "params": {...}}``. `None`
            (and no `k`/`min_delta`): the project's default detector.
        k, min_delta (*optional*): The paper's rule, `k-decline`, with these parameters (when no `detector`).
        mode (`str`, defaults to `"enforce"`): `"enforce"` stops and restores the best weights; `"observe"` only
            evaluates, reports and records where it would have stopped.
        job_id (`str`, *optional*): The job's id at the scheduler.
        job_type (`str`, *optional*): `"rlhf"`, `"dpo"`, `"lora"`, `"sft"` or `"other"`; `None`: what the framework
            config says (its DPO stage is `"dpo"`, a LoRA fine-tune `"lora"`, and so on).
        restore_best (`bool`, defaults to `True`): Load the best weights back at the end (enforce mode).
        trace_path (`str`, *optional*): Write the run's JSONL trace there.
        eval_on_start (`bool`, defaults to `True`): Evaluate at step 0 (the baseline).
        cadence (`str` or `dict`, *optional*): `"adaptive"` or a cadence spec: sooner evaluations when a decline may
            have begun.
        max_extra_evals (`int`, defaults to 4): At most this many evaluations at the scheduler's hints.
        max_eval_share (`float`, *optional*): A time budget (share of wall time, in (0, 1)) for hinted evaluations.
        server_url (`str`, *optional*): Report to the ``evalstop-server`` at this URL (its token from the
            ``EVALSTOP_TOKEN`` environment variable) instead of the scheduler core in the training process.
        max_non_finite (`int`, defaults to 3): NaN or inf evaluations in a row that end the run gracefully with the
            best weights (fewer are recorded and not decided on: :mod:`evalstop_callbacks.nonfinite`).
    """

    evaluator: str | None = None
    eval_steps: int | str | None = None
    detector: str | dict[str, Any] | None = None
    k: int | None = None
    min_delta: float | None = None
    mode: str = "enforce"
    job_id: str | None = None
    job_type: str | None = None
    restore_best: bool = True
    trace_path: str | None = None
    eval_on_start: bool = True
    cadence: str | dict[str, Any] | None = None
    max_extra_evals: int = 4
    max_eval_share: float | None = None
    server_url: str | None = None
    max_non_finite: int = DEFAULT_MAX_CONSECUTIVE


#: Every option's name (as the ``evalstop:`` section spells it; Axolotl's keys add the ``evalstop_`` prefix).
KEYS: tuple[str, ...] = tuple(f.name for f in fields(EvalStopOptions))

#: Environment variable that holds the service token when ``server_url`` is set (tokens stay out of YAML files).
TOKEN_ENV = "EVALSTOP_TOKEN"


def exit_in_one_line(prog: str) -> None:
    """Make an :class:`OptionsError` or :class:`UnsupportedVersionError` that ends this process print one line, not a
    traceback.

    For a framework that calls the integration from deep inside its own command (Axolotl's plugin hooks): the error
    still propagates (a caller in the same process catches it as usual), and only the interpreter's last word on an
    uncaught one changes (``sys.excepthook``); every other exception keeps its traceback.
    """
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        if issubclass(kind, (OptionsError, UnsupportedVersionError)):
            print(f"{prog}: error: {value}", file=sys.stderr)
        else:
            previous(kind, value, tb)

    sys.excepthook = hook


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_spec(build: Callable[[Any], Any]) -> Callable[[Any], str | None]:
    """A checker for a name-or-mapping spec built by ``build`` (its error, in one line, is the reason)."""

    def check(value: Any) -> str | None:
        if not isinstance(value, (str, Mapping)):
            return f"expected a name or a mapping with 'name' and 'params', got {_shown(value)}"
        try:
            build(value)
        except (ValueError, TypeError) as exc:
            return _one_line(str(exc))
        return None

    return check


def _check_evaluator(value: Any) -> str | None:
    if not isinstance(value, str) or value.count(":") != 1 or not all(value.split(":")):
        return f"expected 'module:attr' (an Evaluator or a callable returning one), got {_shown(value)}"
    return None


def _choice(choices: tuple[str, ...]) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if value in choices else f"expected one of {', '.join(choices)}, got {_shown(value)}"

    return check


def _check_str(value: Any) -> str | None:
    return None if isinstance(value, str) and value else f"expected a non-empty string, got {_shown(value)}"


def _check_bool(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"expected true or false, got {_shown(value)}"


def _check_int_min(minimum: int) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if _is_int(value) and value >= minimum else f"expected an integer >= {minimum}, got {_shown(value)}"

    return check


def _check_eval_steps(value: Any) -> str | None:
    if value == "epoch" or (_is_int(value) and value >= 1):
        return None
    return f"expected an integer >= 1 or 'epoch', got {_shown(value)}"


def _check_min_delta(value: Any) -> str | None:
    return None if _is_number(value) and value >= 0 else f"expected a finite number >= 0, got {_shown(value)}"


def _check_share(value: Any) -> str | None:
    return None if _is_number(value) and 0 < value < 1 else f"expected a number between 0 and 1, got {_shown(value)}"


#: Each key's check: the reason a value is wrong, or None (None values mean "not set" and are not checked).
_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "evaluator": _check_evaluator,
    "eval_steps": _check_eval_steps,
    "detector": _check_spec(detector_from_spec),
    "k": _check_int_min(1),
    "min_delta": _check_min_delta,
    "mode": _choice(MODES),
    "job_id": _check_str,
    "job_type": _choice(JOB_TYPES),
    "restore_best": _check_bool,
    "trace_path": _check_str,
    "eval_on_start": _check_bool,
    "cadence": _check_spec(cadence_from_spec),
    "max_extra_evals": _check_int_min(0),
    "max_eval_share": _check_share,
    "server_url": _check_str,
    "max_non_finite": _check_int_min(1),
}
assert set(_CHECKS) == set(KEYS), "every option has a check"


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{text[:60]}... ({type(value).__name__})" if len(text) > 60 else f"{text} ({type(value).__name__})"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def parse_options(raw: Mapping[str, Any], *, prefix: str = "", where: str = "") -> EvalStopOptions:
    """Check a YAML file's evalstop options and return them.

    Args:
        raw: The options as read from YAML: ``{prefix + key: value}``. Keys without ``prefix`` are not looked at (so
            Axolotl's whole config can be passed with ``prefix="evalstop_"``); with ``prefix=""`` every key is one.
        prefix: What each key starts with in ``raw`` (``"evalstop_"`` for Axolotl, ``""`` for a section).
        where: Put before each key's name in errors (``"evalstop."`` names a key of LLaMA-Factory's section).

    Returns:
        The options; keys not given keep their defaults, and a key given as ``null`` counts as not given.

    Raises:
        OptionsError: An unknown key (with the nearest known one) or a wrong value, in one line that starts with the
            key as written in the file.
    """
    if not isinstance(raw, Mapping):
        raise OptionsError(f"{where.rstrip('.') or 'evalstop'}: expected a mapping of options, got {_shown(raw)}")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not key.startswith(prefix):
            continue
        name, shown = key[len(prefix) :], f"{where}{key}"
        if name not in _CHECKS:
            near = difflib.get_close_matches(name, KEYS, n=1)
            hint = f"did you mean {where}{prefix}{near[0]}? " if near else ""
            known = ", ".join(prefix + k for k in KEYS)
            raise OptionsError(f"{shown}: unknown evalstop key; {hint}known keys: {known}")
        if value is None:
            continue
        reason = _CHECKS[name](value)
        if reason is not None:
            raise OptionsError(f"{shown}: {reason}")
        values[name] = dict(value) if isinstance(value, Mapping) else value
    return EvalStopOptions(**values)


def check_version(distribution: str, minimum: str, below: str, what: str) -> str:
    """Refuse, at start, a framework release outside the range an integration was tested with.

    Args:
        distribution: The framework's distribution name (``"axolotl"``, ``"llamafactory"``).
        minimum: The oldest tested release (inclusive).
        below: The first release not tested (exclusive).
        what: The integration's name for the message (``"evalstop's Axolotl plugin"``).

    Returns:
        The installed version.

    Raises:
        UnsupportedVersionError: The framework is not installed, or its version is outside ``[minimum, below)``
            (a warning instead when the environment variable ``EVALSTOP_ALLOW_UNTESTED_VERSIONS`` is ``1``).
    """
    from packaging.version import Version

    try:
        installed = metadata.version(distribution)
    except metadata.PackageNotFoundError:
        raise UnsupportedVersionError(f"{what} needs {distribution} {minimum} (not installed)") from None
    if Version(minimum) <= Version(installed) < Version(below):
        return installed
    message = (
        f"{what} is tested with {distribution} >={minimum},<{below}, but {installed} is installed: install "
        f"{distribution}=={minimum}, or set {ALLOW_UNTESTED_ENV}=1 to try this release anyway"
    )
    if os.environ.get(ALLOW_UNTESTED_ENV) == "1":
        logger.warning("%s", message)
        return installed
    raise UnsupportedVersionError(message)


def _import(module_name: str, key: str, search: Path | None) -> Any:
    """Import ``module_name``; if it is not found, look for it in ``search`` (the config file's folder) too.

    The folder goes to the end of ``sys.path``, and only when the module is found nowhere else, so that a file next
    to the config never shadows an installed package of the same name.
    """
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        top = module_name.split(".")[0]
        there = search is not None and ((search / f"{top}.py").is_file() or (search / top).is_dir())
        if exc.name != top or not there:
            where = f"the config file's folder {search} or " if search is not None else ""
            raise OptionsError(
                f"{key}: cannot import {module_name!r} ({_one_line(str(exc))}): put {top}.py in {where}a folder on "
                "PYTHONPATH (or install it)"
            ) from None
        if str(search) not in sys.path:
            sys.path.append(str(search))
            logger.info("evalstop: %s found next to the config file: %s added to the import path", top, search)
    except ImportError as exc:
        raise OptionsError(f"{key}: cannot import {module_name!r} ({_one_line(str(exc))})") from None
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise OptionsError(f"{key}: cannot import {module_name!r} from {search} ({_one_line(str(exc))})") from None


def load_evaluator(reference: str, key: str, search: str | os.PathLike[str] | None = None) -> Any:
    """The [`Evaluator`] named by ``"module:attr"``: the attribute itself, or what calling it with no arguments returns.

    Args:
        reference: ``"module:attr"`` (``attr`` may be dotted: ``"pkg.mod:Class.factory"``).
        key: The option's name as the file spells it, for errors.
        search: The config file's folder: a module found nowhere on the import path is looked for there.

    Raises:
        OptionsError: The module cannot be imported, has no such attribute, or it is (or returns) no Evaluator.
    """
    from ..evaluators import Evaluator

    module_name, attr = reference.split(":")
    target: Any = _import(module_name, key, None if search is None else Path(search).resolve())
    for part in attr.split("."):
        if not hasattr(target, part):
            raise OptionsError(f"{key}: module {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if not isinstance(target, Evaluator):
        if not callable(target):
            raise OptionsError(f"{key}: {reference} is neither an Evaluator nor a callable returning one")
        target = target()
        if not isinstance(target, Evaluator):
            raise OptionsError(f"{key}: {reference}() returned {type(target).__name__}, not an Evaluator")
    return target


def build_callback(
    options: EvalStopOptions, *, job_type: str, evaluator_key: str, search: str | os.PathLike[str] | None = None
) -> Any:
    """An :class:`~evalstop_callbacks.EvalStopCallback` with these options (imports transformers).

    Args:
        options: The checked options.
        job_type: The job type the framework config implies; ``options.job_type`` wins when set.
        evaluator_key: The evaluator option's name as the file spells it, for errors.
        search: The config file's folder, where an evaluator module is also looked for (:func:`load_evaluator`).

    Raises:
        OptionsError: The evaluator cannot be loaded, the service token is missing, or the callback refuses an
            option combination (its one-line reason, after the word ``evalstop``).
    """
    from ..callback import EvalStopCallback

    evaluator = load_evaluator(options.evaluator, evaluator_key, search) if options.evaluator is not None else None
    client = None
    if options.server_url is not None:
        from ..platform_client import PlatformClient

        token = os.environ.get(TOKEN_ENV)
        if not token:
            raise OptionsError(f"server_url is set but {TOKEN_ENV} holds no token for {options.server_url}")
        client = PlatformClient(options.server_url, token)
    try:
        # Every argument by keyword: the callback's arguments after the evaluator are keyword-only.
        return EvalStopCallback(
            evaluator=evaluator,
            eval_steps=options.eval_steps,
            k=options.k,
            min_delta=options.min_delta,
            client=client,
            job_id=options.job_id,
            job_type=options.job_type or job_type,
            mode=options.mode,
            restore_best=options.restore_best,
            trace_path=options.trace_path,
            detector=options.detector,
            cadence=options.cadence,
            max_extra_evals=options.max_extra_evals,
            max_eval_share=options.max_eval_share,
            eval_on_start=options.eval_on_start,
            max_non_finite=options.max_non_finite,
        )
    except (ValueError, TypeError) as exc:
        raise OptionsError(f"evalstop: {_one_line(str(exc))}") from exc
