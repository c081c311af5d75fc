"""compat.toml, as written: the driver each CUDA version needs (`[cuda."<version>"]`), CUDA forward
compatibility (`[forward_compat]`, its driver branches) and each torch series' CUDA variants, Pythons
and PyPI default build (`[torch."<series>"]`). Typed and closed: a typo is exit 2 at its line; the
versions themselves are parsed by `compat.load_compat`, at the same line."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from stackgate.boundary.base import Model, Name, Text
from stackgate.tomlfile import to_list

Names = Annotated[list[Name], BeforeValidator(to_list), Field(max_length=1000)]


class DriverRow(Model):
    min_driver: Name
    source: Text = ""


class BranchRow(Model):
    """A driver branch (its major, e.g. "580"): Long Term Support, Production or New Feature."""

    kind: Literal["ltsb", "pb", "nfb"]
    end_of_life: Name = ""


GpuClassName = Literal["datacenter", "consumer", "none"]


def _datacenter() -> list[GpuClassName]:
    return ["datacenter"]


class ForwardCompat(Model):
    gpu_classes: Annotated[list[GpuClassName], BeforeValidator(to_list)] = Field(default_factory=_datacenter)
    min_driver: Name = "535"
    source: Text = ""
    branches: Annotated[dict[Annotated[str, Field(pattern=r"^[0-9]{1,6}$")], BranchRow], Field(max_length=1000)] = Field(
        default_factory=dict)


class TorchRow(Model):
    cuda: Names
    python: Names
    pypi_default: Name = ""


class CompatFile(Model):
    cuda: Annotated[dict[Name, DriverRow], Field(max_length=1000)]
    forward_compat: ForwardCompat = Field(default_factory=ForwardCompat)
    torch: Annotated[dict[Name, TorchRow], Field(max_length=1000)]
