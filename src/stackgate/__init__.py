"""stackgate: decide whether an ML stack upgrade is safe to roll out."""

__version__ = "0.1.0"
