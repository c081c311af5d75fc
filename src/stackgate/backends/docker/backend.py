"""The `docker` backend: one image per stack (content-hash tagged, reused when unchanged); a cell
runs one container per node on a private network, each `torchrun`-ing through the suite."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from stackgate import given, osv, proc, shipped
from stackgate.artifacts import Registry, StackArtifact
from stackgate.backends.base import (
    TORCH_PROBE,
    Described,
    EnvHandle,
    Execution,
    PrepareFailed,
    Sbom,
    checked_once,
    freeze_lines,
    torch_probe_problem,
)
from stackgate.backends.docker import images
from stackgate.backends.docker import layout as inside
from stackgate.backends.docker.engine import BuildError, ContainerExit, ContainerSpec, Engine
from stackgate.backends.host import lacking
from stackgate.compat import CompatTable
from stackgate.errors import ConfigError, InfraError
from stackgate.installer import is_disk_full
from stackgate.model import Stack
from stackgate.plan import requirements
from stackgate.rundir.layout import CellDir, leftovers_name
from stackgate.sources import DEBIAN_MIRROR, PipConfig, host_config_problem, installer_args
from stackgate.suite import RDZV_PORT, Layout, NodeCommand, NodeExit
from stackgate.suite_deps import SuiteDeps


@dataclass(frozen=True)
class StackImage:
    """A stack's image on this engine: what was built, reused or pulled."""

    ref: str  # a local tag, or repo@sha256:... when pulled
    key: str  # the content key it was built from
    id: str
    labels: dict[str, str]
    reused: bool
    wheels: tuple[str, ...]  # the wheels it was built from (empty when pulled)
    size: int
    digest: str  # repo@sha256:... in the run's registry ("" when it was never pushed or pulled)


# PID 1 of every node container: runs the node's command, then ends and names what it left running
NODE_INIT = shipped.NODE_INIT.read_text()


