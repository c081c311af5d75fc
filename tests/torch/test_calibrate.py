"""`stackgate calibrate` for real: A/A runs of production's performance-gated test on this runner,
the noise per gated metric, a recommendation, and the calibration stored for the pool so that the
next run's report shows the gate's power."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
POLICY = """[required]
all_tests = true

[performance]
repeats = 2
confirm_repeats = 2  # this test checks the fixed repeats alone
max_pressure = 1.0  # (and no round that replaces a run a busy CI machine disturbed)
noise_budget_s = 0  # (nor the rounds for noise after confirmation: it read 4 pairs once in CI)

[[performance.metric]]
name = "workload.step_time"
tags = { clock = "cpu" }  # the workload's CPU time (it records wall time too)
tolerance = 0.5
devices = ["cpu"]
"""


def test_calibrate_measures_noise_and_the_report_shows_the_gates_power(tmp_path: Path, cache_dir: Path) -> None:
    shutil.copytree(ROOT / "benchmarks" / "sensitivity_suite", tmp_path / "suite")
    (tmp_path / "suite" / "stackgate-policy.toml").write_text(POLICY)
    common = ["--backend", "venv", "--suite", "suite", "--matrix", str(ROOT / "benchmarks" / "sensitivity-matrix.toml"),
              "--no-platform-checks", "--cache-dir", str(cache_dir),
              "--suite-env", "SENSITIVITY_MEASURE_S=0"]  # its shortest runs: this test is about the plumbing
    cal = subprocess.run([sys.executable, "-m", "stackgate", "calibrate", "--runs", "4", "--run-id", "cal", *common],
                         cwd=tmp_path, capture_output=True, text=True, timeout=900, check=False)
    assert cal.returncode == 0, cal.stdout[-3000:] + cal.stderr[-3000:]
    assert "workload.step_time[clock=cpu]: run-to-run noise" in cal.stdout and "with repeats = " in cal.stdout
    data = json.loads((tmp_path / "reports" / "cal" / "calibration.json").read_text())
    found = data["pools"]["local"][0]
    assert found["metric"] == "workload.step_time[clock=cpu]" and found["pairs"] == 2 and found["sigma"] >= 0
    assert round(found["recommended_tolerance"], 9) == 0.03 and found["recommended_repeats"] >= 2
    assert found["recommended_confirm_repeats"] >= found["recommended_repeats"]
    assert "and confirm_repeats = " in cal.stdout
    run = subprocess.run([sys.executable, "-m", "stackgate", "run", "--no-rollback", "--run-id", "gated", *common],
                         cwd=tmp_path, capture_output=True, text=True, timeout=900, check=False)
    assert run.returncode in (0, 1), run.stdout[-3000:] + run.stderr[-3000:]
    assert "repeats: 1 more interleaved run(s) of the performance-gated tests (test_workload.py::test_workload)" \
        in run.stdout
    report = json.loads((tmp_path / "reports" / "gated" / "report.json").read_text())
    power = report["power"]
    assert list(power) == ["local-cpu-cpu-torch2.13.0-py3.11-1x2 workload.step_time[clock=cpu]"]
    assert power["local-cpu-cpu-torch2.13.0-py3.11-1x2 workload.step_time[clock=cpu]"]["repeats"] == 2
    comparison = next(c for c in report["comparisons"] if c["metric"] == "workload.step_time[clock=cpu]")
    assert comparison["gated"] and comparison["statistic"] == "t" and comparison["pairs"] == 2
    wall = next(c for c in report["comparisons"] if c["metric"] == "workload.step_time")
    assert not wall["gated"]
    assert all("pressure" in json.loads(line)["environment"] for line in (tmp_path / "reports" / "gated" /
                                                                          "results.jsonl").read_text().splitlines())
    results = [json.loads(line)["cell_id"] for line in (tmp_path / "reports" / "gated" / "results.jsonl")
               .read_text().splitlines()]
    assert results == ["prod-local-cpu-cpu-torch2.13.0-py3.11-1x2", "local-cpu-cpu-torch2.13.0-py3.11-1x2",
                       "local-cpu-cpu-torch2.13.0-py3.11-1x2@repeat1", "prod-local-cpu-cpu-torch2.13.0-py3.11-1x2@repeat1"]
