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
