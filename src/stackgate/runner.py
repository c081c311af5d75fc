"""One way through a run's cells. A `Runner` executes `Attempt`s: the main cells, the rollbacks, the
repeats, their confirmation and a calibration's A/A runs are lists of attempts, not loops of their
own. It holds the one cache of environments, the one rule for what a resumed run keeps, the
progress lines, the artifacts each phase reads and writes, and the results file. Only this module
calls a backend's `execute` (in `run_cell`)."""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from stackgate import pressure, proc, resolve
from stackgate.backends.base import Backend, EnvHandle, Execution, PrepareFailed
from stackgate.boundary.environment import Environment
from stackgate.console import Console, Printer
from stackgate.errors import InfraError
from stackgate.model import MAIN, Cell, CellResult, Phase, PhaseKind, Role, Status
from stackgate.plan import plan_envs
from stackgate.policy import Policy
from stackgate.rundir import RunDir, results
from stackgate.suite import NodeExit, RunContext, build_result, node_commands


@dataclass(frozen=True)
class Unprepared:
    """A stack that has no environment because the machinery failed (an index out of reach, the
    engine gone): its cells are infra errors, never a verdict on the stack."""

    reason: str


Handle = EnvHandle | PrepareFailed | Unprepared


@dataclass(frozen=True)
class Attempt:
    """One run of one cell: its phase, the candidate a rollback reads (`against`), and which tests
    (`select`: None for the run's own `--test` selection, () for the whole suite)."""

    cell: Cell
    phase: Phase = MAIN
    against: Cell | None = None
    select: tuple[str, ...] | None = None

    @property
    def result_id(self) -> str:
        return self.cell.result_id(self.phase, self.against)


class Progress:
    """One line per test result while a cell runs: which cell, which test, elapsed time."""

    _RESULT = re.compile(r"^(\S+::\S+)\s+(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)")

    def __init__(self, say: Printer) -> None:
        self.say = say
        self.cell = ""
        self.start = time.monotonic()

    def begin(self, cell: str) -> None:
        self.cell, self.start = cell, time.monotonic()

    def line(self, text: str) -> None:
        m = self._RESULT.match(text)
        if m:
            elapsed = time.monotonic() - self.start
            self.say(f"  [{self.cell} {int(elapsed) // 60:02d}:{int(elapsed) % 60:02d}] {m.group(1)} {m.group(2)}")


def run_cell(backend: Backend, cell: Cell, handle: EnvHandle, ctx: RunContext,
             gauge: Callable[[], pressure.Counters] = pressure.read) -> CellResult:
    """One cell on any backend: the suite's node plan, executed invocation by invocation (the nodes
    of each at the same time) under one deadline, then collected into a CellResult."""
    cell_dir = ctx.fresh_cell_dir(cell)
    workdir, shared = cell_dir.root, cell_dir.shared
    tag = hashlib.sha1(f"{ctx.run_id}/{ctx.result_id(cell)}/{secrets.token_hex(4)}".encode()).hexdigest()[:10]
    exe = Execution(cell, workdir, ctx.artifacts_of(cell), shared, ctx.suite.path.resolve(), tag, ctx.on_line,
                    ctx.cpus, plain=ctx.phase.kind is PhaseKind.PLAIN)
    # this attempt's JUnit and records go where only it writes: a process of a killed attempt that is
    # still alive writes into a directory that is gone or never read, not into this attempt's evidence
    evidence = cell_dir.attempt(tag)
    evidence.mkdir()
    base_layout = backend.layout(handle, exe)
    layout = replace(base_layout, out=base_layout.out / evidence.name)
    start = time.monotonic()
    deadline = start + ctx.suite.timeout_s
    exits: list[NodeExit] = []
    before = gauge()  # how busy the runner is while the nodes run: evidence beside their metrics
    for group in node_commands(cell, ctx, layout):
        exits += backend.execute(handle, group, deadline, exe)
    here = pressure.between(before, gauge())
    on_nodes = pressure.busiest([e.pressure for e in exits if e.pressure is not None])  # Slurm: the nodes' own
    extra = {**backend.describe(handle), "pressure": (on_nodes or here).to_json(),
             **({"refused_links": list(ctx.refused_links)} if ctx.refused_links else {})}
    return build_result(cell, exits, evidence, time.monotonic() - start, ctx, extra_env=extra)


