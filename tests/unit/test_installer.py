"""installer.cached_dir: the one way a cached directory (venv, wheelhouse, project wheel) is built."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stackgate.installer import cache_lock, cached_dir


def test_a_cached_directory_appears_whole_or_not_at_all(tmp_path: Path) -> None:
    final = tmp_path / "cache" / "env"
    with pytest.raises(RuntimeError), cached_dir(final) as staging:
        (staging / "half").mkdir(parents=True)
        raise RuntimeError("the installer failed")
    assert not final.exists() and not list(final.parent.glob("env.partial-*"))
    with cache_lock(final), cached_dir(final) as staging:
        staging.mkdir()
        (staging / "marker").write_text("done")
    assert (final / "marker").read_text() == "done" and not list(final.parent.glob("env.partial-*"))


def test_what_a_killed_build_left_is_removed_and_a_live_ones_is_kept(tmp_path: Path) -> None:
    final = tmp_path / "env"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    (tmp_path / f"env.partial-{dead}").mkdir()  # 966 MB of it seen: a kill mid-install
    alive = tmp_path / f"env.partial-{os.getppid()}"  # another live build (its pid exists)
    alive.mkdir()
    said: list[str] = []
    with cached_dir(final, said.append) as staging:
        staging.mkdir()
    assert not (tmp_path / f"env.partial-{dead}").exists() and alive.exists()
    assert said == [f"  removed env.partial-{dead}, left by a build that was killed"]


def test_a_cached_venvs_import_check_runs_again_only_when_its_interpreter_changed(tmp_path: Path) -> None:
    """The reuse check imports torch (4-10 s on a slow runner) once per interpreter: an interpreter that
    answers the probe and counts its calls stands in for a venv's python here."""
    from stackgate.backends import venv
    from stackgate.model import Stack
    from stackgate.versions import CudaVariant, parse_torch
    stack = Stack(parse_torch("2.13.0"), CudaVariant("cpu"), "3.11")
    root = tmp_path / "env"
    (root / "bin").mkdir(parents=True)
    (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
    calls = tmp_path / "calls"
    python = root / "bin" / "python"
    python.write_text(f"#!/bin/sh\necho x >> {calls}\necho 'stackgate-probe 2.13.0+cpu'\n")
    python.chmod(0o755)

    def imports() -> int:
        return len(calls.read_text().splitlines()) if calls.exists() else 0

    assert venv.check_env(root, stack) == "" and imports() == 1
    assert venv.check_env(root, stack) == "" and imports() == 1  # the same interpreter: not imported again
    python.write_text(f"#!/bin/sh\necho x >> {calls}\necho 'stackgate-probe 2.12.0+cpu'\n")  # replaced
    assert "imports torch 2.12.0+cpu, not 2.13.0" in venv.check_env(root, stack) and imports() == 2
    assert "imports torch 2.12.0+cpu" in venv.check_env(root, stack) and imports() == 3  # a failure is not recorded
    python.write_text(f"#!/bin/sh\necho x >> {calls}\necho 'stackgate-probe 2.13.0+cpu'\n")
    assert venv.check_env(root, stack) == "" and imports() == 4
    (root / "pyvenv.cfg").write_text("home = /opt/other/bin\n")  # pointed at another base interpreter
    assert venv.check_env(root, stack) == "" and imports() == 5


def test_one_venv_serves_every_stack_of_the_same_content_whatever_its_channel(tmp_path: Path, root: Path) -> None:
    """Production's 2.13.0+cpu and a stable candidate of 2.13.0+cpu install the same packages: one venv
    (as one Docker image), where each channel used to build its own (15 s each on a fresh cache)."""
    from dataclasses import replace

    from stackgate import compat, sources
    from stackgate.backends.venv import VenvBackend
    from stackgate.model import Stack
    from stackgate.versions import CudaVariant, parse_torch
    backend = VenvBackend(tmp_path, compat.load_compat(root / "matrix" / "compat.toml"), sources.read_pip_config({}), {})
    stack = Stack(parse_torch("2.13.0"), CudaVariant("cpu"), "3.11", channel="production")
    assert backend.root_for(replace(stack, channel="stable"))[0] == backend.root_for(stack)[0]
    assert backend.root_for(replace(stack, torch=parse_torch("2.14.1")))[0] != backend.root_for(stack)[0]
    assert backend.root_for(replace(stack, extra_requirements=("einops",)))[0] != backend.root_for(stack)[0]
