"""The one boundary for Docker: every docker SDK call lives here, behind the small `Engine` protocol.

Containers and networks made by `run_group` are always removed, whatever happens. Every container
gets no capabilities, no new privileges and a network of its cell's, and what training needs on any
machine: a /dev/shm of `SHM_SIZE` (DataLoader workers and torch.multiprocessing hand tensors over
through it; Docker's default of 64 MB hangs or kills them), a writable root (the container's own
layer, removed with it: trainers write caches under HOME, ~/.triton, ~/.cache/torch) and, for a user
that the image does not know, a name and a writable home. GPU cells add device requests and
memlock/stack ulimits. README "Backends" says what a container gets and why.
"""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from stackgate import proc
from stackgate.backends.docker import layout as inside
from stackgate.console import Printer
from stackgate.errors import InfraError


@dataclass(frozen=True)
class ContainerSpec:
    name: str
    image: str
    command: tuple[str, ...]
    env: dict[str, str]
    mounts: tuple[tuple[str, str, str], ...]  # (host path, container path, "rw"|"ro")
    hostname: str
    gpu: bool = False
    user: str | None = None
    workdir: str | None = None
    cpus: tuple[int, ...] = ()  # the host CPUs it may run on (a concurrent pair's share); () = any
    plain: bool = False  # the fidelity rerun: a plain `docker run --ipc=host` (no restriction, engine's network)


@dataclass(frozen=True)
class ContainerExit:
    name: str
    exit_code: int | None
    oom_killed: bool
    timed_out: bool
    log: str
    duration_s: float = 0.0


class BuildError(Exception):
    def __init__(self, message: str, log_tail: str) -> None:
        super().__init__(message)
        self.log_tail = log_tail


@dataclass(frozen=True)
class ImageFacts:
    """What the engine knows of a local image."""

    id: str
    size: int
    repo_digests: tuple[str, ...]  # repo@sha256:... for every registry it was pushed to or pulled from


class Engine(Protocol):
    def problem(self) -> str | None: ...
    def image_labels(self, tag: str) -> dict[str, str] | None: ...
    def facts(self, ref: str) -> ImageFacts | None: ...
    def push(self, tag: str, name: str, on_line: Printer | None) -> str: ...
    def pull(self, ref: str, on_line: Printer | None) -> None: ...
    def resolve_tag(self, name: str, tag: str) -> str | None: ...
    def move_tag(self, ref: str, name: str, tag: str) -> str: ...
    def build(self, context: Path, tag: str, on_line: Printer | None, args: Mapping[str, str]) -> None: ...
    def import_rootfs(self, rootfs: Path, tag: str) -> None: ...
    def read_file(self, tag: str, path: str) -> str: ...
    def remove_images(self, tags: Sequence[str]) -> None: ...
    def run_group(self, specs: Sequence[ContainerSpec], *, network: str | None, timeout_s: float,
                  on_line: Printer | None) -> list[ContainerExit]: ...


