"""The verl-free half of the verl adapter (:mod:`evalstop_callbacks.verl_trainer`): its settings, the reports to the
scheduler core and the decisions, and the result file. The best checkpoints are kept by
:class:`~evalstop_callbacks.keeper.BestCheckpoints`, as everywhere else.

Nothing here imports verl, so it runs (and is tested) in any environment of the package.
"""

from __future__ import annotations

import fnmatch
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from platform_sim.core import Decision, default_spec

from .client import BoundaryClient, EmbeddedClient, make_report
from .keeper import BestCheckpoints
from .nonfinite import DEFAULT_MAX_CONSECUTIVE, NonFinitePolicy, check_max_consecutive
from .outcome import worded

logger = logging.getLogger(__name__)

MODE_PREFIX = "evalstop_"
MODES = ("enforce", "observe")
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
        save_best: Save a checkpoint at each validation that ranks among the ``keep_best`` best (step 0, the
            initial model, is never saved).
        protect_best: Hard-link (copy across file systems) those checkpoints into
            ``<default_local_dir>/evalstop-best-<step>``, out of reach of verl's ``max_actor_ckpt_to_keep`` rotation.
        keep_best: How many best validation checkpoints to keep protected (K >= 1); one that falls out of the K
            best loses its ``evalstop-best-<step>`` copy (verl's own folder is left to verl).
        prune_others: Also delete verl's ``global_step_<N>`` folders that are neither among the K best nor the
            newest (the one a resume starts from).
        mode: ``"enforce"`` (end the loop at a stop) or ``"observe"`` (never stop; still keep the K best, and
            record where the core would have stopped).
        examples: Report the per-prompt scores as well when they can be paired (one data source, ``reward``).
        result: Path of the result JSON; None: ``<default_local_dir>/evalstop-result.json``.
        max_non_finite: How many NaN or inf validations in a row end the run (with the best checkpoint kept); fewer
            are recorded and not decided on (:mod:`evalstop_callbacks.nonfinite`).

    Raises:
        ValueError: One line naming the key: an unknown key, ``mode`` not enforce/observe, ``keep_best`` or
            ``max_non_finite`` not an integer >= 1.
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
    keep_best: int = 1
    prune_others: bool = False
    mode: str = "enforce"
    examples: bool = True
    result: str | None = None
    max_non_finite: int = DEFAULT_MAX_CONSECUTIVE

    def __post_init__(self) -> None:
        check_max_consecutive(self.max_non_finite, "trainer.evalstop.max_non_finite")
        if self.mode not in MODES:
            raise ValueError(f"trainer.evalstop.mode must be enforce or observe, got {self.mode!r}")
        k = self.keep_best
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"trainer.evalstop.keep_best must be an integer >= 1, got {k!r}")
        for key in ("save_best", "protect_best", "prune_others", "examples", "greater_is_better"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"trainer.evalstop.{key} must be true or false, got {getattr(self, key)!r}")

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
    would_stop_at: int | None = None
    metric_name: str | None = None
    example_keys: list[str] | None = None
    non_finite: list[list[Any]] = field(default_factory=list)
    stop_reason: str = ""
    _warned_means_only: bool = False

    def __post_init__(self) -> None:
        self.job_id = self.client.register(self.config.job_type, detector=self.detector(), job_id=self.job_id)
        self.policy = NonFinitePolicy(self.config.max_non_finite, where="evalstop")

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
        self,
        step: int,
        metrics: Mapping[str, Any],
        samples: Sequence[tuple[str, float]] | None = None,
        planned_steps: int | None = None,
    ) -> Decision | None:
        """Report one validation (verl's ``_validate`` result at ``step``) and return the core's decision; None for
        a NaN or inf validation, which is recorded in :attr:`non_finite` and not reported (the one non-finite
        policy, :class:`~evalstop_callbacks.nonfinite.NonFinitePolicy`: a few in a row make :attr:`stopping`).
        ``planned_steps`` (verl's ``total_training_steps``; None or 0: unknown) goes with the report."""
        name, value = self.select(metrics)
        self.metric_name = name
        scores = self.paired_scores(metrics, name, samples)
        if not self.policy.check(step, value, scores, metric=name):
            self.non_finite.append([step, self.policy.last])
            if self.policy.exhausted and self.would_stop_at is None:
                self.would_stop_at, self.stop_reason = step, self.policy.reason(name)
            return None
        if scores is None and not self._warned_means_only:
            logger.info("evalstop: no per-example scores for %s; the detector decides on means alone", name)
            self._warned_means_only = True
        score = self.core_score(value)
        report = make_report(
            self.job_id, self.config.job_type, step, score, scores or None, planned_steps=planned_steps
        )
        self.decision = self.client.report(report)
        self.evals.append([step, value])
        if self.decision.should_stop and self.would_stop_at is None:
            self.would_stop_at, self.stop_reason = step, self.decision.reason
        return self.decision

    def core_score(self, value: float) -> float:
        """A value of the metric as the core sees it (higher is better: a lower-is-better metric negated)."""
        return value if self.config.greater_is_better else -value

    @property
    def stopping(self) -> bool:
        """Whether the run ends here: the core said stop and the mode is ``enforce``."""
        return self.would_stop_at is not None and self.config.mode == "enforce"

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

    def result(self, keeper: BestCheckpoints | None) -> dict[str, Any]:
        """The outcome in ``evalstop watch``'s result format.

        Args:
            keeper: The adapter's keeper of the best checkpoints, or None (``protect_best`` off).
        """
        d = self.decision
        best_step = d.best_step if d else None
        best = keeper.get(best_step) if keeper is not None and best_step is not None else None
        kept = [] if keeper is None else [{**k, "score": self.core_score(k["score"])} for k in keeper.listing()]
        return {
            "decision": "stop" if self.stopping else "continue",
            "stop_step": self.would_stop_at if self.stopping else None,
            "would_stop_step": self.would_stop_at,
            "best_step": best_step,
            "best_score": self.best_score(),
            "best_checkpoint": best.source if best is not None else None,
            "protected_checkpoint": best.path if best is not None else None,
            "detector": self.detector(),
            "metric": self.metric_name,
            "evals": self.evals,
            "reason": worded(self.stop_reason or (d.reason if d else ""), self.config.mode) or None,
            "mode": self.config.mode,
            "keep_best": self.config.keep_best,
            "kept": kept,
            "pruned": [] if keeper is None else list(keeper.pruned),
            "non_finite": [list(e) for e in self.non_finite],
        }

    def state_dict(self) -> dict[str, Any]:
        state_fn = getattr(self.client, "state_dict", None)
        return {
            "client": state_fn() if state_fn else None,
            "evals": self.evals,
            "example_keys": self.example_keys,
            "decision": self.decision.to_dict() if self.decision else None,
            "would_stop_at": self.would_stop_at,
            "non_finite": [list(e) for e in self.non_finite],
            "policy": self.policy.state_dict(),
            "stop_reason": self.stop_reason,
            "metric": self.metric_name,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("client") is not None and hasattr(self.client, "load_state_dict"):
            self.client.load_state_dict(state["client"])
        self.evals = [list(e) for e in state.get("evals", [])]
        self.example_keys = state.get("example_keys")
        raw = state.get("decision")
        self.decision = Decision.from_dict(raw) if raw else None
        self.would_stop_at = state.get("would_stop_at")
        self.non_finite = [list(e) for e in state.get("non_finite", [])]
        self.policy.load_state_dict(state.get("policy", {}))
        self.stop_reason = state.get("stop_reason", "")
        self.metric_name = state.get("metric", self.metric_name)


def make_client(config: VerlEvalStopConfig) -> BoundaryClient:
    """The embedded core, or ``PlatformClient`` when ``config.server`` is set (it needs ``config.token``)."""
    if config.server is None:
        return EmbeddedClient()
    if not config.token:
        raise ValueError("trainer.evalstop.server needs trainer.evalstop.token")
    from .platform_client import PlatformClient

    return PlatformClient(config.server, config.token)
