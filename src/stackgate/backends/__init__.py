"""Backends provide environments and execute node commands: `prepare(stack)` -> an `EnvHandle`;
`layout(handle, execution)` (where things are as a node sees them); `execute(handle, commands, ...)`
of the node commands `suite.node_commands` plans (only `stackgate.runner` calls it); `describe`;
`close`. Which one a run uses: `backends.choose`."""

from __future__ import annotations

from stackgate.backends.base import Backend, EnvHandle

__all__ = ["Backend", "EnvHandle"]
