"""evalstop's trainer side: world-feedback early stopping for transformers and TRL trainers."""

__version__ = "0.1.0"
