"""The whole pipeline for real: venvs for 2.13.0+cpu and 2.14.1, the bundled suite under torchrun
(world sizes 2 and 4), cross-version checkpoints both ways, the gate and all four reports."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from stackgate import suite
from stackgate.backends.base import EnvHandle
from stackgate.backends.venv import VenvBackend
from stackgate.model import Cell, GpuClass, Role, RunnerPool, Status, Topology
from stackgate.runner import run_cell
from stackgate.suite import RunContext

ROOT = Path(__file__).resolve().parents[2]


def run_stackgate(args: list[str], cache_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stackgate", "run", "--cache-dir", str(cache_dir), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=2400, check=False)


# The trainers (recsys, ViT) are the costliest tests. What the upgrade runs select: the platform checks and
# the cross-version tests. The trainers' own run is the README's main command (the whole suite, both
# stacks, in CI after the tests); here ViT trains in the three 2x2 tests (venv, Docker, Slurm) and recsys to
# completion in the resumed cancel tests (test_interrupt.py).
TRAINERS = ("test_recsys.py::test_recsys_ddp_sharded_embeddings", "test_vit_fsdp.py::test_vit_fsdp2_mixed_precision_dcp_resume")
UPGRADE_SELECT = ("-k", "identity or collective or crossversion")


def check_upgrade_run(tmp_path: Path, cache_dir: Path, backend: str) -> None:
    """`stackgate run` twice on the default upgrade matrix: the first builds and decides (UPGRADE_SELECT),
    the second reuses."""
    reports = tmp_path / "reports"
    chosen = [f"--pytest-arg={arg}" for arg in UPGRADE_SELECT]
    first = run_stackgate(["--backend", backend, "--profile", "quick", "--reports", str(reports), "--run-id", "one",
                           *chosen], cache_dir)
    assert first.returncode in (0, 1), first.stderr[-3000:] + first.stdout[-3000:]
    run = reports / "one"
    data = json.loads((run / "report.json").read_text())
    assert data["schema_version"] == 1 and data["verdict"] in ("GO", "NO-GO")
    cells = {c["id"]: c for c in data["cells"]}
    prod = cells["prod-local-cpu-cpu-torch2.13.0-py3.11-1x2"]
    cand = cells["local-cpu-cu130-torch2.14.1-py3.11-1x2"]
    assert prod["status"] == "passed", prod["reason"]
    assert cand["status"] == "passed", cand["reason"]
    outcomes = {t["name"]: t["outcome"] for t in cand["tests"]}
    for name in ("test_collectives.py::test_collective_correctness[2]",
                 "test_crossversion.py::test_load_dcp_model_and_optimizer",
                 "test_crossversion.py::test_load_exported_program",
                 "test_identity.py::test_cuda_build_matches_cell"):
        assert outcomes[name] == "passed", name
    assert not set(TRAINERS) & set(outcomes), "the selection should leave the trainers out"
    assert data["rollback"] and data["rollback"][0]["status"] == "passed"  # production reads the candidate's
    assert cand["environment"]["cuda"] == "13.0" and prod["environment"]["cuda"] is None
    assert any(m["name"] == "busbw" for m in cand["metrics"])
    assert data["not_run_here"] and data["pruned"]
    blocking = [r for r in data["reasons"] if r["severity"] == "blocking"]
    assert not [r for r in blocking if r["kind"] in ("failed-test", "numerics", "rollback")], blocking
    ET.parse(run / "junit.xml")
    assert "stackgate upgrade-torch" in (run / "report.md").read_text()
    assert "id='verdict'" in (run / "report.html").read_text()

    assert cand["environment"]["backend"] == backend
    second = run_stackgate(["--backend", backend, "--profile", "quick", "--reports", str(reports), "--run-id", "two",
                            "--only", "local-*", "--pytest-arg=-k", "--pytest-arg=identity"], cache_dir)
    assert second.returncode in (0, 1), second.stderr[-3000:]
    assert second.stdout.count("reused ") == 2, second.stdout
    results = [json.loads(line) for line in (reports / "two" / "results.jsonl").read_text().splitlines()]
    assert all(r["environment"]["env_reused"] for r in results)
    # history persists across runs, and the second report carries the trend of the first
    second_report = json.loads((reports / "two" / "report.json").read_text())
    assert any(p["run_id"] == "one" for points in second_report["trends"].values() for p in points)
    listing = subprocess.run([sys.executable, "-m", "stackgate", "history", "--history",
                              str(reports / "history.sqlite")], cwd=ROOT, capture_output=True, text=True, check=True)
    assert "one" in listing.stdout and "two" in listing.stdout


def test_upgrade_torch_end_to_end_and_rerun_reuses_envs(tmp_path: Path, cache_dir: Path) -> None:
    check_upgrade_run(tmp_path, cache_dir, "venv")


def test_two_nodes_by_two_processes_on_this_host(backend: VenvBackend, torch_env: EnvHandle, tmp_path: Path) -> None:
    pool = RunnerPool("local", None, GpuClass.NONE, gpu="cpu", nodes=2, is_local=True)
    cell = Cell(torch_env.stack, pool, Topology(2, 2), Role.CANDIDATE, required=True)
    spec = suite.SuiteSpec(pytest_args=("-k", "test_collective_correctness or test_vit"), profile="quick",
                           timeout_s=600)
    result = run_cell(backend, cell, torch_env, RunContext("mn", tmp_path, spec))
    assert result.status is Status.PASSED, result.log_tail[-3000:]
    names = {t.name: t.outcome for t in result.tests}
    assert names["test_collectives.py::test_collective_correctness[2]"] == "passed"
    assert names["test_vit_fsdp.py::test_vit_fsdp2_mixed_precision_dcp_resume"] == "passed"
    wrong = [m for m in result.metrics if m.name == "collective_wrong_elements"]
    assert wrong and dict(wrong[0].tags)["world_size"] == "4" and wrong[0].samples == (0.0,)


@pytest.mark.parametrize("kill_after", [5])
def test_cell_timeout_is_reported_as_timeout(backend: VenvBackend, torch_env: EnvHandle, tmp_path: Path,
                                             kill_after: int) -> None:
    pool = RunnerPool("local", None, GpuClass.NONE, gpu="cpu", nodes=1, is_local=True)
    cell = Cell(torch_env.stack, pool, Topology(1, 2), Role.CANDIDATE)
    spec = suite.SuiteSpec(pytest_args=("-k", "test_vit"), timeout_s=kill_after)
    result = run_cell(backend, cell, torch_env, RunContext("to", tmp_path, spec))
    assert result.status is Status.TIMEOUT
    assert result.duration_s < kill_after + 40


def test_a_users_own_suite_gets_the_platform_checks(backend: VenvBackend, torch_env: EnvHandle, tmp_path: Path) -> None:
    pool = RunnerPool("local", None, GpuClass.NONE, gpu="cpu", nodes=1, is_local=True)
    cell = Cell(torch_env.stack, pool, Topology(1, 2), Role.CANDIDATE)
    spec = suite.SuiteSpec(path=ROOT / "tests" / "data" / "user_suite", profile="quick", timeout_s=900)
    result = run_cell(backend, cell, torch_env, RunContext("user", tmp_path, spec))
    assert result.status is Status.PASSED, result.log_tail[-3000:]
    names = {t.name.split("/")[-1]: t.outcome for t in result.tests}
    assert names["test_my_trainer.py::test_my_trainer_step"] == "passed"
    assert names["test_identity.py::test_torch_version"] == "passed"
    assert names["test_collectives.py::test_collective_correctness[2]"] == "passed"
    assert [m.name for m in result.metrics if m.name == "my_trainer.loss"] == ["my_trainer.loss"]


def test_concurrent_runs_wait_for_each_others_environment(backend: VenvBackend, torch_env: EnvHandle,
                                                          tmp_path: Path) -> None:
    """Two runs sharing a cache: while one holds an environment's lock (building it), the other waits."""
    import threading
    import time

    from filelock import FileLock

    root = Path(torch_env.ref).parents[1]
    lock = FileLock(str(root.with_name(root.name + ".lock")))
    got: list[float] = []
    with lock:
        waiter = threading.Thread(target=lambda: got.append(
            backend.prepare(torch_env.stack, tmp_path / "b.log").prepare_s))
        waiter.start()
        time.sleep(1.5)
        assert not got, "prepare must wait while another run holds the environment's lock"
    waiter.join(timeout=60)
    assert got and got[0] >= 1.0  # it waited for the lock, then reused the environment
