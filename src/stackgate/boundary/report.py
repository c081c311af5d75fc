"""report.json read back (by promote and bisect): the fields they use, typed as report/json_report.py
writes them. A report that is not one (a field of the wrong type, a decision that is not a decision, a
schema newer than this stackgate) is a ConfigError naming the file and the field: promote moves no tag
and writes no file on it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from stackgate.boundary.base import MAX_ITEMS, Model, Name, Text, parse_json, read_bytes
from stackgate.boundary.environment import Environment
from stackgate.errors import ConfigError
from stackgate.rundir.layout import RunDir

SCHEMA_VERSION = 1  # report.data.SCHEMA_VERSION: what this stackgate writes and reads
Items = Field(max_length=MAX_ITEMS)


class _Part(Model):
    model_config = ConfigDict(extra="ignore")


class RunInfo(_Part):
    id: Text = ""


class ReasonRow(_Part):
    severity: Name
    kind: Name = ""
    cell: Text = ""
    test: Text = ""
    message: Text = ""


class StackRow(_Part):
    torch: Name
    cuda: Name
    python: Name


class CellRow(_Part):
    id: Text
    role: Literal["production", "candidate"]
    status: Name
    device: Name = ""
    stack: StackRow
    environment: Environment = Field(default_factory=Environment)


class Fact(_Part):
    what: Text
    production: Text
    candidate: Text


class PackageRow(_Part):
    name: Text
    production: Text | None = None
    candidate: Text | None = None


class StackDiffRow(_Part):
    production_cell: Text
    candidate_cell: Text
    facts: Annotated[list[Fact], Items] = Field(default_factory=list)
    packages: Annotated[list[PackageRow], Items] = Field(default_factory=list)


class ComparisonRow(_Part):
    cell: Text
    metric: Text
    change: Annotated[float, Field(allow_inf_nan=False)] | None = None
    outcome: Name


class KnownFinding(_Part):
    advisory: Text
    package: Text
    aliases: Annotated[list[Text], Items] = Field(default_factory=list)


class Scan(_Part):
    stack: Text = ""
    scanned: bool = False
    findings: Annotated[list[KnownFinding], Items] = Field(default_factory=list)


class SupplyPair(_Part):
    """One candidate stack's scan beside production's (`watch` reads what was known at a promotion)."""

    cell: Text = ""
    candidate: Scan | None = None


class Report(_Part):
    schema_version: Annotated[int, Field(ge=1, le=SCHEMA_VERSION)]
    decision: Literal["GO", "NO-GO", "INCONCLUSIVE"]
    run: RunInfo = Field(default_factory=RunInfo)
    reasons: Annotated[list[ReasonRow], Items] = Field(default_factory=list)
    cells: Annotated[list[CellRow], Items] = Field(default_factory=list)
    stack_diff: Annotated[list[StackDiffRow], Items] = Field(default_factory=list)
    new_warnings: Annotated[dict[Text, Annotated[list[Text], Items]], Items] = Field(default_factory=dict)
    comparisons: Annotated[list[ComparisonRow], Items] = Field(default_factory=list)
    supply_chain: Annotated[list[SupplyPair], Items] = Field(default_factory=list)


def read(run_dir: Path) -> Report:
    path = RunDir(run_dir).report_json
    raw = read_bytes(path, f"{run_dir} has no report.json: it is not a finished stackgate run",
                     hint="give the run directory (reports/<run-id>) or the run id of a finished run")
    newer = _schema(raw)
    if newer is not None and newer > SCHEMA_VERSION:
        raise ConfigError(f"{path} was written by a newer stackgate (schema_version {newer}; this one reads "
                          f"{SCHEMA_VERSION})", hint="upgrade stackgate to promote it")
    return parse_json(raw, Report, f"{path} is not a stackgate report",
                      hint="it was damaged or edited: re-run the gate (or --resume the run) to write it again; "
                           "nothing was promoted")


def _schema(raw: bytes) -> int | None:
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    version = data.get("schema_version") if isinstance(data, dict) else None
    return version if isinstance(version, int) and not isinstance(version, bool) else None
