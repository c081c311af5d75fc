"""#19 in the venv tier: what a suite leaves running is ended and reported; a resumed run ends what
its dead predecessor left."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stackgate import proc, suite
from stackgate.backends.base import EnvHandle
from stackgate.backends.venv import VenvBackend
from stackgate.runner import run_cell
from stackgate.suite import RunContext, SuiteSpec
from tests.unit.test_user_paths import _user_cells

pytestmark = pytest.mark.torch

DAEMON = '''
import json
import subprocess
import sys


def test_starts_a_daemon():
    # escapes the node's session: only the run's marker in its environment still finds it
    subprocess.Popen(["sleep", "1001"], start_new_session=True)
'''


def test_a_daemon_that_outlives_the_suite_is_ended_and_reported(backend: VenvBackend, torch_env: EnvHandle,
                                                                  tmp_path: Path) -> None:
    """#19 item 10: a test that started `sleep 1001` in a session of its own outlived both cells."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_daemon.py").write_text(DAEMON)
    prod, _ = _user_cells()
    ctx = RunContext(run_id="contain-10", run_dir=tmp_path / "run", suite=SuiteSpec(path=suite, platform_checks=False,
                                                                                    timeout_s=300))
    result = run_cell(backend, prod, torch_env, ctx)
    assert result.status.value == "passed", result.reason
    left = result.environment.leftover_processes
    assert left and "sleep 1001" in left[0], result.environment
    assert not proc.marked({"STACKGATE_RUN_ID": "contain-10"})  # nothing of the run is alive


def test_resume_ends_what_the_dead_run_left_running_and_nothing_of_another_run_of_that_name(tmp_path: Path) -> None:
    """#19 item 5: a killed run's processes kept running through --resume; the resumed run now ends them.
    A run id is a name: another checkout's run called `dead-run`, still running, is not this run's."""
    mine, theirs = (suite.run_marks("dead-run", tmp_path / where / "reports" / "dead-run") for where in ("a", "b"))
    assert mine["STACKGATE_RUN_ID"] == theirs["STACKGATE_RUN_ID"] and mine != theirs
    orphan, other = (subprocess.Popen(["sleep", "1002"], env={**marks, "PATH": "/usr/bin:/bin"}, start_new_session=True)
                     for marks in (mine, theirs))
    try:
        time.sleep(0.2)
        assert [pid for pid, _ in proc.marked(mine)] == [orphan.pid]
        ended = proc.end_marked(mine)
        assert ended and ended[0][0] == orphan.pid and "sleep 1002" in ended[0][1]
        assert orphan.wait(timeout=10) < 0  # ended by a signal
        assert other.poll() is None, "the other checkout's run of the same name was ended"
    finally:
        for started in (orphan, other):
            if started.poll() is None:
                started.kill()
                started.wait()


SECRETS = '''
import os


def test_sees_what_it_was_given():
    assert os.environ.get("HF_TOKEN") == "hf-passed-explicitly-1234"


def test_prints_the_hosts_secrets():
    # a failing assert that quotes the environment: it must find nothing of the host's secrets
    seen = {k: os.environ.get(k) for k in ("AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "HF_TOKEN")}
    print(seen)
    assert not seen, f"seen: {seen}"
'''


