"""Everything Docker in one place: the engine (`engine.py`, the only user of the Docker SDK), image
planning (`images.py`), the backend (`backend.py`), and the `base-image` / `prune` commands here.
Nothing outside this package imports the SDK or the engine (a unit test checks)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from stackgate import given, proc
from stackgate.artifacts import Registry, StackArtifact
from stackgate.backends.docker import images
from stackgate.backends.docker.backend import DockerBackend
from stackgate.backends.docker.engine import ContainerSpec, DockerEngine, Engine
from stackgate.compat import CompatTable
from stackgate.errors import ConfigError, InfraError
from stackgate.shipped import BUNDLED_SUITE
from stackgate.sources import PipConfig, pip_command
from stackgate.suite_deps import SuiteDeps


def create(cache_dir: Path, compat: CompatTable, host_pip: PipConfig, env: Mapping[str, str], *,
           allow_bootstrap: bool, mirror: str, ca_bundle: str | None, say: Callable[[str], None],
           deps: SuiteDeps | None, auto: bool, registry: Registry | None = None,
           pinned: Mapping[str, StackArtifact] | None = None, image_python: str = "python3") -> DockerBackend | str:
    """The Docker backend, or the sentence that says why not. With `auto`, Docker is only chosen
    when the base image exists or can be bootstrapped."""
    engine = DockerEngine()
    problem = engine.problem()
    if problem is None and auto:
        has_base = engine.image_labels(images.LOCAL_BASE) is not None
        if not (has_base or (allow_bootstrap and shutil.which("debootstrap"))):
            problem = f"the Docker engine answers but {images.LOCAL_BASE} is missing and debootstrap is not installed"
    if problem is not None:
        return problem
    return DockerBackend(engine, cache_dir, compat, host_pip, env, suite_dir=BUNDLED_SUITE,
                         allow_bootstrap=allow_bootstrap, mirror=mirror, ca_bundle=ca_bundle, say=say, deps=deps,
                         registry=registry, pinned=pinned, image_python=image_python)


def _engine(hint: str = "start dockerd first") -> DockerEngine:
    engine = DockerEngine()
    problem = engine.problem()
    if problem:
        raise InfraError(problem, hint=hint)
    return engine


def base_image(tag: str, *, mirror: str, force: bool, say: Callable[[str], None] = print) -> int:
    """`stackgate base-image`: bootstrap the local Debian base (debootstrap + import)."""
    engine = _engine()
    if not force and engine.image_labels(tag) is not None:
        say(f"{tag} already present")
        return 0
    with tempfile.TemporaryDirectory(prefix="stackgate-base-") as work:
        images.bootstrap_base(engine, tag, mirror=mirror, work_dir=Path(work))
    say(f"imported {tag}")
    return 0


def prune(*, keep: int, dry_run: bool, say: Callable[[str], None] = print) -> int:
    """`stackgate prune`: all but the newest `keep` images per stack label, and dangling build stages."""
    if keep < 1:
        raise ConfigError("--keep must be at least 1")
    engine = _engine()
    found = [images.ImageInfo(tag, created) for tag, created in engine.stack_images()]
    stale = images.stale_images(found, keep)
    for tag in stale:
        say(f"{'would remove' if dry_run else 'remove'} {tag}")
    if dry_run:
        return 0
    engine.remove_images(stale)
    reclaimed = engine.prune_dangling()
    say(f"removed {len(stale)} image(s); dangling build stages: {reclaimed / 2**30:.1f} GiB reclaimed")
    return 0


def probe_image(ref: str, python: str, say: Callable[[str], None] = print) -> given.Probed:
    """A prebuilt image, pulled when it is not here, and probed by its own interpreter (one short
    container, no network, as the node containers run)."""
    engine = _engine()
    if engine.facts(ref) is None:
        say(f"pulling {ref}")
        engine.pull(ref, None)
    return probe_in(engine, ref, python)


def probe_in(engine: Engine, ref: str, python: str) -> given.Probed:
    spec = ContainerSpec(name=f"sg-probe-{os.getpid()}-{time.monotonic_ns() % 10**8}", image=ref,
                         command=(python, "-c", given.PROBE), env={}, mounts=(), hostname="probe",
                         user=f"{os.getuid()}:{os.getgid()}")
    [ran] = engine.run_group([spec], network=None, timeout_s=300, on_line=None)
    return given.parse(given.IMAGE, ref, ran.log, ran.exit_code if ran.exit_code is not None else -1)


def registry_tags() -> DockerEngine:
    """The engine, for moving registry tags (`stackgate promote`): pushes go through its client."""
    return _engine("moving registry tags goes through the Docker engine: start dockerd")


def download_wheels(pins: Sequence[str], to: Path, python: str, env: Mapping[str, str]) -> None:
    """Exact versions as wheels for the target Python/platform, no dependencies (a promotion's lock)."""
    result = proc.run([*pip_command(), "download", "--no-deps", "-d", str(to),
                       *images.download_args([], python, None), *pins], env=dict(env), timeout_s=3600)
    if not result.ok:
        raise InfraError(f"downloading {' '.join(pins)[:300]} failed (exit {result.returncode})",
                         hint=result.tail[-800:])


__all__ = ["DockerBackend", "base_image", "create", "download_wheels", "prune", "registry_tags"]
