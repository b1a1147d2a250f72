"""``python -m evalstop_callbacks.watch``: ``evalstop watch`` without the ``evalstop`` command."""

from .cli import main

raise SystemExit(main())
