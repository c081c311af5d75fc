"""#18 item 3: a broken cached environment is checked before reuse and rebuilt, never blamed on the
stack. Real venvs with torch 2.13.0+cpu, in a cache and a uv cache of the test's own: uv hard-links
installed files to its cache, so damaging a file here must not reach the machine's cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stackgate import compat, sources
from stackgate.backends import venv
from stackgate.backends.venv import VenvBackend
from stackgate.errors import InfraError
from stackgate.model import Stack
from stackgate.versions import CudaVariant, parse_torch

ROOT = Path(__file__).resolve().parents[2]
STACK = Stack(parse_torch("2.13.0"), CudaVariant("cpu"), "3.11")

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def caches(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A cache and uv cache of the module's own, shared by the tests that break an environment and see it
    rebuilt: each ends with a sound environment, which the next one starts from (one build serves two)."""
    home = tmp_path_factory.mktemp("own-caches")
    return home / "cache", home / "uv-cache"


def _backend(cache: Path, uv_cache: Path, said: list[str]) -> VenvBackend:
    env = {**os.environ, "UV_CACHE_DIR": str(uv_cache)}
    return VenvBackend(cache, compat.load_compat(ROOT / "matrix" / "compat.toml"), sources.read_pip_config(env), env,
                       say=said.append)


@pytest.fixture
def own_caches(caches: tuple[Path, Path]) -> tuple[VenvBackend, list[str]]:
    said: list[str] = []
    return _backend(*caches, said), said


def _torch_init(ref: str) -> Path:
    return next(Path(ref).parent.parent.glob("lib/python*/site-packages/torch/__init__.py"))


def test_a_truncated_torch_file_is_found_evicted_from_uvs_cache_and_rebuilt(own_caches, tmp_path: Path) -> None:
    backend, said = own_caches
    first = backend.prepare(STACK, tmp_path / "build.log")
    init = _torch_init(first.ref)
    size = init.stat().st_size
    with init.open("r+b") as fh:  # in place: the same inode as uv's cached copy
        fh.truncate(12)
    assert venv.record_problems(Path(first.ref).parent.parent).startswith("torch/__init__.py: 12 bytes, RECORD says")
    again = backend.prepare(STACK, tmp_path / "build.log")
    assert not again.reused and again.ref == first.ref
    assert _torch_init(again.ref).stat().st_size == size  # uv's cache was cleaned: the file is whole again
    assert any("is broken (torch/__init__.py: 12 bytes" in line and "evicted torch from uv's cache" in line
               for line in said), said
    assert venv.check_env(Path(again.ref).parent.parent, STACK) == ""
    third = backend.prepare(STACK, tmp_path / "build.log")
    assert third.reused  # a sound environment is reused as before


def test_an_empty_interpreter_is_found_and_rebuilt(own_caches, tmp_path: Path) -> None:
    backend, said = own_caches
    first = backend.prepare(STACK, tmp_path / "build.log")
    python = Path(first.ref)
    python.unlink()
    python.write_bytes(b"")
    python.chmod(0o755)
    assert "cannot start" in venv.check_env(python.parent.parent, STACK) or "failed" in venv.check_env(
        python.parent.parent, STACK)
    again = backend.prepare(STACK, tmp_path / "build.log")
    assert not again.reused and Path(again.ref).stat().st_size > 0
    assert any("is broken" in line for line in said)


def test_an_environment_that_stays_broken_after_a_rebuild_is_an_infra_error(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    backend = _backend(tmp_path / "cache", tmp_path / "uv-cache", [])  # caches of its own: built here, not reused
    monkeypatch.setattr(venv, "record_problems", lambda root: "torch/__init__.py: 0 bytes, RECORD says 1 (package torch)")
    with pytest.raises(InfraError, match="broken right after it was built"):
        backend.prepare(STACK, tmp_path / "build.log")
