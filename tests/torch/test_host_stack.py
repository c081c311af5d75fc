"""Issue 21, a host stack for real: a venv made by hand (`python -m venv x && x/bin/pip install
torch==2.13.0`), gated as the candidate with `--candidate-python x/bin/python` against the bundled
production stack: GO, the candidate's cells ran on that interpreter, and its `pip freeze` is the same
afterwards (stackgate installed nothing into it). The same interpreter declared as another torch is
the clear mismatch error (exit 2) before anything runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch


def _stackgate(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stackgate", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=1800, check=False)


def test_a_venv_made_by_hand_is_gated_as_it_is_and_left_as_it_was(tmp_path: Path, cache_dir: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "x"], cwd=tmp_path, check=True)
    subprocess.run(["x/bin/pip", "install", "-q", "torch==2.13.0"], cwd=tmp_path, check=True, timeout=900)
    before = subprocess.run(["x/bin/pip", "freeze"], cwd=tmp_path, capture_output=True, text=True, check=True).stdout

    proc = _stackgate(tmp_path, "run", "--candidate-python", "x/bin/python", "--backend", "venv", "--only", "local-*",
                      "--test", "test_identity.py", "--cache-dir", str(cache_dir), "--run-id", "host")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "reports" / "host" / "report.json").read_text())
    assert report["decision"] == "GO"
    [cand] = [c for c in report["cells"] if c["role"] == "candidate"]
    assert cand["environment"]["backend"] == "host"
    assert cand["environment"]["interpreter"] == str(tmp_path / "x" / "bin" / "python")
    assert cand["environment"]["torch"] == "2.13.0+cpu" and cand["status"] == "passed"
    after = subprocess.run(["x/bin/pip", "freeze"], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert after == before

    wrong = _stackgate(tmp_path, "run", "--candidate-python", "x/bin/python", "--candidate", "2.14.1",
                       "--backend", "venv", "--run-id", "wrong")
    assert wrong.returncode == 2 and "holds torch 2.13.0+cpu" in wrong.stderr and "declares torch 2.14.1" in wrong.stderr
    assert not (tmp_path / "reports" / "wrong").exists()
