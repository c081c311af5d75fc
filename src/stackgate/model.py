"""The resolved concepts, as frozen dataclasses. Strings are parsed before they get here."""

from __future__ import annotations

import enum
import functools
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from packaging.version import Version

from stackgate.boundary.cell import CellRecord
from stackgate.boundary.environment import Environment
from stackgate.versions import CudaVariant, Driver


class Role(str, enum.Enum):
    PRODUCTION = "production"
    CANDIDATE = "candidate"


class GpuClass(str, enum.Enum):
    DATACENTER = "datacenter"
    CONSUMER = "consumer"
    NONE = "none"


class Transport(str, enum.Enum):
    EFA = "efa"
    IB = "ib"
    SOCKET = "socket"
    NONE = "none"
    ANY = "any"  # no expectation: the suite records what NCCL picked without judging it


@dataclass(frozen=True)
class SlurmSpec:
    """A pool whose cells run as Slurm jobs (fleet.toml `launcher = "slurm"`, or `--launcher slurm`)."""

    partition: str = ""  # "" = the cluster's default partition
    account: str = ""
    constraint: str = ""
    # the container runtime of its nodes: each task runs the node's command in the stack's image (by digest)
    # with "podman", "pyxis" (enroot, `srun --container-image`) or "apptainer"; "" = the stack's venv
    container: str = ""


@dataclass(frozen=True)
class RunnerPool:
    """A class of machines a cell can run on. `local` is the machine at hand."""

    name: str
    driver: Driver | None
    gpu_class: GpuClass
    gpu: str = ""
    gpus_per_node: int = 0
    transport: Transport = Transport.NONE
    nodes: int = 1
    is_local: bool = False
    runs_on: tuple[str, ...] = ()  # CI runner labels of this pool (`stackgate ci github`)
    slurm: SlurmSpec | None = None  # its cells are Slurm jobs (submitted from this runner)

    @property
    def has_gpu(self) -> bool:
        return self.driver is not None and self.gpus_per_node > 0

    @property
    def tag(self) -> str:
        return f"drv{self.driver.major}" if self.driver is not None else "cpu"


@dataclass(frozen=True)
class WheelSource:
    """Where wheels come from. `inherit_pip_config` adds this host's pip find-links and indexes."""

    name: str = "default"
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    inherit_pip_config: bool = True
    pre: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "index_url": self.index_url, "extra_index_urls": list(self.extra_index_urls),
                "find_links": list(self.find_links), "inherit_pip_config": self.inherit_pip_config, "pre": self.pre}


@dataclass(frozen=True)
class Stack:
    """What goes into one environment (venv or image)."""

    torch: Version
    cuda: CudaVariant
    python: str
    source: WheelSource = field(default_factory=WheelSource)
    channel: str = "stable"
    base_image: str = "stackgate/base:bookworm"
    cuda_compat: bool = False
    extra_requirements: tuple[str, ...] = ()
    given: str = ""  # "host:<python>" or "image:<ref>": an environment the team has, probed, never built

    @property
    def torch_public(self) -> str:
        """The version without local label: 2.13.0+cpu -> 2.13.0."""
        return self.torch.public

    def requirement(self, pypi_default: CudaVariant | None) -> str:
        """The pip requirement for torch. The variant PyPI serves by default carries no local label."""
        if pypi_default is not None and self.cuda == pypi_default:
            return f"torch=={self.torch_public}"
        return f"torch=={self.torch_public}+{self.cuda.tag}"

    @property
    def label(self) -> str:
        return f"{self.cuda.tag}-torch{self.torch_public}-py{self.python}"

    @property
    def ident(self) -> str:
        """The label and the content hash: unique per stack of a matrix (stacks.json, run.json)."""
        return f"{self.label}-{self.content_hash[:8]}"

    def to_json(self) -> dict[str, Any]:
        data = {"torch": str(self.torch), "cuda": self.cuda.tag, "python": self.python, "channel": self.channel,
                "base_image": self.base_image, "cuda_compat": self.cuda_compat, "source": self.source.to_json(),
                "extra_requirements": list(self.extra_requirements)}
        if self.given:  # (absent otherwise: the content hash of every built stack stays as it was)
            data["given"] = self.given
        return data

    @property
    def content_hash(self) -> str:
        blob = json.dumps(self.to_json(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True)
class Topology:
    nodes: int = 1
    nproc_per_node: int = 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node

    def __str__(self) -> str:
        return f"{self.nodes}x{self.nproc_per_node}"


@dataclass(frozen=True)
class Cell:
    """One Stack on one RunnerPool with a topology and a role."""

    stack: Stack
    pool: RunnerPool
    topology: Topology
    role: Role
    required: bool = False
    baseline: str = ""  # a candidate's production partner (cell id), set once when the matrix is expanded

    @property
    def id(self) -> str:
        prefix = "prod-" if self.role is Role.PRODUCTION else ""
        return f"{prefix}{self.pool.name}-{self.pool.tag}-{self.stack.label}-{self.topology}"

    def result_id(self, phase: Phase | None = None, against: Cell | None = None) -> str:
        """The id of this cell's result in a phase: `<id>` for the main run, `<id>@repeat<r>` and
        `<id>@aa<r>` for a repeat and an A/A run; a production cell's rollback against one candidate
        is `<id>@rollback-<candidate stack label>`."""
        if phase is None or phase.kind is PhaseKind.MAIN:
            return self.id
        return f"{self.id}@{phase}" + (f"-{against.stack.label}" if against is not None else "")

    @property
    def device(self) -> str:
        return "cuda" if self.pool.has_gpu else "cpu"

    @property
    def collective_world_sizes(self) -> tuple[int, ...]:
        """Process counts per node for the collective checks: never more than the cell has per node
        (so never more than the GPUs of a node). One node: 2 (or 1) and the full node; several
        nodes: the cell's processes per node on every node."""
        per_node = self.topology.nproc_per_node
        if self.topology.nodes > 1:
            return (per_node,)
        return tuple(sorted({min(2, per_node), per_node}))

    @property
    def comparison_key(self) -> tuple[str, str]:
        """Cells that are compared with each other: same pool, same topology."""
        return (self.pool.name, str(self.topology))

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "role": self.role.value,
            "required": self.required,
            "baseline": self.baseline,
            "pool": self.pool.name,
            "driver": str(self.pool.driver) if self.pool.driver else None,
            "gpu_class": self.pool.gpu_class.value,
            "transport": self.pool.transport.value,
            "device": self.device,
            "topology": str(self.topology),
            "stack": self.stack.to_json(),
        }

    def record(self, phase: Phase | None = None) -> CellRecord:
        """The cell as a result records it (with the phase of the attempt, where given)."""
        return CellRecord.of({**self.to_json(), **({"phase": str(phase)} if phase is not None else {})})


