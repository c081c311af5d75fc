"""#42's acceptance, for real: a Slurm pool whose nodes run the stack's image with podman. The stack is
built and pushed to the real loopback registry (`stackgate build --push`: stacks.json names it by
digest), then `stackgate run --pool` as a pool runner: every cell is a job on 2 real slurmd nodes x 2
ranks, each task `podman run`s the image pulled by digest (FSDP2 with a distributed checkpoint and the
all-reduce checks across the nodes): GO. The same run when the registry no longer has the digest is an
infra error naming it and the node; no container is left (`podman ps -a`) after either. It lives in
the registry tier (it pushes through the one Docker engine) and needs the Slurm cluster too."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from stackgate.shipped import MATRIX_DIR
from tests.matrices import one_cpu_stack
from tests.registry.conftest import Registries
from tests.slurm.conftest import slurm_cluster  # noqa: F401  (the 2-node cluster)

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.slurm]
ROOT = Path(__file__).resolve().parents[2]
MATRIX = one_cpu_stack("podman-test", ["hpc"], "2x2")
# what this gate decides on: the two multi-node tests it selects (the bundled policy would also want the
# trainers' metrics and the other required tests, which the selection leaves out)
POLICY = """[required]
tests = ["test_vit_fsdp.py::test_vit_fsdp2_mixed_precision_dcp_resume", "test_collectives.py::test_collective_correctness*"]
"""
RUN = ("run", "--pool", "hpc", "--stacks", "stacks.json", "--matrix", "cfg/podman-test.toml", "--config-dir", "cfg",
       "--policy", "cfg/podman-policy.toml", "--profile", "quick", "--no-platform-checks", "--pytest-arg=-k",
       "--pytest-arg=test_collective_correctness or test_vit")


def _stackgate(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "stackgate", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=1800, check=False)
    print(f"$ stackgate {' '.join(args)}  -> exit {done.returncode}\n{done.stdout[-5000:]}{done.stderr[-3000:]}")
    return done


def _containers() -> list[str]:
    return subprocess.run(["podman", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True,
                          check=True).stdout.split()


def test_a_two_node_cell_runs_the_image_by_digest_with_podman_and_a_missing_digest_is_an_infra_error(
        tmp_path: Path, registries: Registries, slurm_cluster: str) -> None:  # noqa: F811
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed: .ci/run installs it (Debian's podman)")
    shutil.copytree(MATRIX_DIR, tmp_path / "cfg")
    (tmp_path / "cfg" / "fleet.toml").write_text(
        f'[registry]\nurl = "{registries.plain}"\nrepository = "stackgate-test/podman"\n\n'
        '[pool.hpc]\ngpu_class = "none"\nnodes = 2\nlauncher = "slurm"\npartition = "cpu"\ncontainer = "podman"\n')
    (tmp_path / "cfg" / "podman-test.toml").write_text(MATRIX)
    (tmp_path / "cfg" / "podman-policy.toml").write_text(POLICY)
    built = _stackgate(tmp_path, "build", "--push", "--matrix", "cfg/podman-test.toml", "--config-dir", "cfg")
    assert built.returncode == 0
    [image] = {s["image"] for s in json.loads((tmp_path / "stacks.json").read_text())["stacks"].values()}
    subprocess.run(["podman", "rmi", "-f", image], capture_output=True, check=False)  # the nodes pull it

    ran = _stackgate(tmp_path, *RUN, "--reports", "r", "--run-id", "go")
    assert ran.returncode == 0 and "GO (gating verdict GO, exit 0)" in ran.stdout
    results = [json.loads(line) for line in (tmp_path / "r" / "go" / "results.jsonl").read_text().splitlines()]
    main = [r for r in results if r["phase"] == "main"]
    assert {r["environment"].get("image_digest") for r in main} == {image}  # what every node ran
    assert all(r["environment"]["launcher"] == "slurm" for r in main)
    for result in main:
        outcomes = {t["name"]: t["outcome"] for t in result["tests"]}
        assert outcomes["test_vit_fsdp.py::test_vit_fsdp2_mixed_precision_dcp_resume"] == "passed"
        assert outcomes["test_collectives.py::test_collective_correctness[2]"] == "passed"
        wrong = next(m for m in result["metrics"] if m["name"] == "collective_wrong_elements")
        assert wrong["tags"]["world_size"] == "4" and wrong["samples"] == [0.0]  # 2 Slurm nodes x 2 ranks
        script = next((tmp_path / "r" / "go" / "cells" / result["cell_id"] / "slurm").glob("node1-suite.sh")).read_text()
        assert f"docker://{image}" in script and "--network host" in script
    manifest = json.loads((tmp_path / "r" / "go" / "run.json").read_text())
    assert all(v == [image] for v in manifest["stacks"].values())  # merge compares these across pools
    assert not _containers(), _containers()

    # the registry loses the digest (a retention policy): each node's pull fails, named
    host, _, repository = image.split("@")[0].partition("/")
    request = urllib.request.Request(f"http://{host}/v2/{repository}/manifests/{image.split('@')[1]}", method="DELETE")
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 202
    subprocess.run(["podman", "rmi", "-f", image], capture_output=True, check=False)
    gone = _stackgate(tmp_path, *RUN, "--reports", "r", "--run-id", "gone")
    assert gone.returncode == 3, gone.stdout[-3000:]
    results = [json.loads(line) for line in (tmp_path / "r" / "gone" / "results.jsonl").read_text().splitlines()]
    failed = [r for r in results if r["phase"] == "main"]
    assert failed and all(r["status"] == "infra-error" for r in failed), [r["status"] for r in failed]
    assert all("podman could not run the stack's image" in r["reason"] and image in r["reason"] for r in failed)
    assert all("node 0 (" in r["reason"] or "node 1 (" in r["reason"] for r in failed)
    assert not _containers(), _containers()
