"""#43 item 3, for real: production's rollback compiles on the caches the candidate left. A plain pytest
suite (it knows nothing of stackgate) compiles a model and compares it with eager; in the candidate's
run a second test of the suite leaves an entry in the compile cache: it rewrites the module inductor
generated for production (its key, so production's next compile loads it from the cache instead of
generating it) to return a wrong output. Production's rollback must catch it, naming the cache, and
the main runs of both stacks stay green: only sharing the cache breaks production."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PYTEST_INI = """\
[pytest]
markers =
    crossversion: run again in production against what the candidate left
"""

MODEL_TEST = """\
import pytest
import torch


@pytest.mark.crossversion
def test_compiled_matches_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 16))
    x = torch.randn(32, 64)
    torch.testing.assert_close(torch.compile(model)(x), model(x))
"""

# After the candidate's own compile: every module inductor generated in the cache it was given (production's,
# copied for it, and its own) now returns its first output plus one. The entry keeps its name, so inductor's
# FX graph cache finds it by production's key and loads the file as it is (it only writes a missing one).
LEAVE_AN_ENTRY = """\
import os
from pathlib import Path

import torch

WRONG = '''
_generated = call


def _planted(args):
    out = _generated(args)
    return (out[0] + 1.0, *out[1:])


call = _planted
if "runner" in globals():
    runner.call = _planted
'''


def test_leave_an_entry_in_the_compile_cache():
    if not torch.__version__.startswith("{candidate}"):
        return
    planted = []
    for module in Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]).rglob("*.py"):
        text = module.read_text()
        if "\\ncall = " in text:
            module.write_text(text + WRONG)
            planted.append(module.name)
    assert planted, "no generated module in the compile cache"
"""


def test_a_compile_cache_entry_the_candidate_left_fails_productions_rollback(tmp_path: Path, cache_dir: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text(PYTEST_INI)
    (suite / "test_model.py").write_text(MODEL_TEST)
    (suite / "test_zz_cache.py").write_text(LEAVE_AN_ENTRY.replace("{candidate}", "2.14.1"))
    reports = tmp_path / "reports"
    done = subprocess.run([sys.executable, "-m", "stackgate", "run", "--cache-dir", str(cache_dir), "--backend", "venv",
                           "--suite", str(suite), "--no-platform-checks", "--profile", "quick",
                           "--reports", str(reports), "--run-id", "plant"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800, check=False)
    assert done.returncode == 1, done.stderr[-3000:] + done.stdout[-3000:]
    data = json.loads((reports / "plant" / "report.json").read_text())
    assert data["verdict"] == "NO-GO"
    cells = {c["id"]: c for c in data["cells"]}
    for cell in ("prod-local-cpu-cpu-torch2.13.0-py3.11-1x2", "local-cpu-cu130-torch2.14.1-py3.11-1x2"):
        assert cells[cell]["status"] == "passed", cells[cell]["reason"]  # each stack alone compiles right
    [rollback] = data["rollback"]
    assert rollback["status"] == "failed"
    blocking = [r for r in data["reasons"] if r["severity"] == "blocking"]
    assert [r["kind"] for r in blocking] == ["rollback"], blocking
    reason = blocking[0]
    assert reason["test"] == "test_model.py::test_compiled_matches_eager"
    assert "TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR" in reason["message"], reason
    assert "artifacts/local-1x2/cu130-torch2.14.1-py3.11/production/compile-cache" in reason["message"], reason
    assert "not close" in reason["message"], reason
    # the entry the candidate left is where the reason says, under the run directory
    cache = reports / "plant" / "artifacts" / "local-1x2" / "cu130-torch2.14.1-py3.11" / "production" / "compile-cache"
    assert any("_planted" in p.read_text() for p in (cache / "inductor").rglob("*.py"))