class PhaseKind(str, enum.Enum):
    MAIN = "main"  # the cell's suite, once
    ROLLBACK = "rollback"  # production reading what one candidate wrote (`-m crossversion`)
    REPEAT = "repeat"  # round r of the interleaved repeats (and confirmation) of the performance-gated tests
    AA = "aa"  # round r of a calibration's A/A runs of the production stack
    RERUN = "rerun"  # round r of the confirmation of a test that failed in the candidate (both stacks)
    PLAIN = "plain"  # production's failing tests once more as plain pytest, outside the harness's machinery


@dataclass(frozen=True)
class Phase:
    """Which run of a cell a result is. Stored and shown as text ("main", "rollback", "repeat3",
    "aa2", "rerun1", "plain": results.jsonl, STACKGATE_PHASE); only this class writes or reads that text."""

    kind: PhaseKind = PhaseKind.MAIN
    round: int = 0  # repeats and A/A runs: 0, 1, ...

    def __str__(self) -> str:
        return self.kind.value + (str(self.round) if self.kind in ROUNDS else "")

    @classmethod
    def parse(cls, text: str) -> Phase:
        found = re.fullmatch(r"(main|rollback|plain)|(repeat|aa|rerun)([0-9]{1,9})", text)
        if found is None:
            raise ValueError(f"not a phase: {text[:40]!r} (main, rollback, plain, repeat<N>, aa<N> or rerun<N>)")
        if found.group(1):
            return cls(PhaseKind(found.group(1)))
        if int(found.group(3)) > MAX_ROUND:
            raise ValueError(f"phase {text!r}: round {int(found.group(3))} is beyond the bound of {MAX_ROUND} (no "
                             "policy makes that many rounds: not a result this harness wrote)")
        return cls(PhaseKind(found.group(2)), int(found.group(3)))


# the most rounds a phase can have: repeats and confirm_repeats (<= 100 each) plus pressure_reruns
# (<= 20), confirm_failures (<= 10); a round beyond it was not written by this harness
MAX_ROUND = 1000
ROUNDS = (PhaseKind.REPEAT, PhaseKind.AA, PhaseKind.RERUN)  # the kinds that have rounds
MAIN = Phase()
ROLLBACK = Phase(PhaseKind.ROLLBACK)
PLAIN = Phase(PhaseKind.PLAIN)
repeat: Callable[[int], Phase] = functools.partial(Phase, PhaseKind.REPEAT)
aa: Callable[[int], Phase] = functools.partial(Phase, PhaseKind.AA)
rerun: Callable[[int], Phase] = functools.partial(Phase, PhaseKind.RERUN)


@dataclass(frozen=True)
class Pruned:
    """A cell that cannot exist, with every rule that removed it."""

    cell: Cell
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class NotHere:
    """A possible cell whose runner pool is not the machine at hand."""

    cell: Cell
    reason: str


@dataclass(frozen=True)
class EnvPlan:
    """Cells grouped by Stack: one environment (venv or image) serves many cells."""

    stack: Stack
    cells: tuple[Cell, ...]


