"""The backend protocol and what every backend shares."""

from __future__ import annotations

import random
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from stackgate.model import Cell, CellResult, Stack
from stackgate.suite import SuiteSpec


@dataclass(frozen=True)
class EnvHandle:
    """A prepared environment: a venv's python or an image tag, with what was installed."""

    stack: Stack
    ref: str  # venv python path, or image tag
    key: str  # content hash of everything that went in
    reused: bool
    prepare_s: float
    sbom: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunContext:
    """Where a cell writes, how the run is configured, and which phase this is: `main`, or `rollback`
    against one candidate (production reading what that candidate wrote)."""

    run_id: str
    run_dir: Path
    suite: SuiteSpec
    on_line: Callable[[str], None] | None = None
    phase: str = "main"
    against: Cell | None = None
    artifacts: Path | None = None  # STACKGATE_ARTIFACTS for this run of the cell (set by the pipeline)
    select: tuple[str, ...] = ()  # repeats: only these test node ids
    suite_deps: Mapping[str, Any] = field(default_factory=dict)  # what the suite installs (for the report)

    def result_id(self, cell: Cell) -> str:
        return cell.result_id(self.phase, self.against)

    def cell_dir(self, cell: Cell) -> Path:
        path = self.run_dir / "cells" / self.result_id(cell)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def fresh_cell_dir(self, cell: Cell) -> tuple[Path, Path]:
        """The cell's directory without outputs of an earlier attempt, and its shared scratch directory."""
        workdir = self.cell_dir(cell)
        for old in [*workdir.glob("junit-node*.xml"), *workdir.glob("results-node*.jsonl"), *workdir.glob("node*.log")]:
            old.unlink()
        shared = workdir / "shared"
        shared.mkdir(exist_ok=True)
        return workdir, shared

    def artifacts_dir(self, cell: Cell) -> Path:
        """Where the suite reads and writes cross-version artifacts: the pipeline's choice (one
        directory per candidate stack), else one per pool and topology."""
        if self.artifacts is not None:
            self.artifacts.mkdir(parents=True, exist_ok=True)
            return self.artifacts
        pool, topo = cell.comparison_key
        path = self.run_dir / "artifacts" / f"{pool}-{topo}"
        path.mkdir(parents=True, exist_ok=True)
        return path


class PrepareFailed(Exception):
    """An environment could not be built; the cells that need it become build-failed."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail


class Backend(Protocol):
    name: str

    def prepare(self, stack: Stack, log_path: Path) -> EnvHandle: ...

    def run(self, cell: Cell, handle: EnvHandle, ctx: RunContext) -> CellResult: ...

    def close(self) -> None: ...


def free_port(low: int = 20000, high: int = 40000) -> int:
    """A free port well below the ephemeral range; the suite offsets it per test (up to +2000)."""
    for _ in range(200):
        port = random.randrange(low, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError("no free port found for the rendezvous")
