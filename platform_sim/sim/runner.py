"""Runners: how independent simulations of a multi-run command are executed.

A runner maps a picklable top-level function over plain-data tasks and returns the results in task order:
``runner.map(fn, tasks, progress=callback)``. Results depend only on each task (every task carries its seed), never
on the runner or its worker count. Backends: :class:`SerialRunner` (in-process) and :class:`ProcessRunner` (a local
process pool, the default). Other backends (e.g. Ray) register with :func:`register_runner` and are chosen by name.
The engine imports none of this.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, ClassVar, TypeVar

T = TypeVar("T")
R = TypeVar("R")

ProgressFn = Callable[[int], None]
"""Called with the number of tasks just finished."""


class Runner(ABC):
    """Interface of a runner backend."""

    name: ClassVar[str]

    def __init__(self, workers: int | None = None) -> None:
        """Every backend is built as ``cls(workers=...)`` by :func:`make_runner`, so each takes this argument.

        Args:
            workers: Parallel workers; None lets the backend choose (in-process backends ignore it).
        """
        del workers

    @abstractmethod
    def map(self, fn: Callable[[T], R], tasks: Sequence[T], progress: ProgressFn | None = None) -> list[R]:
        """``[fn(t) for t in tasks]``, possibly in parallel; results in task order.

        Args:
            fn: A picklable top-level function.
            tasks: Plain-data tasks (picklable).
            progress: Optional callback, called as tasks finish.
        """

    def close(self) -> None:
        """Release workers (no-op for in-process runners)."""

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SerialRunner(Runner):
    """Runs every task in this process, one after the other."""

    name: ClassVar[str] = "serial"

    def __init__(self, workers: int | None = None) -> None:
        del workers  # accepted for a uniform constructor

    def map(self, fn: Callable[[T], R], tasks: Sequence[T], progress: ProgressFn | None = None) -> list[R]:
        out = []
        for t in tasks:
            out.append(fn(t))
            if progress:
                progress(1)
        return out


class ProcessRunner(Runner):
    """A local process pool.

    Args:
        workers: Worker processes (default: the CPUs this process may use).
    """

    name: ClassVar[str] = "process"

    def __init__(self, workers: int | None = None) -> None:
        if workers is not None and workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers or default_workers()
        self._pool: ProcessPoolExecutor | None = None

    def map(self, fn: Callable[[T], R], tasks: Sequence[T], progress: ProgressFn | None = None) -> list[R]:
        tasks = list(tasks)
        if self.workers == 1 or len(tasks) <= 1:
            return SerialRunner().map(fn, tasks, progress)
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.workers)
        futures = [self._pool.submit(fn, t) for t in tasks]
        results: list[Any] = []
        for f in futures:  # in task order; progress therefore lags a little behind completion, which is fine
            results.append(f.result())
            if progress:
                progress(1)
        return results

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


RUNNERS: dict[str, type[Runner]] = {SerialRunner.name: SerialRunner, ProcessRunner.name: ProcessRunner}


def register_runner(cls: type[Runner]) -> type[Runner]:
    """Class decorator that makes a runner backend selectable by its ``name``."""
    RUNNERS[cls.name] = cls
    return cls


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def make_runner(name: str = "process", workers: int | None = None) -> Runner:
    """Build a runner by name (``process``, ``serial``, or a registered backend)."""
    try:
        cls = RUNNERS[name]
    except KeyError:
        raise ValueError(f"unknown runner {name!r}; choose one of {', '.join(RUNNERS)}") from None
    return cls(workers=workers)