@dataclass
class DockerEngine:
    """The real engine, through the docker SDK (docker-py)."""

    timeout_s: int = 600
    _client: Any = field(default=None, init=False, repr=False)

    @property
    def client(self) -> Any:
        if self._client is None:
            import docker
            try:
                self._client = docker.from_env(timeout=self.timeout_s)
            except docker.errors.DockerException as exc:
                raise InfraError(f"cannot reach the Docker engine: {exc}",
                                 hint="start dockerd (see .ci/run) or use --backend venv") from None
        return self._client

    def problem(self) -> str | None:
        try:
            self.client.ping()
        except Exception as exc:
            return f"Docker engine not answering: {exc}"
        return None

    def _image(self, ref: str) -> Any:
        """The SDK's image object, or None when the engine does not have it."""
        import docker
        try:
            return self.client.images.get(ref)
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.APIError as exc:
            raise InfraError(f"Docker engine error: {exc}") from None

    def image_labels(self, tag: str) -> dict[str, str] | None:
        image = self._image(tag)
        return None if image is None else {**(image.labels or {}), "_id": image.id}

    def facts(self, ref: str) -> ImageFacts | None:
        image = self._image(ref)
        if image is None:
            return None
        return ImageFacts(image.id, int(image.attrs.get("Size") or 0), tuple(image.attrs.get("RepoDigests") or ()))

    def push(self, tag: str, name: str, on_line: Printer | None) -> str:
        """Tag the local image `tag` as `name:<its tag>` and push it; the pushed image by digest
        (`name@sha256:...`). The engine's client brings the credentials (`docker login`)."""
        import docker
        remote_tag = tag.rsplit(":", 1)[-1]
        try:
            self.client.images.get(tag).tag(name, remote_tag)
            stream = self.client.api.push(name, tag=remote_tag, stream=True, decode=True)
            pushed = _registry_stream(stream, f"docker push {name}:{remote_tag}", on_line)
        except docker.errors.APIError as exc:
            raise InfraError(f"docker push {name}:{remote_tag} failed: {exc}", hint=_registry_hint(name)) from None
        if not pushed:
            raise InfraError(f"docker push {name}:{remote_tag} reported no digest", hint=_registry_hint(name))
        return f"{name}@{pushed}"

    def pull(self, ref: str, on_line: Printer | None) -> None:
        """Pull `repo@sha256:...` (by digest: what was tested is what runs), or `repo:tag`."""
        import docker
        name, _, digest = ref.partition("@")
        if not digest:
            last = ref.rsplit("/", 1)[-1]
            name, digest = (ref.rsplit(":", 1) if ":" in last else (ref, "latest"))
        try:
            _registry_stream(self.client.api.pull(name, tag=digest, stream=True, decode=True), f"docker pull {ref}",
                             on_line)
        except docker.errors.APIError as exc:
            raise InfraError(f"docker pull {ref} failed: {exc}", hint=_registry_hint(name)) from None

    def resolve_tag(self, name: str, tag: str) -> str | None:
        """What `name:tag` points at in the registry (`name@sha256:...`), or None when it has no such tag."""
        import docker
        try:
            _registry_stream(self.client.api.pull(name, tag=tag, stream=True, decode=True), f"docker pull {name}:{tag}",
                             None)
        except InfraError as exc:
            if "manifest unknown" in str(exc) or "not found" in str(exc).lower():
                return None
            raise
        except docker.errors.NotFound:
            return None
        except docker.errors.APIError as exc:
            raise InfraError(f"docker pull {name}:{tag} failed: {exc}", hint=_registry_hint(name)) from None
        facts = self.facts(f"{name}:{tag}")
        return next((d for d in facts.repo_digests if d.split("@", 1)[0] == name), None) if facts else None

    def manifest_digest(self, name: str, tag: str) -> str | None:
        """The digest `name:tag` names in the registry, from its manifest alone (the engine asks the
        registry, with the client's credentials; nothing is pulled), or None when there is no such tag."""
        import docker
        try:
            found = self.client.api.inspect_distribution(f"{name}:{tag}")
        except docker.errors.NotFound:
            return None
        except docker.errors.APIError as exc:
            if "manifest unknown" in str(exc) or "not found" in str(exc).lower():
                return None
            raise InfraError(f"the registry did not answer for {name}:{tag}: {exc}", hint=_registry_hint(name)) from None
        digest = found.get("Descriptor", {}).get("digest") if isinstance(found, dict) else None
        if not isinstance(digest, str) or not digest.startswith("sha256:"):
            raise InfraError(f"the registry's answer for {name}:{tag} names no digest: {str(found)[:200]}")
        return digest

    def move_tag(self, ref: str, name: str, tag: str) -> str:
        """Point `name:tag` at the image `ref` (already in the registry): its layers are there, so only
        the tag's manifest is written; nothing is rebuilt or uploaded again. The digest it points at."""
        if self.facts(ref) is None:
            self.pull(ref, None)
        self.client.images.get(ref).tag(name, tag)
        return self.push(f"{name}:{tag}", name, None)

    def build(self, context: Path, tag: str, on_line: Printer | None, args: Mapping[str, str]) -> None:
        """`docker build` of `context` with the build arguments `args`. Its steps share the host's network
        namespace: they reach the wheel server `images.serve_wheels` runs on this host's loopback (and,
        with `pip install --no-index`, nothing else)."""
        import docker
        tail: list[str] = []
        try:
            stream = self.client.api.build(path=str(context), tag=tag, rm=True, forcerm=True, decode=True,
                                           pull=False, buildargs=dict(args), network_mode="host")
            for chunk in stream:
                text = chunk.get("stream") or chunk.get("status") or ""
                if "error" in chunk:
                    tail.append(str(chunk["error"]))
                    raise BuildError(f"docker build of {tag} failed: {chunk['error']}", "\n".join(tail[-80:]))
                for line in text.splitlines():
                    if line.strip():
                        tail.append(line)
                        if on_line:
                            on_line(line)
        except docker.errors.APIError as exc:
            raise BuildError(f"docker build of {tag} failed: {exc}", "\n".join(tail[-80:])) from None

    def stack_images(self) -> list[tuple[str, str]]:
        """(tag, created) of every local stackgate stack image and suite layer."""
        out = []
        for repo in ("stackgate/stack", "stackgate/suite-layer"):
            for image in self.client.images.list(name=repo):
                out += [(tag, str(image.attrs.get("Created", ""))) for tag in image.tags if tag.startswith(repo + ":")]
        return out

    def remove_images(self, tags: Sequence[str]) -> None:
        for tag in tags:
            self.client.images.remove(tag)

    def prune_dangling(self) -> int:
        """Remove untagged images (old build stages); bytes reclaimed."""
        return int(self.client.images.prune(filters={"dangling": True}).get("SpaceReclaimed") or 0)

    def import_rootfs(self, rootfs: Path, tag: str) -> None:
        """`tar -C rootfs -c . | docker import - tag`, streamed."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(str(rootfs), arcname=".")
        buf.seek(0)
        repo, _, version = tag.partition(":")
        self.client.api.import_image_from_data(buf.getvalue(), repository=repo, tag=version or "latest")

    def read_file(self, tag: str, path: str) -> str:
        """Read a file from an image without running anything in it."""
        container = self.client.containers.create(tag, command=["true"])
        try:
            stream, _ = container.get_archive(path)
            data = b"".join(stream)
        finally:
            container.remove(force=True)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            member = tar.getmembers()[0]
            fh = tar.extractfile(member)
            return fh.read().decode(errors="replace") if fh else ""

    @contextlib.contextmanager
    def _network(self, name: str | None) -> Iterator[Any]:
        if name is None:
            yield None
            return
        # not `internal`: on an internal network Docker's embedded DNS drops what it cannot answer, so every
        # lookup of a name it does not know (a reverse lookup of ::ffff:127.0.0.1 in c10d's TCPStore) stalls
        # 10 s where the host's resolver says "not known" at once; that broke 23 tests of pytorch-ignite's
        # distributed suite that pass under plain pytest and in a plain `docker run` (#41)
        net = self.client.networks.create(name, driver="bridge", internal=False, check_duplicate=True)
        try:
            yield net
        finally:
            for _ in range(5):  # an interrupt can leave the engine a moment behind the removed containers
                try:
                    net.remove()
                    break
                except Exception:
                    time.sleep(0.5)

    def _remove_unreturned(self, specs: Sequence[ContainerSpec]) -> None:
        """An interrupt inside `containers.run` can leave a container the engine created (or started)
        but the call never returned: it is found by its name and removed too."""
        import docker
        for spec in specs:
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                self.client.containers.get(spec.name).remove(force=True)

    def run_group(self, specs: Sequence[ContainerSpec], *, network: str | None, timeout_s: float,
                  on_line: Printer | None) -> list[ContainerExit]:
        import docker
        containers: list[Any] = []
        start = time.monotonic()
        try:
            with self._network(network):
                try:
                    for spec in specs:
                        kwargs = container_kwargs(spec, network)
                        containers.append(self.client.containers.run(spec.image, **kwargs))
                    if on_line and containers:
                        threading.Thread(target=_follow, args=(containers[0], on_line), daemon=True).start()
                    timed_out = _wait_all(containers, timeout_s)
                    exits = []
                    for c in containers:
                        c.reload()
                        state = c.attrs.get("State", {})
                        log = c.logs(stdout=True, stderr=True).decode(errors="replace")
                        exits.append(ContainerExit(
                            name=c.name, exit_code=state.get("ExitCode") if not timed_out else None,
                            oom_killed=bool(state.get("OOMKilled")), timed_out=timed_out, log=log,
                            duration_s=time.monotonic() - start))
                    return exits
                finally:  # containers first: a network with containers attached cannot be removed
                    for c in containers:
                        with contextlib.suppress(Exception):
                            c.remove(force=True)
                    self._remove_unreturned(specs[len(containers):])
        except docker.errors.ImageNotFound as exc:
            raise InfraError(f"image missing: {exc}") from None
        except docker.errors.APIError as exc:
            raise InfraError(f"Docker engine error while running {specs[0].name if specs else ''}: {exc}") from None
        except Exception as exc:  # requests.ConnectionError when the daemon goes away mid-run
            if exc.__class__.__module__.startswith(("requests", "urllib3")):
                raise InfraError(f"lost the Docker engine: {exc}") from None
            raise


def _registry_stream(stream: Any, what: str, on_line: Printer | None) -> str:
    """Read a push or pull stream: an error chunk is an infrastructure error; the digest a push
    reports (its `aux` chunk), or "" for a pull."""
    digest = ""
    for chunk in stream:
        if "error" in chunk:
            raise InfraError(f"{what} failed: {chunk['error']}", hint=_registry_hint(what.rsplit(maxsplit=1)[-1]))
        digest = str((chunk.get("aux") or {}).get("Digest") or digest)
        status = str(chunk.get("status") or "")
        if on_line and status and "progress" not in chunk and status not in ("Waiting", "Preparing", "Downloading",
                                                                               "Extracting", "Pushing"):
            on_line(f"{chunk.get('id', '')} {status}".strip())
    return digest


def _registry_hint(name: str) -> str:
    host = name.split("/", 1)[0]
    return (f"is the registry {host} up and reachable from the Docker engine? If it needs credentials, "
            f"`docker login {host}` (stackgate never takes a password itself)")


SHM_SIZE = "16g"  # a limit, not a reservation: tmpfs pages are taken as they are written


def container_kwargs(spec: ContainerSpec, network: str | None) -> dict[str, Any]:
    """docker SDK `containers.run` arguments: what every container gets (its command, environment,
    mounts, user, GPUs), then, unless it is the fidelity rerun's plain `docker run --ipc=host`, a cell's
    own: no capability, no new privilege, its network and what training needs (shared memory, a
    writable root and home); GPU cells add memlock/stack ulimits."""
    from docker.types import DeviceRequest, Ulimit
    kwargs: dict[str, Any] = {
        "name": spec.name, "environment": dict(spec.env), "command": list(spec.command), "detach": True,
        "volumes": {h: {"bind": c, "mode": m} for h, c, m in spec.mounts}, "user": spec.user,
    }
    if spec.workdir:
        kwargs["working_dir"] = spec.workdir
    if spec.gpu:
        kwargs["device_requests"] = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    if spec.plain:  # as a user types `docker run --rm --ipc=host IMAGE ...`: nothing of stackgate's
        return {**kwargs, "ipc_mode": "host"}
    tmpfs = {"/tmp": "rw,exec,size=8g"}
    if spec.user is not None and spec.user.split(":", 1)[0] != "0":
        # a host uid the image has no passwd entry for: getpass.getuser() and a home to write must
        # still work, as they do for the same user on this machine
        tmpfs[str(inside.HOME)] = "rw,exec,size=8g,mode=1777"
        user = _user_name()
        kwargs["environment"] = {"HOME": str(inside.HOME), "USER": user, "LOGNAME": user} | kwargs["environment"]
    kwargs.update(hostname=spec.hostname, cap_drop=["ALL"], security_opt=["no-new-privileges:true"],
                  shm_size=SHM_SIZE, tmpfs=tmpfs, pids_limit=4096)
    if spec.cpus:
        kwargs["cpuset_cpus"] = ",".join(str(c) for c in spec.cpus)
    if network:
        kwargs["network"] = network
    if spec.gpu:
        # NCCL needs unlimited locked memory (GPUDirect RDMA registration); IPC stays private: ranks of
        # one cell share a container, so no host IPC namespace is needed.
        kwargs["ulimits"] = [Ulimit(name="memlock", soft=-1, hard=-1),
                             Ulimit(name="stack", soft=67108864, hard=67108864)]
    return kwargs


def _user_name() -> str:
    """This host's name for the user that runs the containers (as USER says on this machine)."""
    import pwd
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid{os.getuid()}"


def _wait_all(containers: Sequence[Any], timeout_s: float) -> bool:
    """Wait for every container; on timeout kill them all. Returns whether it timed out."""
    deadline = time.monotonic() + timeout_s
    pending = list(containers)
    while pending:
        if proc.STOPPING.is_set():  # an interrupt on the main thread (this one runs one of a concurrent pair)
            raise KeyboardInterrupt
        for c in list(pending):
            c.reload()
            if c.status in ("exited", "dead"):
                pending.remove(c)
        if not pending:
            return False
        if time.monotonic() > deadline:
            for c in pending:
                with contextlib.suppress(Exception):
                    c.kill()
            return True
        time.sleep(0.5)
    return False


def _follow(container: Any, on_line: Printer) -> None:
    with contextlib.suppress(Exception):
        buffer = b""
        for chunk in container.logs(stream=True, follow=True):
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                on_line(line.decode(errors="replace"))
