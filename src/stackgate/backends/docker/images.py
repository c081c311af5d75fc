"""Image planning for the Docker backend: host-side wheelhouse, rendered Dockerfile, content key,
labels, and the local base-image bootstrap (debootstrap + docker import) for registry-less hosts.

Everything here is plain functions over files; the Docker engine is only touched through
`engine.Engine`.
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import http.server
import json
import shutil
import tempfile
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import parse_wheel_filename

from stackgate import proc
from stackgate.backends.docker import layout
from stackgate.backends.docker.engine import Engine
from stackgate.errors import InfraError
from stackgate.installer import cache_lock, cached_dir, file_sha256, is_network_failure
from stackgate.model import Stack
from stackgate.shipped import DOCKERFILE_TEMPLATE, SUITE_LAYER
from stackgate.sources import PipConfig, pip_command

TEMPLATE = DOCKERFILE_TEMPLATE
LAYER_TEMPLATE = SUITE_LAYER
STACK_REPO = "stackgate/stack"  # local tags of stack images: <repo>:<stack label>-<content key>
SUITE_REPO = "stackgate/suite-layer"  # local tags of the thin suite layers on top of them
LOCAL_BASE = "stackgate/base:bookworm"
WHEELS_ARG = "STACKGATE_WHEELS"  # the build argument naming the URL `serve_wheels` answers on
BASE_PACKAGES = ("python3", "python3-venv", "python3-dev", "g++", "libgomp1", "procps")  # torch.compile needs g++ + Python.h
TARGET_GLIBC = (2, 36)  # Debian bookworm, the local base


def platforms(glibc: tuple[int, int] = TARGET_GLIBC, arch: str = "x86_64") -> tuple[str, ...]:
    """Every manylinux tag the target can load: pip matches --platform values exactly, newest first."""
    major, minor = glibc
    tags = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 16, -1)]
    return (*tags, f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}")


class WheelhouseFailed(Exception):
    """The wheels of a stack could not be downloaded for a reason other than the network."""

    def __init__(self, message: str, log_tail: str) -> None:
        super().__init__(message)
        self.log_tail = log_tail


@dataclass(frozen=True)
class Wheel:
    filename: str
    sha256: str


@dataclass(frozen=True)
class Wheelhouse:
    path: Path
    wheels: tuple[Wheel, ...]

    def version_of(self, project: str) -> str | None:
        for w in self.wheels:
            name, version, _, _ = parse_wheel_filename(w.filename)
            if name == project:
                return str(version)
        return None

    def version_with_prefix(self, prefix: str) -> str | None:
        for w in self.wheels:
            name, version, _, _ = parse_wheel_filename(w.filename)
            if str(name).startswith(prefix):
                return str(version)
        return None


def pin_of(wheel: Wheel) -> str:
    """A wheel as `name==version` (canonical name)."""
    name, version, _, _ = parse_wheel_filename(wheel.filename)
    return f"{name}=={version}"


def in_image(requirement: str) -> str:
    """A requirement as the image installs it from /wheels: a local wheel (`name @ file:///...whl`)
    becomes `name[extras]==version`, so no host path enters the Dockerfile or the image key."""
    if " @ " not in requirement:
        return requirement
    head, url = (part.strip() for part in requirement.split(" @ ", 1))
    name, version, _, _ = parse_wheel_filename(url.rsplit("/", 1)[-1])
    extras = head[len(head.split("[", 1)[0]):]
    return f"{name}{extras}=={version}"


def download_args(index_args: Sequence[str], python: str, ca_bundle: str | None) -> list[str]:
    """pip download arguments for the target Python/platform (not the host's)."""
    args = ["--only-binary=:all:", "--python-version", python.rstrip("t"), "--implementation", "cp",
            "--disable-pip-version-check"]
    for platform in platforms():
        args += ["--platform", platform]
    translated: list[str] = []
    items = iter(index_args)
    for a in items:  # uv spellings -> pip spellings
        if a == "--index-strategy":  # pip always considers every index
            next(items, None)
        elif a == "--prerelease":
            next(items, None)
            translated.append("--pre")
        else:
            translated.append(a)
    if ca_bundle:
        args += ["--cert", ca_bundle]
    return args + translated


def wheelhouse(cache_dir: Path, requirements: Sequence[str], index_args: Sequence[str], python: str,
               ca_bundle: str | None, env: dict[str, str], log_path: Path,
               constraints: Sequence[str] = ()) -> Wheelhouse:
    """Resolve and download on the host into a content-addressed directory (reused when present)."""
    parts: list[Any] = [list(requirements), list(index_args), python]
    if constraints:  # (absent from the key when there are none: existing wheelhouses stay valid)
        parts.append(list(constraints))
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode())
    path = cache_dir / "wheelhouse" / key.hexdigest()[:16]
    with cache_lock(path):  # concurrent runs share one download
        return _wheelhouse_locked(path, requirements, index_args, python, ca_bundle, env, log_path, constraints)


