"""The harness's side of the suite contract: what each node of a cell runs (`node_commands`: argv,
environment, working directory), and how the outputs (JUnit XML from pytest, JSON lines from
$STACKGATE_RESULTS) and the nodes' exits become a CellResult.

Every way of running cells uses this one plan: a backend only says where things are as a node sees
them (`Layout`) and executes the commands, returning a `NodeExit` per node.

Any pytest suite works: identity/metrics records are optional; test outcomes come from JUnit.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stackgate.boundary import records as records_boundary
from stackgate.installer import is_disk_full  # the installers' rule serves the nodes' output too
from stackgate.junit import missing_nodes, read_junit
from stackgate.masking import Masker
from stackgate.model import MAIN, ROLLBACK, Cell, CellResult, Phase, PhaseKind, Status, TestOutcome
from stackgate.pressure import Pressure
from stackgate.rundir.layout import (
    JUNIT_GLOB,
    RECORDS_GLOB,
    CellDir,
    RunDir,
    compile_cache_env,
    junit_name,
    records_file,
)
from stackgate.shipped import BUNDLED_SUITE

RDZV_PORT = 29400  # the c10d rendezvous port of node0 where a cell has a host of its own (containers, Slurm)
_OOM = re.compile(r"(OutOfMemoryError|CUDA out of memory|std::bad_alloc|MemoryError)")


@dataclass(frozen=True)
class SuiteSpec:
    """Which suite runs in a cell and how."""

    path: Path = BUNDLED_SUITE
    pytest_args: tuple[str, ...] = ()
    profile: str = "default"  # default | quick
    timeout_s: float = 1200.0
    platform_checks: bool = True  # add the bundled identity/collective/transport checks to a user's suite
    env: tuple[tuple[str, str], ...] = ()  # extra variables for the suite (NCCL_*, FI_*, STACKGATE_DIST_TIMEOUT)


PLATFORM_CHECKS = ("test_identity.py", "test_collectives.py", "test_transport.py")


def run_marks(run_id: str, run_dir: Path) -> dict[str, str]:
    """What every process of a run carries in its environment, and so what a resume ends: its run id,
    and a key of its run directory. A run id alone is a name a user gives (`--run-id nightly`): two
    checkouts on one runner can each have a run of that name, and one's resume must not end the other's."""
    key = hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]
    return {"STACKGATE_RUN_ID": run_id, "STACKGATE_RUN_KEY": key}


def suite_env(cell: Cell, *, results: Path, artifacts: Path, shared: Path, profile: str,
              marks: Mapping[str, str], node_rank: int = 0, endpoint: str = "", phase: Phase = MAIN,
              extra: tuple[tuple[str, str], ...] = ()) -> dict[str, str]:
    """STACKGATE_* variables: what the cell asked for, where to write, the topology, and the run's marks;
    and the compile caches the stacks share (`compile_cache_env`), unless the suite's own variables
    (`--suite-env`) name others."""
    return compile_cache_env(artifacts) | dict(extra) | dict(marks) | {
        "STACKGATE_EXPECT_TORCH": cell.stack.torch_public,
        "STACKGATE_EXPECT_CUDA": cell.stack.cuda.tag,
        "STACKGATE_EXPECT_TRANSPORT": cell.pool.transport.value,
        "STACKGATE_DEVICE": cell.device,
        "STACKGATE_ROLE": cell.role.value,
        "STACKGATE_STACK_GIVEN": cell.stack.given,
        "STACKGATE_PHASE": str(phase),
        "STACKGATE_PROFILE": profile,
        "STACKGATE_CELL": cell.id,
        "STACKGATE_RESULTS": str(results),
        "STACKGATE_ARTIFACTS": str(artifacts),
        "STACKGATE_SHARED_DIR": str(shared),
        "STACKGATE_NNODES": str(cell.topology.nodes),
        "STACKGATE_NPROC_PER_NODE": str(cell.topology.nproc_per_node),
        "STACKGATE_WORLD_SIZES": ",".join(str(n) for n in cell.collective_world_sizes),
        "STACKGATE_NODE_RANK": str(node_rank),
        "STACKGATE_RDZV_ENDPOINT": endpoint,
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1",
    }


@dataclass(frozen=True)
class Invocation:
    """One pytest run per node: the suite itself, and for a user's suite also the platform checks,
    each with its own rootdir and configuration."""

    label: str
    args: tuple[str, ...]
    cwd: Path


_CONFIG_FILES = (("pytest.ini", ""), (".pytest.ini", ""), ("pyproject.toml", "[tool.pytest"), ("tox.ini", "[pytest]"),
                 ("setup.cfg", "[tool:pytest]"))


def has_own_config(suite: Path) -> bool:
    """The suite directory holds a pytest configuration of its own (pytest's own rules of which
    file counts)."""
    for name, marker in _CONFIG_FILES:
        found = suite / name
        if found.is_file() and (not marker or marker in found.read_text(errors="replace")):
            return True
    return False


def isolation(suite: Path, seen_as: Path) -> tuple[str, ...]:
    """A suite is configured by what is in its own directory, whichever backend runs it: without a
    pytest configuration of its own, pytest would otherwise pick up a parent directory's (its
    filterwarnings, markers, conftest.py) on this host but not inside a container, where the suite
    is mounted alone; the same suite would get a different verdict per backend."""
    if has_own_config(suite):
        return ()
    return ("-c", "/dev/null", "--confcutdir", str(seen_as))


def platform_check(spec: SuiteSpec, name: str) -> bool:
    """A node id of the bundled platform checks that run beside a user's suite (it names one of their
    files), not of the suite itself."""
    return spec.platform_checks and name.split("::", 1)[0] in PLATFORM_CHECKS


def invocations(spec: SuiteSpec, phase: Phase, *, path: Path | None = None,
                bundled: Path = BUNDLED_SUITE, select: tuple[str, ...] = ()) -> list[Invocation]:
    """The pytest runs of one cell. `select`: node ids (relative to the suite) to run alone, for the
    repeats of the performance-gated tests."""
    path = path or spec.path
    common = ("-v", "-p", "no:cacheprovider", "-o", "junit_family=xunit1")
    own = isolation(spec.path, path)
    only = ("-m", "crossversion") if phase == ROLLBACK else ()
    if select:
        # a platform check's node id names a file of the bundled suite (its JUnit is relative to it): it
        # runs from there, as in the main run
        checks = tuple(n for n in select if path != bundled and platform_check(spec, n))
        own_ids = tuple(n for n in select if n not in checks)
        out = [Invocation("platform", (*(f"{bundled}/{n}" for n in checks), "--rootdir", str(bundled), *common),
                          bundled)] if checks else []
        if own_ids:
            out.append(Invocation("suite", (*(f"{path}/{n}" for n in own_ids), "--rootdir", str(path), *own, *common,
                                            *only, *spec.pytest_args), path))
        return out
    out = []
    if spec.platform_checks and path != bundled and phase == MAIN:
        checks = tuple(str(bundled / name) for name in PLATFORM_CHECKS)
        out.append(Invocation("platform", (*checks, "--rootdir", str(bundled), *common), bundled))
    out.append(Invocation("suite", (str(path), "--rootdir", str(path), *own, *common, *only, *spec.pytest_args),
                          path))
    return out


def pytest_argv(python: str, invocation: Invocation, junit: Path) -> list[str]:
    return [python, "-m", "pytest", *invocation.args, f"--junitxml={junit}"]


@dataclass(frozen=True)
class RunContext:
    """One attempt's context, the suite contract's input: where the cell writes, how the run is
    configured, and which run of the cell this is (`phase`: main, a repeat or A/A round, or production's
    rollback `against` one candidate), which tests (`select`) and which artifacts directory. The runner
    makes one per attempt."""

    run_id: str
    run_dir: Path
    suite: SuiteSpec
    on_line: Callable[[str], None] | None = None
    phase: Phase = MAIN
    against: Cell | None = None
    artifacts: Path | None = None  # STACKGATE_ARTIFACTS for this attempt (set by the runner)
    select: tuple[str, ...] = ()  # repeats: only these test node ids
    suite_deps: Mapping[str, Any] = field(default_factory=dict)  # what the suite installs (for the report)
    refused_links: tuple[str, ...] = ()  # links out of the run directory not copied into this run's artifacts
    mask: Masker = field(default_factory=Masker)  # secrets never reach what stackgate writes
    cpus: tuple[int, ...] = ()  # this attempt's share of the host's CPUs (pairing = "concurrent"); () = any

    def result_id(self, cell: Cell) -> str:
        return cell.result_id(self.phase, self.against)

    def cell_dir(self, cell: Cell) -> CellDir:
        found = RunDir(self.run_dir).cell(self.result_id(cell))
        found.root.mkdir(parents=True, exist_ok=True)
        return found

    def fresh_cell_dir(self, cell: Cell) -> CellDir:
        """The cell's directory without outputs of an earlier attempt, with its shared scratch directory."""
        found = self.cell_dir(cell)
        for old in found.node_logs():
            old.unlink()
        for attempt in found.attempts():  # a killed attempt's evidence is never read again
            shutil.rmtree(attempt, ignore_errors=True)
        found.shared.mkdir(exist_ok=True)
        return found

    def artifacts_of(self, cell: Cell) -> Path:
        """Where the suite reads and writes cross-version artifacts: the runner's choice for the attempt
        (`runner.stack_artifacts`, one directory per candidate stack), else one per pool and topology."""
        if self.artifacts is not None:
            self.artifacts.mkdir(parents=True, exist_ok=True)
            return self.artifacts
        pool, topo = cell.comparison_key
        path = RunDir(self.run_dir).artifacts(pool, topo)
        path.mkdir(parents=True, exist_ok=True)
        return path


