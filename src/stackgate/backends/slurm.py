"""Cells as Slurm jobs. Each invocation of a cell's node plan (`suite.node_commands`) is one `sbatch`
job with `--nodes N --ntasks-per-node 1`; task `SLURM_NODEID` runs node N's command, and the c10d
rendezvous is the first host of `SLURM_JOB_NODELIST` (its NodeAddr when Slurm knows one).

The environment is the stack's venv, prepared on this (submit) host in the cache directory, which
must be on a filesystem the compute nodes share, like the reports directory. Job state comes from
`scontrol show job` (and `sacct` once the controller has forgotten the job) and maps to cell
statuses: TIMEOUT -> timeout, OUT_OF_MEMORY -> oom, NODE_FAIL / BOOT_FAIL / PREEMPTED / CANCELLED by
someone else -> infra error, FAILED / COMPLETED -> each node's own exit code. Interrupting stackgate
cancels its jobs (`scancel`)."""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from stackgate import masking, pressure, proc
from stackgate.backends import containers
from stackgate.backends.base import Backend, Described, EnvHandle, Execution, free_port
from stackgate.backends.docker.layout import VENV
from stackgate.errors import ConfigError, InfraError
from stackgate.model import Cell, SlurmSpec, Stack
from stackgate.rundir.layout import CellDir
from stackgate.suite import Layout, NodeCommand, NodeExit

ENDPOINT = "STACKGATE_SLURM_ENDPOINT"  # set by the job script: first node's address and the port
_UNREACHABLE = re.compile(r"Unable to contact slurm controller|Socket timed out|Connection refused|"
                          r"Zero Bytes were transmitted|slurm_load_jobs error|Could not establish a configuration",
                          re.I)
_DONE = {"COMPLETED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "CANCELLED", "BOOT_FAIL", "PREEMPTED",
         "DEADLINE", "SPECIAL_EXIT"}
_MACHINERY = {"NODE_FAIL", "BOOT_FAIL", "PREEMPTED", "DEADLINE", "SPECIAL_EXIT"}
POLL_S = 1.0
GRACE_S = 90.0  # past the cell's deadline, Slurm has had time to enforce --time: cancel the job ourselves


@dataclass(frozen=True)
class JobState:
    state: str  # JobState, without "by <uid>" and the like
    exit_code: int = 0
    signal: int = 0
    reason: str = ""


def spec_for(cell: Cell, forced: SlurmSpec | None) -> SlurmSpec | None:
    """The Slurm settings a cell runs with: its pool's (fleet.toml), or `--launcher slurm`'s."""
    return cell.pool.slurm or forced


def time_limit(seconds: float) -> int:
    """Slurm's --time is in whole minutes: at least one, rounded up."""
    return max(1, math.ceil(seconds / 60))


def node_script(command: NodeCommand, multi_node: bool, container: containers.Container | None = None) -> str:
    """What task `command.node` runs: the node's environment and argv, exactly as planned; with a
    container runtime, in the stack's image, with only the plan's variables passed in (by name, for
    podman, so that no value is on a command line; as APPTAINERENV_* for Apptainer's --cleanenv)."""
    runs_outside = container is not None and container.runtime != "pyxis"  # pyxis: the task is in the image
    lines = ["#!/bin/bash", f"# node {command.node}, {command.label}: written by stackgate"]
    if not runs_outside:
        lines.append(f"cd {shlex.quote(str(command.cwd))}")
    lines += _allow_list()
    lines += [f"export {key}={shlex.quote(value)}" for key, value in sorted(command.env.items())]
    if multi_node:
        lines.append(f'export STACKGATE_RDZV_ENDPOINT="${ENDPOINT}"')
    if container is None or not runs_outside:
        lines.append("exec " + shlex.join(command.argv))
    elif container.runtime == "apptainer":
        lines += containers.apptainer(command, container, multi_node)
    else:
        lines += containers.podman(command, container, multi_node)
    return "\n".join(lines) + "\n"


