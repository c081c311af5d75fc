"""The committed GitHub workflows are exactly what `stackgate ci github` generates from fleet.toml,
and they pass a real workflow checker (check-jsonschema's GitHub-workflows schema; `nox -s lint`
runs it in CI)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from stackgate.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_committed_workflows_equal_the_generated_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    assert main(["ci", "github", "--check"]) == 0


def test_generated_workflows_follow_the_fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    assert main(["ci", "github", "--out", str(tmp_path)]) == 0
    nightly = (tmp_path / "nightly.yml").read_text()
    gate = (tmp_path / "upgrade-gate.yml").read_text()
    assert 'runs-on: ["self-hosted", "linux", "h100"]' in nightly and "--pool p5-h100" in nightly
    assert "pool-p4d-a100" not in nightly and "pool-p4d-a100" in gate  # each workflow: its matrix's pools
    assert "needs: [pool-local, pool-p5-h100, pool-g5-a10g]" in nightly
    assert "stackgate merge bundles/* --matrix matrix/nightly.toml" in nightly
    assert "workflow_call:" in gate and "STACKGATE_CANDIDATE: ${{ inputs.candidate }}" in gate
    assert "${{ inputs.candidate }}\"" not in gate  # inputs never reach a shell as text

    checker = shutil.which("check-jsonschema")
    if checker is None:
        pytest.skip("check-jsonschema is not installed here (nox -s lint installs and runs it)")
    proc = subprocess.run([checker, "--builtin-schema", "vendor.github-workflows", *map(str, tmp_path.glob("*.yml"))],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
