"""The `docker` backend: one image per stack (content-hash tagged, reused when unchanged); a cell
runs one container per node on a private network, each `torchrun`-ing through the suite."""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from stackgate import proc, shipped
from stackgate.backends.base import (
    TORCH_PROBE,
    Described,
    EnvHandle,
    Execution,
    PrepareFailed,
    Sbom,
    torch_probe_problem,
)
from stackgate.backends.docker import images
from stackgate.backends.docker import layout as inside
from stackgate.backends.docker.engine import BuildError, ContainerExit, ContainerSpec, Engine
from stackgate.compat import CompatTable
from stackgate.errors import InfraError
from stackgate.installer import is_disk_full
from stackgate.model import Stack
from stackgate.plan import requirements
from stackgate.sources import DEBIAN_MIRROR, PipConfig, host_config_problem, installer_args
from stackgate.suite import RDZV_PORT, Layout, NodeCommand, NodeExit, suite_digest
from stackgate.suite_deps import SuiteDeps

# PID 1 of every node container: runs the node's command, then ends and names what it left running
NODE_INIT = shipped.NODE_INIT.read_text()


class DockerBackend:
    name = "docker"

    def __init__(self, engine: Engine, cache_dir: Path, compat: CompatTable, host_pip: PipConfig,
                 env: Mapping[str, str], *, suite_dir: Path, allow_bootstrap: bool = True,
                 mirror: str = DEBIAN_MIRROR, ca_bundle: str | None = None,
                 say: Callable[[str], None] = print, deps: SuiteDeps | None = None) -> None:
        self.engine = engine
        self.cache_dir = cache_dir
        self.compat = compat
        self.host_pip = host_pip
        self.env = dict(env)
        self.suite_dir = suite_dir
        self.allow_bootstrap = allow_bootstrap
        self.mirror = mirror
        self.ca_bundle = images.host_ca_bundle(host_pip, ca_bundle)
        self.say = say
        self.deps = deps or SuiteDeps()

    def prepare(self, stack: Stack, log_path: Path) -> EnvHandle:
        start = time.monotonic()
        base = stack.base_image
        base_id = images.ensure_base(self.engine, base, allow_bootstrap=self.allow_bootstrap
                                     and base.startswith("stackgate/base:"), mirror=self.mirror, say=self.say,
                                     work_dir=log_path.parent)
        reqs = requirements(self.compat, stack)
        lines = self.deps.own_lines()
        extra = [images.in_image(r) for r in lines]
        self.say(f"  resolving wheels for {' '.join(reqs)} into the host wheelhouse")
        index = installer_args(stack.source, self.host_pip)
        try:
            house = images.wheelhouse(self.cache_dir, reqs, index, stack.python, self.ca_bundle, self.env, log_path)
            suite_house = None
            if extra:  # the suite's wheels, with everything the stack has held where it is
                self.say(f"  resolving the suite's wheels for {' '.join(extra)}")
                fetched = images.wheelhouse(self.cache_dir, lines, index, stack.python, self.ca_bundle, self.env,
                                            log_path, constraints=(*images.pins(house), *self.deps.constraint_lines()))
                have = {w.filename for w in house.wheels}
                suite_house = images.Wheelhouse(fetched.path, tuple(w for w in fetched.wheels
                                                                    if w.filename not in have))
        except images.WheelhouseFailed as exc:
            problem = host_config_problem(exc.log_tail, self.host_pip)
            if problem is not None:  # the host, not the stack: the cells are infra errors that say why
                raise InfraError(f"{exc}: {problem}", hint=f"the installer's log: {log_path}") from None
            if is_disk_full(exc.log_tail):
                raise InfraError(f"{exc}: the disk is full ({_conflict(exc.log_tail)})",
                                 hint=f"free space under {self.cache_dir}, or pass --cache-dir") from None
            what = ("the stack's own requirements conflict" if "conflict" in exc.log_tail.lower()
                    else "the stack cannot be installed")
            raise PrepareFailed(f"{exc}: {what} ({_conflict(exc.log_tail)})", exc.log_tail) from None
        template = images.TEMPLATE.read_text()
        every = images.Wheelhouse(house.path, house.wheels + (suite_house.wheels if suite_house else ()))
        recipe = template + (shipped.SUITE_STEP.read_text() if extra else "")  # what renders the Dockerfile
        key = images.image_key(recipe, base_id, every, suite_digest(self.suite_dir), [*reqs, *extra])
        tag = f"stackgate/stack:{stack.label}-{key}"
        found = self.engine.image_labels(tag)
        if found is not None:
            broken = self._image_problem(tag, stack)
            if broken:  # the same rule as a cached venv: checked before reuse, rebuilt when broken
                self.say(f"  cached image {tag} is broken ({broken[:300]}): rebuilding it")
                self.engine.remove_images([tag])
                found = None
        if found is None:
            dockerfile = images.render(template, base=base, requirements=reqs, suite_requirements=extra,
                                       label_map=images.labels(stack, house, base, base_id, key))
            ctx = images.build_context(dockerfile, house, self.suite_dir, suite_house)
            self.say(f"  building image {tag} (log: {log_path})")
            try:
                with log_path.open("a") as log:
                    def on_line(line: str) -> None:
                        log.write(line + "\n")
                        if line.startswith("Step "):  # each build step as it happens
                            self.say(f"    {line[:160]}")
                    self.engine.build(ctx, tag, on_line)
            except BuildError as exc:
                raise PrepareFailed(str(exc), exc.log_tail) from None
            finally:
                shutil.rmtree(ctx, ignore_errors=True)
            found = self.engine.image_labels(tag) or {}
            reused = False
        else:
            reused = True
        sbom = Sbom(kind="image", tag=tag, key=key, labels={k: v for k, v in found.items() if k != "_id"},
                    image_id=found.get("_id", ""), wheels=[w.filename for w in every.wheels])
        try:
            sbom["packages"] = self.engine.read_file(tag, str(inside.PIP_FREEZE)).split()
        except Exception as exc:
            sbom["sbom_error"] = str(exc)
        return EnvHandle(stack, tag, key, reused=reused, prepare_s=time.monotonic() - start, sbom=sbom)

    def _image_problem(self, tag: str, stack: Stack) -> str:
        """Why a cached image cannot be reused ("" when it can): its interpreter runs and imports torch at
        the stack's version (one short container, about 2 s; the layers themselves are content-addressed)."""
        probe = ContainerSpec(name=f"sg-check-{stack.content_hash[:8]}-{os.getpid()}", image=tag,
                              command=("python", "-c", TORCH_PROBE), env={}, mounts=(), hostname="check",
                              user=f"{os.getuid()}:{os.getgid()}")
        try:
            [ran] = self.engine.run_group([probe], network=None, timeout_s=300, on_line=None)
        except InfraError as exc:
            return f"its check could not run: {exc}"
        return torch_probe_problem(stack, ran.exit_code, ran.log)

    def layout(self, handle: EnvHandle, exe: Execution) -> Layout:
        """Nodes are containers: the cell's directories are mounted at /sg/..., the bundled suite is
        in the image, a user's suite is mounted read-only, and node0 hosts the rendezvous."""
        suite_path = inside.SUITE_IN_IMAGE if exe.suite == self.suite_dir.resolve() else inside.USER_SUITE
        return Layout(python="python", out=Path(inside.OUT), artifacts=Path(inside.ARTIFACTS), shared=Path(inside.SHARED),
                      suite=Path(suite_path), bundled=Path(inside.SUITE_IN_IMAGE),
                      endpoint=f"node0:{RDZV_PORT}" if exe.cell.topology.nodes > 1 else "")

    def execute(self, handle: EnvHandle, commands: Sequence[NodeCommand], deadline: float,
                exe: Execution) -> tuple[NodeExit, ...]:
        """One container per node on a private internal network (no route out: torchrun's standalone
        rendezvous needs a resolvable hostname, which `--network none` does not give)."""
        mounts = [(str(exe.workdir), str(inside.OUT), "rw"), (str(exe.artifacts), str(inside.ARTIFACTS), "rw"),
                  (str(exe.shared), str(inside.SHARED), "rw")]
        if exe.suite != self.suite_dir.resolve():
            mounts.append((str(exe.suite), str(inside.USER_SUITE), "ro"))
        label = commands[0].label if commands else "none"
        reports = [f"leftovers-node{c.node}-{c.label}.txt" for c in commands]
        specs = [ContainerSpec(name=f"sg-{exe.tag}-{c.label}-node{c.node}", image=handle.ref,
                               command=("python", "-c", NODE_INIT, str(inside.OUT / r), "--", *c.argv),
                               env=dict(c.env), mounts=tuple(mounts), hostname=f"node{c.node}",
                               gpu=exe.cell.device == "cuda", user=f"{os.getuid()}:{os.getgid()}", workdir=str(c.cwd))
                 for c, r in zip(commands, reports, strict=True)]
        ran = self.engine.run_group(specs, network=f"sg-{exe.tag}-{label}",
                                    timeout_s=max(deadline - time.monotonic(), 1), on_line=exe.on_line)
        exits = []
        for command, container, report in zip(commands, ran, reports, strict=True):
            log = proc.CappedLog(exe.workdir / f"node{command.node}.log")
            for line in container.log.splitlines():
                log.write(line)
            log.close()
            # a node log that could not be written (a full disk) says so in the tail
            written = dataclasses.replace(container, log=f"{container.log}\n{log.problem}") if log.problem else container
            exits.append(_node_exit(command.node, written, _leftovers(exe.workdir / report)))
        return tuple(exits)

    def describe(self, handle: EnvHandle) -> Described:
        return {"backend": "docker", "image": handle.ref, "env_key": handle.key,
                "image_labels": handle.sbom.get("labels", {})}

    def close(self) -> None:
        return None


def _conflict(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip().startswith(("ERROR:", "The conflict",
                                                                                      "The user requested"))]
    return " / ".join(lines[-4:])[:600] or output.strip()[-300:]


def _leftovers(report: Path) -> tuple[str, ...]:
    """What a node container's init ended after the node's command ("pid N: command"), read once."""
    try:
        lines = report.read_text(errors="replace").splitlines()[:50]
    except OSError:
        return ()
    report.unlink(missing_ok=True)
    return tuple(line[:240] for line in lines if line.strip())


def _node_exit(node: int, ex: ContainerExit, leftovers: tuple[str, ...] = ()) -> NodeExit:
    """A container's exit as data: the engine's OOMKilled flag, not a line in a log."""
    tail = "\n".join(ex.log.splitlines()[-200:])
    code = ex.exit_code if ex.exit_code is not None else -9
    if ex.oom_killed:
        tail += "\n[stackgate] container OOMKilled"
        code = -9
    elif code == 137:
        code = -9
        tail += f"\n[stackgate] container {ex.name} was killed (exit 137)"
    return NodeExit(node, ex.name, code, ex.timed_out, oom_killed=ex.oom_killed, duration_s=ex.duration_s, tail=tail,
                    leftovers=leftovers)
