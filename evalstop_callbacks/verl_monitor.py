"""The verl-free half of the verl adapter (:mod:`evalstop_callbacks.verl_trainer`): its settings, the reports to the
scheduler core and the decisions, the result file, and protecting the best checkpoint folder from rotation.

Nothing here imports verl, so it runs (and is tested) in any environment of the package.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import math
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from platform_sim.core import Action, Decision, Report, default_spec

from .client import BoundaryClient, EmbeddedClient

logger = logging.getLogger(__name__)

MODE_PREFIX = "evalstop_"
BEST_DIR = "evalstop-best"
RESULT_FILE = "evalstop-result.json"
STATE_FILE = "evalstop_state.json"


@dataclass
class VerlEvalStopConfig:
    """What ``trainer.evalstop`` in verl's config may hold (added with ``+trainer.evalstop.<key>=...``).

    Args:
        metric: Glob over the keys ``_validate`` returns; exactly one must match (several: an error naming them).
            The default takes verl's core validation metric of a run with one data source.
        greater_is_better: False for a metric that falls as the model improves (the core always sees higher as
            better: such scores are negated before they are reported).
        detector: Detector spec: a name, a JSON object text or a mapping ``{"name", "params"}``. None: the default
            detector (``platform_sim.core.default_spec()``).
        job_type: The job type reported to the core (``rlhf`` for verl's RL trainers).
        job_id: The job's id; None: ``<project_name>/<experiment_name>``.
        server: URL of an ``evalstop-server``; None: the embedded core decides in-process.
        token: The tenant's bearer token for ``server``.
        save_best: Save a checkpoint at each new best step (step 0, the initial model, is never saved).
        protect_best: Hard-link (copy across file systems) the best step's checkpoint folder into
            ``<default_local_dir>/evalstop-best``, out of reach of verl's checkpoint rotation.
        examples: Report the per-prompt scores as well when they can be paired (one data source, ``reward``).
        result: Path of the result JSON; None: ``<default_local_dir>/evalstop-result.json``.
    """

    metric: str = "val-core/*/*/mean@*"
    greater_is_better: bool = True
    detector: Any = None
    job_type: str = "rlhf"
    job_id: str | None = None
    server: str | None = None
    token: str | None = None
    save_best: bool = True
    protect_best: bool = True
    examples: bool = True
    result: str | None = None

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> VerlEvalStopConfig:
        """Build from ``trainer.evalstop`` (a plain mapping or an OmegaConf node), refusing unknown keys."""
        data = dict(values or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown trainer.evalstop key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**data)

    def detector_spec(self) -> dict[str, Any] | str:
        """The detector spec to register: the default one when none is given; JSON text parsed."""
        spec = self.detector
        if spec is None:
            return default_spec()
        if isinstance(spec, str):
            return json.loads(spec) if spec.lstrip().startswith("{") else spec
        return _plain(spec)


def _plain(value: Any) -> Any:
    """An OmegaConf node (or nested mappings and lists) as plain dicts and lists, for the core's spec checks."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or (not isinstance(value, str) and isinstance(value, Sequence)):
        return [_plain(v) for v in value]
    return value


@dataclass
class EvalStopMonitor:
    """The verl-free half of the adapter: picks the metric, reports to the core, remembers what it saw.

    Args:
        config: The adapter's settings.
        client: The boundary client; registered here once.
        job_id: The id the job is registered under.
    """

    config: VerlEvalStopConfig
    client: BoundaryClient
    job_id: str
    evals: list[list[float]] = field(default_factory=list)
    decision: Decision | None = None
    metric_name: str | None = None
    example_keys: list[str] | None = None
    _warned_means_only: bool = False

    def __post_init__(self) -> None:
        self.job_id = self.client.register(self.config.job_type, detector=self.detector(), job_id=self.job_id)

    def detector(self) -> dict[str, Any]:
        spec = self.config.detector_spec()
        return {"name": spec} if isinstance(spec, str) else spec

    def select(self, metrics: Mapping[str, Any]) -> tuple[str, float]:
        """The one metric the glob names in one validation's metrics, as ``(name, value)``.

        Raises:
            ValueError: No key or several keys match (the message lists what there was to choose from).
        """
        matches = sorted(k for k in metrics if fnmatch.fnmatchcase(k, self.config.metric))
        if len(matches) != 1:
            what = "no" if not matches else "several"
            seen = matches or sorted(metrics)
            raise ValueError(
                f"trainer.evalstop.metric={self.config.metric!r} matches {what} validation metric(s); "
                f"{'matched' if matches else 'seen'}: {', '.join(seen)}"
            )
        return matches[0], float(metrics[matches[0]])

    def paired_scores(
        self, metrics: Mapping[str, Any], name: str, samples: Sequence[tuple[str, float]] | None
    ) -> list[float] | None:
        """Per-prompt mean scores in a fixed prompt order, or None where they cannot stand for the metric.

        verl hands its validation samples' summed rewards to ``_maybe_log_val_generations``; they are the metric's
        examples only when the metric is the ``reward`` variable of the one data source there is, and they pair
        across validations only while the set of prompts stays the same (the core wants the same examples in the
        same order at every eval).
        """
        sources = {k.split("/")[1] for k in metrics if k.startswith("val-core/") and k.count("/") >= 3}
        if not self.config.examples or not samples or len(sources) != 1 or name.split("/")[2:3] != ["reward"]:
            return None
        by_prompt: dict[str, list[float]] = {}
        for prompt, score in samples:
            by_prompt.setdefault(prompt, []).append(float(score))
        keys = sorted(by_prompt)
        if self.example_keys is None:
            self.example_keys = keys
        elif keys != self.example_keys:
            logger.warning("evalstop: the validation prompts changed; deciding on means from here on")
            self.config.examples = False
            return None
        sign = 1.0 if self.config.greater_is_better else -1.0
        return [sign * sum(v) / len(v) for v in (by_prompt[k] for k in keys)]

    def observe(
        self, step: int, metrics: Mapping[str, Any], samples: Sequence[tuple[str, float]] | None = None
    ) -> Decision:
        """Report one validation (verl's ``_validate`` result at ``step``) and return the core's decision."""
        name, value = self.select(metrics)
        self.metric_name = name
        if not math.isfinite(value):
            # A NaN validation (no samples scored) is no evidence either way: the last decision stands.
            logger.warning("evalstop: %s is %s at step %d; not reported", name, value, step)
            return self.decision or self._first_decision()
        scores = self.paired_scores(metrics, name, samples)
        if scores is None and not self._warned_means_only:
            logger.info("evalstop: no per-example scores for %s; the detector decides on means alone", name)
            self._warned_means_only = True
        sign = 1.0 if self.config.greater_is_better else -1.0
        report = Report(self.job_id, self.config.job_type, step, sign * value, tuple(scores) if scores else None)
        self.decision = self.client.report(report)
        self.evals.append([step, value])
        return self.decision

    def _first_decision(self) -> Decision:
        return Decision(Action.CONTINUE, "no evaluation yet", 0, None, None)

    def best_score(self) -> float | None:
        """The best score in the metric's own sign (the core holds it negated for lower-is-better metrics)."""
        if self.decision is None or self.decision.best_score is None:
            return None
        return self.decision.best_score if self.config.greater_is_better else -self.decision.best_score

    def log_fields(self, decision: Decision, score: float) -> dict[str, float]:
        """The decision as numbers for verl's ``Tracking`` logger (every backend takes floats)."""
        out = {"evalstop/stop": float(decision.should_stop), "evalstop/declines": float(decision.declines)}
        out["evalstop/score"] = score
        if decision.best_step is not None:
            out["evalstop/best_step"] = float(decision.best_step)
            best = self.best_score()
            if best is not None:
                out["evalstop/best_score"] = best
        return out

    def result(self, best_checkpoint: str | None, protected_checkpoint: str | None = None) -> dict[str, Any]:
        """The outcome in ``evalstop watch``'s result format.

        Args:
            best_checkpoint: The best step's ``global_step_<N>`` folder, or None (none was saved).
            protected_checkpoint: Its copy out of the rotation's reach (``evalstop-best``), or None.
        """
        d = self.decision
        stopped = d is not None and d.should_stop
        return {
            "decision": "stop" if stopped else "continue",
            "stop_step": int(self.evals[-1][0]) if stopped and self.evals else None,
            "best_step": d.best_step if d else None,
            "best_score": self.best_score(),
            "best_checkpoint": best_checkpoint,
            "protected_checkpoint": protected_checkpoint,
            "detector": self.detector(),
            "metric": self.metric_name,
            "evals": self.evals,
            "reason": d.reason if d else None,
        }

    def state_dict(self) -> dict[str, Any]:
        state_fn = getattr(self.client, "state_dict", None)
        return {
            "client": state_fn() if state_fn else None,
            "evals": self.evals,
            "example_keys": self.example_keys,
            "decision": self.decision.to_dict() if self.decision else None,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("client") is not None and hasattr(self.client, "load_state_dict"):
            self.client.load_state_dict(state["client"])
        self.evals = [list(e) for e in state.get("evals", [])]
        self.example_keys = state.get("example_keys")
        raw = state.get("decision")
        self.decision = Decision.from_dict(raw) if raw else None


def make_client(config: VerlEvalStopConfig) -> BoundaryClient:
    """The embedded core, or ``PlatformClient`` when ``config.server`` is set (it needs ``config.token``)."""
    if config.server is None:
        return EmbeddedClient()
    if not config.token:
        raise ValueError("trainer.evalstop.server needs trainer.evalstop.token")
    from .platform_client import PlatformClient

    return PlatformClient(config.server, config.token)


def protect_folder(source: str, target: str) -> str:
    """Replace ``target`` by a copy of ``source`` made of hard links (a plain copy across file systems).

    Returns:
        ``"hard-linked"`` or ``"copied"``: what was done.
    """
    tmp = target + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    how = "hard-linked"
    try:
        shutil.copytree(source, tmp, copy_function=os.link)
    except OSError:  # another file system, or links refused: a real copy keeps the best safe all the same
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(source, tmp)
        how = "copied"
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    return how
