"""results.jsonl: one `ResultLine` per finished cell (model.CellResult as written). Read back by
resume, merge, calibrate and the report: every line is validated here, so a hand-edited or damaged
line is a problem naming the line and the field, never a crash or a number made of a string."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, ValidationError, field_validator

from stackgate.boundary.base import MAX_ITEMS, Model, Seconds, Text, describe
from stackgate.boundary.cell import CellRecord
from stackgate.boundary.environment import Environment
from stackgate.boundary.records import MetricRecord
from stackgate.model import CellResult, Outcome, Phase, Role, Status, TestOutcome


class TestLine(Model):
    __test__ = False  # not a pytest test class

    name: Annotated[str, Field(min_length=1, max_length=2000)]
    outcome: Outcome
    duration_s: Seconds = 0.0
    message: Text = ""


class ResultLine(Model):
    cell_id: Annotated[str, Field(min_length=1, max_length=2000)]
    role: Role
    status: Status
    reason: Text = ""
    duration_s: Seconds = 0.0
    cell: CellRecord = Field(default_factory=CellRecord)
    tests: Annotated[list[TestLine], Field(max_length=MAX_ITEMS)] = Field(default_factory=list)
    metrics: Annotated[list[MetricRecord], Field(max_length=MAX_ITEMS)] = Field(default_factory=list)
    environment: Environment = Field(default_factory=Environment)
    warnings: Annotated[list[Text], Field(max_length=MAX_ITEMS)] = Field(default_factory=list)
    log_tail: Text = ""
    phase: Annotated[str, Field(max_length=40)] = "main"
    against: Annotated[str, Field(max_length=2000)] = ""

    @field_validator("phase")
    @classmethod
    def _phase(cls, value: str) -> str:
        Phase.parse(value)  # a ValueError (a phase that is not one, a round beyond its bound) is the field's error
        return value

    def to_result(self) -> CellResult:
        metrics = tuple(m.to_metric() for m in self.metrics)
        keys = [m.key for m in metrics]
        if len(set(keys)) < len(keys):
            twice = next(k for k in keys if keys.count(k) > 1)
            raise ValueError(f"metric {twice} appears twice in one result")
        return CellResult(
            cell_id=self.cell_id, role=self.role, status=self.status, reason=self.reason,
            tests=tuple(TestOutcome(t.name, t.outcome, t.duration_s, t.message) for t in self.tests),
            metrics=metrics, environment=self.environment,
            warnings=tuple(self.warnings), log_tail=self.log_tail, duration_s=self.duration_s, cell=self.cell,
            phase=Phase.parse(self.phase), against=self.against)


def parse_line(raw: bytes | str) -> CellResult:
    """One line of results.jsonl; ValueError (naming the field) when it is not a result."""
    try:
        return ResultLine.model_validate_json(raw).to_result()
    except ValidationError as exc:
        raise ValueError(describe(exc)) from None


def cell_id_of(raw: bytes | str) -> str | None:
    """The cell a broken line was about, where that much can be read: its evidence becomes an error."""
    try:
        return _CellOnly.model_validate_json(raw).cell_id
    except ValidationError:
        return None


class _CellOnly(Model):
    model_config = {"extra": "ignore"}  # noqa: RUF012 (pydantic's config)
    cell_id: Annotated[str, Field(min_length=1, max_length=2000)]


def from_json(data: Any) -> CellResult:
    """A result given as JSON data (a result rewritten by the masker): validated as if read."""
    import json

    return parse_line(json.dumps(data, allow_nan=True))