class Runner:
    """Executes attempts at `cells` on `backend`, recording each result in the run directory."""

    def __init__(self, backend: Backend, ctx: RunContext, console: Console, cells: Sequence[Cell],
                 resolutions: Mapping[str, resolve.Resolution] | None = None, *,
                 gauge: Callable[[], pressure.Counters] = pressure.read) -> None:
        self.backend = backend
        self.gauge = gauge
        self.console = console
        self.ctx = ctx
        self._recording = threading.Lock()  # attempts made at the same time append one line each
        self.by_id = {c.id: c for c in cells}
        self._plans = {p.stack.content_hash: p for p in plan_envs(cells)}
        self._resolutions = resolutions or {}
        self._handles: dict[str, Handle] = {}
        self.log_dir = RunDir(ctx.run_dir).build_logs
        self.log_dir.mkdir(parents=True, exist_ok=True)

    def environment(self, cell: Cell) -> Handle:
        """The cell's stack's environment, prepared once per run (a failure too is kept, and said once)."""
        key = cell.stack.content_hash
        if key in self._handles:
            return self._handles[key]
        say = self.console.say
        plan = self._plans[key]
        resolution = self._resolutions.get(key)
        if resolution is not None and not resolution.ok:
            say(f"  {plan.stack.label}: infrastructure problem: {resolution.problem}")
            self._handles[key] = Unprepared(resolution.problem)
            return self._handles[key]
        say(f"prepare {self.backend.name} env for {plan.stack.label} ({len(plan.cells)} cell(s))")
        handle: Handle
        try:
            with self.console.step(f"prepare {plan.stack.label}"):
                handle = self.backend.prepare(plan.stack, self.log_dir / f"{plan.stack.label}.log")
            say(f"  {'reused' if handle.reused else 'built'} {handle.ref} in {handle.prepare_s:.1f}s")
        except PrepareFailed as exc:
            say(f"  FAILED: {exc}")
            handle = exc
        except InfraError as exc:  # every backend: the machinery, not the stack
            say(f"  infrastructure problem: {exc}")
            handle = Unprepared(str(exc) + (f" ({exc.hint})" if exc.hint else ""))
        self._handles[key] = handle
        self.ctx.mask.scrub(self.log_dir)  # the installer's log, once per environment
        return handle

    def run(self, attempts: Iterable[Attempt], *, say_skipped: bool = False) -> None:
        """Each attempt that is to be made (`_to_make`), one after the other."""
        recorded = results.read(self.ctx.run_dir)
        for attempt in attempts:
            handle = self._to_make(attempt, recorded, say_skipped)
            if handle is not None:
                self.attempt(attempt, handle)

    def _to_make(self, attempt: Attempt, recorded: Mapping[str, CellResult], say_skipped: bool = False) -> Handle | None:
        """The attempt's environment if it is to be made: it is not recorded yet (a resumed run keeps what
        it finished and retries what the machinery failed), and its stack has an environment (a stack
        without one is recorded once, by its main run; the attempts after it are not made). Else None."""
        earlier = results.kept(recorded, attempt.result_id)
        if earlier is not None:
            if say_skipped:
                self.console.say(f"skip {attempt.result_id}: finished in the resumed run ({earlier.status.value})")
            return None
        handle = self.environment(attempt.cell)
        return None if attempt.phase != MAIN and not isinstance(handle, EnvHandle) else handle

    def run_together(self, groups: Iterable[Sequence[Attempt]], *, turn: int | None = None) -> list[CellResult]:
        """Each group's attempts to be made (`_to_make`; a round of one production cell and its
        candidates) at the same time, each on its own share of this runner's CPUs, the shares turned by
        one each round, `turn` (default: the group's round), so that no stack keeps the faster cores:
        duet benchmarking, for pairing = "concurrent". A group that cannot be split (fewer CPUs than
        attempts, one attempt left, or a GPU cell: both stacks would share the device) runs one attempt
        after the other. Returns the results made."""
        recorded = results.read(self.ctx.run_dir)
        made: list[CellResult] = []
        for group in groups:
            todo = [(a, h) for a in group if (h := self._to_make(a, recorded)) is not None]
            shares = cpu_shares(len(todo), turn if turn is not None else todo[0][0].phase.round if todo else 0)
            if len(todo) < 2 or not shares or any(a.cell.device != "cpu" for a, _ in todo):
                made += [self.attempt(attempt, handle) for attempt, handle in todo]
                continue
            # shares go by a fixed order of the stacks (production first), not the group's, which alternates
            # for the sequential pairs' sake: with both turning, production would keep the same share
            fixed = sorted(range(len(todo)), key=lambda i: (todo[i][0].cell.role is not Role.PRODUCTION,
                                                            todo[i][0].cell.id, todo[i][0].phase.round))
            shares = [shares[fixed.index(i)] for i in range(len(todo))]
            self.console.say("together: " + ", ".join(f"{a.result_id} on CPU(s) {','.join(map(str, s))}"
                                                      for (a, _), s in zip(todo, shares, strict=True)))
            pool = ThreadPoolExecutor(len(todo), thread_name_prefix="pair")
            running = [pool.submit(self.attempt, a, h, cpus=s) for (a, h), s in zip(todo, shares, strict=True)]
            try:
                made += [done.result() for done in running]
            except BaseException:  # Ctrl-C, SIGTERM: the other threads' processes and containers stop too
                proc.STOPPING.set()
                proc.stop_all()
                raise
            finally:
                pool.shutdown(wait=True)
                proc.STOPPING.clear()
        return made

    def attempt(self, attempt: Attempt, handle: Handle | None = None, *, step: str = "",
                cpus: tuple[int, ...] = ()) -> CellResult:
        """Make one attempt now and record its result; on `cpus` (this thread and every process it
        starts, and a container's cpuset), or wherever the runner's own CPUs allow."""
        handle = handle if handle is not None else self.environment(attempt.cell)
        if cpus:
            os.sched_setaffinity(0, cpus)  # this thread only: what it starts inherits it
        with self.console.step(step or f"run {attempt.result_id}"):
            result = self._execute(attempt.cell, handle, replace(self.context(attempt), cpus=cpus))
        if proc.STOPPING.is_set():  # interrupted beside the main thread: what it saw is not a result
            raise KeyboardInterrupt
        with self._recording:
            results.append(self.ctx.run_dir, result)
        return result

    def context(self, attempt: Attempt) -> RunContext:
        """The attempt's context; what it reads and writes across versions is the phase's rule: the main
        run and the repeats use the cell's own directory (a candidate's holds a copy of what production
        wrote), a rollback the directory of the candidate it reads, an A/A run the pool's."""
        ctx = replace(self.ctx, phase=attempt.phase, against=attempt.against,
                      select=self.ctx.select if attempt.select is None else attempt.select, refused_links=())
        kind = attempt.phase.kind
        if kind is PhaseKind.ROLLBACK and attempt.against is not None:
            return replace(ctx, artifacts=stack_artifacts(ctx.run_dir, attempt.against))
        if kind is PhaseKind.AA:
            return replace(ctx, artifacts=stack_artifacts(ctx.run_dir, attempt.cell) if attempt.phase.round == 0 else None)
        target = stack_artifacts(ctx.run_dir, attempt.cell)
        target.mkdir(parents=True, exist_ok=True)
        base = self.by_id.get(attempt.cell.baseline)
        refused: tuple[str, ...] = ()
        if attempt.cell.role is Role.CANDIDATE and base is not None:
            written = stack_artifacts(ctx.run_dir, base) / "production"
            if written.is_dir():
                refused = copy_artifacts(written, target / "production", ctx.run_dir)
        return replace(ctx, artifacts=target, refused_links=refused)

    def _execute(self, cell: Cell, handle: Handle, ctx: RunContext) -> CellResult:
        say = self.console.say
        label = ctx.result_id(cell)

        def did_not_run(status: Status, reason: str, log_tail: str = "") -> CellResult:
            return CellResult(cell_id=label, role=cell.role, status=status, reason=reason, log_tail=log_tail,
                              cell=cell.record(), phase=ctx.phase, against=ctx.against.id if ctx.against else "")

        if isinstance(handle, Unprepared):
            return ctx.mask.result(did_not_run(Status.INFRA_ERROR, handle.reason))
        if isinstance(handle, PrepareFailed):
            return ctx.mask.result(did_not_run(Status.BUILD_FAILED, str(handle), handle.log_tail))
        say(f"run {label}")
        progress = Progress(say)
        progress.begin(label)
        try:
            result = run_cell(self.backend, cell, handle, replace(ctx, on_line=progress.line), self.gauge)
        except InfraError as exc:
            result = did_not_run(Status.INFRA_ERROR, str(exc))
        environment = {**result.environment.to_json(), "env_reused": handle.reused,
                       "env_prepare_s": round(float(handle.prepare_s), 1),
                       **({"cpus": list(ctx.cpus)} if ctx.cpus else {})}
        if handle.sbom.get("packages"):  # the stack's own SBOM, as its backend recorded it (what a promotion locks)
            environment["stack_packages"] = handle.sbom["packages"]
            environment.setdefault("packages", handle.sbom["packages"])
        for key, into in (("os_packages", "os_packages"), ("os_release", "os_release"), ("size", "image_size")):
            if handle.sbom.get(key):  # an image's OS packages and size: the supply chain's evidence (supply.py)
                environment[into] = handle.sbom[key]  # type: ignore[literal-required]
        if ctx.suite_deps:
            environment["suite_requirements"] = dict(ctx.suite_deps)
        result = ctx.mask.result(replace(result, environment=Environment.of(environment)))
        cell_dir = RunDir(ctx.run_dir).cell(label)
        for folder in (cell_dir.root, *cell_dir.attempts()):  # what the nodes and pytest wrote there
            ctx.mask.scrub(folder)
        left = result.environment.leftover_processes
        if left:  # every backend reports them the same way (NodeExit.leftovers)
            say(f"  ended {len(left)} process(es) that outlived the suite: " + "; ".join(str(x)[:80] for x in left))
        say(f"  {label}: {result.status.value} in {result.duration_s:.0f}s {result.reason[:200]}")
        return result


