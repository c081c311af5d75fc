"""Requirements are resolved before anything is built, the same way for both backends: an unknown
version is a usage error (exit 2, nothing written); an index out of reach is an infrastructure error
(exit 3) with a report whose cells say why."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stackgate", "run", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, check=False)


@pytest.mark.parametrize("backend", ["venv", "docker"])
def test_unknown_version_in_a_known_series_exits_2_with_nothing_written(tmp_path: Path, backend: str) -> None:
    proc = _run(tmp_path, "--candidate", "2.14.9", "--backend", backend)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "cannot be resolved" in proc.stderr and "torch==2.14.9" in proc.stderr
    assert not (tmp_path / "reports").exists()


def test_unreachable_index_exits_3_with_a_report(tmp_path: Path) -> None:
    proc = _run(tmp_path, "--backend", "venv", "--index-url", "http://127.0.0.1:9/simple", "--run-id", "offline")
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "reports" / "offline" / "report.json").read_text())
    assert report["decision"] == "INCONCLUSIVE" and report["exit_code"] == 3
    assert {c["status"] for c in report["cells"]} == {"infra-error"}
    assert all("127.0.0.1:9" in c["reason"] for c in report["cells"])


def test_a_broken_history_database_exits_3_after_the_reports_are_written(tmp_path: Path) -> None:
    broken = tmp_path / "history.sqlite"
    broken.write_text("this is not an SQLite database\n" * 100)
    proc = _run(tmp_path, "--backend", "venv", "--index-url", "http://127.0.0.1:9/simple", "--run-id", "h",
                "--history", str(broken))
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "history database" in proc.stderr and "Traceback" not in proc.stderr
    run_dir = tmp_path / "reports" / "h"
    for name in ("report.json", "report.md", "junit.xml", "report.html"):
        assert (run_dir / name).is_file(), name  # the reports came first
