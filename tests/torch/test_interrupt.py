"""A CI cancel for real: SIGTERM a running `stackgate run` mid-cell, then check that no process of the
run is left, the report is on disk and exit is 143; tear the results file's last line as a kill
mid-write would, and `--resume` finishes the run with every cell present exactly once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SELECT = ["--pytest-arg=-k", "--pytest-arg=test_torch_version or test_collective_correctness or test_recsys"]


def processes_of_run(run_id: str) -> list[str]:
    """Live processes started for this run: their environment carries STACKGATE_RUN_ID=<run_id>."""
    needle = f"STACKGATE_RUN_ID={run_id}".encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if needle in environ.read_bytes().split(b"\0"):
                found.append(f"{environ.parent.name}: {(environ.parent / 'cmdline').read_bytes()[:150]!r}")
        except OSError:
            continue
    return found


def docker_leftovers(before: frozenset[str] = frozenset()) -> list[str]:
    """stackgate's containers and networks (named sg-*) still present, but those in `before`: what an
    earlier run on this machine left (one killed with the machine) is not this test's to judge."""
    found = []
    for what, field in ((["ps", "-a"], "{{.Names}}"), (["network", "ls"], "{{.Name}}")):
        listing = subprocess.run(["docker", *what, "--filter", "name=sg-", "--format", field],
                                 capture_output=True, text=True, check=True)
        found += [name for name in listing.stdout.split() if name not in before]
    return found


def _stackgate(args: list[str], cwd: Path, cache_dir: Path, backend: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "stackgate", "run", "--backend", backend, "--profile", "quick",
                             "--cache-dir", str(cache_dir), *SELECT, *args],
                            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_sigterm_mid_cell_cleans_up_reports_and_resume_finishes(tmp_path: Path, cache_dir: Path) -> None:
    check_cancel_and_resume(tmp_path, cache_dir, "venv")


def check_cancel_and_resume(tmp_path: Path, cache_dir: Path, backend: str) -> None:
    before = frozenset(docker_leftovers()) if backend == "docker" else frozenset()
    run_id = f"cancel-{backend}"  # the venv and Docker tests run at the same time (pytest -n): each its own name
    run = _stackgate(["--run-id", run_id], tmp_path, cache_dir, backend)
    assert run.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + 600
    started_second = False
    for line in run.stdout:  # wait until the second cell (the candidate) is running its tests
        seen.append(line)
        if line.startswith("run local-cpu-cu130"):
            started_second = True
        if started_second and "PASSED" in line and (backend == "docker" or processes_of_run(run_id)):
            break
        assert time.monotonic() < deadline, "".join(seen[-30:])
    assert started_second, "".join(seen[-30:])
    assert processes_of_run(run_id) or docker_leftovers(before), "the cell should be running"
    run.send_signal(signal.SIGTERM)  # to stackgate alone, as a CI runner cancelling the step would
    rest, _ = run.communicate(timeout=120)
    output = "".join(seen) + rest
    assert run.returncode == 143, output[-3000:]
    assert "interrupted: stopped" in output
    time.sleep(1)
    assert processes_of_run(run_id) == [], "stray processes after SIGTERM"
    if backend == "docker":
        assert docker_leftovers(before) == [], "containers or networks left after SIGTERM"
    run_dir = tmp_path / "reports" / run_id
    report = json.loads((run_dir / "report.json").read_text())
    assert report["decision"] == "INCONCLUSIVE"  # the candidate has no result yet
    finished = [json.loads(line)["cell_id"] for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert finished == ["prod-local-cpu-cpu-torch2.13.0-py3.11-1x2"]

    with (run_dir / "results.jsonl").open("a") as fh:  # a kill in the middle of writing the next line
        fh.write('{"cell_id": "local-cpu-cu130-torch2.14.1-py3.11-1x2", "status": "pass')

    changed = subprocess.run([sys.executable, "-m", "stackgate", "run", "--backend", backend, "--profile", "default",
                              "--cache-dir", str(cache_dir), *SELECT, "--resume", run_id],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert changed.returncode == 2 and "definition changed" in changed.stderr  # not the same run
    assert "profile: was 'quick', now 'default'" in changed.stderr

    resumed = _stackgate(["--resume", run_id], tmp_path, cache_dir, backend)
    out, _ = resumed.communicate(timeout=1200)
    assert resumed.returncode in (0, 1), out[-3000:]
    assert "repaired a torn last line" in out and "skip prod-local-cpu-cpu-torch2.13.0-py3.11-1x2" in out
    lines = (run_dir / "results.jsonl").read_text().splitlines()
    ids = [json.loads(line)["cell_id"] for line in lines]  # every line parses: the torn one is gone
    assert sorted(ids) == sorted(set(ids)), ids  # every finished cell exactly once
    assert set(ids) >= {"prod-local-cpu-cpu-torch2.13.0-py3.11-1x2", "local-cpu-cu130-torch2.14.1-py3.11-1x2"}
    assert '"status": "pass' in (run_dir / "results.jsonl.torn").read_text()
    final = json.loads((run_dir / "report.json").read_text())
    cells = {c["id"]: c["status"] for c in final["cells"]}
    assert cells == {"prod-local-cpu-cpu-torch2.13.0-py3.11-1x2": "passed",
                     "local-cpu-cu130-torch2.14.1-py3.11-1x2": "passed"}
    assert processes_of_run(run_id) == []
    if backend == "docker":
        assert docker_leftovers(before) == []
