"""Run ids and the layout of a run directory: every path under one is spelled here, once. A run
directory belongs to one live run: `RunDir.claim` takes its lock (a file lock the kernel drops when
the owner dies, so a killed run never leaves a stale claim) before anything is written, and a second
run of the same id exits 2 naming the owner. Run, calibrate and merge claim theirs."""

from __future__ import annotations

import datetime as dt
import fcntl
import os
import re
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path

from stackgate.errors import ConfigError, InfraError

OWNER = ".owner.lock"
RESULTS = "results.jsonl"
ATTEMPT = "attempt-"  # cells/<result id>/attempt-<tag>/: one attempt's JUnit and records
RECORDS_GLOB = "results-node*.jsonl"
JUNIT_GLOB = "junit-node*.xml"


def new_run_id(matrix_name: str) -> str:
    """`<UTC time>-<matrix name>-<4 hex>`: unique, and sorted by time."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{re.sub(r'[^a-z0-9]+', '-', matrix_name.lower())}-{secrets.token_hex(2)}"


@dataclass
class Claim:
    path: Path
    fd: int

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # the file stays: removing a lock file races with the next claimant
            self.fd = -1


@dataclass(frozen=True)
class RunDir:
    """A run directory and where each thing in it lies."""

    root: Path

    @classmethod
    def of(cls, reports: Path, run_id: str) -> RunDir:
        return cls(reports / run_id)

    @property
    def owner(self) -> Path:
        return self.root / OWNER

    @property
    def results(self) -> Path:
        return self.root / RESULTS

    @property
    def torn(self) -> Path:
        """The bytes of a line a kill tore, cut off before the next append."""
        return self.root / (RESULTS + ".torn")

    @property
    def manifest(self) -> Path:
        return self.root / "run.json"

    @property
    def calibration(self) -> Path:
        return self.root / "calibration.json"

    @property
    def report_json(self) -> Path:
        return self.root / "report.json"

    @property
    def report_md(self) -> Path:
        return self.root / "report.md"

    @property
    def report_html(self) -> Path:
        return self.root / "report.html"

    @property
    def junit(self) -> Path:
        return self.root / "junit.xml"

    @property
    def build_logs(self) -> Path:
        """The installers' and image builds' logs, one per stack."""
        return self.root / "build"

    def cell(self, result_id: str) -> CellDir:
        """One result of a cell (a result id): its nodes' logs, its attempts' records and JUnit, scratch."""
        return CellDir(self.root / "cells" / result_id)

    def artifacts(self, pool: str, topology: str) -> Path:
        """Cross-version artifacts of one pool and topology (production's, and each candidate's)."""
        return self.root / "artifacts" / f"{pool}-{topology}"

    def stack_artifacts(self, pool: str, topology: str, label: str | None) -> Path:
        """One stack's cross-version artifacts: production's main run writes `production-main/production/`
        (`label` None); each candidate stack (its label) gets a directory of its own with a copy of
        production's artifacts to read, its own `candidate/` to write, and production's rollback
        against it runs there too."""
        return self.artifacts(pool, topology) / (label or "production-main")

    @property
    def promotion(self) -> Promotion:
        """What `stackgate promote` writes for a GO run: the new production.toml and the locks."""
        return Promotion(self.root / "promotion")

    def is_run(self) -> bool:
        """A run's directory: it has results, or a manifest (written before any cell runs)."""
        return self.results.exists() or self.manifest.exists()

    def claim(self) -> Claim:
        """The directory, made and locked for this process (exit 2 naming the owner if it is taken)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.owner, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise InfraError(f"cannot create {self.root}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 400, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise ConfigError(f"run directory {self.root} belongs to a live run: {owner}",
                              hint="pass another --run-id (or none: generated ids are unique), or wait for that run "
                                   "to end before you --resume it") from None
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {stamp}\n".encode(), 0)
        return Claim(self.owner, fd)


@dataclass(frozen=True)
class CellDir:
    """A cell's directory (one result id): its nodes' logs, one directory per attempt (only that
    attempt writes its records and JUnit there), the nodes' shared scratch, a Slurm job's scripts."""

    root: Path

    def node_log(self, node: int) -> Path:
        return self.root / f"node{node}.log"

    def node_logs(self) -> list[Path]:
        return sorted(self.root.glob("node*.log"))

    @property
    def shared(self) -> Path:
        return self.root / "shared"

    @property
    def slurm(self) -> Path:
        """A Slurm job's batch and node scripts, and the exit code each node wrote."""
        return self.root / "slurm"

    def leftovers(self, node: int, label: str) -> Path:
        """What a container's init found still running when its suite ended (the Docker backend)."""
        return self.root / leftovers_name(node, label)

    def attempt(self, tag: str) -> Path:
        return self.root / f"{ATTEMPT}{tag}"

    def attempts(self) -> list[Path]:
        return sorted(self.root.glob(f"{ATTEMPT}*"))


def records_file(out: Path, node: int) -> Path:
    """Where node `node` appends its records ($STACKGATE_RESULTS), under an attempt's directory as
    the node sees it (a host path, or a mount point in a container)."""
    return out / f"results-node{node}.jsonl"


def leftovers_name(node: int, label: str) -> str:
    return f"leftovers-node{node}-{label}.txt"


def junit_name(node: int, label: str) -> str:
    """The JUnit file of node `node` for one pytest invocation (`label`)."""
    return f"junit-node{node}-{label}.xml"


@dataclass(frozen=True)
class Promotion:
    """A promotion's (or a rollback's) directory: production.toml to commit, its patch, the changelog,
    and per stack its pylock.toml with the tested wheels beside it."""

    root: Path

    @property
    def production_toml(self) -> Path:
        return self.root / "production.toml"

    @property
    def patch(self) -> Path:
        return self.root / "production.toml.patch"

    @property
    def changelog(self) -> Path:
        return self.root / "CHANGELOG.md"

    def stack(self, label: str) -> Path:
        return self.root / label


def runs_with_results(reports: Path) -> list[str]:
    """The ids of the runs under `reports` that recorded results, oldest first."""
    if not reports.is_dir():
        return []
    return sorted(p.name for p in reports.iterdir() if RunDir(p).results.exists())


# The compile caches a node's stacks share (#43): production's main run fills them, a candidate's run
# compiles on a copy of them (in its own artifacts), and production's rollback against that candidate on
# what the candidate left there, as on a node where both stacks use one TORCHINDUCTOR_CACHE_DIR and
# TRITON_CACHE_DIR (pytorch#150494, #173679). Relative to a stack's artifacts directory.
COMPILE_CACHE = Path("production") / "compile-cache"
COMPILE_CACHE_VARS = (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton"))


def compile_cache_env(artifacts: Path) -> dict[str, str]:
    """The variables that point a node's torch.compile (inductor) and Triton at the shared caches under
    `artifacts` (the path as the node sees it)."""
    return {var: str(artifacts / COMPILE_CACHE / sub) for var, sub in COMPILE_CACHE_VARS}