class Status(str, enum.Enum):
    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    TIMEOUT = "timeout"
    OOM = "oom"
    CRASHED = "crashed"
    BUILD_FAILED = "build-failed"
    INFRA_ERROR = "infra-error"
    HOST_MISMATCH = "host-mismatch"  # the runner does not match its pool's declaration (host probe)
    HOST_UNHEALTHY = "host-unhealthy"  # ECC, pending remap/retirement, Xid, a GPU in an error state
    NO_BUILD = "no-build"  # the nightly channel has no (fresh, matching) build for this cell: a guard said so

    @property
    def is_machinery(self) -> bool:
        """The machine, the tooling or the channel failed, not the stack: never a verdict on it;
        retried on resume."""
        return self in (Status.INFRA_ERROR, Status.HOST_MISMATCH, Status.HOST_UNHEALTHY, Status.NO_BUILD)
    SKIPPED = "skipped"
    NOT_RUN_HERE = "not-run-here"

    @property
    def ran_suite(self) -> bool:
        """The suite ran to its end (every test passed, or some failed): its tests and metrics are evidence."""
        return self in (Status.PASSED, Status.FAILED)


class Outcome(str, enum.Enum):
    """A test's outcome (from JUnit); a str enum, so it compares equal to its value."""

    __test__ = False

    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    SKIPPED = "skipped"

    def __str__(self) -> str:  # "failed", not "Outcome.FAILED", wherever it is formatted
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


@dataclass(frozen=True)
class TestOutcome:
    __test__ = False  # not a pytest test class

    name: str
    outcome: Outcome
    duration_s: float = 0.0
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "outcome": Outcome(self.outcome).value, "duration_s": self.duration_s,
                "message": self.message}


@dataclass(frozen=True)
class Metric:
    """A measurement with its samples (repeats). `better` says which direction is good."""

    name: str
    unit: str
    samples: tuple[float, ...]
    test: str = ""
    better: str = "lower"  # lower | higher | equal
    tags: tuple[tuple[str, str], ...] = ()
    nodeid: str = ""  # the pytest test that recorded it (for repeating the performance-gated tests)

    @property
    def key(self) -> str:
        if not self.tags:
            return self.name
        return self.name + "[" + ",".join(f"{k}={v}" for k, v in self.tags) + "]"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "unit": self.unit, "samples": list(self.samples), "test": self.test,
                "better": self.better, "tags": dict(self.tags), "nodeid": self.nodeid}



@dataclass(frozen=True)
class CellResult:
    cell_id: str
    role: Role
    status: Status
    reason: str = ""
    tests: tuple[TestOutcome, ...] = ()
    metrics: tuple[Metric, ...] = ()
    environment: Environment = field(default_factory=Environment)
    warnings: tuple[str, ...] = ()
    log_tail: str = ""
    duration_s: float = 0.0
    cell: CellRecord = field(default_factory=CellRecord)
    phase: Phase = MAIN
    against: str = ""  # rollback: the candidate cell whose artifacts production read

    def __post_init__(self) -> None:
        if not isinstance(self.environment, Environment):  # given as JSON data: validated like what is read
            object.__setattr__(self, "environment", Environment.of(self.environment))
        if not isinstance(self.cell, CellRecord):
            object.__setattr__(self, "cell", CellRecord.of(self.cell))

    def test(self, name: str) -> TestOutcome | None:
        for outcome in self.tests:
            if outcome.name == name or outcome.name.endswith("::" + name):
                return outcome
        return None

    def to_json(self) -> dict[str, Any]:
        return {"cell_id": self.cell_id, "role": self.role.value, "status": self.status.value, "reason": self.reason,
                "duration_s": round(self.duration_s, 3), "cell": self.cell.to_json(), "tests": [t.to_json() for t in self.tests],
                "metrics": [m.to_json() for m in self.metrics], "environment": self.environment.to_json(),
                "warnings": list(self.warnings), "log_tail": self.log_tail, "phase": str(self.phase),
                "against": self.against}



class Decision(str, enum.Enum):
    GO = "GO"
    NO_GO = "NO-GO"
    INCONCLUSIVE = "INCONCLUSIVE"


class Severity(str, enum.Enum):
    BLOCKING = "blocking"
    INCONCLUSIVE = "inconclusive"
    WAIVED = "waived"
    INFO = "info"


@dataclass(frozen=True)
class Reason:
    severity: Severity
    message: str
    cell: str = ""
    test: str = ""
    kind: str = ""  # stable machine-readable category: failed-test, regression, numerics, ...
    subject: tuple[tuple[str, str], ...] = ()  # (key, value) beyond cell and test: a finding's advisory, ...

    def to_json(self) -> dict[str, Any]:
        return {"severity": self.severity.value, "kind": self.kind, "cell": self.cell, "test": self.test,
                "message": self.message, **({"subject": dict(self.subject)} if self.subject else {})}


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    reasons: tuple[Reason, ...]

    @property
    def blocking(self) -> tuple[Reason, ...]:
        return tuple(r for r in self.reasons if r.severity is Severity.BLOCKING)

    def to_json(self) -> dict[str, Any]:
        return {"decision": self.decision.value, "reasons": [r.to_json() for r in self.reasons]}
