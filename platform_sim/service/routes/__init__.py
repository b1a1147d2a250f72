"""The service's routes, one module per group: :mod:`.jobs` (register, list, read, finish), :mod:`.reports` (the
report endpoint and its fast path), :mod:`.operator` (health, readiness, metrics). Each module's ``router(ctx)``
builds its :class:`fastapi.APIRouter` around the app's :class:`~platform_sim.service.deps.ServiceContext`.
"""

API_VERSION = "v1"
PREFIX = f"/{API_VERSION}"
"""Every tenant route lives under this prefix."""