class DockerBackend:
    name = "docker"
    runs_plain = True

    def __init__(self, engine: Engine, cache_dir: Path, compat: CompatTable, host_pip: PipConfig,
                 env: Mapping[str, str], *, suite_dir: Path, allow_bootstrap: bool = True,
                 mirror: str = DEBIAN_MIRROR, ca_bundle: str | None = None,
                 say: Callable[[str], None] = print, deps: SuiteDeps | None = None,
                 registry: Registry | None = None, pinned: Mapping[str, StackArtifact] | None = None,
                 image_python: str = "python3") -> None:
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
        self.registry = registry
        self.pinned = pinned  # stacks.json: pull these by digest, build nothing
        self.image_python = image_python  # the interpreter of a given image (--candidate-image)

    def prepare(self, stack: Stack, log_path: Path) -> EnvHandle:
        """The stack's image: pulled by digest when the run was given stacks.json (never built then),
        else built (or reused by its content key); the suite's own requirements, if any, as a thin layer
        on top. The suite itself is mounted when a cell runs: it is never part of an image."""
        start = time.monotonic()
        if stack.given.startswith(f"{given.IMAGE}:"):
            return self._given(stack, log_path, start)
        image = self._pulled(stack, log_path) if self.pinned is not None else self._built(stack, log_path)
        runs = self._suite_layer(stack, image, log_path) if self.deps.own_lines() else image.ref
        sbom = Sbom(kind="image", tag=image.ref, key=image.key, labels=image.labels, image_id=image.id,
                    wheels=list(image.wheels), size=image.size)
        if image.digest:
            sbom["digest"] = image.digest
        if runs != image.ref:
            sbom["suite_layer"] = runs
        try:  # the stack image's own SBOM (a suite layer on top adds the suite's packages to what the suite sees)
            sbom["packages"] = freeze_lines(self.engine.read_file(image.ref, str(inside.PIP_FREEZE)))
        except Exception as exc:
            sbom["sbom_error"] = str(exc)
        self._os_sbom(image.ref, sbom)
        return EnvHandle(stack, runs, image.key, reused=image.reused, prepare_s=time.monotonic() - start, sbom=sbom)

    def _given(self, stack: Stack, log_path: Path, start: float) -> EnvHandle:
        """A prebuilt image, as it is: pulled when it is not here, probed again (it must still hold what
        the run started with), never rebuilt. What the suite needs and it lacks is a prefix on the host,
        mounted read-only into each node container (the image's digest stays the one tested)."""
        from stackgate.backends import docker
        from stackgate.backends.host import suite_prefix
        ref = stack.given.removeprefix(f"{given.IMAGE}:")
        if self.engine.facts(ref) is None:
            self.say(f"  pulling {ref}")
            self.engine.pull(ref, None)
        try:
            probed = docker.probe_in(self.engine, ref, self.image_python)
        except ConfigError as exc:
            raise InfraError(f"the image {ref} no longer answers its probe: {exc}") from None
        if probed.torch != stack.torch or probed.cuda != stack.cuda:
            raise InfraError(f"the image {ref} changed while the run went on: it holds torch {probed.torch}, "
                             f"the run started with {stack.torch}")
        target = ["--python-version", probed.python, "--python-platform", "x86_64-manylinux_2_28"]
        prefix = suite_prefix(self.cache_dir / "envs", self.deps, probed, target,
                              installer_args(stack.source, self.host_pip), self.env, log_path, self.say)
        image = self._image(ref, "", True)
        sbom = Sbom(kind="image", tag=ref, key=image.id[7:23], labels=image.labels, image_id=image.id,
                    size=image.size, packages=list(probed.packages), interpreter=probed.executable)
        if image.digest:
            sbom["digest"] = image.digest
        if prefix is not None:
            sbom["suite_prefix"] = str(prefix)
        self._os_sbom(ref, sbom)
        return EnvHandle(stack, ref, sbom["key"], reused=True, prepare_s=time.monotonic() - start, sbom=sbom)

    def _os_sbom(self, ref: str, sbom: Sbom) -> None:
        """The image's Debian packages (by source, as Debian's advisories name them) and its release."""
        try:
            # /etc/os-release is a link to /usr/lib/os-release on Debian: read the file itself
            sbom["os_release"] = osv.os_release(self.engine.read_file(ref, "/usr/lib/os-release"))
            sbom["os_packages"] = osv.dpkg_sources(self.engine.read_file(ref, "/var/lib/dpkg/status"))
        except Exception as exc:  # not a Debian image, or no dpkg: the SBOM has the Python packages only
            sbom["sbom_error"] = f"{sbom.get('sbom_error', '')} OS packages: {exc}".strip()

    def publish(self, handle: EnvHandle) -> StackArtifact:
        """Push a prepared stack image to the registry: the artifact by digest. An unchanged stack is
        pushed again as a no-op (the registry has its layers); no image is rebuilt for it."""
        if self.registry is None:
            raise ConfigError("no registry configured to push to", hint="pass --registry HOST[:PORT]")
        tag = handle.sbom.get("tag", handle.ref)
        self.say(f"  pushing {tag} to {self.registry.name}")
        ref = self.engine.push(tag, self.registry.name, None)
        packages = "\n".join(handle.sbom.get("packages", [])) + "\n"
        labels = handle.sbom.get("labels", {})
        return StackArtifact(stack=handle.stack.ident, image=ref, key=handle.key, size=handle.sbom.get("size", 0),
                             sbom_digest="sha256:" + hashlib.sha256(packages.encode()).hexdigest(),
                             torch=labels.get("org.stackgate.torch", str(handle.stack.torch)),
                             cuda=handle.stack.cuda.tag, python=handle.stack.python)

    def _wheels(self, stack: Stack, requirements: Sequence[str], log_path: Path,
                constraints: Sequence[str] = ()) -> images.Wheelhouse:
        """The host wheelhouse of `requirements` for the stack's target; a failure says whose it is."""
        index = installer_args(stack.source, self.host_pip)
        try:
            return images.wheelhouse(self.cache_dir, requirements, index, stack.python, self.ca_bundle, self.env,
                                     log_path, constraints=constraints)
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

    def _built(self, stack: Stack, log_path: Path) -> StackImage:
        """The stack image built from the host wheelhouse, or reused when its content key is present
        (after a short check that it imports the stack's torch)."""
        base = stack.base_image
        base_id = images.ensure_base(self.engine, base, allow_bootstrap=self.allow_bootstrap
                                     and base.startswith("stackgate/base:"), mirror=self.mirror, say=self.say,
                                     work_dir=log_path.parent)
        reqs = requirements(self.compat, stack)
        self.say(f"  resolving wheels for {' '.join(reqs)} into the host wheelhouse")
        house = self._wheels(stack, reqs, log_path)
        template = images.TEMPLATE.read_text()
        key = images.image_key(template, base_id, house, reqs)
        tag = f"{images.STACK_REPO}:{stack.label}-{key}"
        reused = self._usable(tag, stack)
        if not reused:
            dockerfile = images.render(template, base=base, requirements=reqs,
                                       label_map=images.labels(stack, house, base, base_id, key))
            self._build(dockerfile, house, tag, log_path)
        return self._image(tag, key, reused, wheels=tuple(w.filename for w in house.wheels))

    def _pulled(self, stack: Stack, log_path: Path) -> StackImage:
        """The stack image named by digest in stacks.json, pulled when it is not here. A stack that
        stacks.json does not name is an infrastructure error: a pool runner never builds."""
        assert self.pinned is not None
        artifact = self.pinned.get(stack.ident)
        if artifact is None:
            raise InfraError(f"stacks.json has no image for stack {stack.ident} (it names: "
                             f"{', '.join(sorted(self.pinned)) or 'none'}); a pool runner pulls by digest and never "
                             "builds", hint="build and push every stack of this matrix first: `stackgate build --push` "
                                            "with the same matrix and candidate")
        if self.engine.facts(artifact.image) is None:
            self.say(f"  pulling {artifact.image} (by digest)")
            with log_path.open("a") as log:
                def on_line(line: str) -> None:
                    log.write(line + "\n")
                self.engine.pull(artifact.image, on_line)
        else:
            self.say(f"  {artifact.image} is already here (by digest)")
        broken = self._image_problem(artifact.image, stack)
        if broken:
            raise PrepareFailed(f"the stack image {artifact.image} cannot run the stack: {broken}")
        return self._image(artifact.image, artifact.key, True)

    def _image(self, ref: str, key: str, reused: bool, wheels: tuple[str, ...] = ()) -> StackImage:
        facts = self.engine.facts(ref)
        if facts is None:
            raise InfraError(f"the engine does not list the image {ref}")
        labels = {k: v for k, v in (self.engine.image_labels(ref) or {}).items() if k != "_id"}
        name = self.registry.name if self.registry else ref.split("@", 1)[0] if "@" in ref else ""
        if not name and ":" in ref.rsplit("/", 1)[-1]:  # a given image by tag: its repository's digest
            name = ref.rsplit(":", 1)[0]
        digest = next((d for d in facts.repo_digests if name and d.split("@", 1)[0] == name), "")
        return StackImage(ref, key, facts.id, labels, reused, wheels, facts.size, digest)

    def _usable(self, tag: str, stack: Stack) -> bool:
        """Whether the image `tag` is here and passes its check; a broken one is removed."""
        if self.engine.image_labels(tag) is None:
            return False
        broken = self._image_problem(tag, stack)
        if broken:  # the same rule as a cached venv: checked before reuse, rebuilt when broken
            self.say(f"  cached image {tag} is broken ({broken[:300]}): rebuilding it")
            self.engine.remove_images([tag])
            return False
        return True

    def _build(self, dockerfile: str, house: images.Wheelhouse, tag: str, log_path: Path) -> None:
        self.say(f"  building image {tag} (log: {log_path})")
        ctx = images.build_context(dockerfile)
        try:
            with log_path.open("a") as log, images.serve_wheels(house) as url:
                def on_line(line: str) -> None:
                    log.write(line + "\n")
                    if line.startswith("Step "):  # each build step as it happens
                        self.say(f"    {line[:160]}")
                self.engine.build(ctx, tag, on_line, {images.WHEELS_ARG: url})
        except BuildError as exc:
            raise PrepareFailed(str(exc), exc.log_tail) from None
        finally:
            shutil.rmtree(ctx, ignore_errors=True)

    def _suite_layer(self, stack: Stack, image: StackImage, log_path: Path) -> str:
        """The suite's own requirements as a thin layer FROM the stack image (its parent's id in the
        labels): the stack image is not changed by it. Everything the stack holds stays as it is."""
        lines = self.deps.own_lines()
        extra = [images.in_image(r) for r in lines]
        held = [p for p in freeze_lines(self.engine.read_file(image.ref, str(inside.PIP_FREEZE))) if "==" in p]
        self.say(f"  resolving the suite's wheels for {' '.join(extra)}")
        fetched = self._wheels(stack, lines, log_path, constraints=(*held, *self.deps.constraint_lines()))
        missing = set(lacking(tuple(images.pin_of(w) for w in fetched.wheels), tuple(held)))
        house = images.Wheelhouse(fetched.path, tuple(w for w in fetched.wheels if images.pin_of(w) in missing))
        template = images.LAYER_TEMPLATE.read_text()
        key = images.layer_key(template, image.id, house, extra)
        tag = f"{images.SUITE_REPO}:{stack.label}-{key}"
        if self.engine.image_labels(tag) is None:
            dockerfile = images.render_layer(template, parent=image.ref, requirements=extra, label_map={
                "org.stackgate.key": key, "org.stackgate.parent": image.id,
                "org.stackgate.parent-ref": image.digest or image.ref})
            self._build(dockerfile, house, tag, log_path)
        return tag

    def _image_problem(self, tag: str, stack: Stack) -> str:
        """Why a cached image cannot be reused ("" when it can): its interpreter runs and imports torch at
        the stack's version (one short container, 4-12 s on a slow runner). An image is immutable by its
        id, so the check runs once per id: one that passed is recorded under the cache directory."""
        facts = self.engine.facts(tag)
        probe = ContainerSpec(name=f"sg-check-{stack.content_hash[:8]}-{os.getpid()}", image=tag,
                              command=("python", "-c", TORCH_PROBE), env={}, mounts=(), hostname="check",
                              user=f"{os.getuid()}:{os.getgid()}")

        def imports() -> str:
            try:
                [ran] = self.engine.run_group([probe], network=None, timeout_s=300, on_line=None)
            except InfraError as exc:
                return f"its check could not run: {exc}"
            return torch_probe_problem(stack, ran.exit_code, ran.log)

        stamp = self.cache_dir / "checked-images" / facts.id.split(":")[-1] if facts else None
        return checked_once(stamp, stack.torch_public, imports)

    def layout(self, handle: EnvHandle, exe: Execution) -> Layout:
        """Nodes are containers: the cell's directories are mounted at /sg/..., the suite (and the
        bundled one, for its platform checks) read-only, and node0 hosts the rendezvous."""
        bundled = inside.SUITE if exe.suite == self.suite_dir.resolve() else inside.BUNDLED_SUITE
        return Layout(python=handle.sbom.get("interpreter") or "python", out=Path(inside.OUT), artifacts=Path(inside.ARTIFACTS), shared=Path(inside.SHARED),
                      suite=Path(inside.SUITE), bundled=Path(bundled),
                      endpoint=f"node0:{RDZV_PORT}" if exe.cell.topology.nodes > 1 else "")

    def mounts(self, handle: EnvHandle, exe: Execution) -> list[tuple[str, str, str]]:
        return node_mounts(exe, self.suite_dir, handle.sbom.get("suite_prefix") or "")

    def execute(self, handle: EnvHandle, commands: Sequence[NodeCommand], deadline: float,
                exe: Execution) -> tuple[NodeExit, ...]:
        """One container per node on a network of the cell's own (a bridge: torchrun's standalone
        rendezvous needs a resolvable hostname, which `--network none` does not give)."""
        mounts = self.mounts(handle, exe)
        prefix = handle.sbom.get("suite_prefix")
        python = handle.sbom.get("interpreter") or "python"
        label = commands[0].label if commands else "none"
        reports = [leftovers_name(c.node, c.label) for c in commands]
        # the fidelity rerun runs the command itself, without the node init that reports leftovers
        specs = [ContainerSpec(name=f"sg-{exe.tag}-{c.label}-node{c.node}", image=handle.ref,
                               command=tuple(c.argv) if exe.plain else (python, "-c", NODE_INIT, str(inside.OUT / r),
                                                                        "--", *c.argv),
                               env={**c.env, **({"PYTHONPATH": str(inside.PREFIX)} if prefix else {})}, mounts=tuple(mounts), hostname=f"node{c.node}",
                               gpu=exe.cell.device == "cuda", user=f"{os.getuid()}:{os.getgid()}", workdir=str(c.cwd),
                               cpus=exe.cpus, plain=exe.plain)
                 for c, r in zip(commands, reports, strict=True)]
        ran = self.engine.run_group(specs, network=None if exe.plain else f"sg-{exe.tag}-{label}",
                                    timeout_s=max(deadline - time.monotonic(), 1), on_line=exe.on_line)
        exits = []
        cell_dir = CellDir(exe.workdir)
        for command, container in zip(commands, ran, strict=True):
            log = proc.CappedLog(cell_dir.node_log(command.node))
            for line in container.log.splitlines():
                log.write(line)
            log.close()
            # a node log that could not be written (a full disk) says so in the tail
            written = dataclasses.replace(container, log=f"{container.log}\n{log.problem}") if log.problem else container
            exits.append(_node_exit(command.node, written, _leftovers(cell_dir.leftovers(command.node, command.label))))
        return tuple(exits)

    def describe(self, handle: EnvHandle) -> Described:
        described = Described(backend="docker", image=handle.ref, env_key=handle.key, stack_label=handle.stack.ident,
                              image_labels=handle.sbom.get("labels", {}), image_id=handle.sbom.get("image_id", ""))
        if handle.sbom.get("digest"):
            described["image_digest"] = handle.sbom["digest"]
        if handle.sbom.get("suite_layer"):
            described["stack_image"] = handle.sbom["tag"]
        return described

    def close(self) -> None:
        return None


def node_mounts(exe: Execution, bundled: Path, prefix: str = "") -> list[tuple[str, str, str]]:
    """(host path, container path, rw|ro) of a node container: the cell's directories, the suite
    read-only (and the bundled one beside a user's), what a given image lacks (`prefix`). Any container
    runtime that runs the layout's paths mounts these (Slurm's, on its nodes, too)."""
    mounts = [(str(exe.workdir), str(inside.OUT), "rw"), (str(exe.artifacts), str(inside.ARTIFACTS), "rw"),
              (str(exe.shared), str(inside.SHARED), "rw")]
    mounts.append((str(exe.suite), str(inside.SUITE), "ro"))
    if prefix:  # a given image: what the suite needs and it lacks, read-only, on PYTHONPATH
        mounts.append((prefix, str(inside.PREFIX), "ro"))
    if exe.suite != bundled.resolve():
        mounts.append((str(bundled.resolve()), str(inside.BUNDLED_SUITE), "ro"))
    return mounts


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
