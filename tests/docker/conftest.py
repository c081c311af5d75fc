from __future__ import annotations

import os
from pathlib import Path

import pytest

from stackgate import compat, sources
from stackgate.backends.base import EnvHandle
from stackgate.backends.docker import DockerBackend, images
from stackgate.backends.docker.engine import DockerEngine
from stackgate.model import Stack
from stackgate.suite import BUNDLED_SUITE
from stackgate.versions import CudaVariant, parse_torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def engine() -> DockerEngine:
    eng = DockerEngine()
    problem = eng.problem()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Docker tier: {problem}")
        pytest.skip(problem)
    return eng


@pytest.fixture(scope="session")
def docker_backend(engine: DockerEngine) -> DockerBackend:
    env = dict(os.environ)
    cache = Path(os.environ.get("STACKGATE_CACHE_DIR", Path.home() / ".cache" / "stackgate"))
    return DockerBackend(engine, cache, compat.load_compat(ROOT / "matrix" / "compat.toml"),
                         sources.read_pip_config(env), env, suite_dir=BUNDLED_SUITE, say=print)


@pytest.fixture(scope="session")
def cpu_image(docker_backend: DockerBackend, tmp_path_factory: pytest.TempPathFactory) -> EnvHandle:
    """A real image with torch 2.13.0+cpu (the base is bootstrapped with debootstrap when missing)."""
    stack = Stack(parse_torch("2.13.0"), CudaVariant("cpu"), "3.11", base_image=images.LOCAL_BASE)
    return docker_backend.prepare(stack, tmp_path_factory.mktemp("build") / "build.log")
