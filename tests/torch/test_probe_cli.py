"""The host probe through the real CLI: this CPU machine declares itself a runner of the H100 pool.
The probe finds no NVIDIA driver, so the pool's cells are host-mismatch: INCONCLUSIVE (exit 3),
never NO-GO, with the probe's evidence in the report, and nothing resolved or built for them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stackgate import fleet


def test_a_runner_that_does_not_match_its_pool_runs_nothing(tmp_path: Path) -> None:
    if fleet.detect_local().driver is not None:
        pytest.skip("this machine has an NVIDIA driver")
    proc = subprocess.run([sys.executable, "-m", "stackgate", "run", "--pool", "p5-h100", "--run-id", "probe"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "host probe for pool p5-h100: host-mismatch" in proc.stdout
    assert "resolving the requirements of 0 stack(s)" in proc.stdout
    report = json.loads((tmp_path / "reports" / "probe" / "report.json").read_text())
    assert report["decision"] == "INCONCLUSIVE"
    assert {c["status"] for c in report["cells"]} == {"host-mismatch"}
    assert report["host_probe"]["p5-h100"]["status"] == "host-mismatch"
    assert "no NVIDIA driver answered" in report["host_probe"]["p5-h100"]["evidence"][0]
    assert not [r for r in report["reasons"] if r["severity"] == "blocking"]
    assert "## Host probe" in (tmp_path / "reports" / "probe" / "report.md").read_text()
