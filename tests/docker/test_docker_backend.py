"""The Docker tier, for real: image reuse and labels, 2 nodes x 2 processes over a docker network with
a killed rank in the same cell, and no CA bundle or secret in any layer."""

from __future__ import annotations

import io
import json
import re
import subprocess
import tarfile
import threading
import time
from pathlib import Path

from stackgate import suite
from stackgate.backends.base import EnvHandle
from stackgate.backends.docker import DockerBackend
from stackgate.model import Cell, GpuClass, Role, RunnerPool, Status, Topology
from stackgate.runner import run_cell
from stackgate.suite import RunContext
from tests.torch.test_interrupt import docker_leftovers

RECSYS_RANK = r"python[0-9.]* -u .*_worker\.py test_recsys:"  # a rank of the recsys trainer


def _cell(handle: EnvHandle, nodes: int, nproc: int) -> Cell:
    pool = RunnerPool("local", None, GpuClass.NONE, gpu="cpu", nodes=nodes, is_local=True)
    return Cell(handle.stack, pool, Topology(nodes, nproc), Role.CANDIDATE, required=True)


def test_image_is_reused_and_labelled(docker_backend: DockerBackend, cpu_image: EnvHandle, tmp_path: Path) -> None:
    again = docker_backend.prepare(cpu_image.stack, tmp_path / "build.log")
    assert again.reused and again.ref == cpu_image.ref
    labels = again.sbom["labels"]
    assert labels["org.stackgate.torch"] == "2.13.0+cpu"
    assert labels["org.stackgate.python"] == "3.11" and labels["org.stackgate.cuda"] == "cpu"
    assert labels["org.stackgate.base-digest"].startswith("sha256:")
    assert "torch==2.13.0+cpu" in again.sbom["packages"]


def test_single_node_cell_runs_torchrun_inside_its_container(docker_backend: DockerBackend, cpu_image: EnvHandle,
                                                           tmp_path: Path) -> None:
    spec = suite.SuiteSpec(pytest_args=("-k", "identity or test_collective_correctness"), profile="quick",
                           timeout_s=300)
    result = run_cell(docker_backend, _cell(cpu_image, 1, 2), cpu_image, RunContext("d1", tmp_path, spec))
    assert result.status is Status.PASSED, result.log_tail[-4000:]
    assert result.environment.torch == "2.13.0+cpu" and result.environment.backend == "docker"


def test_two_nodes_by_two_processes_fsdp_allreduce_and_a_killed_rank(docker_backend: DockerBackend,
                                                                     cpu_image: EnvHandle, tmp_path: Path) -> None:
    """One 2-node x 2-process cell over a docker network, many assertions: the all-reduce checks and FSDP2
    with a distributed checkpoint across the two containers (world size 4); a rank of the recsys trainer
    killed mid-test fails that test (and the cell) within the distributed timeout while the next test
    completes; every node's log is kept; no container or network is left."""
    timeout = 300
    spec = suite.SuiteSpec(pytest_args=("-k", "test_collective_correctness or test_recsys or test_vit"),
                           profile="quick", timeout_s=timeout,
                           env=(("STACKGATE_DIST_TIMEOUT", "60"),))  # a rank left hanging fails within a minute
    before = frozenset(docker_leftovers())  # what an earlier run on this machine left is not this test's
    killed: list[str] = []

    def kill_one_recsys_rank() -> None:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not killed:
            names = subprocess.run(["docker", "ps", "--format", "{{.Names}}", "--filter", "name=-node1"],
                                   capture_output=True, text=True, check=False).stdout.split()
            for name in names:
                # a rank's command line is `python -u .../_worker.py MODULE:FUNCTION ...`; torchrun's is `python -m torch...`
                found = subprocess.run(["docker", "exec", name, "pgrep", "-f", RECSYS_RANK], capture_output=True,
                                       text=True, check=False).stdout.split()
                if found:
                    subprocess.run(["docker", "exec", name, "pkill", "-9", "-n", "-f", RECSYS_RANK], check=False)
                    killed.append(name)
                    return
            time.sleep(0.3)

    killer = threading.Thread(target=kill_one_recsys_rank)
    killer.start()
    start = time.monotonic()
    result = run_cell(docker_backend, _cell(cpu_image, 2, 2), cpu_image, RunContext("dmn", tmp_path, spec))
    killer.join()
    assert killed, "the test could not find a recsys rank to kill"
    assert result.status is Status.FAILED, result.log_tail[-4000:]
    assert time.monotonic() - start < timeout
    outcomes = {t.name: t for t in result.tests}
    recsys = outcomes["test_recsys.py::test_recsys_ddp_sharded_embeddings"]
    assert recsys.outcome == "failed" and "rank" in recsys.message
    assert outcomes["test_vit_fsdp.py::test_vit_fsdp2_mixed_precision_dcp_resume"].outcome == "passed"
    assert outcomes["test_collectives.py::test_collective_correctness[2]"].outcome == "passed"
    wrong = next(m for m in result.metrics if m.name == "collective_wrong_elements")
    assert dict(wrong.tags)["world_size"] == "4"
    assert (tmp_path / "cells" / result.cell_id / "node1.log").read_text()  # every node's log is kept
    assert docker_leftovers(before) == [], "containers and networks must always be removed"


