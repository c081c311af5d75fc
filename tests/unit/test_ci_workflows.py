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
    assert "run: stackgate watch --config-dir matrix" in nightly and "stackgate watch" not in gate  # #44

    checker = shutil.which("check-jsonschema")
    if checker is None:
        pytest.skip("check-jsonschema is not installed here (nox -s lint installs and runs it)")
    proc = subprocess.run([checker, "--builtin-schema", "vendor.github-workflows", *map(str, tmp_path.glob("*.yml"))],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_with_a_registry_a_build_job_pushes_once_and_every_pool_pulls_by_digest(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "matrix"
    shutil.copytree(ROOT / "matrix", cfg)
    (cfg / "fleet.toml").write_text('[registry]\nurl = "registry.example:5000"\n\n' + (cfg / "fleet.toml").read_text())
    monkeypatch.chdir(tmp_path)
    assert main(["ci", "github", "--out", "wf"]) == 0
    gate = (tmp_path / "wf" / "upgrade-gate.yml").read_text()
    build = gate[gate.index("  build:"):gate.index("  pool-")]
    assert "stackgate build --push --matrix matrix/upgrade.toml --stacks stacks.json" in build
    assert "name: stacks" in build and "path: stacks.json" in build
    pools = gate.split("\n  pool-")[1:]
    assert pools and all("needs: [build]" in job and "name: stacks" in job and "--stacks stacks.json" in job
                         for job in pools)
    plain = (ROOT / ".github" / "workflows" / "upgrade-gate.yml").read_text()  # the repository's: no registry
    assert "stackgate build" not in plain and "--stacks" not in plain
    checker = shutil.which("check-jsonschema")
    if checker is None:
        pytest.skip("check-jsonschema is not installed here (nox -s lint installs and runs it)")
    proc = subprocess.run([checker, "--builtin-schema", "vendor.github-workflows", *map(str, (tmp_path / "wf").glob("*.yml"))],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
