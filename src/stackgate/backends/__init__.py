"""Backends: prepare(stack) -> environment handle; run(cell, handle) -> CellResult."""

from __future__ import annotations

from stackgate.backends.base import Backend, EnvHandle, RunContext

__all__ = ["Backend", "EnvHandle", "RunContext"]