@dataclass(frozen=True)
class Layout:
    """Where things are as a node sees them: host paths for a venv, mount points in a container,
    shared-filesystem paths on a cluster. The backend's only say in what a node runs."""

    python: str
    out: Path  # the cell's directory: JUnit and results files
    artifacts: Path
    shared: Path
    suite: Path
    bundled: Path = BUNDLED_SUITE
    endpoint: str = ""  # host:port of the c10d rendezvous, for cells of more than one node


@dataclass(frozen=True)
class NodeCommand:
    """What one node runs for one pytest invocation."""

    node: int
    label: str  # the invocation: "suite" or "platform"
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: Path


@dataclass(frozen=True)
class NodeExit:
    """How one node's command ended, as data: no status is ever read back out of log text."""

    node: int
    name: str  # the process or container, for messages
    returncode: int  # negative: killed by that signal
    timed_out: bool = False
    oom_killed: bool = False
    duration_s: float = 0.0
    tail: str = ""
    leftovers: tuple[str, ...] = ()  # processes of this node's command still alive after it ended: ended then
    pressure: Pressure | None = None  # measured where the node ran, by a backend whose nodes are not the harness host


def node_commands(cell: Cell, ctx: RunContext, layout: Layout) -> list[tuple[NodeCommand, ...]]:
    """The plan of one cell: for each pytest invocation, in order, the command of every node (the
    nodes of one invocation run at the same time and meet at `layout.endpoint`)."""
    if ctx.phase.kind is PhaseKind.PLAIN:
        # the fidelity rerun: the selected tests of the suite, on one node, with the suite's own variables
        # (--suite-env) and none of stackgate's
        runs = [inv for inv in invocations(ctx.suite, MAIN, path=layout.suite, bundled=layout.bundled,
                                           select=ctx.select) if inv.label == "suite"]
        return [(NodeCommand(0, inv.label, tuple(pytest_argv(layout.python, inv, layout.out / junit_name(0, inv.label))),
                             dict(ctx.suite.env), inv.cwd),) for inv in runs]
    nodes = cell.topology.nodes
    groups = []
    for inv in invocations(ctx.suite, ctx.phase, path=layout.suite, bundled=layout.bundled, select=ctx.select):
        group = []
        for i in range(nodes):
            env = suite_env(cell, results=records_file(layout.out, i), artifacts=layout.artifacts,
                            shared=layout.shared, profile=ctx.suite.profile,
                            marks=run_marks(ctx.run_id, ctx.run_dir), node_rank=i,
                            endpoint=layout.endpoint if nodes > 1 else "", phase=ctx.phase, extra=ctx.suite.env)
            argv = pytest_argv(layout.python, inv, layout.out / junit_name(i, inv.label))
            group.append(NodeCommand(i, inv.label, tuple(argv), env, inv.cwd))
        groups.append(tuple(group))
    return groups