def _pem_bodies(text: str) -> set[str]:
    return {re.sub(r"\s+", "", m) for m in re.findall(r"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----",
                                                      text, re.S)}


def test_no_ca_bundle_or_secret_in_any_layer(docker_backend: DockerBackend, cpu_image: EnvHandle,
                                             tmp_path: Path) -> None:
    host_bundle = Path(docker_backend.ca_bundle or "/etc/ssl/certs/ca-certificates.crt")
    host_bytes = host_bundle.read_bytes()
    host_certs = _pem_bodies(host_bytes.decode(errors="replace"))
    history = subprocess.run(["docker", "history", "--no-trunc", "--format", "{{.CreatedBy}}", cpu_image.ref],
                             capture_output=True, text=True, check=True).stdout
    assert str(host_bundle) not in history and "PIP_CERT" not in history and "--cert" not in history
    saved = tmp_path / "image.tar"
    subprocess.run(["docker", "save", "-o", str(saved), cpu_image.ref], check=True)
    public: set[str] = set()
    layer_files: list[tuple[str, bytes]] = []
    with tarfile.open(saved) as outer:
        manifest = json.load(outer.extractfile("manifest.json"))  # type: ignore[arg-type]
        config = json.load(outer.extractfile(manifest[0]["Config"]))  # type: ignore[arg-type]
        env = " ".join(config.get("config", {}).get("Env") or [])
        assert not re.search(r"(TOKEN|PASSWORD|SECRET|PIP_CERT|REQUESTS_CA_BUNDLE|SSL_CERT_FILE)", env), env
        for layer in manifest[0]["Layers"]:
            with tarfile.open(fileobj=io.BytesIO(outer.extractfile(layer).read())) as inner:  # type: ignore[union-attr]
                for member in inner:
                    if not member.isfile():
                        continue
                    name = member.name
                    assert not name.endswith(("pip.conf", ".netrc", ".pypirc")), name
                    if member.size > 5_000_000 and not name.endswith((".crt", ".pem")):
                        continue
                    data = inner.extractfile(member).read()  # type: ignore[union-attr]
                    assert data != host_bytes, f"the host CA bundle was baked into {name}"
                    if name.endswith("ca-certificates.crt"):
                        public |= _pem_bodies(data.decode(errors="replace"))  # Debian's own public store
                    if b"BEGIN CERTIFICATE" in data:
                        layer_files.append((name, data))
    host_only = host_certs - public  # the host's private (proxy / corporate) CAs; empty on a stock host
    for name, data in layer_files:
        bodies = _pem_bodies(data.decode(errors="replace"))
        leaked = bodies & host_only
        assert not leaked, f"{name} carries {len(leaked)} certificate(s) from the host's private bundle"


