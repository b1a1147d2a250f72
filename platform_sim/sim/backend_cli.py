"""Command-line flags that choose where the independent simulations of a multi-run command run.

Every multi-run command of ``evalstop-sim`` (``paper``, ``replay``, ``detectors``, ``sweep``) calls
:func:`add_backend_args` on its sub-parser and :func:`runner_from_args` to get its
:class:`~platform_sim.sim.runner.Runner`:

- ``--backend pool`` (default): a local process pool of ``--workers`` processes;
- ``--backend ray``: Ray tasks, on the cluster at ``--address`` (or ``$RAY_ADDRESS``), else on a local Ray instance
  of ``--workers`` CPUs started for the command;
- ``--backend serial``: in this process (debugging, profiling).

Results are the same whatever the backend: each task carries its seed.
"""

from __future__ import annotations

import argparse

from .runner import ProcessRunner, Runner, SerialRunner

BACKENDS: tuple[str, ...] = ("pool", "ray", "serial")


class BackendArgError(ValueError):
    """A bad backend flag; the message names the flag."""


def add_backend_args(p: argparse.ArgumentParser) -> None:
    """Add ``--backend``, ``--workers`` and ``--address`` to a multi-run command's parser."""
    g = p.add_argument_group("where the simulations run")
    g.add_argument("--backend", choices=BACKENDS, default="pool",
                   help="pool: local process pool (default); ray: Ray tasks (pip install 'evalstop[ray]'); "
                        "serial: in this process")
    g.add_argument("--workers", type=int, default=None,
                   help="simulations at once (default: the CPUs available here; with --backend ray and --address: "
                        "the whole cluster)")
    g.add_argument("--address", default=None,
                   help="Ray cluster to use (e.g. ray://head:10001, or 'auto' on a cluster node); default: "
                        "$RAY_ADDRESS, else a local Ray instance for this command")


def runner_from_args(args: argparse.Namespace) -> Runner:
    """The runner chosen by :func:`add_backend_args`'s flags.

    Raises:
        BackendArgError: ``--workers`` < 1, ``--address`` without ``--backend ray``, or Ray not installed.
    """
    workers = getattr(args, "workers", None)
    backend = getattr(args, "backend", "pool")
    address = getattr(args, "address", None)
    if workers is not None and workers < 1:
        raise BackendArgError(f"--workers must be >= 1, got {workers}")
    if address is not None and backend != "ray":
        raise BackendArgError(f"--address needs --backend ray (got --backend {backend})")
    if backend == "ray":
        try:
            import ray  # noqa: F401  - fail here, with the flag's name, rather than at the first task
        except ImportError:
            raise BackendArgError("--backend ray needs Ray: pip install 'evalstop[ray]'") from None
        from .ray_backend import RayRunner

        return RayRunner(workers=workers, address=address)
    if backend == "serial":
        return SerialRunner()
    if backend != "pool":
        raise BackendArgError(f"--backend: unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    return ProcessRunner(workers=workers)
