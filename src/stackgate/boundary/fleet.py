"""fleet.toml, as written: the runner pools (`[pool.<name>]`) and the registry a fleet shares
(`[registry]`, which stackgate.toml may hold too). Typed, ranged and closed: a typo is exit 2 at its line."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, ConfigDict, Field

from stackgate.boundary.base import Model, Name, Text
from stackgate.tomlfile import to_list

MAX_NODES = 4096  # nodes of a pool, and of a topology
MAX_GPUS_PER_NODE = 128


class PoolRow(Model):
    """One `[pool.<name>]`."""

    detect: bool = False
    driver: Name = ""
    gpu_class: Literal["datacenter", "consumer", "none"] = "none"
    gpu: Name = ""
    gpus_per_node: Annotated[int, Field(ge=0, le=MAX_GPUS_PER_NODE)] = 0
    transport: Literal["efa", "ib", "socket", "none", "any"] | None = None  # None: "any" if detected, else "none"
    nodes: Annotated[int, Field(ge=1, le=MAX_NODES)] = 1
    runs_on: Annotated[list[Name], BeforeValidator(to_list), Field(max_length=100)] = Field(default_factory=list)
    launcher: Literal["local", "slurm"] = "local"
    partition: Name = ""
    account: Name = ""
    constraint: Text = ""
    container: Literal["podman", "pyxis", "apptainer"] | None = None


class RegistryTable(Model):
    """`[registry]`: where stack images are pushed (url: host[:port][/path]) and the repository under it."""

    url: Name | None = None
    repository: Name | None = None


class FleetFile(Model):
    pool: Annotated[dict[Name, PoolRow], Field(max_length=10_000)]
    registry: RegistryTable | None = None


class RegistryOnly(Model):
    """`[registry]` of a file that holds more (stackgate.toml, fleet.toml): the rest is read elsewhere."""

    model_config = ConfigDict(extra="ignore")
    registry: RegistryTable = Field(default_factory=RegistryTable)
