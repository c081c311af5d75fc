"""The unit tier's seam: every command takes the `Machinery` it starts; here, the in-memory backend (nothing
resolves, builds or starts), passed as a parameter, with no module global patched."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stackgate import fleet
from stackgate.backends.choose import Machinery
from stackgate.backends.memory import Gauge, MemoryBackend
from stackgate.commands.run import run as run_command
from stackgate.options import Options
from stackgate.options import read as read_options

ROOT = Path(__file__).resolve().parents[2]
RunMemory = Callable[..., tuple[int, dict[str, Any], list[str]]]


def on_memory(backend: MemoryBackend, gauge: Gauge | None = None) -> Machinery:
    """What a command starts in the unit tier: the in-memory backend, no resolver, a plain CPU host,
    a quiet runner (or `gauge`'s interference)."""
    return Machinery(backend=lambda *a, **k: backend, resolve=lambda *a, **k: {}, local=fleet.LocalHost,
                     gauge=gauge or Gauge())


@pytest.fixture
def no_subprocesses() -> MemoryBackend:
    """The in-memory backend a test scripts; pass `on_memory(it)` to a command: nothing resolves,
    builds or starts."""
    return MemoryBackend()


def memory_options(tmp_path: Path, **options: Any) -> Options:
    """Options of a run of tests/data/plain_suite whose reports and caches are under tmp_path."""
    cli = {"suite": str(ROOT / "tests" / "data" / "plain_suite"), "run_id": "mem", "reports": str(tmp_path / "r"),
           "cache_dir": str(tmp_path / "cache"), "backend": "venv", "platform_checks": False, **options}
    return read_options(cli, {}, cwd=tmp_path)


@pytest.fixture
def run_memory(no_subprocesses: MemoryBackend, tmp_path: Path) -> RunMemory:
    """`stackgate run` of tests/data/plain_suite on the memory backend, with extra options: (exit code,
    report.json, what it printed)."""
    def run(**options: Any) -> tuple[int, dict[str, Any], list[str]]:
        said: list[str] = []
        code = run_command(memory_options(tmp_path, **options), {}, said.append, machinery=on_memory(no_subprocesses))
        return code, json.loads((tmp_path / "r" / "mem" / "report.json").read_text()), said
    return run
