"""The fleet: the runner pools of `fleet.toml` (what each offers, how its cells are launched), the
machine at hand (`detect_local`: nvidia-smi, run once and passed in), and which pools this runner
serves (`--pool`)."""

from __future__ import annotations

import difflib
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from stackgate import tomlfile
from stackgate.boundary import fleet as boundary
from stackgate.boundary.fleet import FleetFile, PoolRow
from stackgate.errors import ConfigError
from stackgate.model import GpuClass, RunnerPool, SlurmSpec, Transport
from stackgate.versions import Driver, parse_driver

MAX_NODES = boundary.MAX_NODES  # nodes of a pool, and of a topology
MAX_PROCS_PER_NODE = 1024
_DATACENTER = re.compile(r"\b(A100|A800|A10G?|A30|A40|H100|H800|H200|GH200|H20|B100|B200|B300|GB200|GB300|L4|L20|"
                         r"L40S?|T4|V100)\b", re.I)


@dataclass(frozen=True)
class LocalHost:
    """What the machine at hand offers, from nvidia-smi (or nothing)."""

    driver: Driver | None = None
    gpu: str = ""
    gpu_count: int = 0

    @property
    def gpu_class(self) -> GpuClass:
        if self.driver is None:
            return GpuClass.NONE
        return GpuClass.DATACENTER if _DATACENTER.search(self.gpu) else GpuClass.CONSUMER


def detect_local(nvidia_smi: str | None = None) -> LocalHost:
    """Query nvidia-smi; a missing or failing tool means a CPU runner.

    nvidia-smi can exit 0 with a crashed driver; the per-GPU query below fails in that case, as
    PyTorch's CI health probe relies on.
    """
    exe = nvidia_smi or shutil.which("nvidia-smi")
    if not exe:
        return LocalHost()
    try:
        proc = subprocess.run(
            [exe, "--query-gpu=driver_version,name", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return LocalHost()
    return parse_nvidia_smi(proc.stdout) if proc.returncode == 0 else LocalHost()


def parse_nvidia_smi(text: str) -> LocalHost:
    rows = [line.split(",") for line in text.strip().splitlines() if line.strip()]
    rows = [r for r in rows if len(r) >= 2 and "ERR" not in r[0]]
    if not rows:
        return LocalHost()
    return LocalHost(driver=parse_driver(rows[0][0].strip()), gpu=rows[0][1].strip(), gpu_count=len(rows))


def load_pools(path: Path, local: LocalHost) -> dict[str, RunnerPool]:
    """fleet.toml's pools (`boundary.fleet.FleetFile`: each key typed and ranged, exit 2 at its line);
    a detected pool takes this machine's driver, GPUs and their count."""
    doc = tomlfile.load(path)
    found = tomlfile.validate(doc, FleetFile)
    pools: dict[str, RunnerPool] = {}
    for name, row in found.pool.items():
        if not re.fullmatch(r"[a-z0-9][a-z0-9\-]*", name):
            raise doc.error(f"pool name {name!r} must be lower-case letters, digits and '-'", "pool", name)
        slurm = _slurm(doc, row, name)
        # the expected network is what the pool declares; a detected pool that declares none expects "any"
        transport = Transport(row.transport or ("any" if row.detect else "none"))
        if row.detect:
            pools[name] = RunnerPool(
                name=name, driver=local.driver, gpu_class=local.gpu_class, gpu=local.gpu or "cpu",
                gpus_per_node=local.gpu_count, transport=transport if local.gpu_count else Transport.NONE,
                nodes=row.nodes, is_local=True, runs_on=tuple(row.runs_on), slurm=slurm,
            )
            continue
        pools[name] = RunnerPool(
            name=name,
            driver=tomlfile.parsed(doc, parse_driver, row.driver, "pool", name, "driver") if row.driver else None,
            gpu_class=GpuClass(row.gpu_class),
            gpu=row.gpu,
            gpus_per_node=row.gpus_per_node,
            transport=transport,
            nodes=row.nodes,
            runs_on=tuple(row.runs_on),
            slurm=slurm,
        )
    return pools


def _slurm(doc: tomlfile.Doc, row: PoolRow, name: str) -> SlurmSpec | None:
    """`launcher = "slurm"` with its partition/account/constraint/container; those keys without it are an error."""
    found = {"partition": row.partition, "account": row.account, "constraint": row.constraint,
             "container": row.container or ""}
    if row.launcher == "local":
        given = [k for k, v in found.items() if v]
        if given:
            raise doc.error(f"pool {name}: {', '.join(given)} only apply with launcher = \"slurm\"", "pool", name,
                            given[0])
        return None
    return SlurmSpec(**found)


def assign_runner(pools: Mapping[str, RunnerPool], names: Sequence[str], fleet: Path) -> dict[str, RunnerPool]:
    """This runner declares which pools it serves (`--pool`): exactly those run here, whatever their
    names; every other pool, detected or not, is "not run here". No names: the detected pools run."""
    if not names:
        return dict(pools)
    for name in names:
        if name not in pools:
            close = difflib.get_close_matches(name, list(pools), n=1)
            raise ConfigError(f"--pool {name}: no such runner pool in {fleet}",
                              hint=f"did you mean '{close[0]}'?" if close else f"pools: {', '.join(sorted(pools))}")
    return {n: replace(p, is_local=n in names) for n, p in pools.items()}
