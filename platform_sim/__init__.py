"""evalstop's platform side: the scheduler core, the discrete-event simulator and the scheduler service."""

__version__ = "0.1.0"