def test_upgrade_torch_with_docker_builds_both_images_then_rebuilds_nothing(engine: object, tmp_path: Path) -> None:
    """Issue #3's acceptance: images for 2.13.0+cpu and 2.14.1, the suite in each, reports; a rerun reuses.
    The trainers are left out here, as in the venv tier's twin: CI's README main command (Docker, the
    default backend) runs the whole suite in these images right after the tests."""
    import os

    from tests.torch.test_end_to_end import check_upgrade_run
    cache = Path(os.environ.get("STACKGATE_CACHE_DIR", Path.home() / ".cache" / "stackgate"))
    check_upgrade_run(tmp_path, cache, "docker")


def test_sigterm_mid_cell_removes_containers_and_networks_and_resume_finishes(engine: object, tmp_path: Path) -> None:
    """Issue 9's cancellation test with the Docker backend: no container or network is left behind."""
    import os

    from tests.torch.test_interrupt import check_cancel_and_resume
    cache = Path(os.environ.get("STACKGATE_CACHE_DIR", Path.home() / ".cache" / "stackgate"))
    check_cancel_and_resume(tmp_path, cache, "docker")


def test_a_cached_image_that_no_longer_imports_torch_is_rebuilt(docker_backend: DockerBackend, cpu_image: EnvHandle,
                                                                 tmp_path: Path) -> None:
    """#18 item 3 on the Docker tier: a cached image is checked before it is reused. Here the stack's
    tag is replaced by an image whose torch/__init__.py is truncated; the next prepare finds it
    (`python -c 'import torch'` fails in a container), removes it and builds the stack's image again."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "Dockerfile").write_text(f"FROM {cpu_image.ref}\nUSER root\n"
                                       "RUN find / -path '*site-packages/torch/__init__.py' -exec truncate -s 12 {} +\n")
    subprocess.run(["docker", "build", "-q", "-t", cpu_image.ref, str(broken)], check=True, capture_output=True)
    said: list[str] = []
    docker_backend.say = said.append
    try:
        again = docker_backend.prepare(cpu_image.stack, tmp_path / "build.log")
    finally:
        docker_backend.say = print
    assert not again.reused and again.ref == cpu_image.ref
    assert any(f"cached image {cpu_image.ref} is broken" in line and "import torch" in line for line in said), said
    ran = subprocess.run(["docker", "run", "--rm", again.ref, "python", "-c", "import torch; print(torch.__version__)"],
                         capture_output=True, text=True, check=False)
    assert ran.returncode == 0 and ran.stdout.strip() == "2.13.0+cpu", ran.stderr[-500:]


def test_a_cells_containers_get_the_planned_environment_and_no_host_secret(engine, cpu_image: EnvHandle,
                                                                           tmp_path: Path) -> None:
    """#19 item 11 on the Docker tier: what the engine is asked to start (what `docker inspect` of a
    cell's container shows as Config.Env) holds the plan's variables and none of the host's secrets;
    a value passed explicitly and printed by a test is masked in the result."""
    import os

    from stackgate import compat, masking, sources
    from stackgate.backends.docker.engine import ContainerSpec
    env = {**os.environ, "GITHUB_TOKEN": "ghp-docker-canary", "AWS_SECRET_ACCESS_KEY": "aws-docker-canary"}
    backend = DockerBackend(engine, Path(os.environ.get("STACKGATE_CACHE_DIR", Path.home() / ".cache" / "stackgate")),
                            compat.load_compat(Path(__file__).resolve().parents[2] / "matrix" / "compat.toml"),
                            sources.read_pip_config(env), env, suite_dir=suite.BUNDLED_SUITE, say=print)
    started: list[ContainerSpec] = []
    inspected: dict[str, list[str]] = {}  # container name -> `docker inspect`'s Config.Env, while it runs
    real = engine.run_group

    def recording(specs, **kwargs):  # type: ignore[no-untyped-def]
        started.extend(specs)
        stop = threading.Event()

        def inspect() -> None:
            while not stop.is_set():
                for s in specs:
                    if s.name not in inspected:
                        got = subprocess.run(["docker", "inspect", "--format", "{{json .Config.Env}}", s.name],
                                             capture_output=True, text=True, check=False)
                        if got.returncode == 0:
                            inspected[s.name] = json.loads(got.stdout)
                time.sleep(0.2)
        watcher = threading.Thread(target=inspect, daemon=True)
        watcher.start()
        try:
            return real(specs, **kwargs)
        finally:
            stop.set()
            watcher.join()

    backend.engine = type("Recording", (), {"run_group": staticmethod(recording),
                                            "__getattr__": lambda self, name: getattr(engine, name)})()
    user_suite = tmp_path / "suite"
    user_suite.mkdir()
    (user_suite / "test_env.py").write_text(
        "import os\n\ndef test_env():\n    assert os.environ.get('GITHUB_TOKEN') is None\n"
        "    assert False, f\"HF_TOKEN={os.environ.get('HF_TOKEN')}\"\n")
    spec = suite.SuiteSpec(path=user_suite, platform_checks=False, timeout_s=300,
                           env=(("HF_TOKEN", "hf-docker-canary"),))
    ctx = RunContext("d11", tmp_path / "run", spec, mask=masking.Masker.of(env, spec.env))
    result = ctx.mask.result(run_cell(backend, _cell(cpu_image, 1, 2), cpu_image, ctx))
    cell_specs = [s for s in started if s.mounts]
    assert cell_specs and all("GITHUB_TOKEN" not in s.env and "AWS_SECRET_ACCESS_KEY" not in s.env
                              for s in cell_specs)
    assert all(s.env["HF_TOKEN"] == "hf-docker-canary" for s in cell_specs)  # passed explicitly: the suite has it
    seen = [inspected[s.name] for s in cell_specs if s.name in inspected]
    assert seen, f"no cell container was inspected while it ran: {inspected}"
    for env_list in seen:  # what the engine really gave the container
        names = {e.split("=", 1)[0] for e in env_list}
        assert "GITHUB_TOKEN" not in names and "AWS_SECRET_ACCESS_KEY" not in names, env_list
        assert "HF_TOKEN=hf-docker-canary" in env_list and "STACKGATE_RUN_ID=d11" in env_list
        assert not any("canary" in e for e in env_list if not e.startswith("HF_TOKEN="))
    [outcome] = result.tests
    assert outcome.outcome == "failed" and "HF_TOKEN=***" in outcome.message and "canary" not in outcome.message
    left = subprocess.run(["docker", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True,
                          check=True).stdout.split()
    assert not {s.name for s in started} & set(left)  # the cell's containers (and the check's) are gone


DAEMON = """
import subprocess


