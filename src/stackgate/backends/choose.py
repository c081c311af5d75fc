"""Which backend and launcher a run uses (`--backend`, `--launcher`, the fleet's `launcher`), and the
`Machinery` a command starts on this machine: the backend factory, the resolver and the local host's
detection. The unit tier passes a `Machinery` that starts nothing; no module global is patched."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from stackgate import artifacts, fleet, given, pressure, resolve
from stackgate.backends.base import Backend
from stackgate.backends.routed import Routed
from stackgate.compat import CompatTable
from stackgate.console import Printer
from stackgate.errors import ConfigError, InfraError
from stackgate.inputs import Loaded
from stackgate.model import SlurmSpec, Stack
from stackgate.options import Options
from stackgate.sources import PipConfig
from stackgate.suite_deps import SuiteDeps

BackendFactory = Callable[[Options, Loaded, Mapping[str, str], Printer, SuiteDeps], Backend]
Resolver = Callable[[Sequence[Stack], CompatTable, PipConfig, Mapping[str, str], SuiteDeps],
                    Mapping[str, resolve.Resolution]]


def make_backend(opts: Options, loaded: Loaded, env: Mapping[str, str], say: Printer,
                 deps: SuiteDeps | None = None) -> Backend:
    """The environment backend (`environment_backend`), started through Slurm for the pools whose cells
    are Slurm jobs (`--launcher slurm`, or `launcher = "slurm"` in fleet.toml)."""
    backend = environment_backend(opts, loaded, env, say, deps)
    if any(g is not None and g.kind == given.HOST for g in (loaded.given, loaded.production_given)):
        from stackgate.backends.host import HostBackend
        backend = Routed(backend, HostBackend(opts.cache_dir, loaded.table, loaded.host_pip, env, deps=deps, say=say))
    if slurm_pools(opts, loaded):
        from stackgate.backends.slurm import SlurmBackend
        return SlurmBackend(backend, forced=SlurmSpec() if opts.launcher == "slurm" else None, env=env, say=say,
                            container=opts.container or "")
    return backend


def slurm_pools(opts: Options, loaded: Loaded) -> set[str]:
    """The pools run here whose cells are Slurm jobs."""
    if opts.launcher == "local":
        return set()
    return {n for n, p in loaded.pools.items() if p.is_local and (opts.launcher == "slurm" or p.slurm is not None)}


def environment_backend(opts: Options, loaded: Loaded, env: Mapping[str, str], say: Printer,
                 deps: SuiteDeps | None) -> Backend:
    """`docker` when asked for, or by default whenever an engine answers (and cells start locally);
    `venv` otherwise (with a notice)."""
    from stackgate.backends.venv import VenvBackend
    remote = slurm_pools(opts, loaded)
    in_images = opts.container is not None or any(
        (p := loaded.pools[n].slurm) is not None and p.container for n in remote)
    if opts.backend == "auto" and remote and not in_images:
        say("notice: Slurm jobs run the stack's venv on the nodes: using the venv backend")
        return VenvBackend(opts.cache_dir, loaded.table, loaded.host_pip, env, deps=deps, say=say)
    if in_images and remote and opts.backend == "venv":
        raise ConfigError("a container runtime on the Slurm nodes runs the stack's image: --backend venv prepares "
                          "venvs", hint="use --backend docker (or auto), or drop --container / the pool's container")
    if remote and not in_images and opts.backend == "docker":
        raise ConfigError("--backend docker with Slurm jobs: the nodes need a container runtime to run the stack's image",
                          hint='set container = "podman" | "pyxis" | "apptainer" for the pool in fleet.toml (or '
                               "--container RUNTIME), or use --backend venv (or auto)")
    if in_images and remote and opts.backend == "auto":
        opts = replace(opts, backend="docker")  # the nodes' container runtime runs the stack's image
    images = opts.candidate_image is not None or opts.production_image is not None
    if (opts.stacks is not None or images) and opts.backend == "venv":
        raise ConfigError(f"{'--stacks' if opts.stacks else '--candidate-image / --production-image'} names images: "
                          "it needs the docker backend, not --backend venv")
    if opts.backend in ("docker", "auto"):
        from stackgate.backends import docker

        pinned = artifacts.read(opts.stacks) if opts.stacks is not None else None
        made = docker.create(opts.cache_dir, loaded.table, loaded.host_pip, env, allow_bootstrap=opts.bootstrap_base,
                             mirror=opts.debian_mirror, ca_bundle=opts.ca_bundle, say=say, deps=deps,
                             auto=opts.backend == "auto" and pinned is None,
                             registry=artifacts.configured(opts.registry, opts.repository, opts.config_dir),
                             pinned=pinned, image_python=opts.image_python)
        if not isinstance(made, str):
            return made
        if opts.backend == "docker" or pinned is not None or images:
            raise InfraError(made, hint="start the Docker engine, or use --backend venv")
        say(f"notice: {made}; falling back to the venv backend")
    return VenvBackend(opts.cache_dir, loaded.table, loaded.host_pip, env, deps=deps, say=say)


@dataclass(frozen=True)
class Machinery:
    """What a command starts on this machine (all real by default)."""

    backend: BackendFactory = make_backend
    resolve: Resolver = resolve.resolve_all
    local: Callable[[], fleet.LocalHost] = fleet.detect_local
    gauge: Callable[[], pressure.Counters] = pressure.read  # the runner's interference counters


REAL = Machinery()
