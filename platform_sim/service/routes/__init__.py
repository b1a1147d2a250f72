"""The service's routes, one module per group: :mod:`.jobs` (register, list, read, finish), :mod:`.reports` (the
report endpoint and its fast path), :mod:`.history` (a job's evals, the summary, the events), :mod:`.operator`
(health, readiness, metrics), :mod:`.dashboard` (the HTML pages). Each module's ``add_routes(app,
...)`` adds its routes to the app around the app's :class:`~platform_sim.service.deps.ServiceContext`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI

API_VERSION = "v1"
PREFIX = f"/{API_VERSION}"
"""Every tenant route lives under this prefix."""
JSON = "application/json"
"""The media type of the pages the routes render themselves (:func:`~platform_sim.service.fairness.json_page`)."""


@dataclass(frozen=True)
class Routes:
    """A group of routes added straight to ``app`` under a path prefix with the group's OpenAPI tags.

    Not an :class:`fastapi.APIRouter`: FastAPI includes routers lazily, and the 405 handler
    (:func:`~platform_sim.service.errors.install_error_handlers`) reads each route's methods from the app's own route
    list to answer ``Allow``.

    Args:
        app: The app the routes go to.
        prefix: Prepended to every path (``""``: none).
        tags: The routes' OpenAPI tags.
    """

    app: FastAPI
    prefix: str
    tags: list[str]

    def get(self, path: str, **kwargs: Any) -> Callable[[Any], Any]:
        """``app.get`` of ``prefix + path`` with the group's tags."""
        return self.app.get(self.prefix + path, tags=list(self.tags), **kwargs)

    def post(self, path: str, **kwargs: Any) -> Callable[[Any], Any]:
        """``app.post`` of ``prefix + path`` with the group's tags."""
        return self.app.post(self.prefix + path, tags=list(self.tags), **kwargs)