def _allow_list() -> list[str]:
    """Shell lines that drop every variable sbatch carried over from the submitting host except the
    allow-list (`masking`: what a process and the stack need, Slurm's own and the endpoint), and every
    name that looks secret: the suite's environment is the plan's, as on the other backends."""
    keep = "|".join([*masking.BASE, *(f"{p}*" for p in (*masking.STACK, "SLURM_", "STACKGATE_SLURM_"))])
    return ["shopt -s nocasematch",
            'for name in $(compgen -e); do case "$name" in',
            f"  {masking.SECRET_GLOBS}) unset \"$name\" ;;",
            f"  {keep}) ;;",
            '  *) unset "$name" ;;',
            "esac; done",
            "shopt -u nocasematch"]


# podman's own failures (125: the image could not be pulled or the container not created) and our
# script's "the runtime is not installed" (127); Apptainer says 255 when it cannot fetch or start the image
RUNTIME_FAILED = (125, 127, 255)


def job_script(cell: Cell, spec: SlurmSpec, *, name: str, label: str, scripts: Path, workdir: Path,
               seconds: float, port: int, container: containers.Container | None = None) -> str:
    """The batch script of one invocation of a cell (its sbatch options as #SBATCH lines)."""
    nodes = cell.topology.nodes
    options = [f"--job-name={name}", f"--nodes={nodes}", "--ntasks-per-node=1", f"--time={time_limit(seconds)}",
               f"--output={scripts / f'job-{label}-%j.out'}"]
    options += [f"--{flag}={value}" for flag, value in (("partition", spec.partition), ("account", spec.account),
                                                         ("constraint", spec.constraint)) if value]
    if cell.device == "cuda" and cell.pool.gpus_per_node:
        options.append(f"--gpus-per-node={cell.pool.gpus_per_node}")
    node = f"{shlex.quote(str(scripts))}/node${{SLURM_NODEID}}-{label}"
    task = (f"{pressure.SNAPSHOT}; sg_snapshot > {node}.pressure-start; bash {node}.sh; echo $? > {node}.exit; "
            f"sg_snapshot > {node}.pressure-end")  # the node's own interference over its command
    body = [
        "#!/bin/bash",
        f"# stackgate: cell {cell.id}, invocation {label}, {nodes} node(s)"
        + (f", in the image {container.image} ({container.runtime})" if container is not None else ""),
        *(f"#SBATCH {o}" for o in options),
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "addr=$(scontrol show node -o \"$head\" 2>/dev/null | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)",
        f'export {ENDPOINT}="${{addr:-$head}}:{port}"',
    ]
    if container is not None and container.runtime == "podman":
        # every node pulls the image first, as a step of its own: the suite's nodes then start together (a
        # node still pulling gigabytes would miss the others' rendezvous); what each pull ended with is
        # read by its node's script
        pull = containers.pull(container, f"{node}.pulled")
        body.append(f"srun --nodes={nodes} --ntasks-per-node=1 --kill-on-bad-exit=0 --open-mode=append "
                    f"--output={shlex.quote(str(workdir))}/node%n.log bash -c {shlex.quote(pull)}")
    body += [
        f"srun --nodes={nodes} --ntasks-per-node=1 --kill-on-bad-exit=0 --open-mode=append "
        f"--output={shlex.quote(str(workdir))}/node%n.log "
        + "".join(f"{shlex.quote(o)} " for o in (containers.pyxis_options(container, scripts)
                                                 if container is not None and container.runtime == "pyxis" else []))
        + f"bash -c {shlex.quote(task)}",
    ]
    return "\n".join(body) + "\n"


