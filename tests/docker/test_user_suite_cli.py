"""Issue 8's acceptance for `--suite`, as a user types it: the real CLI, no flags but `--suite`, from a
working directory of the user's (relative suite path, default reports/ and caches, the default
backend: Docker, since an engine answers). A plain pytest suite that knows nothing of stackgate."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BREAKS_ON_UPGRADE = '''

def test_pinned_to_the_production_release() -> None:
    assert torch.__version__.startswith("2.13"), f"this code only works on torch 2.13, got {torch.__version__}"
'''


def _stackgate(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stackgate", "run", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=2400, check=False)


def test_plain_suite_gives_go_then_no_go_naming_the_failing_test(engine: object, tmp_path: Path) -> None:
    shutil.copytree(ROOT / "tests" / "data" / "plain_suite", tmp_path / "mysuite")
    green = _stackgate(tmp_path, "--suite", "mysuite", "--run-id", "green")
    assert green.returncode == 0, green.stdout[-4000:] + green.stderr[-2000:]
    assert "GO (gating verdict GO, exit 0)" in green.stdout
    assert "policy: default for a user suite" in green.stdout
    report = json.loads((tmp_path / "reports" / "green" / "report.json").read_text())
    assert report["decision"] == "GO"
    for cell in report["cells"]:
        outcomes = {t["name"].rsplit("/", 1)[-1]: t["outcome"] for t in cell["tests"]}
        assert cell["environment"]["backend"] == "docker"
        assert outcomes["test_model.py::test_linear_layer_trains"] == "passed"
        assert outcomes["test_model.py::test_matmul_matches_numpy"] == "passed"
        assert outcomes["test_identity.py::test_torch_version"] == "passed"  # the platform checks ran beside it
    rollback = report["rollback"][0]
    assert rollback["status"] == "skipped" and "no cross-version tests" in rollback["reason"]

    with (tmp_path / "mysuite" / "test_model.py").open("a") as fh:
        fh.write(BREAKS_ON_UPGRADE)
    red = _stackgate(tmp_path, "--suite", "mysuite", "--run-id", "red")
    assert red.returncode == 1, red.stdout[-4000:] + red.stderr[-2000:]
    assert "NO-GO (gating verdict NO-GO, exit 1)" in red.stdout
    why = red.stdout[red.stdout.index("why ("):]
    assert "test_model.py::test_pinned_to_the_production_release" in why and "[failed-test]" in why
    report = json.loads((tmp_path / "reports" / "red" / "report.json").read_text())
    blocking = [r for r in report["reasons"] if r["severity"] == "blocking"]
    assert [r["test"].rsplit("/", 1)[-1] for r in blocking] == ["test_model.py::test_pinned_to_the_production_release"]


def test_a_monorepo_suite_with_its_own_package_in_both_images(engine: object, tmp_path: Path) -> None:
    """Issue 14 with the Docker backend (the default): the suite's requirements and the team's package
    go into the images from the host wheelhouse, in a layer after the stack; a rerun reuses both images."""
    from tests.torch.test_suite_requirements import MONOREPO, check_green_in_both_stacks
    shutil.copytree(MONOREPO, tmp_path / "monorepo")
    args = ("--suite", "monorepo/trainer_suite", "--suite-install", "monorepo/libs/recsys_kit")
    first = _stackgate(tmp_path, *args, "--run-id", "first")
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    cells = check_green_in_both_stacks(tmp_path / "reports" / "first" / "report.json")
    assert {c["environment"]["backend"] for c in cells} == {"docker"}
    again = _stackgate(tmp_path, *args, "--run-id", "again")
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-2000:]
    assert "building image" not in again.stdout and "building a wheel" not in again.stdout
    cells = check_green_in_both_stacks(tmp_path / "reports" / "again" / "report.json")
    assert all(c["environment"]["env_reused"] for c in cells)


TIMED_SUITE = '''import json, os, time

import torch


def test_timed_step() -> None:
    torch.set_num_threads(1)
    a = torch.randn(64, 64)
    steps, cpu = [], []
    for _ in range(200):
        start = time.process_time()
        x = a
        for _ in range(50):
            x = torch.tanh(x @ a)
        cpu.append((time.process_time() - start) * 1000)
    with open(os.environ["STACKGATE_RESULTS"], "a") as fh:
        node = os.environ["PYTEST_CURRENT_TEST"].rsplit(" (", 1)[0]
        fh.write(json.dumps({"name": "work.step_time", "unit": "ms", "samples": cpu, "better": "lower",
                             "tags": {"clock": "cpu"}, "nodeid": node}) + "\\n")
        fh.write(json.dumps({"name": "work.cpus", "unit": "", "samples": sorted(os.sched_getaffinity(0)),
                             "better": "equal", "nodeid": node}) + "\\n")
'''
TIMED_POLICY = '''[performance]
repeats = 3
confirm_repeats = 3
pairing = "concurrent"

[[performance.metric]]
name = "work.step_time"
tags = { clock = "cpu" }
summary = "best"
tolerance = 0.5
'''


def test_concurrent_pairs_run_in_containers_each_on_its_own_cpus(engine: object, tmp_path: Path) -> None:
    """#22's pairing = "concurrent" on the Docker backend: each round's production and candidate
    containers run at the same time, each given its share of the host's CPUs as its cpuset, which is
    what the suite inside sees; the gated comparison is over those pairs alone."""
    import os

    import pytest
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs to split")
    (tmp_path / "timed").mkdir()
    (tmp_path / "timed" / "test_timed.py").write_text(TIMED_SUITE)
    (tmp_path / "timed" / "stackgate-policy.toml").write_text(TIMED_POLICY)
    shutil.copy(ROOT / "benchmarks" / "sensitivity-matrix.toml", tmp_path / "same-stack.toml")
    done = _stackgate(tmp_path, "--suite", "timed", "--matrix", "same-stack.toml", "--backend", "docker",
                      "--no-platform-checks", "--no-rollback", "--run-id", "duet")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "together: " in done.stdout
    report = json.loads((tmp_path / "reports" / "duet" / "report.json").read_text())
    (gated,) = [c for c in report["comparisons"] if c["metric"].startswith("work.step_time")]
    assert gated["pairing"] == "concurrent" and gated["pairs"] == 3
    rows = [json.loads(line) for line in (tmp_path / "reports" / "duet" / "results.jsonl").read_text().splitlines()]
    repeats = [r for r in rows if r["phase"].startswith("repeat")]
    assert len(repeats) == 6
    for r in repeats:
        seen = next(m["samples"] for m in r["metrics"] if m["name"] == "work.cpus")
        assert r["environment"]["backend"] == "docker" and seen == r["environment"]["cpus"]  # the container's cpuset
    for n in (1, 2, 3):
        prod, cand = (next(r for r in repeats if r["phase"] == f"repeat{n}" and r["role"] == role)
                      for role in ("production", "candidate"))
        assert not set(prod["environment"]["cpus"]) & set(cand["environment"]["cpus"])