def _wheelhouse_locked(path: Path, requirements: Sequence[str], index_args: Sequence[str], python: str,
                       ca_bundle: str | None, env: dict[str, str], log_path: Path,
                       constraints: Sequence[str]) -> Wheelhouse:
    manifest = path / "wheels.json"
    if manifest.exists():
        data = json.loads(manifest.read_text())
        return Wheelhouse(path, tuple(Wheel(**w) for w in data))
    with cached_dir(path) as staging:
        staging.mkdir()
        argv = [*pip_command(), "download", "-d", str(staging), *download_args(index_args, python, ca_bundle)]
        if constraints:
            (staging / "constraints.txt").write_text("\n".join(constraints) + "\n")
            argv += ["--constraint", str(staging / "constraints.txt")]
        argv += list(requirements)
        result = proc.run(argv, env=env, timeout_s=3600, log_path=log_path)
        if not result.ok:
            if is_network_failure(result.tail):  # the same classification as the venv backend's installs
                raise InfraError(f"downloading wheels for {' '.join(requirements)} failed: an index could not be "
                                 "reached", hint=result.tail[-1500:])
            raise WheelhouseFailed(f"downloading wheels for {' '.join(requirements)} failed (exit "
                                   f"{result.returncode})", result.tail)
        wheels = tuple(sorted((Wheel(p.name, file_sha256(p)) for p in staging.glob("*.whl")), key=lambda w: w.filename))
        (staging / "wheels.json").write_text(json.dumps([w.__dict__ for w in wheels], indent=1))
    return Wheelhouse(path, wheels)


def labels(stack: Stack, house: Wheelhouse, base: str, base_id: str, key: str) -> dict[str, str]:
    return {
        "org.stackgate.key": key,
        "org.stackgate.torch": house.version_of("torch") or str(stack.torch),
        "org.stackgate.cuda": stack.cuda.tag,
        "org.stackgate.nccl": house.version_with_prefix("nvidia-nccl") or "none",
        "org.stackgate.cudnn": house.version_with_prefix("nvidia-cudnn") or "none",
        "org.stackgate.python": stack.python,
        "org.stackgate.base": base,
        "org.stackgate.base-digest": base_id,
        "org.stackgate.sbom": str(layout.PIP_FREEZE),
    }


