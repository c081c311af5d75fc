"""Runs the FSDP + all-reduce + DCP job under torchrun, as a team's own suite would."""

import os
import subprocess
import sys
from pathlib import Path


def test_fsdp_allreduce_dcp_under_torchrun(tmp_path: Path) -> None:
    job = Path(__file__).with_name("fsdp_job.py")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(job), str(tmp_path / "ckpt")], capture_output=True, text=True, timeout=300,
                          check=False, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (tmp_path / "ckpt" / ".metadata").exists()
