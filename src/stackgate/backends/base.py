"""The backend protocol and what every backend shares."""

from __future__ import annotations

import contextlib
import random
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypedDict

from stackgate.model import Cell, Stack
from stackgate.suite import Layout, NodeCommand, NodeExit


class Sbom(TypedDict, total=False):
    """What an environment holds, as its backend recorded it when it was built (or checked)."""

    kind: str  # "venv" | "image"
    key: str  # the content key of everything that went in
    packages: list[str]  # `pip freeze` of the stack's environment
    requirements: list[str]  # venv: what was installed
    python: str
    created: float
    tag: str  # image: its tag, its labels, its id, the wheels it was built from
    labels: dict[str, str]
    image_id: str
    wheels: list[str]
    sbom_error: str  # image: why its SBOM could not be read
    size: int  # image: bytes
    digest: str  # image: repo@sha256:... in the registry (pushed or pulled)
    suite_layer: str  # image: the thin layer with the suite's own requirements that the cells ran
    interpreter: str  # a given image: its interpreter (the probe's sys.executable)
    suite_prefix: str  # a given image or interpreter: the host prefix with what the suite needs and it lacks
    in_venv: bool  # a given interpreter: it is a venv's (its nodes get VIRTUAL_ENV)
    os_packages: list[str]  # image: its Debian source packages (`name==version`, from dpkg's status)
    os_release: str  # image: its OSV ecosystem ("Debian:12"), "" when OSV has no data for its OS


class Described(TypedDict, total=False):
    """A backend's account of where a cell ran (merged into the result's environment)."""

    backend: str
    env_key: str
    image: str
    image_labels: dict[str, str]
    stack_label: str
    interpreter: str  # host: the interpreter the stack is
    image_id: str
    image_digest: str  # repo@sha256:...: the stack image in the registry
    stack_image: str  # the stack image under a suite layer (`image` is then the layer)
    launcher: str


def freeze_lines(text: str) -> list[str]:
    """A `pip freeze` (or `uv pip freeze`) output as its requirement lines. A line is one package, and
    some have spaces: `recsys-kit @ file:///.../recsys_kit-0.3.0-py3-none-any.whl` (a --suite-install
    project, a direct URL), which a split on whitespace cut into two "packages", one with no version."""
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


@dataclass(frozen=True)
class EnvHandle:
    """A prepared environment: a venv's python or an image tag, with what was installed."""

    stack: Stack
    ref: str  # venv python path, or image tag
    key: str  # content hash of everything that went in
    reused: bool
    prepare_s: float
    sbom: Sbom = field(default_factory=Sbom)


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


def checked_once(stamp: Path | None, facts: str, check: Callable[[], str]) -> str:
    """`check()` ("" when it passes), skipped when `stamp` holds `facts` from an earlier pass; a pass is
    recorded there (None: no record, always checked; a cache that cannot be written checks again)."""
    try:
        if stamp is not None and stamp.read_text() == facts:
            return ""
    except OSError:
        pass
    problem = check()
    if not problem and stamp is not None:
        with contextlib.suppress(OSError):
            stamp.parent.mkdir(parents=True, exist_ok=True)
            stamp.write_text(facts)
    return problem


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
    # the host CPUs its nodes may run on (one stack's share of a concurrent pair); () = any. Processes
    # started on this host inherit it from the runner's thread; a container is given it as its cpuset
    cpus: tuple[int, ...] = ()
    # the fidelity rerun (phase "plain"): the command runs as a user would run it, with none of the
    # harness's machinery (no node init, no marker variable, no container restriction)
    plain: bool = False


class Backend(Protocol):
    """Provides environments and executes node commands; what the nodes run is `suite.node_commands`."""

    name: str
    # whether it can run the fidelity rerun (`Execution.plain`) outside its own machinery: a Slurm job
    # cannot (its script is the machinery), a process on this host or a plain container can
    runs_plain: bool

    def prepare(self, stack: Stack, log_path: Path) -> EnvHandle: ...

    def layout(self, handle: EnvHandle, exe: Execution) -> Layout: ...

    def execute(self, handle: EnvHandle, commands: Sequence[NodeCommand], deadline: float,
                exe: Execution) -> tuple[NodeExit, ...]: ...

    def describe(self, handle: EnvHandle) -> Described: ...

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
