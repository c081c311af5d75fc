"""The package is usable from a wheel: built, installed non-editable into a fresh venv, and run from a
directory outside the repository (the suite, matrix data and templates ship inside the package)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: int = 1200) -> str:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"{argv}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_wheel_installed_outside_the_repo_runs_the_bundled_suite(tmp_path: Path, cache_dir: Path) -> None:
    wheels = tmp_path / "dist"
    _run([sys.executable, "-m", "uv", "build", "--quiet", "--wheel", "--out-dir", str(wheels), str(ROOT)],
         cwd=tmp_path)
    wheel = next(wheels.glob("stackgate-*.whl"))
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "uv", "venv", "--quiet", "--python", sys.executable, str(venv)], cwd=tmp_path)
    _run([sys.executable, "-m", "uv", "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"),
          str(wheel)], cwd=tmp_path)
    stackgate = str(venv / "bin" / "stackgate")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    installed = _run([str(venv / "bin" / "python"), "-c", "import stackgate.shipped as b; print(b.BUNDLED_SUITE)"],
                     cwd=elsewhere, env=env).strip()
    assert str(venv) in installed and not installed.startswith(str(ROOT))  # not the checkout's copy

    shown = _run([stackgate, "matrix", "show"], cwd=elsewhere, env=env)
    assert "local-cpu-cu130-torch2.14.1-py3.11-1x2" in shown and "pruned: cuda-min-driver" in shown

    proc = subprocess.run([stackgate, "run", "--backend", "venv", "--profile", "quick", "--no-rollback",
                           "--cache-dir", str(cache_dir), "--run-id", "pkg",
                           "--pytest-arg=-k", "--pytest-arg=test_torch_version or test_cuda_build_matches_cell"],
                          cwd=elsewhere, env=env, capture_output=True, text=True, timeout=1200, check=False)
    # only two tests were selected, so the bundled policy's other required tests are missing: INCONCLUSIVE
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((elsewhere / "reports" / "pkg" / "report.json").read_text())  # relative default reports/
    assert report["decision"] == "INCONCLUSIVE"
    for cell in report["cells"]:
        outcomes = {t["name"]: t["outcome"] for t in cell["tests"]}
        assert cell["status"] == "passed", cell["reason"]
        assert outcomes == {"test_identity.py::test_torch_version": "passed",
                            "test_identity.py::test_cuda_build_matches_cell": "passed"}
    assert "why (" in proc.stdout and "required test" in proc.stdout  # the console says why