def parse_scontrol(text: str) -> JobState | None:
    """`scontrol show job -o ID`: JobState, ExitCode (code:signal) and Reason."""
    state = re.search(r"\bJobState=(\S+)", text)
    if state is None:
        return None
    code = re.search(r"\bExitCode=([0-9]+):([0-9]+)", text)
    reason = re.search(r"\bReason=(\S+)", text)
    return JobState(state.group(1), int(code.group(1)) if code else 0, int(code.group(2)) if code else 0,
                    reason.group(1) if reason else "")


def parse_sacct(text: str) -> JobState | None:
    """`sacct -j ID -n -P -X -o State,ExitCode`: the allocation's line."""
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 2 and parts[0]:
            code, _, sig = parts[1].partition(":")
            return JobState(parts[0].split()[0], int(code or 0), int(sig or 0))
    return None


def render(spec: SlurmSpec, commands: Sequence[NodeCommand], exe: Execution, *, seconds: float,
           port: int | None = None, container: containers.Container | None = None) -> dict[str, str]:
    """The files of one invocation's job, by name (in the cell's `slurm/` directory): the batch
    script and one script per node. `execute` writes them; `stackgate run --dry-run` prints them."""
    label = commands[0].label
    scripts = CellDir(exe.workdir).slurm
    files = {f"job-{label}.sbatch": job_script(exe.cell, spec, name=f"sg-{exe.tag}-{label}", label=label,
                                               scripts=scripts, workdir=exe.workdir, seconds=seconds,
                                               port=port if port is not None else free_port(), container=container)}
    for command in commands:
        files[f"node{command.node}-{label}.sh"] = node_script(command, len(commands) > 1, container)
    return files


