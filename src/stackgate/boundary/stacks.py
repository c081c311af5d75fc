"""stacks.json, which `stackgate build --push` writes and every pool runner reads (`--stacks`): each
stack (label and content hash) -> its image by digest, the content key it was built from, its size
and its SBOM's digest. A file that is not one (a field missing, unknown or of the wrong type, an image
named by tag, an entry filed under another stack) is a ConfigError naming the file and the field."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from stackgate.boundary.base import Count, Model, Name, Text, parse_json, read_bytes

SCHEMA = 1
# what a pool runner pulls: repo@sha256:<64 hex> (a tag can move)
DIGEST_REF = r"^[a-z0-9][^@\s]*@sha256:[0-9a-f]{64}$"


class StackEntry(Model):
    stack: Name  # label and content hash, e.g. cpu-torch2.13.0-py3.11-1a2b3c4d
    image: Annotated[str, Field(max_length=1000, pattern=DIGEST_REF)]
    key: Name
    size: Count
    sbom_digest: Name
    torch: Name
    cuda: Name
    python: Name


class StacksFile(Model):
    schema_: Literal[1] = Field(alias="schema")
    registry: Text = ""
    stacks: Annotated[dict[Name, StackEntry], Field(max_length=10_000)]

    @model_validator(mode="after")
    def _filed_under_their_own_label(self) -> StacksFile:
        for label, entry in self.stacks.items():
            if entry.stack != label:
                raise ValueError(f"stacks.{label}: the entry is stack {entry.stack!r}, filed under another label")
        return self


def read(path: Path) -> StacksFile:
    raw = read_bytes(path, f"--stacks {path}: no such file",
                     hint="`stackgate build --push` writes it (or pass the file your build job produced)")
    return parse_json(raw, StacksFile, f"--stacks {path}: not a stacks.json of schema {SCHEMA}",
                      hint="write it with `stackgate build --push`; a pool runner pulls each stack by digest "
                           "(repo@sha256:<64 hex>), never by tag")
