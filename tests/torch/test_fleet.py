"""Issue 10's acceptance, for real: a test fleet of two CPU pools, each run by its own
`stackgate run --pool ...` process with its own cache and reports directory (venv backend), then
`stackgate merge` of the bundles: the same decision and cell set as one run over both pools; shards
merged equal the unsharded run; a bundle of another candidate is refused; a missing pool is named."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from stackgate.shipped import MATRIX_DIR
from tests.matrices import one_cpu_stack

ROOT = Path(__file__).resolve().parents[2]
FLEET = """[pool.cpu-a]
gpu_class = "none"
nodes = 1

[pool.cpu-b]
gpu_class = "none"
nodes = 1
"""
# production's stack as the candidate too: this test is about bundles, shards and the merge, so every
# cell runs the small 2.13.0+cpu environment (an upgrade's two stacks: test_end_to_end.py)
MATRIX = one_cpu_stack("fleet-test", ["cpu-a", "cpu-b"], "1x2")


def _stackgate(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stackgate", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=1800, check=False)


def _cells(run_dir: Path) -> tuple[str, dict[str, str]]:
    report = json.loads((run_dir / "report.json").read_text())
    return report["decision"], {c["id"]: c["status"] for c in report["cells"] if c["status"] != "no-result"}


def test_pools_run_apart_merge_into_one_verdict(tmp_path: Path, cache_dir: Path) -> None:
    cfg = tmp_path / "cfg"
    shutil.copytree(MATRIX_DIR, cfg)
    (cfg / "fleet.toml").write_text(FLEET)
    (cfg / "fleet-test.toml").write_text(MATRIX)
    shutil.copytree(ROOT / "tests" / "data" / "plain_suite", tmp_path / "suite")
    common = ["--matrix", "cfg/fleet-test.toml", "--config-dir", "cfg", "--suite", "suite", "--no-platform-checks"]
    run = ["run", "--backend", "venv", *common]

    def ok(proc: subprocess.CompletedProcess[str], *codes: int) -> None:
        assert proc.returncode in (codes or (0,)), proc.stdout[-3000:] + proc.stderr[-3000:]

    # each pool's runner: its own process, cache and reports directory. Alone, a pool's run cannot be GO
    # (the other pool's required cells are not run here): exit 1; the merge decides.
    ok(_stackgate(tmp_path, *run, "--pool", "cpu-a", "--cache-dir", "cache-a", "--reports", "ra", "--run-id", "a"), 1)
    ok(_stackgate(tmp_path, *run, "--pool", "cpu-b", "--cache-dir", "cache-b", "--reports", "rb", "--run-id", "b"), 1)
    ok(_stackgate(tmp_path, "merge", "ra/a", "rb/b", "--out", "merged/ab", *common))
    ok(_stackgate(tmp_path, *run, "--pool", "cpu-a", "--pool", "cpu-b", "--cache-dir", str(cache_dir),
                  "--reports", "rall", "--run-id", "all"))
    merged, single = _cells(tmp_path / "merged" / "ab"), _cells(tmp_path / "rall" / "all")
    assert merged == single and merged[0] == "GO"
    assert set(merged[1]) == {"prod-cpu-a-cpu-cpu-torch2.13.0-py3.11-1x2", "cpu-a-cpu-cpu-torch2.13.0-py3.11-1x2",
                              "prod-cpu-b-cpu-cpu-torch2.13.0-py3.11-1x2", "cpu-b-cpu-cpu-torch2.13.0-py3.11-1x2"}
    manifest = json.loads((tmp_path / "ra" / "a" / "run.json").read_text())
    assert manifest["selection"]["pools"] == "cpu-a" and manifest["definition_hash"]

    # shards of the two-pool run, merged, equal the unsharded run
    for index in (0, 1):
        ok(_stackgate(tmp_path, *run, "--pool", "cpu-a", "--pool", "cpu-b", "--shard", f"{index}/2",
                      "--cache-dir", str(cache_dir), "--reports", "rs", "--run-id", f"s{index}"), 0, 1)
    ok(_stackgate(tmp_path, "merge", "rs/s0", "rs/s1", "--out", "merged/shards", *common))
    assert _cells(tmp_path / "merged" / "shards") == single

    # a bundle of another candidate is refused, saying what differs
    ok(_stackgate(tmp_path, *run, "--pool", "cpu-b", "--candidate", "2.14.1", "--only", "prod-*",
                  "--cache-dir", str(cache_dir), "--reports", "rc", "--run-id", "other"), 0, 1)
    mixed = _stackgate(tmp_path, "merge", "ra/a", "rc/other", "--out", "merged/mixed", *common)
    assert mixed.returncode == 2 and "candidate: was '2.14.1', now '2.13.0'" in mixed.stderr, mixed.stderr
    assert not (tmp_path / "merged" / "mixed").exists()

    # a pool nobody ran: INCONCLUSIVE, naming it
    alone = _stackgate(tmp_path, "merge", "ra/a", "--out", "merged/alone", *common)
    assert alone.returncode == 1, alone.stdout[-3000:] + alone.stderr[-3000:]
    decision, cells = _cells(tmp_path / "merged" / "alone")
    assert decision == "INCONCLUSIVE" and set(cells) == {c for c in single[1] if "cpu-a" in c}
    assert "not run: no bundle ran pool cpu-b" in alone.stdout
