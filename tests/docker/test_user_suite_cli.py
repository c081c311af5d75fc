"""Issue 8's acceptance for `--suite`, as a user types it: the real CLI, from a working directory of the
user's (relative suite path, default reports/ and caches, the default backend: Docker, since an engine
answers). A plain pytest suite that knows nothing of stackgate."""

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


def test_a_users_suite_gives_go_then_no_go_naming_the_failing_test_and_reuses_its_images(engine: object,
                                                                                          tmp_path: Path) -> None:
    """Issues 8 and 14 with the Docker backend (the default), in one pair of runs as a user types them: a
    monorepo's plain pytest suite (it imports the team's own package, given with --suite-install, and a
    requirement from its requirements.txt) runs green in both images beside the platform checks; then a
    test that only works on the production release is added and the rerun is NO-GO naming it alone,
    with both images and their suite layers reused (nothing built)."""
    from tests.torch.test_suite_requirements import MONOREPO, SUITE_TESTS, check_green_in_both_stacks
    shutil.copytree(MONOREPO, tmp_path / "monorepo")
    args = ("--suite", "monorepo/trainer_suite", "--suite-install", "monorepo/libs/recsys_kit")
    green = _stackgate(tmp_path, *args, "--run-id", "green")
    assert green.returncode == 0, green.stdout[-4000:] + green.stderr[-2000:]
    assert "GO (gating verdict GO, exit 0)" in green.stdout
    assert "policy: default for a user suite" in green.stdout
    cells = check_green_in_both_stacks(tmp_path / "reports" / "green" / "report.json")
    for cell in cells:
        outcomes = {t["name"].rsplit("/", 1)[-1]: t["outcome"] for t in cell["tests"]}
        assert cell["environment"]["backend"] == "docker"
        assert outcomes["test_identity.py::test_torch_version"] == "passed"  # the platform checks ran beside it
    rollback = json.loads((tmp_path / "reports" / "green" / "report.json").read_text())["rollback"][0]
    assert rollback["status"] == "skipped" and "no cross-version tests" in rollback["reason"]

    with (tmp_path / "monorepo" / "trainer_suite" / "test_recsys.py").open("a") as fh:
        fh.write(BREAKS_ON_UPGRADE)
    red = _stackgate(tmp_path, *args, "--no-platform-checks", "--run-id", "red")  # (the green run had them)
    assert red.returncode == 1, red.stdout[-4000:] + red.stderr[-2000:]
    assert "NO-GO (gating verdict NO-GO, exit 1)" in red.stdout
    why = red.stdout[red.stdout.index("why ("):]
    assert "test_recsys.py::test_pinned_to_the_production_release" in why and "[failed-test]" in why
    assert "building image" not in red.stdout and "building a wheel" not in red.stdout
    report = json.loads((tmp_path / "reports" / "red" / "report.json").read_text())
    blocking = [r for r in report["reasons"] if r["severity"] == "blocking"]
    assert [r["test"].rsplit("/", 1)[-1] for r in blocking] == ["test_recsys.py::test_pinned_to_the_production_release"]
    ran = [c for c in report["cells"] if c["status"] != "not-run"]
    assert len(ran) == 2 and all(c["environment"]["env_reused"] for c in ran)  # both images and suite layers
    for cell in ran:
        outcomes = {t["name"].rsplit("/", 1)[-1]: t["outcome"] for t in cell["tests"]}
        assert {name: outcomes[name] for name in SUITE_TESTS} == dict.fromkeys(SUITE_TESTS, "passed")


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
max_pressure = 1.0  # (no round replaces a pair a busy CI machine disturbed: this test is about the cpusets)

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
    assert done.returncode in (0, 1), done.stdout[-4000:] + done.stderr[-2000:]
    assert "together: " in done.stdout
    report = json.loads((tmp_path / "reports" / "duet" / "report.json").read_text())
    # the same stack on both sides is never a regression; on a busy 2-core CI machine 9 pairs of
    # sub-millisecond steps may not be enough to say GO (INCONCLUSIVE, "noise too high"): that is the
    # gate telling the truth, and what this test is about is where and how the pairs ran
    assert report["decision"] in ("GO", "INCONCLUSIVE"), done.stdout[-4000:]
    assert not [r for r in report["reasons"] if r["severity"] == "blocking"], report["reasons"]
    (gated,) = [c for c in report["comparisons"] if c["metric"].startswith("work.step_time")]
    rows = [json.loads(line) for line in (tmp_path / "reports" / "duet" / "results.jsonl").read_text().splitlines()]
    repeats = [r for r in rows if r["phase"].startswith("repeat")]
    rounds = sorted({int(r["phase"].removeprefix("repeat")) for r in repeats})
    # the 3 repeats, or more where the gate confirmed (a pair standing apart asks for the sign test's 9):
    # either way the comparison is over the pairs taken together alone, never the main runs
    assert gated["pairing"] == "concurrent" and gated["pairs"] == len(rounds) >= 3, (gated, rounds)
    assert rounds == list(range(1, len(rounds) + 1)) and len(repeats) == 2 * len(rounds)
    for r in repeats:
        seen = next(m["samples"] for m in r["metrics"] if m["name"] == "work.cpus")
        assert r["environment"]["backend"] == "docker" and seen == r["environment"]["cpus"]  # the container's cpuset
    for n in rounds:
        prod, cand = (next(r for r in repeats if r["phase"] == f"repeat{n}" and r["role"] == role)
                      for role in ("production", "candidate"))
        assert not set(prod["environment"]["cpus"]) & set(cand["environment"]["cpus"])
