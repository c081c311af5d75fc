from __future__ import annotations

import os
from pathlib import Path

import pytest

from stackgate import compat, sources
from stackgate.backends.base import EnvHandle
from stackgate.backends.venv import VenvBackend
from stackgate.model import Stack
from stackgate.versions import CudaVariant, parse_torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    return Path(os.environ.get("STACKGATE_CACHE_DIR", Path.home() / ".cache" / "stackgate"))


@pytest.fixture(scope="session")
def backend(cache_dir: Path) -> VenvBackend:
    env = dict(os.environ)
    return VenvBackend(cache_dir, compat.load_compat(ROOT / "matrix" / "compat.toml"), sources.read_pip_config(env), env)


@pytest.fixture(scope="session")
def torch_env(backend: VenvBackend, tmp_path_factory: pytest.TempPathFactory) -> EnvHandle:
    """A real venv with torch 2.13.0+cpu (built once, then reused from the cache)."""
    stack = Stack(parse_torch("2.13.0"), CudaVariant("cpu"), "3.11")
    return backend.prepare(stack, tmp_path_factory.mktemp("build") / "build.log")
