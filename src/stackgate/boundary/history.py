"""Rows of the history database (reports/history.sqlite), typed. SQLite stores whatever it is given
in any column (NULL, a BLOB, text where a number belongs): a row that is not what stackgate writes
is skipped and named by the reader, never a crash."""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from pydantic import Field, ValidationError

from stackgate.boundary.base import Count, Model, Text, describe

Finite = Annotated[float, Field(allow_inf_nan=False)]


class RunRow(Model):
    run_id: Text
    matrix: Text
    channel: Text
    started: Text
    decision: Text
    candidate: Text
    summary: Text


class NightlyRun(Model):
    candidate: Text
    run_id: Text
    decision: Text
    finished: Text


class CellRow(Model):
    cell_id: Text
    status: Text


class RunStarted(Model):
    run_id: Text
    started: Text


class MetricRow(Model):
    role: Text
    metric: Text
    median: Finite


class CalibrationRow(Model):
    metric: Text
    sigma: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    pairs: Count
    recorded: Text


class PromotionRow(Model):
    at: Text
    who: Text
    action: Text
    run_id: Text
    stack: Text
    image: Text
    tag: Text
    previous: Text
    production_toml: Text
    previous_toml: Text
    run_dir: Text = ""  # the promoted run's directory ("" in a version 1 database)


class WatchRow(Model):
    at: Text
    run_id: Text
    check_name: Text
    state: Text
    findings: Count
    detail: Text


class CanaryRow(Model):
    at: Text
    run_id: Text
    pool: Text
    cell_id: Text
    suite: Text
    profile: Text
    metric: Text
    median: Finite
    baseline: Finite | None  # None: too few earlier canaries to compare with
    shift: Finite | None
    flagged: Annotated[int, Field(ge=0, le=1)]


class Garbage(bytes):
    """A text cell that is not UTF-8 (sqlite3's text_factory hands these back): no model accepts it."""


def text(raw: bytes) -> Any:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return Garbage(raw)


Row = TypeVar("Row", bound=Model)


def rows(kind: type[Row], found: list[tuple[Any, ...]], table: str, skipped: list[str] | None) -> list[Row]:
    """Each row as `kind`, in order; a row that is not one is left out and said in `skipped`."""
    out = []
    names = list(kind.model_fields)
    for number, row in enumerate(found, start=1):
        try:
            out.append(kind.model_validate(dict(zip(names, row, strict=True))))
        except (ValidationError, ValueError) as exc:
            why = describe(exc) if isinstance(exc, ValidationError) else str(exc)
            if skipped is not None:
                skipped.append(f"{table} row {number}: {why[:200]}")
    return out