def suite_digest(suite: Path) -> str:
    """A content hash of a suite directory (names and bytes; no caches)."""
    h = hashlib.sha256()
    for p in sorted(suite.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".pyc"):
            h.update(str(p.relative_to(suite)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


# Limits on what a suite may hand back (README "Contract"): a record beyond them, or one that is not
# valid UTF-8, is unreadable evidence and makes the cell ERROR; it is never cut down or repaired. The
# records themselves are read at the boundary (`boundary.records`).
MAX_RECORD_BYTES = records_boundary.MAX_RECORD_BYTES
MAX_RECORDS_BYTES = records_boundary.MAX_RECORDS_BYTES
MAX_SAMPLES = records_boundary.MAX_SAMPLES
parse_records = records_boundary.parse_records


LOW_DISK_BYTES = 1 << 20  # less than this free where a cell writes: its missing evidence is the disk's doing


def _free_kib(path: Path) -> int:
    try:
        return shutil.disk_usage(path).free // 1024
    except OSError:
        return -1


def _disk_is_full(workdir: Path, procs: Sequence[NodeExit]) -> bool:
    return any(is_disk_full(p.tail) for p in procs) or 0 <= _free_kib(workdir) * 1024 < LOW_DISK_BYTES


NO_ROLLBACK_TESTS = "the suite has no cross-version tests (-m crossversion): nothing to roll back"


def classify(procs: Sequence[NodeExit], tests: tuple[TestOutcome, ...], phase: Phase = MAIN) -> tuple[Status, str]:
    """Status of a suite run from its nodes' exits and the JUnit outcomes."""
    if phase == ROLLBACK and procs and {p.returncode for p in procs} == {5} and not any(p.timed_out for p in procs):
        return Status.SKIPPED, NO_ROLLBACK_TESTS  # pytest's "no tests collected" under -m crossversion
    if any(p.timed_out for p in procs):
        return Status.TIMEOUT, "the suite exceeded the cell timeout"
    tails = "\n".join(p.tail for p in procs)
    for p in procs:
        if p.oom_killed:
            return Status.OOM, f"{p.name} was killed (exit {p.returncode}): out of memory"
        if p.returncode in (-9, 137):
            return Status.CRASHED, f"{p.name} was killed (signal 9)"
        if p.returncode < 0:
            return Status.CRASHED, f"suite process died with signal {-p.returncode}"
    if any(t.outcome in ("failed", "error") and _OOM.search(t.message) for t in tests):
        return Status.OOM, "a test ran out of memory"
    codes = {p.returncode for p in procs}
    if codes <= {0}:
        if not tests:
            return Status.ERROR, "pytest ran but reported no tests"
        return Status.PASSED, ""
    if codes <= {0, 1}:
        failed = [t.name for t in tests if t.outcome in ("failed", "error")]
        return Status.FAILED, f"{len(failed)} test(s) failed: " + ", ".join(failed[:5])
    if 5 in codes:
        return Status.ERROR, "no tests were collected (check the suite path and -k/-m filters)"
    if not tests:
        return Status.ERROR, f"pytest exited {sorted(codes)} before running tests:\n" + tails[-1500:]
    return Status.ERROR, f"pytest exited {sorted(codes)} (interrupted or internal error)"


def build_result(cell: Cell, procs: Sequence[NodeExit], workdir: Path, duration_s: float,
                 ctx: RunContext | None = None, extra_env: Mapping[str, Any] | None = None) -> CellResult:
    phase = ctx.phase if ctx is not None else MAIN
    files = sorted(workdir.glob(JUNIT_GLOB))
    junit = read_junit(files)
    tests = junit.tests
    records = parse_records(sorted(workdir.glob(RECORDS_GLOB)))
    status, reason = classify(procs, tests, phase)
    if status is Status.ERROR and not tests and _disk_is_full(workdir, procs):
        status, reason = Status.INFRA_ERROR, (f"the disk is full under {workdir} ({_free_kib(workdir)} KiB free): the "
                                              "suite could not write its evidence (retried by --resume)")
    extra = dict(extra_env or {})
    leftovers = [p for e in procs for p in e.leftovers]
    if leftovers:
        extra["leftover_processes"] = leftovers
    unreadable = [*records.problems, *junit.problems]
    if status.ran_suite and len({p.node for p in procs}) > 1:  # every node of a multi-node cell is evidence
        unreadable += missing_nodes(files, {p.node for p in procs}, junit)
    if unreadable:
        extra["record_problems"] = unreadable
        if status.ran_suite:  # evidence that cannot be read is not evidence
            status = Status.ERROR
            reason = (f"{len(unreadable)} record(s) or JUnit file(s) could not be read; first: "
                      f"{unreadable[0]}" + (f"; and: {reason}" if reason else ""))
    environment = records.environment_model(extra)
    tail = procs[0].tail if procs else ""
    if status is not Status.PASSED:
        tail = "\n".join(f"===== node {i} =====\n{p.tail}" for i, p in enumerate(procs))
    return CellResult(
        cell_id=ctx.result_id(cell) if ctx is not None else cell.id,
        role=cell.role,
        status=status,
        reason=reason,
        tests=tests,
        metrics=tuple(records.metrics),
        environment=environment,
        warnings=tuple(records.warnings),
        log_tail=tail[-20000:],
        duration_s=duration_s,
        cell=cell.record(phase),
        phase=phase,
        against=ctx.against.id if ctx is not None and ctx.against is not None else "",
    )
