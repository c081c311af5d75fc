"""Issue 12: cells as Slurm jobs, against a real controller and two real node daemons on this
machine (`scripts/slurm-local-cluster.sh start`; `.ci/run` does it). One node plan for every way of
running cells: these jobs run `suite.node_commands`, as the venv and Docker backends do."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stackgate import pressure, suite
from stackgate.backends.base import EnvHandle
from stackgate.backends.slurm import SlurmBackend
from stackgate.backends.venv import VenvBackend
from stackgate.errors import InfraError
from stackgate.model import Cell, GpuClass, Role, RunnerPool, SlurmSpec, Status, Topology
from stackgate.runner import run_cell
from stackgate.suite import RunContext

ROOT = Path(__file__).resolve().parents[2]


def _cell(handle: EnvHandle, nodes: int) -> Cell:
    pool = RunnerPool("slurm-cpu", None, GpuClass.NONE, gpu="cpu", nodes=nodes, is_local=True,
                      slurm=SlurmSpec(partition="cpu"))
    return Cell(handle.stack, pool, Topology(nodes, 2), Role.CANDIDATE, required=True)


def _jobs() -> list[str]:
    return subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True, check=True).stdout.split("\n")


def test_a_two_node_cell_trains_fsdp_and_all_reduces_across_two_slurm_nodes(
        slurm_cluster: str, backend: VenvBackend, torch_env: EnvHandle, tmp_path: Path) -> None:
    slurm = SlurmBackend(backend, forced=None, env=dict(os.environ), say=print)
    spec = suite.SuiteSpec(pytest_args=("-k", "test_collective_correctness or test_vit"), profile="quick",
                           timeout_s=600)
    result = run_cell(slurm, _cell(torch_env, 2), torch_env, RunContext("sl2", tmp_path, spec))
    assert result.status is Status.PASSED, result.log_tail[-4000:]
    outcomes = {t.name: t.outcome for t in result.tests}
    assert outcomes["test_vit_fsdp.py::test_vit_fsdp2_mixed_precision_dcp_resume"] == "passed"
    assert outcomes["test_collectives.py::test_collective_correctness[2]"] == "passed"
    wrong = next(m for m in result.metrics if m.name == "collective_wrong_elements")
    assert dict(wrong.tags)["world_size"] == "4" and wrong.samples == (0.0,)  # 2 Slurm nodes x 2 ranks
    cell_dir = tmp_path / "cells" / result.cell_id
    assert (cell_dir / "node0.log").read_text() and (cell_dir / "node1.log").read_text()  # both nodes' logs came back
    script = (cell_dir / "slurm" / "job-suite.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --partition=cpu" in script and "#SBATCH --time=10" in script
    assert result.environment.launcher == "slurm"
    seen = pressure.of_result(result.environment)  # #22: measured by each task on its node, the busiest node's
    assert seen is not None and seen.where in ("slurm node n1", "slurm node n2") and seen.wall_s > 0
    assert seen.some is not None and seen.steal is not None  # PSI and /proc/stat are offered on this kind of machine
    snapshots = {p.name for p in (cell_dir / "slurm").glob("*.pressure-*")}
    assert {f"node{n}-suite.pressure-{w}" for n in (0, 1) for w in ("start", "end")} <= snapshots, snapshots


def test_a_job_killed_by_its_time_limit_is_a_timeout_with_no_stray_process(
        slurm_cluster: str, backend: VenvBackend, torch_env: EnvHandle, tmp_path: Path) -> None:
    slurm = SlurmBackend(backend, forced=None, env=dict(os.environ), say=print)
    spec = suite.SuiteSpec(path=ROOT / "tests" / "data" / "sleepy_suite", platform_checks=False, timeout_s=30)
    start = time.monotonic()
    result = run_cell(slurm, _cell(torch_env, 2), torch_env, RunContext("slto", tmp_path, spec))
    assert result.status is Status.TIMEOUT, result.log_tail[-3000:]
    assert "TIMEOUT" in result.log_tail  # Slurm's own --time=1 ended it, not stackgate
    assert time.monotonic() - start < 60 + 90
    shared = tmp_path / "cells" / result.cell_id / "shared"
    pids = [int(p.read_text()) for p in shared.glob("sleepy-*.pid")]
    assert len(pids) == 2, "both nodes' tests started"
    time.sleep(2)
    assert not [p for p in pids if Path(f"/proc/{p}").exists()], "a test process outlived its job"
    ours = set(re.findall(r"slurm job (\d+)", result.log_tail))  # other tiers may have jobs of their own queued
    assert ours and not [j for j in _jobs() if j.split()[:1] and j.split()[0] in ours], "the job is gone from the queue"


def test_a_controller_that_is_down_is_an_infra_error_with_a_clear_message(
        slurm_cluster: str, backend: VenvBackend, torch_env: EnvHandle, tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"  # the same cluster, but a controller port nothing listens on
    conf.write_text(Path(slurm_cluster).read_text().replace("SlurmctldPort=16817", "SlurmctldPort=16999"))
    slurm = SlurmBackend(backend, forced=None, env={**os.environ, "SLURM_CONF": str(conf)}, say=print)
    spec = suite.SuiteSpec(profile="quick", timeout_s=60)
    with pytest.raises(InfraError, match="could not reach the Slurm controller") as caught:
        run_cell(slurm, _cell(torch_env, 1), torch_env, RunContext("sldown", tmp_path, spec))
    assert "scontrol ping" in (caught.value.hint or "")


def test_dry_run_prints_the_job_script_without_a_controller(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "stackgate", "run", "--launcher", "slurm", "--dry-run",
                           "--suite", str(ROOT / "tests" / "data" / "plain_suite")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "SLURM_CONF": "/nonexistent"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "#SBATCH --nodes=1" in proc.stdout and "#SBATCH --ntasks-per-node=1" in proc.stdout
    assert "srun --nodes=1" in proc.stdout and "STACKGATE_NODE_RANK=0" in proc.stdout
    assert not (tmp_path / "reports").exists()
