"""Ray runner: the simulator's independent runs on a Ray cluster, or on a local Ray instance.

Selected with ``--backend ray`` on any multi-run command of ``evalstop-sim`` (``--address`` names an existing
cluster; without it a local instance is started for the command and shut down after it). Ray is the optional extra
``ray``; nothing else in the simulator imports it, and importing this module does not import Ray either (it is
imported when the first map starts).

Results are identical to the process pool's: each task carries its seed and :func:`~platform_sim.sim.experiments.run_task`
is a pure function of it, so where a task runs changes nothing. Results come back in task order.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

from .runner import ProgressFn, Runner, default_workers, register_runner

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


def _run_chunk(fn: Callable[[Any], Any], chunk: Sequence[Any]) -> list[Any]:
    return [fn(t) for t in chunk]


@register_runner
class RayRunner(Runner):
    """Runs tasks as Ray tasks (one CPU each).

    Args:
        workers: Most tasks running at once. On a local instance this is its CPU count (default: the CPUs this
            process may use); on a cluster it caps the tasks in flight (default: no cap, Ray schedules on every
            CPU of the cluster).
        address: Address of an existing cluster (``ray://head:10001`` for Ray Client, ``head:6379`` or ``auto``
            from a cluster node). None: ``$RAY_ADDRESS`` if set, else a local instance for this runner.
        chunksize: Tasks sent to a worker together. 1 (default) balances best; larger values amortize Ray's
            per-task overhead when tasks are very short.
        runtime_env: Ray runtime environment for the workers (e.g. ``{"pip": ["evalstop[ray]"]}`` or
            ``{"py_modules": [...]}``) when the cluster's nodes do not have evalstop installed.
    """

    name: ClassVar[str] = "ray"

    def __init__(
        self,
        workers: int | None = None,
        address: str | None = None,
        chunksize: int = 1,
        runtime_env: dict[str, Any] | None = None,
    ) -> None:
        if workers is not None and workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if chunksize < 1:
            raise ValueError(f"chunksize must be >= 1, got {chunksize}")
        self.workers = workers
        self.address = address if address is not None else (os.environ.get("RAY_ADDRESS") or None)
        self.chunksize = chunksize
        self.runtime_env = runtime_env
        self._ray: Any = None
        self._owns_instance = False

    def _start(self) -> Any:
        if self._ray is not None:
            return self._ray
        try:
            import ray
        except ImportError as exc:
            raise RuntimeError("the ray backend needs Ray: pip install 'evalstop[ray]'") from exc
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
            if self.runtime_env:
                kwargs["runtime_env"] = self.runtime_env
            if self.address is None:
                # A private local instance, sized to the worker count, gone again at close().
                kwargs["num_cpus"] = self.workers or default_workers()
                kwargs["address"] = "local"
            else:
                kwargs["address"] = self.address
            logger.info("starting Ray (%s)", kwargs.get("address"))
            ray.init(**kwargs)
            self._owns_instance = True
        self._ray = ray
        return ray

    def map(self, fn: Callable[[T], R], tasks: Sequence[T], progress: ProgressFn | None = None) -> list[R]:
        tasks = list(tasks)
        if not tasks:
            return []
        ray = self._start()
        remote = ray.remote(num_cpus=1)(_run_chunk)
        fn_ref = ray.put(fn)
        chunks = [tasks[i : i + self.chunksize] for i in range(0, len(tasks), self.chunksize)]
        limit = self.workers if self.address is not None and self.workers else len(chunks)
        results: list[list[R] | None] = [None] * len(chunks)
        pending: dict[Any, int] = {}
        next_chunk = 0
        while next_chunk < len(chunks) or pending:
            while next_chunk < len(chunks) and len(pending) < limit:
                pending[remote.remote(fn_ref, chunks[next_chunk])] = next_chunk
                next_chunk += 1
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                i = pending.pop(ref)
                results[i] = ray.get(ref)
                if progress:
                    progress(len(chunks[i]))
        return [r for chunk in results for r in chunk]  # type: ignore[union-attr]

    def close(self) -> None:
        if self._ray is not None and self._owns_instance:
            self._ray.shutdown()
        self._ray = None
        self._owns_instance = False
