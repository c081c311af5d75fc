from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.torch.conftest import backend, cache_dir, torch_env  # noqa: F401  (the venv the jobs run)


@pytest.fixture(scope="session")
def slurm_cluster() -> str:
    """A running Slurm controller with at least two idle nodes (scripts/slurm-local-cluster.sh)."""
    problem = ""
    if shutil.which("sbatch") is None:
        problem = "Slurm's client commands are not installed"
    else:
        found = subprocess.run(["sinfo", "-h", "-o", "%D %T"], capture_output=True, text=True, check=False)
        nodes = sum(int(line.split()[0]) for line in found.stdout.splitlines() if line.split()[1:] == ["idle"])
        if found.returncode != 0 or nodes < 2:
            problem = f"no Slurm cluster with two idle nodes: {found.stdout.strip()} {found.stderr.strip()[-300:]}"
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Slurm tier (scripts/slurm-local-cluster.sh start): {problem}")
        pytest.skip(problem)
    return os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")