class SlurmBackend:
    """Slurm for the cells whose pool says `launcher = "slurm"` (or every cell, with `--launcher
    slurm`); the inner backend prepares environments and runs any other cell itself."""

    name = "slurm"
    runs_plain = False

    def __init__(self, inner: Backend, *, forced: SlurmSpec | None, env: Mapping[str, str],
                 say: Callable[[str], None] = print, container: str = "") -> None:
        self.inner = inner
        self.forced = forced
        self.container = container  # --container: the runtime of every Slurm pool's nodes
        self.env = dict(env)
        self.say = say

    def spec(self, cell: Cell) -> SlurmSpec | None:
        """The cell's Slurm settings, with the run's --container over its pool's."""
        spec = spec_for(cell, self.forced)
        if spec is None or not self.container:
            return spec
        return replace(spec, container=self.container)

    def prepare(self, stack: Stack, log_path: Path) -> EnvHandle:
        return self.inner.prepare(stack, log_path)

    def layout(self, handle: EnvHandle, exe: Execution) -> Layout:
        layout = self.inner.layout(handle, exe)
        spec = self.spec(exe.cell)
        if spec is None:
            return layout
        containers.check_pairing(spec, self.inner.name, exe.cell)
        python = layout.python
        if spec.container and not python.startswith("/"):  # a runtime may hand the task the host's PATH (pyxis)
            python = str(VENV / "bin" / "python")  # a built stack image's
        return Layout(python=python, out=layout.out, artifacts=layout.artifacts, shared=layout.shared,
                      suite=layout.suite, bundled=layout.bundled, endpoint=f"${ENDPOINT}")

    def container_of(self, handle: EnvHandle, exe: Execution, spec: SlurmSpec) -> containers.Container | None:
        """How the nodes run the stack's image (the image's digest when it has one), or None: its venv."""
        if not spec.container:
            return None
        mounts = getattr(self.inner, "mounts", None)
        if mounts is None:
            raise ConfigError(f"container = \"{spec.container}\" runs the stack's image: it needs the docker backend")
        image = str(handle.sbom.get("digest") or handle.ref)
        return containers.Container(spec.container, image, tuple(mounts(handle, exe)), gpu=exe.cell.device == "cuda",
                         name=f"sg-{exe.tag}")

    def describe(self, handle: EnvHandle) -> Described:
        return {**self.inner.describe(handle), "launcher": "slurm"}

    def close(self) -> None:
        self.inner.close()

    def execute(self, handle: EnvHandle, commands: Sequence[NodeCommand], deadline: float,
                exe: Execution) -> tuple[NodeExit, ...]:
        spec = self.spec(exe.cell)
        if spec is None or not commands:
            return self.inner.execute(handle, commands, deadline, exe)
        container = self.container_of(handle, exe, spec)
        label = commands[0].label
        scripts = CellDir(exe.workdir).slurm
        scripts.mkdir(exist_ok=True)
        for name, text in render(spec, commands, exe, seconds=max(deadline - time.monotonic(), 1),
                                 container=container).items():
            (scripts / name).write_text(text)
        for command in commands:
            for suffix in ("exit", "pressure-start", "pressure-end", "pulled"):
                (scripts / f"node{command.node}-{label}.{suffix}").unlink(missing_ok=True)
        batch = scripts / f"job-{label}.sbatch"
        job = self._submit(batch)
        self.say(f"  slurm job {job} ({exe.cell.topology.nodes} node(s), --time={time_limit(deadline - time.monotonic())}"
                 f" min): {batch}")
        try:
            state = self._wait(job, deadline, exe)
        except BaseException:
            self._cancel(job)
            raise
        return self._exits(job, state, commands, scripts, label, exe, container)

    # ------------------------------------------------------------------------------------ slurm
    def _command(self, argv: Sequence[str], what: str) -> proc.ProcResult:
        if shutil.which(argv[0], path=self.env.get("PATH", os.environ.get("PATH"))) is None:
            raise InfraError(f"{argv[0]} is not installed on this host: cannot {what}",
                             hint="run stackgate on a Slurm submit host (slurm-client), or drop --launcher slurm")
        return proc.run(argv, env=self.env, timeout_s=60)

    def _submit(self, batch: Path) -> str:
        result = self._command(["sbatch", "--parsable", str(batch)], "submit the cell's job")
        if not result.ok:
            text = result.tail.strip()[-600:]
            if _UNREACHABLE.search(result.tail) or result.timed_out:
                raise InfraError(f"sbatch could not reach the Slurm controller: {text}",
                                 hint="check slurmctld (`scontrol ping`) and SLURM_CONF on this host")
            raise InfraError(f"sbatch refused the cell's job (exit {result.returncode}): {text}",
                             hint=f"the job script is {batch}; check the pool's partition/account/constraint "
                                  "in fleet.toml")
        job = result.tail.strip().splitlines()[-1].split(";")[0].strip()
        if not job.isdigit():
            raise InfraError(f"sbatch printed no job id: {result.tail.strip()[-300:]}")
        return job

    def _state(self, job: str) -> JobState | None:
        shown = self._command(["scontrol", "show", "job", "-o", job], "follow the job")
        if shown.ok:
            return parse_scontrol(shown.tail)
        if _UNREACHABLE.search(shown.tail):
            return None  # the controller is away for a moment: ask again
        if shutil.which("sacct"):  # the controller forgot the job: accounting may remember it
            acct = proc.run(["sacct", "-j", job, "-n", "-P", "-X", "-o", "State,ExitCode"], env=self.env, timeout_s=60)
            found = parse_sacct(acct.tail) if acct.ok else None
            if found is not None:
                return found
        return JobState("GONE", reason=shown.tail.strip()[-200:])

    def _wait(self, job: str, deadline: float, exe: Execution) -> JobState:
        log = CellDir(exe.workdir).node_log(0)
        offset = log.stat().st_size if log.exists() else 0
        missing_since: float | None = None
        while True:
            offset = _follow(log, offset, exe.on_line)
            state = self._state(job)
            now = time.monotonic()
            if state is not None and state.state.split()[0] in _DONE | {"GONE"}:
                _follow(log, offset, exe.on_line)
                return state
            if state is None:
                missing_since = missing_since or now
                if now - missing_since > 300:
                    raise InfraError(f"the Slurm controller stopped answering while job {job} ran")
            else:
                missing_since = None
            if now > deadline + GRACE_S:
                self._cancel(job)
                return JobState("TIMEOUT", reason="past the cell timeout; cancelled by stackgate")
            time.sleep(POLL_S)

    def _cancel(self, job: str) -> None:
        if shutil.which("scancel"):
            proc.run(["scancel", job], env=self.env, timeout_s=30)

    def _exits(self, job: str, state: JobState, commands: Sequence[NodeCommand], scripts: Path, label: str,
               exe: Execution, container: containers.Container | None = None) -> tuple[NodeExit, ...]:
        word = state.state.split()[0]
        if word in _MACHINERY:
            raise InfraError(f"slurm job {job} ended {word} ({state.reason}): the cluster failed, not the stack")
        if word == "CANCELLED":
            raise InfraError(f"slurm job {job} was cancelled outside stackgate ({state.reason})")
        out = []
        for command in commands:
            written = scripts / f"node{command.node}-{label}.exit"
            code = int(written.read_text().strip() or 1) if written.exists() else None
            if word == "GONE" and code is None:
                raise InfraError(f"slurm job {job} vanished without a trace ({state.reason})")
            log = CellDir(exe.workdir).node_log(command.node)
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-200:]) if log.exists() else ""
            if code is None:  # the task never finished: killed with its job
                code = -9
            if container is not None and code in containers.RUNTIME_FAILED and word != "TIMEOUT":
                raise InfraError(f"slurm job {job}, node {command.node} ({_node_name(scripts, command.node, label)}): "
                                 f"{container.runtime} could not run the stack's image {container.image} (exit {code}): "
                                 f"{_last_lines(tail)}", hint="the node must reach the registry and hold the runtime; "
                                                              "the image is named by digest in stacks.json")
            out.append(NodeExit(command.node, f"slurm job {job} node {command.node}", code,
                                timed_out=word == "TIMEOUT", oom_killed=word == "OUT_OF_MEMORY",
                                tail=tail + f"\n[stackgate] slurm job {job}: {state.state} exit {state.exit_code}:"
                                            f"{state.signal} {state.reason}".rstrip(),
                                pressure=node_pressure(scripts, command.node, label)))
        return tuple(out)


