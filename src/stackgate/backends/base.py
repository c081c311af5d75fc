"""The backend protocol and what every backend shares."""

from __future__ import annotations

import hashlib
import random
import secrets
import shutil
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from stackgate.masking import Masker
from stackgate.model import Cell, CellResult, Stack
from stackgate.suite import Layout, NodeCommand, NodeExit, SuiteSpec, build_result, node_commands


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
    refused_links: tuple[str, ...] = ()  # links out of the run directory not copied into this run's artifacts
    mask: Masker = field(default_factory=Masker)  # secrets never reach what stackgate writes

    def result_id(self, cell: Cell) -> str:
        return cell.result_id(self.phase, self.against)

    def cell_dir(self, cell: Cell) -> Path:
        path = self.run_dir / "cells" / self.result_id(cell)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def fresh_cell_dir(self, cell: Cell) -> tuple[Path, Path]:
        """The cell's directory without outputs of an earlier attempt, and its shared scratch directory."""
        workdir = self.cell_dir(cell)
        for old in workdir.glob("node*.log"):
            old.unlink()
        for attempt in workdir.glob(f"{ATTEMPT_PREFIX}*"):  # a killed attempt's evidence is never read again
            shutil.rmtree(attempt, ignore_errors=True)
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


ATTEMPT_PREFIX = "attempt-"  # cells/<result>/attempt-<tag>/: one attempt's JUnit and metric records

# A cached environment's check, the same on every backend: its interpreter imports torch at the version
# the stack asks for.
TORCH_PROBE = "import torch; print('stackgate-probe', torch.__version__)"


def torch_probe_problem(stack: Stack, exit_code: int | None, output: str) -> str:
    """Why the output of TORCH_PROBE (run with the environment's python) rules the environment out,
    or "" when it imports the stack's torch."""
    found = [line.split() for line in output.splitlines() if line.startswith("stackgate-probe ")]
    if exit_code != 0 or not found:
        return f"`python -c 'import torch'` failed (exit {exit_code}): {output.strip()[-300:]}"
    if found[-1][1].split("+")[0] != stack.torch_public:
        return f"it imports torch {found[-1][1]}, not {stack.torch_public}"
    return ""


class PrepareFailed(Exception):
    """An environment could not be built; the cells that need it become build-failed."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail


@dataclass(frozen=True)
class Execution:
    """One attempt at one cell, as the backend sees it: host directories and a unique name."""

    cell: Cell
    workdir: Path  # the cell's directory on this host (per-node logs go here)
    artifacts: Path
    shared: Path
    suite: Path  # the suite on this host
    tag: str  # unique per attempt: what an earlier, killed attempt left never blocks this one
    on_line: Callable[[str], None] | None = None


class Backend(Protocol):
    """Provides environments and executes node commands; what the nodes run is `suite.node_commands`."""

    name: str

    def prepare(self, stack: Stack, log_path: Path) -> EnvHandle: ...

    def layout(self, handle: EnvHandle, exe: Execution) -> Layout: ...

    def execute(self, handle: EnvHandle, commands: Sequence[NodeCommand], deadline: float,
                exe: Execution) -> tuple[NodeExit, ...]: ...

    def describe(self, handle: EnvHandle) -> dict[str, Any]: ...

    def close(self) -> None: ...


def run_cell(backend: Backend, cell: Cell, handle: EnvHandle, ctx: RunContext) -> CellResult:
    """One cell on any backend: the suite's node plan, executed invocation by invocation (the nodes
    of each at the same time) under one deadline, then collected into a CellResult."""
    workdir, shared = ctx.fresh_cell_dir(cell)
    tag = hashlib.sha1(f"{ctx.run_id}/{ctx.result_id(cell)}/{secrets.token_hex(4)}".encode()).hexdigest()[:10]
    exe = Execution(cell, workdir, ctx.artifacts_dir(cell), shared, ctx.suite.path.resolve(), tag, ctx.on_line)
    # this attempt's JUnit and records go where only it writes: a process of a killed attempt that is
    # still alive writes into a directory that is gone or never read, not into this attempt's evidence
    evidence = workdir / f"{ATTEMPT_PREFIX}{tag}"
    evidence.mkdir()
    base_layout = backend.layout(handle, exe)
    layout = replace(base_layout, out=base_layout.out / evidence.name)
    start = time.monotonic()
    deadline = start + ctx.suite.timeout_s
    exits: list[NodeExit] = []
    for group in node_commands(cell, ctx, layout):
        exits += backend.execute(handle, group, deadline, exe)
    extra = {**backend.describe(handle), **({"refused_links": list(ctx.refused_links)} if ctx.refused_links else {})}
    return build_result(cell, exits, evidence, time.monotonic() - start, ctx, extra_env=extra)


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
