"""The suite's launcher under real torchrun: a dead or hung rank fails fast and explains itself."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from stackgate.backends.base import EnvHandle

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

DRIVER = """
import json, sys
sys.path.insert(0, {suite!r})
import launch
try:
    res = launch.launch({target!r}, __import__('pathlib').Path({out!r}), nproc_per_node=2, timeout_s={timeout})
    print(json.dumps({{"ok": True, "values": [r["value"] for r in res]}}))
except launch.DistributedFailure as exc:
    print(json.dumps({{"ok": False, "message": str(exc)}}))
"""


def _launch(env: EnvHandle, target: str, tmp_path: Path, timeout: int) -> tuple[dict, float]:
    code = DRIVER.format(suite=str(ROOT / "integration_tests"), target=target, out=str(tmp_path / "ranks"),
                         timeout=timeout)
    start = time.monotonic()
    proc = subprocess.run([env.ref, "-c", code], capture_output=True, text=True, timeout=timeout + 90,
                          env={"PYTHONPATH": str(HERE), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), time.monotonic() - start


def test_all_ranks_report_values(torch_env: EnvHandle, tmp_path: Path) -> None:
    got, _ = _launch(torch_env, "faulty:ok", tmp_path, 120)
    assert got == {"ok": True, "values": [3.0, 3.0]}


def test_dead_rank_fails_the_test_with_its_log(torch_env: EnvHandle, tmp_path: Path) -> None:
    got, took = _launch(torch_env, "faulty:crash_rank1", tmp_path, 60)
    assert got["ok"] is False
    message = got["message"]
    assert "ranks with no result: 1" in message or "failed ranks" in message
    assert "----- rank0" in message and "----- rank1" in message  # one block per rank
    assert took < 60 + 30


def test_hung_rank_times_out_with_a_stack_dump(torch_env: EnvHandle, tmp_path: Path) -> None:
    got, took = _launch(torch_env, "faulty:hang_rank1", tmp_path, 20)
    assert got["ok"] is False
    assert "hang_rank1" in got["message"]  # faulthandler's dump names the stuck frame
    assert took < 20 + 45
