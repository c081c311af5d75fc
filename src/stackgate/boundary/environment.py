"""A cell's environment: what its suite recorded (`{"kind": "environment", ...}`: torch, CUDA,
packages, sizes, loaded libraries) and what the harness adds (backend, image and digest, SBOM,
pressure, leftovers, record problems). The fields the harness reads are typed; a suite's own keys
are kept, as JSON, and only shown."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, JsonValue

from stackgate.boundary.base import Count, Model, Name, OpenModel, Text

Texts = Annotated[list[Text], Field(max_length=200_000)]
Table = Annotated[dict[Name, JsonValue], Field(max_length=10_000)]


class LoaderCopies(OpenModel):
    """Which copies of one library the loader can reach (the identity test's `loader_copies`)."""

    competing: Annotated[list[Text], Field(max_length=1000)] = Field(default_factory=list)


class MappedFile(OpenModel):
    """One file of a library that a process of the cell had mapped (the identity test's
    `mapped_libraries`, from /proc/self/maps): its real path and where it comes from."""

    path: Text
    origin: Name = ""  # "env" (the stack's environment), "system" or "outside"


Share = Annotated[float, Field(ge=0.0, le=1e6)]


class PressureRecord(Model):
    """What the runner measured around an attempt (pressure.Pressure.to_json): shares of the wall time
    the CPUs were stalled, stolen or throttled, and on which machine."""

    wall_s: Annotated[float, Field(ge=0.0, le=1e9)] = 0.0
    some: Share | None = None
    full: Share | None = None
    steal: Share | None = None
    throttled: Share | None = None
    interference: Share | None = None
    where: Text = ""


class EnvironmentFields(Model):
    """The typed fields: what the harness reads."""

    backend: Name = ""
    launcher: Name = ""
    env_key: Text = ""
    interpreter: Text = ""
    torch: Name | None = None
    cuda: Name | None = None
    python: Name | None = None
    packages: Texts = Field(default_factory=list)
    stack_packages: Texts = Field(default_factory=list)
    package_sizes: Annotated[dict[Name, Count], Field(max_length=10_000)] = Field(default_factory=dict)
    env_size: Count | None = None
    image: Text = ""
    image_id: Text = ""
    image_digest: Text = ""
    image_size: Count | None = None
    stack_label: Text = ""
    os_release: Text = ""
    os_packages: Texts = Field(default_factory=list)
    leftover_processes: Texts = Field(default_factory=list)
    record_problems: Texts = Field(default_factory=list)
    refused_links: Texts = Field(default_factory=list)
    cpus: Annotated[list[Count], Field(max_length=4096)] = Field(default_factory=list)
    pressure: PressureRecord | None = None
    suite_requirements: Table = Field(default_factory=dict)
    loader_copies: Annotated[dict[Name, LoaderCopies], Field(max_length=1000)] = Field(default_factory=dict)
    mapped_libraries: Annotated[dict[Name, Annotated[list[MappedFile], Field(max_length=1000)]],
                                Field(max_length=1000)] = Field(default_factory=dict)
    env_reused: bool | None = None
    env_prepare_s: Annotated[float, Field(ge=0)] | None = None


class Environment(EnvironmentFields, OpenModel):
    """A cell's environment. Built from records already validated (`records.EnvironmentRecord`) and
    from what the harness measured; `of` validates both strictly."""

    @classmethod
    def of(cls, data: Any) -> Environment:
        if isinstance(data, Environment):
            return data
        return cls.model_validate(data or {})

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_unset=True)

    def __bool__(self) -> bool:
        return bool(self.model_fields_set) or bool(self.model_extra)
