"""The GPU tier, with the defaults (no overrides that hide a bug). Skipped where there is no GPU;
`scripts/gpu-validate.sh` runs it on a lent GPU machine and keeps the evidence.

1. The bundled suite under plain pytest on this host's torch, as the harness would set it up for
   the detected local pool: STACKGATE_DEVICE=cuda and one process per GPU. World sizes and the
   expected transport are left to their defaults (derived from the node, "any").
2. A real `stackgate run` of the upgrade matrix's local cells with this host's interpreter as both
   production and candidate (the host backend: probed, never modified, no package index needed when
   torch, pytest and numpy are installed) must reach GO: an A/A gate of the host's stack on its GPUs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stackgate import fleet, shipped, suite

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def host() -> fleet.LocalHost:
    found = fleet.detect_local()
    if found.driver is None:
        pytest.skip("no NVIDIA GPU on this machine (nvidia-smi absent or failing)")
    return found


def _keep(paths: list[Path], name: str, text: str = "") -> None:
    out_dir = Path(os.environ.get("STACKGATE_GPU_OUT", "/tmp/stackgate-gpu"))
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in paths:
        if f.exists():
            shutil.copy(f, out_dir / f"{name}-{f.name}")
    if text:
        (out_dir / f"{name}.log").write_text(text)


def test_bundled_suite_on_host_torch_with_nccl(host: fleet.LocalHost, tmp_path: Path) -> None:
    torch_cuda = subprocess.run([sys.executable, "-c", "import torch;print(torch.version.cuda or 'cpu')"],
                                capture_output=True, text=True, check=True).stdout.strip()
    variant = "cpu" if torch_cuda == "cpu" else "cu" + torch_cuda.replace(".", "")[:3]
    env = {**os.environ, "STACKGATE_DEVICE": "cuda", "STACKGATE_EXPECT_CUDA": variant,
           "STACKGATE_NPROC_PER_NODE": str(host.gpu_count), "STACKGATE_EXPECT_TRANSPORT": "any",
           "STACKGATE_RESULTS": str(tmp_path / "results.jsonl"), "STACKGATE_ARTIFACTS": str(tmp_path / "art")}
    junit = tmp_path / "junit.xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", str(shipped.BUNDLED_SUITE), "-p", "no:cacheprovider",
                           f"--junitxml={junit}", "-q"], env=env, cwd=shipped.BUNDLED_SUITE, capture_output=True,
                          text=True, timeout=1800, check=False)
    _keep([junit, tmp_path / "results.jsonl"], "host-suite", proc.stdout + proc.stderr)
    tests = suite.parse_junit([junit])
    failed = [t for t in tests if t.outcome in ("failed", "error")]
    assert not failed, "\n".join(f"{t.name}: {t.message[:500]}" for t in failed)
    assert any(t.name.endswith("test_cuda_usable_on_gpu_runner") and t.outcome == "passed" for t in tests)
    sizes = [t.name for t in tests if "test_collective_correctness[" in t.name]
    assert sizes and all(int(n.rsplit("[", 1)[1].rstrip("]")) <= host.gpu_count for n in sizes)


def test_stackgate_run_reaches_go_on_this_gpu_runner(host: fleet.LocalHost, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "stackgate", "run", "--candidate-python", sys.executable,
                           "--production-python", sys.executable, "--only", "local-*", "--run-id", "gpu"], cwd=tmp_path, capture_output=True, text=True, timeout=3600,
                          check=False)
    run_dir = tmp_path / "reports" / "gpu"
    _keep([run_dir / "report.json", run_dir / "report.md"], "stackgate-run", proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert json.loads((run_dir / "report.json").read_text())["decision"] == "GO"