def together_here(policy: Policy, backend: Backend) -> bool:
    """Whether the repeats' pairs run at the same time: pairing = "concurrent", on a backend whose nodes
    run on this host (a Slurm job's run on its own nodes, where this runner's CPUs mean nothing)."""
    return policy.concurrent and backend.name != "slurm"


def cpu_shares(parts: int, turn: int, cpus: Iterable[int] | None = None) -> list[tuple[int, ...]]:
    """This runner's CPUs (`os.sched_getaffinity`) cut into `parts` contiguous shares as even as they
    go, turned by `turn` (attempt j gets share (j + turn) % parts); [] when there are fewer CPUs than
    parts."""
    have = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    if parts < 1 or len(have) < parts:
        return []
    size, extra = divmod(len(have), parts)
    shares, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        shares.append(tuple(have[start:end]))
        start = end
    turn %= parts
    return shares[turn:] + shares[:turn]


def stack_artifacts(run_dir: Path, cell: Cell) -> Path:
    """Cross-version artifacts, one directory per candidate stack (`RunDir.stack_artifacts`)."""
    return RunDir(run_dir).stack_artifacts(*cell.comparison_key, None if cell.role is Role.PRODUCTION else cell.stack.label)


def copy_artifacts(source: Path, target: Path, run_dir: Path) -> tuple[str, ...]:
    """Copy what production wrote for a candidate to read, never following a link out of the run
    directory (a test could leave one to /etc/passwd, and the bundle would hold a copy of it): such a
    link is not copied, and is returned ("<path> -> <where it points>") as evidence that cannot be used."""
    refused: list[str] = []
    inside = run_dir.resolve()

    def ignore(folder: str, names: list[str]) -> set[str]:
        skip = set()
        for name in names:
            path = Path(folder) / name
            if path.is_symlink():
                where = path.resolve()
                if where != inside and inside not in where.parents:
                    refused.append(f"{path.relative_to(source)} -> {path.readlink()}")
                    skip.add(name)
        return skip

    shutil.copytree(source, target, dirs_exist_ok=True, symlinks=True, ignore=ignore)
    return tuple(refused)
