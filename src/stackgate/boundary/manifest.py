"""run.json, a run directory's manifest, read back (by --resume, merge and the reports): the run
definition, the selection, the options behind them, the host probe, the cells and the images each
stack ran. A manifest that is not one (a field of the wrong type, an unknown field, a definition that
is not strings) is a ConfigError naming the file and the field: nothing is merged or resumed on it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, JsonValue

from stackgate.boundary.base import MAX_ITEMS, Model, Name, Text, parse_json, read_bytes

Strings = Annotated[dict[Name, Text], Field(max_length=1000)]
Items = Field(max_length=MAX_ITEMS)


class ProbeRow(Model):
    """One pool's host probe on the runner that wrote the manifest (probe.ProbeResult.to_json)."""

    pool: Name
    status: Name
    evidence: Annotated[list[Text], Field(max_length=1000)] = Field(default_factory=list)
    facts: Annotated[dict[Name, JsonValue], Field(max_length=1000)] = Field(default_factory=dict)


class Manifest(Model):
    definition: Strings
    definition_hash: Name = ""
    selection: Strings = Field(default_factory=dict)
    options: Annotated[dict[Name, JsonValue], Field(max_length=1000)] = Field(default_factory=dict)
    stackgate_version: Name = ""
    cells: Annotated[list[Text], Items] = Field(default_factory=list)
    host_probe: Annotated[dict[Name, ProbeRow], Field(max_length=1000)] = Field(default_factory=dict)
    merged_from: Annotated[list[Text], Items] = Field(default_factory=list)
    # stack label -> the images its cells ran (by registry digest, else "local build"): what a merge compares
    stacks: Annotated[dict[Text, Annotated[list[Text], Field(max_length=1000)]], Items] = Field(default_factory=dict)

    @property
    def pools(self) -> str:
        return self.selection.get("pools", "?")


def read(path: Path) -> Manifest:
    raw = read_bytes(path, f"{path} is missing: {path.parent} is not a stackgate run (bundle)",
                     hint="a bundle is the run directory `stackgate run` wrote (reports/<run-id>)")
    return parse_json(raw, Manifest, f"{path} is not a stackgate manifest",
                      hint="a bundle is the run directory `stackgate run` wrote (reports/<run-id>); this one was "
                           "damaged, edited or written by another version")
