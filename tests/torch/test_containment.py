"""#19 in the venv tier: what a suite leaves running is ended and reported; a resumed run ends what
its dead predecessor left."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from stackgate import proc
from stackgate.backends.base import EnvHandle, RunContext, run_cell
from stackgate.backends.venv import VenvBackend
from stackgate.suite import SuiteSpec
from tests.unit.test_user_paths import _user_cells

pytestmark = pytest.mark.torch

DAEMON = '''
import subprocess


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
    left = result.environment.get("leftover_processes")
    assert left and "sleep 1001" in left[0], result.environment
    assert not proc.marked({"STACKGATE_RUN_ID": "contain-10"})  # nothing of the run is alive


def test_resume_ends_what_the_dead_run_left_running(tmp_path: Path) -> None:
    """#19 item 5: a killed run's processes kept running through --resume; the resumed run now ends them."""
    orphan = subprocess.Popen(["sleep", "1002"], env={"STACKGATE_RUN_ID": "dead-run", "PATH": "/usr/bin:/bin"},
                              start_new_session=True)
    try:
        time.sleep(0.2)
        assert [pid for pid, _ in proc.marked({"STACKGATE_RUN_ID": "dead-run"})] == [orphan.pid]
        ended = proc.end_marked({"STACKGATE_RUN_ID": "dead-run"})
        assert ended and ended[0][0] == orphan.pid and "sleep 1002" in ended[0][1]
        assert orphan.wait(timeout=10) < 0  # ended by a signal
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()