def test_host_secrets_never_reach_the_suite_and_passed_ones_are_masked_everywhere(tmp_path: Path,
                                                                                   cache_dir: Path) -> None:
    """#19 item 11: with AWS_SECRET_ACCESS_KEY and GITHUB_TOKEN set, a failing assert printed them into
    results.jsonl, every report and the node log; --suite-env HF_TOKEN=... was stored verbatim."""
    import os

    from tests.torch.test_end_to_end import ROOT
    suite = tmp_path / "secrets_suite"
    suite.mkdir()
    (suite / "test_secrets.py").write_text(SECRETS)
    env = {**os.environ, "AWS_SECRET_ACCESS_KEY": "aws-canary-5678", "GITHUB_TOKEN": "ghp-canary-9012"}
    ran = subprocess.run([sys.executable, "-m", "stackgate", "run", "--suite", str(suite), "--backend", "venv",
                          "--no-platform-checks", "--no-rollback", "--cache-dir", str(cache_dir),
                          "--reports", str(tmp_path / "reports"), "--run-id", "s",
                          "--suite-env", "HF_TOKEN=hf-passed-explicitly-1234"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800, check=False)
    run = tmp_path / "reports" / "s"
    report = json.loads((run / "report.json").read_text())
    cells = {c["id"]: c for c in report["cells"]}
    for cell in cells.values():
        outcomes = {t["name"]: t for t in cell["tests"]}
        assert outcomes["test_secrets.py::test_sees_what_it_was_given"]["outcome"] == "passed"
        printed = outcomes["test_secrets.py::test_prints_the_hosts_secrets"]["message"]
        assert "'AWS_SECRET_ACCESS_KEY': None" in printed and "'GITHUB_TOKEN': None" in printed
        assert "'HF_TOKEN': '***'" in printed  # the suite saw it; what it printed of it is masked
    for canary in ("aws-canary-5678", "ghp-canary-9012", "hf-passed-explicitly-1234"):
        assert canary not in ran.stdout + ran.stderr
        for path in run.rglob("*"):
            if path.is_file():
                assert canary.encode() not in path.read_bytes(), path
    assert "HF_TOKEN=***" in json.dumps(report["run"]["options"]["suite_env"])


def test_a_full_disk_is_one_line_of_exit_3_and_resume_reruns_what_was_not_written(tmp_path: Path,
                                                                                   cache_dir: Path) -> None:
    """#19 item 4: at 16 KiB free, a traceback, the candidate "reported no tests", and --resume skipped it."""
    import os

    from tests.torch.test_end_to_end import ROOT
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=120k", "tmpfs", str(small)], capture_output=True,
                             text=True, check=False)
    if mounted.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"cannot mount a small tmpfs under CI: {mounted.stderr}")
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        args = [sys.executable, "-m", "stackgate", "run", "--suite", "tests/data/plain_suite", "--backend", "venv",
                "--cache-dir", str(cache_dir), "--reports", str(small / "r")]
        full = subprocess.run([*args, "--run-id", "full"], cwd=ROOT, capture_output=True, text=True, timeout=1200,
                              check=False)
        assert full.returncode == 3, full.stdout[-2000:] + full.stderr[-2000:]
        assert "Traceback" not in full.stderr and "error: disk full: cannot write " in full.stderr
        assert "KiB free on its filesystem" in full.stderr
        subprocess.run(["mount", "-o", "remount,size=20m", str(small)], check=True)
        resumed = subprocess.run([*args, "--resume", "full"], cwd=ROOT, capture_output=True, text=True, timeout=1200,
                                 check=False)
        assert resumed.returncode == 0, resumed.stdout[-3000:]
        assert "GO (gating verdict GO, exit 0)" in resumed.stdout
        report = json.loads((small / "r" / "full" / "report.json").read_text())
        assert {c["status"] for c in report["cells"]} == {"passed"}
    finally:
        subprocess.run(["umount", str(small)], check=False)


HOLD = '''
import json
import os
import time
from pathlib import Path


def test_holds_while_told_to():
    hold = Path(os.environ["HOLD_FILE"])
    try:  # only the first attempt of the run holds: the one that is killed
        os.close(os.open(str(hold) + ".claimed", os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        hold = Path(os.devnull + ".never")
    def record(stage):
        with open(os.environ["STACKGATE_RESULTS"], "a") as fh:
            fh.write(json.dumps({"kind": "environment", f"pid_{stage}": os.getpid()}) + "\\n")
    record("start")
    deadline = time.monotonic() + 120
    while hold.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    record("end")
'''


def test_kill_9_mid_cell_then_resume_ends_the_orphans_and_keeps_one_attempts_evidence(tmp_path: Path,
                                                                                        cache_dir: Path) -> None:
    """#19 item 5: after `kill -9` the dead run's pytest kept running through --resume, and its records
    were merged into the resumed cell's result (two pids)."""
    import os
    import signal

    from tests.torch.test_end_to_end import ROOT
    suite = tmp_path / "hold_suite"
    suite.mkdir()
    (suite / "test_hold.py").write_text(HOLD)
    hold = tmp_path / "hold"
    hold.write_text("")
    args = [sys.executable, "-m", "stackgate", "run", "--suite", str(suite), "--backend", "venv",
            "--no-platform-checks", "--no-rollback", "--cache-dir", str(cache_dir), "--reports",
            str(tmp_path / "reports"), "--suite-env", f"HOLD_FILE={hold}"]
    first = subprocess.Popen([*args, "--run-id", "k9"], cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while not proc.marked({"STACKGATE_RUN_ID": "k9"}) and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(2)
        os.kill(first.pid, signal.SIGKILL)  # the harness alone: its suite processes are orphaned
        first.wait()
        orphans = proc.marked({"STACKGATE_RUN_ID": "k9"})
        assert orphans, "the killed run's suite should still be running"
        resumed = subprocess.run([*args, "--resume", "k9"], cwd=ROOT, capture_output=True, text=True, timeout=1200,
                                 check=False, input=None)
        assert f"resume: ended {len(orphans)} process(es) the dead run k9 left running" in resumed.stdout or \
            "resume: ended" in resumed.stdout, resumed.stdout[-3000:]
        assert not proc.marked({"STACKGATE_RUN_ID": "k9"})
    finally:
        hold.unlink(missing_ok=True)
        proc.end_marked({"STACKGATE_RUN_ID": "k9"})
    report = json.loads((tmp_path / "reports" / "k9" / "report.json").read_text())
    assert {c["status"] for c in report["cells"]} == {"passed"}, [c["reason"] for c in report["cells"]]
    for cell in report["cells"]:
        environment = cell["environment"]
        assert environment["pid_start"] == environment["pid_end"], environment  # one attempt's records