def test_starts_a_daemon():
    # a session of its own: in a container it still dies with the container, but it must be named
    subprocess.Popen(["sleep", "1001"], start_new_session=True)
"""


def test_a_daemon_that_outlives_the_suite_is_ended_and_named_by_the_container(docker_backend: DockerBackend,
                                                                             cpu_image: EnvHandle,
                                                                             tmp_path: Path) -> None:
    """#19 item 10 on the Docker tier: the node container's init ends what the suite left running and
    names it; the cell's result carries it as a leftover and no container is left."""
    user_suite = tmp_path / "suite"
    user_suite.mkdir()
    (user_suite / "test_daemon.py").write_text(DAEMON)
    spec = suite.SuiteSpec(path=user_suite, platform_checks=False, timeout_s=300)
    cell = _cell(cpu_image, 1, 1)
    result = run_cell(docker_backend, cell, cpu_image, RunContext("d10", tmp_path / "run", spec))
    assert result.status is Status.PASSED, result.log_tail[-3000:]
    left = result.environment.leftover_processes
    assert left and "sleep 1001" in left[0], result.environment
    names = subprocess.run(["docker", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True,
                           check=True).stdout.split()
    assert not [n for n in names if n.startswith("sg-d10")], names
    assert subprocess.run(["pgrep", "-f", "sleep 1001"], capture_output=True, check=False).returncode == 1
