"""A matrix file (matrix/upgrade.toml, nightly.toml, a team's own) and production.toml, as written:
the axes, the CPU pools' axes, `[[include]]`/`[[exclude]]` rules, the wheel source, stacks a team
already has (`[[stack]]`), and production's versions. Typed and closed: a typo is exit 2 at its line;
the versions themselves are parsed by `matrix.load_matrix`, at the same line."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from stackgate.boundary.base import Model, Name, Text
from stackgate.tomlfile import to_list

Names = Annotated[list[Name], BeforeValidator(to_list), Field(max_length=1000)]
Axis = Annotated[list[Name], BeforeValidator(to_list), Field(min_length=1, max_length=1000)]  # a value, at least


def _node() -> list[str]:
    return ["node"]


def _one_by_two() -> list[str]:
    return ["1x2"]


class CpuAxes(Model):
    """`[matrix.cpu]`: the axes of CPU pools (their CUDA variants default to the matrix's)."""

    cuda: Axis | None = None
    topology: Annotated[list[Name], BeforeValidator(to_list), Field(max_length=1000)] = Field(
        default_factory=_one_by_two)


class MatrixTable(Model):
    name: Name | None = None
    channel: Literal["stable", "nightly", "test"] = "stable"
    pools: Axis
    torch: Axis
    cuda: Axis
    python: Axis
    topology: Axis = Field(default_factory=_node)
    required: Names = Field(default_factory=list)
    cpu: CpuAxes = Field(default_factory=CpuAxes)
    fallback: Literal["", "last-green"] = ""


class IncludeRow(Model):
    """`[[include]]`: one more cell (its values range-checked like the axes')."""

    pool: Name
    cuda: Name | None = None
    torch: Name | None = None
    python: Name | None = None
    topology: Name | None = None


class ExcludeRow(Model):
    """`[[exclude]]`: cells to drop (its values are globs)."""

    pool: Name | None = None
    cuda: Name | None = None
    torch: Name | None = None
    python: Name | None = None
    topology: Name | None = None


class SourceTable(Model):
    """`[source]`: where the candidate's wheels come from."""

    name: Name = "default"
    index_url: Text | None = None
    extra_index_urls: Names = Field(default_factory=list)
    find_links: Names = Field(default_factory=list)
    inherit_pip_config: bool = True
    pre: bool = False


class StackRow(Model):
    """`[[stack]]`: a stack the team already has, an interpreter on this host or an image."""

    role: Literal["candidate", "production"] = "candidate"
    backend: Name | None = None
    python: Text = ""
    image: Text = ""


class MatrixFile(Model):
    matrix: MatrixTable
    include: Annotated[list[IncludeRow], Field(max_length=10_000)] = Field(default_factory=list)
    exclude: Annotated[list[ExcludeRow], Field(max_length=10_000)] = Field(default_factory=list)
    source: SourceTable = Field(default_factory=SourceTable)
    stack: Annotated[list[StackRow], Field(max_length=10)] = Field(default_factory=list)


class CpuProduction(Model):
    cuda: Name = "cpu"


class ProductionTable(Model):
    torch: Name
    cuda: Name
    python: Name
    cpu: CpuProduction = Field(default_factory=CpuProduction)
    run: Text = ""  # `stackgate promote`: the run that proved it
    images: Annotated[dict[Name, Annotated[str, Field(max_length=1000)]], Field(max_length=1000)] = Field(
        default_factory=dict)  # the tested images, by digest


class ProductionFile(Model):
    production: ProductionTable
