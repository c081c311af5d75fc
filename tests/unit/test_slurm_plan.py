"""The Slurm launcher without a cluster: pools in fleet.toml, the job script, the parsers on
captured `scontrol` output, and each job state's mapping to a cell status (issue 12)."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest

from stackgate import fleet, pressure, suite
from stackgate.backends import slurm
from stackgate.backends.memory import Gauge, MemoryBackend
from stackgate.errors import ConfigError, InfraError, StackgateError
from stackgate.model import Cell, GpuClass, Role, RunnerPool, SlurmSpec, Stack, Status, Topology
from stackgate.runner import run_cell
from stackgate.suite import RunContext
from stackgate.versions import CudaVariant, parse_driver, parse_torch

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
STACK = Stack(parse_torch("2.14.1"), CudaVariant("cu130"), "3.11")


def test_a_pool_says_slurm_in_fleet_toml(tmp_path: Path) -> None:
    toml = tmp_path / "fleet.toml"
    toml.write_text('[pool.p5]\nlauncher = "slurm"\npartition = "gpu"\naccount = "ml"\ndriver = "580.65.06"\n'
                    'gpu_class = "datacenter"\ngpus_per_node = 8\nnodes = 2\n[pool.cpu]\nnodes = 1\n')
    pools = fleet.load_pools(toml, fleet.LocalHost())
    assert pools["p5"].slurm == SlurmSpec(partition="gpu", account="ml") and pools["cpu"].slurm is None
    toml.write_text('[pool.cpu]\nnodes = 1\npartition = "gpu"\n')
    with pytest.raises(StackgateError, match='partition only apply with launcher = "slurm"') as caught:
        fleet.load_pools(toml, fleet.LocalHost())
    assert f"{toml}:3" in str(caught.value)
    toml.write_text('[pool.cpu]\nlauncher = "pbs"\n')
    with pytest.raises(StackgateError, match="launcher = 'pbs'"):
        fleet.load_pools(toml, fleet.LocalHost())


def _gpu_cell(nodes: int = 2) -> Cell:
    pool = RunnerPool("p5", parse_driver("580.65.06"), GpuClass.DATACENTER, gpu="H100", gpus_per_node=8,
                      nodes=2, slurm=SlurmSpec(partition="gpu", account="ml", constraint="efa"))
    return Cell(STACK, pool, Topology(nodes, 8), Role.CANDIDATE)


def test_the_job_script_asks_for_the_pools_nodes_gpus_and_time(tmp_path: Path) -> None:
    script = slurm.job_script(_gpu_cell(), SlurmSpec("gpu", "ml", "efa"), name="sg-x-suite", label="suite",
                              scripts=tmp_path / "slurm", workdir=tmp_path, seconds=1801, port=29401)
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --time=31", "#SBATCH --partition=gpu",
                 "#SBATCH --account=ml", "#SBATCH --constraint=efa", "#SBATCH --gpus-per-node=8"):
        assert line in script.splitlines()
    assert 'export STACKGATE_SLURM_ENDPOINT="${addr:-$head}:29401"' in script
    assert slurm.time_limit(1) == 1 and slurm.time_limit(60) == 1 and slurm.time_limit(61) == 2


def test_each_node_runs_its_planned_command_with_the_jobs_rendezvous(tmp_path: Path) -> None:
    command = suite.NodeCommand(1, "suite", ("/venv/bin/python", "-m", "pytest", "it's quoted"),
                                {"STACKGATE_NODE_RANK": "1", "STACKGATE_RDZV_ENDPOINT": "$STACKGATE_SLURM_ENDPOINT"},
                                tmp_path)
    text = slurm.node_script(command, multi_node=True)
    assert "export STACKGATE_NODE_RANK=1" in text
    assert text.splitlines()[-2] == 'export STACKGATE_RDZV_ENDPOINT="$STACKGATE_SLURM_ENDPOINT"'
    assert text.splitlines()[-1] == "exec /venv/bin/python -m pytest 'it'\"'\"'s quoted'"


def test_parsers_on_captured_scontrol_output() -> None:
    assert slurm.parse_scontrol((DATA / "scontrol-timeout.txt").read_text()) == slurm.JobState(
        "TIMEOUT", 0, 15, "TimeLimit")
    assert slurm.parse_scontrol((DATA / "scontrol-completed.txt").read_text()) == slurm.JobState("COMPLETED", 0, 0,
                                                                                                  "None")
    assert slurm.parse_scontrol("slurm_load_jobs error: Invalid job id specified") is None
    assert slurm.parse_sacct("OUT_OF_MEMORY|0:125\n") == slurm.JobState("OUT_OF_MEMORY", 0, 125)
    assert slurm.parse_sacct("CANCELLED by 0|0:15\n") == slurm.JobState("CANCELLED", 0, 15)


class FakeCluster(slurm.SlurmBackend):
    """The launcher with sbatch and scontrol answered here: each node writes its exit code unless
    the job state says it was killed."""

    def __init__(self, state: str, codes: tuple[int, ...] = (0, 0), files: Mapping[str, str] | None = None) -> None:
        super().__init__(MemoryBackend(), forced=None, env={}, say=lambda _: None)
        self.final, self.codes, self.cancelled = state, codes, False
        self.files = dict(files or {})  # what the tasks write beside their scripts (the pressure snapshots)

    def _submit(self, batch: Path) -> str:
        scripts = batch.parent
        for name, text in self.files.items():
            (scripts / name).write_text(text)
        if self.final in ("COMPLETED", "FAILED"):
            for i, code in enumerate(self.codes):
                (scripts / f"node{i}-{batch.stem.split('-', 1)[1]}.exit").write_text(f"{code}\n")
        return "42"

    def _state(self, job: str) -> slurm.JobState:
        return slurm.JobState(self.final, 0, 0, "Reason")

    def _cancel(self, job: str) -> None:
        self.cancelled = True


def _run(backend: FakeCluster, tmp_path: Path) -> Status:
    cell = _gpu_cell()
    spec = suite.SuiteSpec(path=tmp_path / "mysuite", platform_checks=False, timeout_s=60)
    (tmp_path / "mysuite").mkdir(exist_ok=True)
    result = run_cell(backend, cell, backend.prepare(STACK, tmp_path / "b.log"), RunContext("r", tmp_path / "run", spec))
    return result.status


@pytest.mark.parametrize(("state", "codes", "status"), [
    ("TIMEOUT", (), Status.TIMEOUT),
    ("OUT_OF_MEMORY", (), Status.OOM),
    ("FAILED", (0, 1), Status.FAILED),  # node 1 exited 1: its own exit code, as pytest gave it
    ("COMPLETED", (0, 0), Status.ERROR),  # exit codes alone never make a pass: "reported no tests"
])
def test_job_states_map_to_cell_statuses(tmp_path: Path, state: str, codes: tuple[int, ...], status: Status) -> None:
    assert _run(FakeCluster(state, codes), tmp_path) is status


@pytest.mark.parametrize("state", ["NODE_FAIL", "BOOT_FAIL", "PREEMPTED", "CANCELLED"])
def test_the_cluster_failing_is_an_infra_error_not_a_verdict(tmp_path: Path, state: str) -> None:
    with pytest.raises(InfraError, match=f"job 42 (ended {state}|was cancelled outside stackgate)"):
        _run(FakeCluster(state), tmp_path)


def test_an_interrupt_cancels_the_job(tmp_path: Path) -> None:
    backend = FakeCluster("RUNNING")

    def interrupted(job: str) -> slurm.JobState:
        raise KeyboardInterrupt

    backend._state = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        _run(backend, tmp_path)
    assert backend.cancelled


def test_images_on_slurm_nodes_need_a_container_runtime_and_a_runtime_needs_images(tmp_path: Path) -> None:
    """#42: the docker backend's images run on Slurm nodes only through a container runtime; a runtime
    with the venv backend has no image to run: each is exit 2 naming the pool, before any job."""
    from stackgate.backends.base import Execution

    stack = Stack(parse_torch("2.13.0"), CudaVariant("cpu"), "3.11")
    cell = Cell(stack, RunnerPool("hpc", None, GpuClass.NONE, slurm=SlurmSpec(), is_local=True), Topology(1, 2),
                Role.CANDIDATE)
    exe = Execution(cell, tmp_path, tmp_path, tmp_path, tmp_path, "t")
    for inner, container, message in ((MemoryBackend(name="docker"), "", "need a container runtime"),
                                      (MemoryBackend(name="venv"), "podman", "backend prepares venvs")):
        backend = slurm.SlurmBackend(inner, forced=None, env={}, container=container)
        with pytest.raises(ConfigError, match=message) as caught:
            backend.layout(inner.prepare(stack, tmp_path / "b.log"), exe)
        assert "pool hpc" in str(caught.value)


def test_a_node_script_runs_with_the_allow_list_not_the_submitting_hosts_environment(tmp_path: Path) -> None:
    """#19 item 11 on Slurm: sbatch carries the submitter's environment over to the job by default."""
    import subprocess

    from stackgate.suite import NodeCommand
    command = NodeCommand(0, "suite", ("env",), {"STACKGATE_ROLE": "candidate", "HF_TOKEN": "given-explicitly"},
                          tmp_path)
    script = tmp_path / "node0.sh"
    script.write_text(slurm.node_script(command, multi_node=False))
    host = {"PATH": "/usr/bin:/bin", "HOME": "/root", "GITHUB_TOKEN": "ghp-canary", "AWS_SECRET_ACCESS_KEY": "aws",
            "NCCL_SOCKET_IFNAME": "eth0", "NCCL_API_KEY": "nope", "EDITOR": "vim", "SLURM_JOB_ID": "7",
            "STACKGATE_SLURM_ENDPOINT": "n1:29400"}
    ran = subprocess.run(["bash", str(script)], env=host, capture_output=True, text=True, check=True)
    seen = dict(line.split("=", 1) for line in ran.stdout.splitlines() if "=" in line)
    assert seen["STACKGATE_ROLE"] == "candidate" and seen["HF_TOKEN"] == "given-explicitly"  # the plan's own
    assert seen["NCCL_SOCKET_IFNAME"] == "eth0" and seen["SLURM_JOB_ID"] == "7" and seen["PATH"] == "/usr/bin:/bin"
    assert seen["STACKGATE_SLURM_ENDPOINT"] == "n1:29400"
    for gone in ("GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "NCCL_API_KEY", "EDITOR"):
        assert gone not in seen, gone


def test_each_task_measures_its_own_nodes_interference_around_its_command() -> None:
    """#22: a Slurm cell's pressure is its compute nodes', taken by the task itself (the submitting
    host's counters say nothing of the nodes)."""
    script = slurm.job_script(_gpu_cell(), SlurmSpec("gpu"), name="sg-x-suite", label="suite",
                              scripts=Path("/shared/s"), workdir=Path("/shared/w"), seconds=60, port=29400)
    task = script[script.index("bash -c "):]
    assert task.index("sg_snapshot > /shared/s/node${SLURM_NODEID}-suite.pressure-start") \
        < task.index("bash /shared/s/node${SLURM_NODEID}-suite.sh") \
        < task.index("sg_snapshot > /shared/s/node${SLURM_NODEID}-suite.pressure-end")
    ran = subprocess.run(["bash", "-c", f"{pressure.SNAPSHOT}; sg_snapshot"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": "n7"}, check=True).stdout
    counters = pressure.parse(ran)  # the real shell function on this machine, read back by the parser
    assert counters is not None and counters.at > 0 and counters.cpu_total
    assert pressure.snapshot_node(ran) == "n7"
    if Path("/proc/pressure/cpu").exists():
        assert counters.some_us is not None
    assert pressure.parse("node n7\n") is None  # cut short before its clock: nothing to measure with


def test_the_cells_pressure_is_its_busiest_nodes_not_the_submitting_hosts(tmp_path: Path) -> None:
    snapshots = {f"node{i}-suite.pressure-{w}": (DATA / f"pressure-n{i + 1}-{w}.txt").read_text()
                 for i in (0, 1) for w in ("start", "end")}
    backend = FakeCluster("FAILED", (0, 1), files=snapshots)
    cell = _gpu_cell()
    spec = suite.SuiteSpec(path=tmp_path / "mysuite", platform_checks=False, timeout_s=60)
    (tmp_path / "mysuite").mkdir()
    quiet_host = Gauge([0.0])
    result = run_cell(backend, cell, backend.prepare(STACK, tmp_path / "b.log"), RunContext("r", tmp_path / "run", spec),
                      gauge=quiet_host)
    seen = pressure.of_result(result.environment)
    assert seen is not None and seen.where == "slurm node n2"
    assert (round(seen.some or 0, 3), round(seen.steal or 0, 3), seen.throttled) == (0.45, 0.05, 0.0)
    assert seen.describe() == "CPU pressure (PSI some) 45%, steal 5%, throttled 0% on slurm node n2"
    killed = FakeCluster("TIMEOUT", files={k: v for k, v in snapshots.items() if k.endswith("start")})
    result = run_cell(killed, cell, killed.prepare(STACK, tmp_path / "b.log"), RunContext("k", tmp_path / "run2", spec),
                      gauge=Gauge([0.9]))
    seen = pressure.of_result(result.environment)  # no second snapshot: not measurable, and not the host's 90%
    assert seen is not None and seen.interference is None and seen.where.startswith("slurm node")


def test_a_nodes_share_is_taken_over_all_its_jobs_then_the_busiest_node_counts() -> None:
    n1 = [pressure.Pressure(10.0, some=0.1, where="n1"), pressure.Pressure(30.0, some=0.5, steal=0.2, where="n1")]
    n2 = [pressure.Pressure(40.0, some=0.3, where="n2")]
    worst = pressure.busiest([*n1, *n2])
    assert worst is not None and worst.where == "n1" and worst.wall_s == 40.0
    assert (round(worst.some or 0, 3), worst.steal) == (0.4, 0.2)  # (0.1 x 10 + 0.5 x 30) / 40; steal over the job offering it
    assert pressure.busiest([]) is None
