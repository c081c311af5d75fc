"""The GPU tier: the bundled suite on this host's torch with the nccl backend (world size 1, as NCCL
refuses two ranks on one GPU). Skipped where there is no GPU; `scripts/gpu-validate.sh` runs it on a
lent GPU machine and records the figures."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stackgate import matrix, suite

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def host() -> matrix.LocalHost:
    found = matrix.detect_local()
    if found.driver is None:
        pytest.skip("no NVIDIA GPU on this machine (nvidia-smi absent or failing)")
    return found


def test_suite_on_gpu_with_nccl(host: matrix.LocalHost, tmp_path: Path) -> None:
    torch_cuda = subprocess.run([sys.executable, "-c", "import torch;print(torch.version.cuda or 'cpu')"],
                                capture_output=True, text=True, check=True).stdout.strip()
    variant = "cpu" if torch_cuda == "cpu" else "cu" + torch_cuda.replace(".", "")
    env = {**os.environ, "STACKGATE_DEVICE": "cuda", "STACKGATE_EXPECT_CUDA": variant, "STACKGATE_NPROC_PER_NODE": "1",
           "STACKGATE_RESULTS": str(tmp_path / "results.jsonl"), "STACKGATE_ARTIFACTS": str(tmp_path / "art"),
           "STACKGATE_EXPECT_TRANSPORT": "none", "STACKGATE_PARAM_DTYPE": "bfloat16",
           "STACKGATE_WORLD_SIZES": "1"}
    junit = tmp_path / "junit.xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", str(suite.BUNDLED_SUITE), "-p", "no:cacheprovider",
                           f"--junitxml={junit}", "-q"],
                          env=env, cwd=suite.BUNDLED_SUITE, capture_output=True, text=True, timeout=1800, check=False)
    out_dir = Path(os.environ.get("STACKGATE_GPU_OUT", tmp_path))
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in (junit, tmp_path / "results.jsonl"):
        if f.exists():
            shutil.copy(f, out_dir / f.name)
    (out_dir / "pytest.log").write_text(proc.stdout + proc.stderr)
    tests = suite.parse_junit([junit])
    failed = [t for t in tests if t.outcome in ("failed", "error")]
    assert not failed, "\n".join(f"{t.name}: {t.message[:500]}" for t in failed)
    assert any(t.name.endswith("test_cuda_usable_on_gpu_runner") and t.outcome == "passed" for t in tests)
