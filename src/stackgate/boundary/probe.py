"""What stackgate reads back from its own helpers and earlier runs besides results: a bisect's state
(bisect.json, read by `bisect --resume`) and the probe line a given stack's interpreter prints
(`stackgate-given <json>`, given.PROBE). A file or line that is not one is a ConfigError naming it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, JsonValue

from stackgate.boundary.base import Model, Name, Text, parse_json, read_bytes

Names = Annotated[list[Name], Field(max_length=100_000)]


class StepRow(Model):
    version: Name
    run_id: Name
    outcome: Literal["good", "bad", "skip"]
    exit_code: Annotated[int, Field(ge=-(1 << 31), le=1 << 31)]
    git_version: Name = ""


class BisectState(Model):
    bisect_id: Name
    good: Name
    bad: Name
    candidates: Names
    without_wheels: Names = Field(default_factory=list)
    steps: Annotated[list[StepRow], Field(max_length=100_000)] = Field(default_factory=list)
    only: Names = Field(default_factory=list)
    tests: Names = Field(default_factory=list)
    result: Annotated[dict[Name, JsonValue], Field(max_length=100)] | None = None  # what finish wrote


def read_bisect(path: Path) -> BisectState:
    return parse_json(read_bytes(path, f"{path}: no such file"), BisectState, f"{path} is not a bisect's state",
                      hint="it was damaged or edited: start the bisect again with --good and --bad")


class GivenProbe(Model):
    """The line a given stack's interpreter prints: its Python, torch build and packages, or the
    error importing torch."""

    python: Name = ""
    executable: Text = ""
    venv: bool = False
    torch: Name | None = None
    cuda: Name | None = None
    cudnn: Name | None = None
    nccl: Name | None = None
    packages: Annotated[list[Text], Field(max_length=100_000)] = Field(default_factory=list)
    error: Text | None = None


def parse_given(line: str, what: str) -> GivenProbe:
    return parse_json(line, GivenProbe, f"{what}: its probe answered with what is not a probe's line",
                      hint="is it a Python 3 interpreter, and is its stdout its own?")
