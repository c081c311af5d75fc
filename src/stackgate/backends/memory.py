"""The `memory` backend: runs nothing. Each node command is answered by a script that writes what
pytest would have written (JUnit, results lines) and returns the node's exit, so every command
(plan, run, collect, decide, report) can be unit-tested without a subprocess, an installer or Docker.
It executes the same node plan (`suite.node_commands`) as the real backends."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.sax.saxutils import quoteattr

from stackgate import pressure
from stackgate.backends.base import Described, EnvHandle, Execution
from stackgate.model import Stack
from stackgate.suite import RDZV_PORT, Layout, NodeCommand, NodeExit

Script = Callable[[NodeCommand, Execution], NodeExit]


def junit_path(command: NodeCommand) -> Path:
    """Where the command's pytest writes JUnit (its --junitxml argument)."""
    for arg in command.argv:
        if arg.startswith("--junitxml="):
            return Path(arg.split("=", 1)[1])
    raise ValueError(f"no --junitxml in {command.argv}")


def answer(command: NodeCommand, outcomes: Mapping[str, str], *, returncode: int | None = None,
           metrics: Sequence[Mapping[str, Any]] = (), oom_killed: bool = False, timed_out: bool = False) -> NodeExit:
    """Write the JUnit (test node id -> passed | failed | skipped | error) and metric lines a real run
    of `command` would, and return its exit (1 when a test failed, unless given)."""
    cases = []
    for nodeid, outcome in outcomes.items():
        file, _, rest = nodeid.partition("::")
        *classes, name = rest.split("::")
        classname = ".".join((file.removesuffix(".py").replace("/", "."), *classes))  # as pytest's xunit1 writes it
        inner = {"passed": "", "failed": "<failure message=\"failed\"/>", "skipped": "<skipped message=\"skip\"/>",
                 "error": "<error message=\"error\"/>"}[outcome]
        cases.append(f"<testcase classname={quoteattr(classname)} file={quoteattr(file)} name={quoteattr(name)} "
                     f"time=\"0.1\">{inner}</testcase>")
    junit_path(command).write_text(f"<testsuite>{''.join(cases)}</testsuite>")
    if metrics:  # (a fidelity rerun has no STACKGATE_RESULTS: it writes no records)
        with Path(command.env["STACKGATE_RESULTS"]).open("a") as fh:
            for metric in metrics:
                fh.write(json.dumps({"kind": "metric", **metric}) + "\n")
    if returncode is None:
        returncode = 1 if any(o in ("failed", "error") for o in outcomes.values()) else 0
    if oom_killed:
        returncode = -9
    return NodeExit(command.node, f"memory-node{command.node}", returncode, timed_out, oom_killed, 0.1)


class Gauge:
    """Interference counters for the unit tier: a quiet runner unless told otherwise. `busy` is the
    share of CPU pressure (PSI some) each next run sees, in order (then 0): a run spans two reads."""

    def __init__(self, busy: Sequence[float] = ()) -> None:
        self.busy = list(busy)
        self.clock = 0.0
        self.some_us = 0.0
        self._open = False

    def __call__(self) -> pressure.Counters:
        if self._open:  # the end of a run: one second that was `busy` under pressure
            self.clock += 1.0
            self.some_us += 1e6 * (self.busy.pop(0) if self.busy else 0.0)
        self._open = not self._open
        return pressure.Counters(self.clock, int(self.some_us), 0, 0, int(self.clock * 100), 0.0)


def all_pass(command: NodeCommand, exe: Execution) -> NodeExit:
    return answer(command, {f"test_{command.label}.py::test_ok": "passed"})


@dataclass
class MemoryBackend:
    script: Script = all_pass
    name: str = "memory"
    runs_plain: bool = True
    prepared: list[Stack] = field(default_factory=list)
    executed: list[NodeCommand] = field(default_factory=list)

    def prepare(self, stack: Stack, log_path: Path) -> EnvHandle:
        reused = stack in self.prepared
        self.prepared.append(stack)
        return EnvHandle(stack, f"memory:{stack.label}", stack.content_hash[:16], reused=reused, prepare_s=0.0,
                         sbom={"packages": [f"torch=={stack.torch_public}"]})

    def layout(self, handle: EnvHandle, exe: Execution) -> Layout:
        return Layout(python="python", out=exe.workdir, artifacts=exe.artifacts, shared=exe.shared, suite=exe.suite,
                      endpoint=f"memory-node0:{RDZV_PORT}" if exe.cell.topology.nodes > 1 else "")

    def execute(self, handle: EnvHandle, commands: Sequence[NodeCommand], deadline: float,
                exe: Execution) -> tuple[NodeExit, ...]:
        self.executed += commands
        return tuple(self.script(command, exe) for command in commands)

    def describe(self, handle: EnvHandle) -> Described:
        return {"backend": "memory", "env_key": handle.key}

    def close(self) -> None:
        return None