def _last_lines(text: str, n: int = 4) -> str:
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("[stackgate] slurm job")]
    return " / ".join(lines[-n:])[-600:]


def _node_name(scripts: Path, node: int, label: str) -> str:
    start = scripts / f"node{node}-{label}.pressure-start"
    name = pressure.snapshot_node(start.read_text(errors="replace")) if start.is_file() else ""
    return name or f"node {node}"


def node_pressure(scripts: Path, node: int, label: str) -> pressure.Pressure:
    """The interference a node's task measured on its compute node around its command (nothing
    measurable when a snapshot is missing: the task was killed before it took the second one)."""
    texts = [(scripts / f"node{node}-{label}.pressure-{when}") for when in ("start", "end")]
    start, end = (path.read_text(errors="replace") if path.is_file() else "" for path in texts)
    name = pressure.snapshot_node(start) or pressure.snapshot_node(end)
    where = f"slurm node {name}" if name else f"slurm node {node}"
    first, last = pressure.parse(start), pressure.parse(end)
    if first is None or last is None:
        return pressure.Pressure(0.0, where=where)
    return replace(pressure.between(first, last), where=where)


def _follow(log: Path, offset: int, on_line: Callable[[str], None] | None) -> int:
    """Hand node 0's new output lines to the progress display."""
    if on_line is None or not log.exists():
        return offset
    with log.open("r", errors="replace") as fh:
        fh.seek(offset)
        chunk = fh.read()
    complete, _, _ = chunk.rpartition("\n")
    for line in complete.splitlines():
        on_line(line)
    return offset + len(complete.encode()) + (1 if complete else 0)
