"""policy.toml (or a suite's stackgate-policy.toml, or `--policy FILE`), as written: every table and
key typed, ranged and closed, so a typo is an error at its line, never a rule that gates nothing.
`policy.load_policy` turns it into the `Policy` the gate reads."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from stackgate.boundary.base import Model, Name, Text
from stackgate.tomlfile import to_date, to_list

# the choices a policy offers, spelled once: the file's model and the Policy the gate reads share them
PreexistingRule = Literal["go", "inconclusive"]
HarnessRule = Literal["inconclusive", "go"]
FlakyRule = Literal["inconclusive", "go", "no-go"]
Pairing = Literal["sequential", "concurrent"]
Clock = Literal["wall", "cpu", "device"]  # a step time's clock: its `clock` tag (none: wall)
PRESSURE_CLOCKS: tuple[Clock, ...] = ("wall", "device")  # the clocks interference moves (docs/performance.md)
Device = Literal["cpu", "cuda"]  # model.Cell.device
UnratedRule = Literal["list", "block"]
SizeRule = Literal["no-go", "inconclusive"]

Globs = Annotated[list[Text], BeforeValidator(to_list), Field(max_length=10_000)]
Date = Annotated[dt.date, BeforeValidator(to_date)]
Share = Annotated[float, Field(ge=0.0)]
# a tag's value as a suite records it: a string, or an integer (a size, a world size), compared as text
Tag = Annotated[Name, BeforeValidator(lambda v: str(v) if isinstance(v, int) and not isinstance(v, bool) else v)]


class Gate(Model):
    inconclusive_exit_code: Annotated[int, Field(ge=0, le=1)] = 1
    preexisting_failures: PreexistingRule = "go"
    harness_failures: HarnessRule = "inconclusive"
    confirm_failures: Annotated[int, Field(ge=0, le=10)] = 2
    flaky_failures: FlakyRule = "inconclusive"


class Required(Model):
    cells: Globs = Field(default_factory=list)
    tests: Globs = Field(default_factory=list)
    candidate_tests: Globs = Field(default_factory=list)
    all_tests: bool = False
    metrics: Globs = Field(default_factory=list)


class MetricRow(Model):
    """One `[[performance.metric]]` rule."""

    name: Name
    tolerance: Share
    devices: Annotated[list[Device], BeforeValidator(to_list)] = Field(default_factory=list)
    tags: Annotated[dict[Name, Tag], Field(max_length=100)] = Field(default_factory=dict)
    method: Literal["bootstrap", "threshold"] = "bootstrap"
    summary: Literal["median", "best"] = "median"


class Performance(Model):
    confidence: Annotated[float, Field(ge=0.5, le=0.9999)] = 0.95
    resamples: Annotated[int, Field(ge=200, le=20_000)] = 2000
    min_samples: Annotated[int, Field(ge=1, le=100_000)] = 3
    repeats: Annotated[int, Field(ge=1, le=100)] = 1
    confirm_repeats: Annotated[int, Field(ge=1, le=100)] = 5
    max_pressure: Annotated[float, Field(ge=0.0, le=1.0)] | None = None  # None: policy.MAX_PRESSURE
    pressure_reruns: Annotated[int, Field(ge=0, le=20)] = 3
    pressure_clocks: Annotated[list[Clock], Field(max_length=3)] = Field(default_factory=lambda: list(PRESSURE_CLOCKS))
    noise_budget_s: Annotated[float, Field(ge=0.0, le=86_400.0)] = 300.0
    pairing: Pairing = "sequential"
    metric: Annotated[list[MetricRow], Field(max_length=10_000)] = Field(default_factory=list)


class NumericsRow(Model):
    """One `[[numerics.metric]]` rule."""

    name: Name
    rtol: Share = 0.0
    atol: Share = 0.0
    steps: Annotated[int, Field(ge=0, le=10**9)] = 0


class Numerics(Model):
    metric: Annotated[list[NumericsRow], Field(max_length=10_000)] = Field(default_factory=list)


class WaiverRow(Model):
    """One `[[waiver]]`: it must name what it waives (`load_policy` refuses one that names nothing)."""

    cells: Text = "*"
    tests: Text = "*"
    reason: Text
    link: Text = ""
    expires: Date


class AllowRow(Model):
    """One `[[vulnerabilities.allow]]`: an advisory allowed until its review."""

    id: Name
    package: Name = "*"
    stacks: Text = "*"
    reason: Text
    review_by: Date
    link: Text = ""


class Vulnerabilities(Model):
    database: Text = ""
    threshold: Literal["LOW", "MODERATE", "HIGH", "CRITICAL"] = "HIGH"
    inherited: FlakyRule = "go"
    unrated: UnratedRule = "list"
    allow: Annotated[list[AllowRow], Field(max_length=10_000)] = Field(default_factory=list)


class Size(Model):
    max_growth: Annotated[float, Field(ge=0.0, le=1000.0)] = 0.10
    max_growth_mb: Annotated[float, Field(ge=0.0, le=1e9)] = 500.0
    over: SizeRule = "no-go"


class Watch(Model):
    """`stackgate watch`'s canary of production on a pool (#44)."""

    drift_tolerance: Annotated[float, Field(gt=0.0, le=10.0)] = 0.15
    baseline_runs: Annotated[int, Field(ge=2, le=1000)] = 10
    min_baseline_runs: Annotated[int, Field(ge=2, le=1000)] = 5
    spread_k: Annotated[float, Field(ge=0.0, le=100.0)] = 3.0


class PolicyFile(Model):
    gate: Gate = Field(default_factory=Gate)
    required: Required = Field(default_factory=Required)
    performance: Performance = Field(default_factory=Performance)
    numerics: Numerics = Field(default_factory=Numerics)
    waiver: Annotated[list[WaiverRow], Field(max_length=10_000)] = Field(default_factory=list)
    vulnerabilities: Vulnerabilities = Field(default_factory=Vulnerabilities)
    size: Size = Field(default_factory=Size)
    watch: Watch = Field(default_factory=Watch)
