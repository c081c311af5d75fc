"""Issue 21, a host stack for real: a venv made by hand (`python -m venv x && x/bin/pip install
torch==2.13.0`), gated as the candidate with `--candidate-python x/bin/python` against the bundled
production stack, with a plain pytest suite: GO, the candidate's cells ran on that interpreter, and
its `pip freeze` is the same afterwards (stackgate installed nothing into it). `stackgate promote`
of that GO: its pylock.toml, installed offline into a fresh venv, reproduces the tested freeze. The
same interpreter declared as another torch is the clear mismatch error (exit 2) before anything runs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch
ROOT = Path(__file__).resolve().parents[2]


def _stackgate(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stackgate", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=1800, check=False)


def test_a_venv_made_by_hand_is_gated_as_it_is_and_left_as_it_was(tmp_path: Path, cache_dir: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "x"], cwd=tmp_path, check=True)
    subprocess.run(["x/bin/pip", "install", "-q", "torch==2.13.0"], cwd=tmp_path, check=True, timeout=900)
    before = subprocess.run(["x/bin/pip", "freeze"], cwd=tmp_path, capture_output=True, text=True, check=True).stdout

    shutil.copytree(ROOT / "tests" / "data" / "plain_suite", tmp_path / "suite")
    proc = _stackgate(tmp_path, "run", "--candidate-python", "x/bin/python", "--backend", "venv", "--only", "local-*",
                      "--suite", "suite", "--no-platform-checks", "--cache-dir", str(cache_dir), "--run-id", "host")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "reports" / "host" / "report.json").read_text())
    assert report["decision"] == "GO"
    [cand] = [c for c in report["cells"] if c["role"] == "candidate"]
    assert cand["environment"]["backend"] == "host"
    assert cand["environment"]["interpreter"] == str(tmp_path / "x" / "bin" / "python")
    assert cand["stack"]["torch"] == "2.13.0+cpu" and cand["status"] == "passed"  # what the probe found
    after = subprocess.run(["x/bin/pip", "freeze"], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert after == before

    promoted = _stackgate(tmp_path, "promote", "host", "--cache-dir", str(cache_dir))
    assert promoted.returncode == 0, promoted.stdout[-2000:] + promoted.stderr[-2000:]
    lock = tmp_path / "reports" / "host" / "promotion" / "cpu-torch2.13.0-py3.11" / "pylock.toml"
    uv = [sys.executable, "-m", "uv"]
    subprocess.run([*uv, "venv", "-q", "--python", "3.11", "fresh"], cwd=tmp_path, check=True)
    subprocess.run([*uv, "pip", "sync", "-q", "--offline", "--python", "fresh/bin/python", str(lock)], cwd=tmp_path,
                   check=True)
    def freeze(python: str) -> str:
        return subprocess.run([*uv, "pip", "freeze", "--python", python], cwd=tmp_path, capture_output=True,
                              text=True, check=True).stdout
    assert freeze("fresh/bin/python") == freeze("x/bin/python")  # the tested environment, exactly

    wrong = _stackgate(tmp_path, "run", "--candidate-python", "x/bin/python", "--candidate", "2.14.1",
                       "--backend", "venv", "--run-id", "wrong")
    assert wrong.returncode == 2 and "holds torch 2.13.0+cpu" in wrong.stderr and "declares torch 2.14.1" in wrong.stderr
    assert not (tmp_path / "reports" / "wrong").exists()
