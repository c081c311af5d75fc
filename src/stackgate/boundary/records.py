"""A suite's records (`$STACKGATE_RESULTS`, results-node<N>.jsonl): metric, environment and warning
lines, as the README's "Contract" defines them. A line that is not one of them, or that breaks its
meaning (a `better` that is neither lower, higher nor equal; a sample that is a string, a boolean or,
for a performance metric, not finite; one name and tags recorded twice), is unreadable evidence: the
cell is ERROR, quoting the line."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, TypeAdapter, ValidationError, model_validator

from stackgate.boundary.base import MAX_INT, MAX_NAME, Model, Name, OpenModel, Sample, Text, describe, quote
from stackgate.boundary.environment import Environment, EnvironmentFields
from stackgate.model import Metric

MAX_RECORD_BYTES = 1 << 20  # one JSON line of $STACKGATE_RESULTS
MAX_RECORDS_BYTES = 16 << 20  # all of one node's results file
MAX_SAMPLES = 20_000  # samples of one metric
MAX_TAGS = 32
Better = Literal["lower", "higher", "equal"]


class MetricRecord(Model):
    kind: Literal["metric"] = "metric"
    name: Annotated[str, Field(min_length=1, max_length=MAX_NAME)]
    unit: Name = ""
    samples: Annotated[tuple[Sample, ...], Field(min_length=1, max_length=MAX_SAMPLES)] | None = None
    value: Sample | None = None
    test: Text = ""
    better: Better = "lower"
    # a tag's value is text; an integer (a message size) is taken as its decimal text, nothing else
    tags: Annotated[dict[Name, Name | Annotated[int, Field(ge=-MAX_INT, le=MAX_INT)]],
                    Field(max_length=MAX_TAGS)] = Field(default_factory=dict)
    nodeid: Text = ""

    @model_validator(mode="after")
    def _meaning(self) -> MetricRecord:
        if (self.samples is None) == (self.value is None):
            raise ValueError("a metric has either 'samples' (a list of numbers) or 'value' (one number), not "
                             + ("both" if self.samples is not None else "neither"))
        if self.better != "equal" and not all(math.isfinite(x) for x in self.all_samples):
            raise ValueError(f"a performance metric (better = {self.better!r}) has a sample that is NaN or infinite: "
                             "its samples must be finite numbers (a numerics series, better = 'equal', may hold them)")
        return self

    @property
    def all_samples(self) -> tuple[float, ...]:
        return self.samples if self.samples is not None else (self.value,)  # type: ignore[return-value]

    def to_metric(self) -> Metric:
        return Metric(name=self.name, unit=self.unit, samples=self.all_samples, test=self.test, better=self.better,
                      tags=tuple(sorted((k, str(v)) for k, v in self.tags.items())), nodeid=self.nodeid)


class EnvironmentRecord(EnvironmentFields, OpenModel):
    kind: Literal["environment"]


class WarningRecord(Model):
    kind: Literal["warning"]
    category: Name = "Warning"
    message: Text = ""
    test: Text = ""
    where: Text = ""


def _kind(value: Any) -> str:
    return str(value.get("kind", "metric")) if isinstance(value, dict) else "metric"


Record = Annotated[Annotated[MetricRecord, Tag("metric")] | Annotated[EnvironmentRecord, Tag("environment")]
                   | Annotated[WarningRecord, Tag("warning")], Discriminator(_kind)]
RECORD: TypeAdapter[MetricRecord | EnvironmentRecord | WarningRecord] = TypeAdapter(Record)


class Records:
    """What one attempt's nodes recorded, and every line that could not be read."""

    def __init__(self) -> None:
        self.metrics: list[Metric] = []
        self.environment: dict[str, Any] = {}
        self.warnings: list[str] = []
        self.problems: list[str] = []
        self._where: dict[str, str] = {}  # metric key -> file:line that recorded it

    def environment_model(self, extra: dict[str, Any]) -> Environment:
        return Environment.of({**self.environment, **extra})

    def add(self, where: str, raw: bytes | str, record: MetricRecord | EnvironmentRecord | WarningRecord) -> None:
        if isinstance(record, MetricRecord):
            metric = record.to_metric()
            first = self._where.get(metric.key)
            if first is not None:
                self.problems.append(f"{where}: unreadable record (metric {metric.key} recorded twice in one attempt, "
                                     f"first at {first}: which one counts is unknown): {quote(raw)}")
                self.metrics = [m for m in self.metrics if m.key != metric.key]
                return
            self._where[metric.key] = where
            self.metrics.append(metric)
        elif isinstance(record, EnvironmentRecord):
            self.environment.update(record.model_dump(mode="json", exclude={"kind"}, exclude_unset=True))
        else:
            text = f"{record.category}: {record.message}"
            if text not in self.warnings:
                self.warnings.append(text)

    def read(self, path: Path) -> None:
        """One node's results file: each line within the limits, valid UTF-8 and a record."""
        size = path.stat().st_size
        if size > MAX_RECORDS_BYTES:
            self.problems.append(f"{path.name}: {size} bytes of records, more than the limit of {MAX_RECORDS_BYTES} "
                                 "(unreadable evidence: nothing of this file is used)")
            return
        for number, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
            if not raw.strip():
                continue
            where = f"{path.name}:{number}"
            if len(raw) > MAX_RECORD_BYTES:
                self.problems.append(f"{where}: unreadable record (a line of {len(raw)} bytes, more than the limit of "
                                     f"{MAX_RECORD_BYTES}): {quote(raw, 120)}")
                continue
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                self.problems.append(f"{where}: unreadable record (not valid UTF-8: {exc.reason} at byte {exc.start}): "
                                     f"{quote(raw)}")
                continue
            try:
                record = RECORD.validate_json(raw)
            except ValidationError as exc:
                self.problems.append(f"{where}: unreadable record ({describe(exc)}): {quote(raw)}")
                continue
            self.add(where, raw, record)


def parse_records(paths: list[Path]) -> Records:
    out = Records()
    for path in paths:
        if path.exists():
            out.read(path)
    return out
