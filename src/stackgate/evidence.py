"""What the gate weighed, beside its verdict: every metric comparison and numerics parity check,
the candidate's new warnings, and the failures that were there before the upgrade."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stackgate import stats
from stackgate.model import Verdict

if TYPE_CHECKING:
    from stackgate.supply import PairScan


@dataclass(frozen=True)
class MetricComparison:
    cell: str
    baseline: str
    metric: str
    unit: str
    device: str
    comparison: stats.Comparison
    gated: bool


@dataclass(frozen=True)
class ParityCheck:
    cell: str
    baseline: str
    metric: str
    parity: stats.Parity
    rtol: float
    atol: float


@dataclass(frozen=True)
class Preexisting:
    """A test that failed in the candidate and in its production baseline: not caused by the upgrade."""

    cell: str
    baseline: str
    test: str
    candidate: str  # the candidate's outcome and first message line
    production: str  # production's


@dataclass(frozen=True)
class Evidence:
    comparisons: tuple[MetricComparison, ...] = ()
    parity: tuple[ParityCheck, ...] = ()
    new_warnings: dict[str, tuple[str, ...]] = field(default_factory=dict)
    preexisting: tuple[Preexisting, ...] = ()
    supply: tuple[PairScan, ...] = ()  # each candidate stack's supply chain beside production's


@dataclass(frozen=True)
class GateOutcome:
    verdict: Verdict
    evidence: Evidence
