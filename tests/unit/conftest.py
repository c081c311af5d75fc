"""The unit tier's seam: the whole pipeline on the in-memory backend (nothing resolves, builds or starts)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stackgate import matrix, pipeline, resolve
from stackgate.backends.memory import MemoryBackend
from stackgate.options import Options
from stackgate.options import resolve as resolve_options

ROOT = Path(__file__).resolve().parents[2]
RunMemory = Callable[..., tuple[int, dict[str, Any], list[str]]]


@pytest.fixture
def no_subprocesses(monkeypatch: pytest.MonkeyPatch) -> MemoryBackend:
    """The pipeline with the in-memory backend: nothing resolves, builds or starts."""
    backend = MemoryBackend()
    monkeypatch.setattr(pipeline, "make_backend", lambda *a, **k: backend)
    monkeypatch.setattr(resolve, "resolve_all", lambda *a, **k: {})
    monkeypatch.setattr(matrix, "detect_local", lambda *a, **k: matrix.LocalHost())
    return backend


def memory_options(tmp_path: Path, **options: Any) -> Options:
    """Options of a run of tests/data/plain_suite whose reports and caches are under tmp_path."""
    cli = {"suite": str(ROOT / "tests" / "data" / "plain_suite"), "run_id": "mem", "reports": str(tmp_path / "r"),
           "cache_dir": str(tmp_path / "cache"), "backend": "venv", "platform_checks": False, **options}
    return resolve_options(cli, {}, cwd=tmp_path)


@pytest.fixture
def run_memory(no_subprocesses: MemoryBackend, tmp_path: Path) -> RunMemory:
    """`stackgate run` of tests/data/plain_suite on the memory backend, with extra options: (exit code,
    report.json, what it printed)."""
    def run(**options: Any) -> tuple[int, dict[str, Any], list[str]]:
        said: list[str] = []
        code = pipeline.run(memory_options(tmp_path, **options), {}, said.append)
        return code, json.loads((tmp_path / "r" / "mem" / "report.json").read_text()), said
    return run
