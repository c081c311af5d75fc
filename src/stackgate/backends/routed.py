"""A run whose stacks live in different places: `Routed` sends each stack to its backend (an
interpreter given with --candidate-python / --production-python to the host backend, every other
stack to the backend that builds environments)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stackgate import given
from stackgate.backends.base import Backend, Described, EnvHandle, Execution
from stackgate.model import Stack
from stackgate.suite import Layout, NodeCommand, NodeExit


@dataclass
class Routed:
    """Stacks given as interpreters (`--candidate-python`, `--production-python`) go to the host
    backend; every other stack to the backend that builds environments."""

    built: Backend
    host: Backend
    name: str = ""
    runs_plain: bool = True

    def __post_init__(self) -> None:
        self.name = self.name or f"{self.built.name}+{self.host.name}"
        self.runs_plain = self.built.runs_plain and self.host.runs_plain

    def _for(self, stack: Stack) -> Backend:
        return self.host if stack.given.startswith(f"{given.HOST}:") else self.built

    def prepare(self, stack: Stack, log_path: Path) -> EnvHandle:
        return self._for(stack).prepare(stack, log_path)

    def layout(self, handle: EnvHandle, exe: Execution) -> Layout:
        return self._for(handle.stack).layout(handle, exe)

    def execute(self, handle: EnvHandle, commands: Sequence[NodeCommand], deadline: float,
                exe: Execution) -> tuple[NodeExit, ...]:
        return self._for(handle.stack).execute(handle, commands, deadline, exe)

    def describe(self, handle: EnvHandle) -> Described:
        return self._for(handle.stack).describe(handle)

    def close(self) -> None:
        self.built.close()
        self.host.close()