def image_key(template: str, base_id: str, house: Wheelhouse, requirements: Sequence[str]) -> str:
    """The tag is a hash of everything that goes into the stack image (never the suite): an unchanged
    stack is never rebuilt, and a changed suite never changes it."""
    blob = json.dumps({"template": template, "base": base_id, "wheels": [w.sha256 for w in house.wheels],
                       "requirements": list(requirements)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def layer_key(template: str, parent_id: str, house: Wheelhouse, requirements: Sequence[str]) -> str:
    """The suite layer's tag: its parent stack image, the suite's wheels and requirements."""
    blob = json.dumps({"template": template, "parent": parent_id, "wheels": [w.sha256 for w in house.wheels],
                       "requirements": list(requirements)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _labels_text(label_map: dict[str, str]) -> str:
    return " \\\n      ".join(f"{k}={json.dumps(v)}" for k, v in sorted(label_map.items()))


def render(template: str, *, base: str, requirements: Sequence[str], label_map: dict[str, str]) -> str:
    """The stack image's Dockerfile."""
    return (template.replace("{{BASE}}", base).replace("{{WHEELS}}", WHEELS_ARG)
            .replace("{{REQUIREMENTS}}", " ".join(_quote(r) for r in requirements))
            .replace("{{LABELS}}", _labels_text(label_map)))


def render_layer(template: str, *, parent: str, requirements: Sequence[str], label_map: dict[str, str]) -> str:
    """The suite layer's Dockerfile: FROM the stack image, the suite's own wheels installed on top."""
    return (template.replace("{{PARENT}}", parent).replace("{{WHEELS}}", WHEELS_ARG)
            .replace("{{VENV}}", str(layout.VENV)).replace("{{PIP_FREEZE}}", str(layout.PIP_FREEZE))
            .replace("{{SUITE_REQUIREMENTS}}", " ".join(_quote(r) for r in requirements))
            .replace("{{LABELS}}", _labels_text(label_map)))


def _quote(req: str) -> str:
    return "'" + req.replace("'", "") + "'"


def build_context(dockerfile: str) -> Path:
    """A temporary context holding only the Dockerfile: the wheels come from `serve_wheels`."""
    ctx = Path(tempfile.mkdtemp(prefix="stackgate-ctx-"))
    (ctx / "Dockerfile").write_text(dockerfile)
    return ctx


@contextlib.contextmanager
def serve_wheels(house: Wheelhouse) -> Iterator[str]:
    """The wheelhouse's wheels, and nothing else of the host, over HTTP on 127.0.0.1 (an ephemeral port)
    while a build runs: the URL a build step's `pip install --find-links` reads them from. The wheels
    never enter the build context or a layer, and the venv is written once, in the step that installs
    it (the copy through the context and a second build stage had made a 6 GB CUDA stack take about
    twice as long to build). Loopback is the engine's own only when the engine runs on this host, as
    it must anyway for the cells' mounts."""
    files = {w.filename: house.path / w.filename for w in house.wheels}
    index = "".join(f'<a href="{html.escape(urllib.parse.quote(name))}">{html.escape(name)}</a>\n'
                    for name in sorted(files)).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            name = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path.lstrip("/"))
            if not name:
                self._send(index, "text/html")
                return
            path = files.get(name)
            if path is None:
                self.send_error(404)
                return
            with path.open("rb") as wheel:
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(path.stat().st_size))
                self.end_headers()
                shutil.copyfileobj(wheel, self.wfile, 1 << 20)

        def _send(self, body: bytes, kind: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="stackgate-wheels", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def ensure_base(engine: Engine, base: str, *, allow_bootstrap: bool, mirror: str, say: Callable[[str], None],
                work_dir: Path) -> str:
    """The base image id; bootstraps the local Debian base when it is missing and allowed."""
    found = engine.image_labels(base)
    if found is not None:
        return found["_id"]
    if not allow_bootstrap:
        raise InfraError(f"base image {base} is not present and cannot be pulled here",
                         hint="run `nox -s base-image`, or configure a base your engine can pull")
    say(f"base image {base} missing: bootstrapping Debian bookworm with debootstrap ({mirror})")
    bootstrap_base(engine, base, mirror=mirror, work_dir=work_dir)
    found = engine.image_labels(base)
    if found is None:
        raise InfraError(f"bootstrapped {base} but the engine does not list it")
    return found["_id"]


def bootstrap_base(engine: Engine, tag: str, *, mirror: str, work_dir: Path, suite: str = "bookworm",
                   packages: Sequence[str] = BASE_PACKAGES) -> None:
    if shutil.which("debootstrap") is None:
        raise InfraError("debootstrap is not installed", hint="apt-get install -y debootstrap")
    rootfs = Path(tempfile.mkdtemp(prefix="stackgate-rootfs-", dir=work_dir))
    try:
        result = proc.run(["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", suite,
                           str(rootfs), mirror], timeout_s=1800, log_path=work_dir / "debootstrap.log")
        if not result.ok:
            raise InfraError(f"debootstrap {suite} failed (exit {result.returncode})", hint=result.tail[-1500:])
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            shutil.rmtree(rootfs / junk, ignore_errors=True)
        engine.import_rootfs(rootfs, tag)
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)


@dataclass(frozen=True)
class ImageInfo:
    tag: str
    created: str  # ISO time, sortable


def stale_images(found: Sequence[ImageInfo], keep: int = 1) -> list[str]:
    """`<repo>:<label>-<key>` tags to remove: all but the newest `keep` per repository and stack label."""
    by_label: dict[str, list[ImageInfo]] = {}
    for image in found:
        label = image.tag.rsplit("-", 1)[0]
        by_label.setdefault(label, []).append(image)
    stale = []
    for images_of_label in by_label.values():
        images_of_label.sort(key=lambda i: i.created, reverse=True)
        stale += [i.tag for i in images_of_label[keep:]]
    return sorted(stale)


def host_ca_bundle(pip: PipConfig, configured: str | None) -> str | None:
    """The CA bundle pip needs on the host to reach an index. Used by `pip download` only."""
    return configured or pip.cert
