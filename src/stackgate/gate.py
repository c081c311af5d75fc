"""The one function that decides GO / NO-GO / INCONCLUSIVE, with every reason.

Inputs are data: the cells (run here and not), their results, the policy and today's date.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from stackgate import stats
from stackgate.model import (
    Cell,
    CellResult,
    Decision,
    Metric,
    NotHere,
    Reason,
    Role,
    Severity,
    Status,
    Verdict,
)
from stackgate.policy import Policy


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
class Evidence:
    comparisons: tuple[MetricComparison, ...] = ()
    parity: tuple[ParityCheck, ...] = ()
    new_warnings: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class GateOutcome:
    verdict: Verdict
    evidence: Evidence


def _matches(name: str, globs: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, g) or fnmatch.fnmatchcase(name.rsplit("/", maxsplit=1)[-1], g) for g in globs)


def decide(cells: Sequence[Cell], not_here: Sequence[NotHere], results: Mapping[str, CellResult],
           policy: Policy, today: dt.date) -> GateOutcome:
    reasons: list[Reason] = []
    by_key: dict[tuple[str, str], Cell] = {c.comparison_key: c for c in cells if c.role is Role.PRODUCTION}
    required = [c for c in cells if c.required or _matches(c.id, policy.required_cells)]
    candidates = [c for c in cells if c.role is Role.CANDIDATE]
    if not candidates:
        reasons.append(Reason(Severity.INCONCLUSIVE, "no candidate cell ran here", kind="no-candidate"))

    for cell in cells:
        result = results.get(cell.id)
        is_required = cell in required
        if result is None:
            if is_required:
                reasons.append(Reason(Severity.INCONCLUSIVE, "required cell has no result (run interrupted?)",
                                      cell=cell.id, kind="missing-result"))
            continue
        reasons += _cell_reasons(cell, result, is_required, policy)
        rollback = results.get(cell.result_id("rollback"))
        if rollback is not None:
            for t in rollback.tests:
                if t.outcome in ("failed", "error"):
                    reasons.append(Reason(Severity.BLOCKING,
                                          f"rollback: production cannot read what the candidate wrote: "
                                          f"{_first_line(t.message)}", cell=cell.id, test=t.name, kind="rollback"))
            if rollback.status not in (Status.PASSED, Status.FAILED):
                reasons.append(Reason(Severity.INCONCLUSIVE, f"rollback phase {rollback.status.value}: "
                                      f"{rollback.reason}", cell=cell.id, kind="rollback"))

    for away in not_here:
        required_away = away.cell.required or _matches(away.cell.id, policy.required_cells)
        reasons.append(Reason(Severity.INCONCLUSIVE if required_away else Severity.INFO,
                              f"not run here: {away.reason}", cell=away.cell.id, kind="not-run-here"))

    comparisons: list[MetricComparison] = []
    parity: list[ParityCheck] = []
    new_warnings: dict[str, tuple[str, ...]] = {}
    for cand in candidates:
        base = by_key.get(cand.comparison_key)
        cres, bres = results.get(cand.id), results.get(base.id) if base else None
        if base is None or cres is None or bres is None:
            continue
        c_cmp, c_par, c_reasons = _compare(cand, base, cres, bres, policy)
        comparisons += c_cmp
        parity += c_par
        reasons += c_reasons
        fresh = tuple(w for w in cres.warnings if w not in set(bres.warnings))
        if fresh:
            new_warnings[cand.id] = fresh
            for w in fresh:
                reasons.append(Reason(Severity.INFO, f"new in candidate (upgrade work item): {w}", cell=cand.id,
                                      kind="new-warning"))

    reasons = _apply_waivers(reasons, policy, today)
    if any(r.severity is Severity.BLOCKING for r in reasons):
        decision = Decision.NO_GO
    elif any(r.severity is Severity.INCONCLUSIVE for r in reasons):
        decision = Decision.INCONCLUSIVE
    else:
        decision = Decision.GO
    order = {Severity.BLOCKING: 0, Severity.INCONCLUSIVE: 1, Severity.WAIVED: 2, Severity.INFO: 3}
    reasons.sort(key=lambda r: (order[r.severity], r.cell, r.test))
    return GateOutcome(Verdict(decision, tuple(reasons)),
                       Evidence(tuple(comparisons), tuple(parity), new_warnings))


def _first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[0][:300] if lines else ""


def _cell_reasons(cell: Cell, result: CellResult, is_required: bool, policy: Policy) -> list[Reason]:
    out: list[Reason] = []
    is_prod = cell.role is Role.PRODUCTION
    # a failing baseline makes the comparison meaningless: the candidate cannot be judged
    bad = Severity.INCONCLUSIVE if is_prod else (Severity.BLOCKING if is_required else Severity.INFO)
    prefix = "production baseline: " if is_prod else ""
    if result.status is Status.INFRA_ERROR:  # the machinery failed, not the stack: no verdict on it
        out.append(Reason(Severity.INCONCLUSIVE, f"{prefix}infrastructure error: {result.reason}", cell=cell.id,
                          kind="cell-infra-error"))
        return out
    if result.status not in (Status.PASSED, Status.FAILED):
        out.append(Reason(bad, f"{prefix}cell {result.status.value}: {result.reason}", cell=cell.id,
                          kind=f"cell-{result.status.value}"))
        return out
    for t in result.tests:
        if t.outcome in ("failed", "error"):
            out.append(Reason(bad, f"{prefix}{t.outcome}: {_first_line(t.message)}", cell=cell.id, test=t.name,
                              kind="failed-test"))
    if not is_required:
        return out
    wanted = list(policy.required_tests) + ([] if is_prod else list(policy.candidate_tests))
    for pattern in wanted:
        hits = [t for t in result.tests if _matches(t.name, [pattern])]
        if not hits:
            out.append(Reason(Severity.INCONCLUSIVE, f"required test {pattern} did not run", cell=cell.id,
                              test=pattern, kind="required-test-missing"))
        for t in hits:
            if t.outcome == "skipped":
                out.append(Reason(Severity.INCONCLUSIVE, f"required test was skipped: {_first_line(t.message)}",
                                  cell=cell.id, test=t.name, kind="required-test-skipped"))
    return out


def _metric_index(result: CellResult) -> dict[str, Metric]:
    return {m.key: m for m in result.metrics}


def _compare(cand: Cell, base: Cell, cres: CellResult, bres: CellResult,
             policy: Policy) -> tuple[list[MetricComparison], list[ParityCheck], list[Reason]]:
    comparisons, parity, reasons = [], [], []
    bmetrics = _metric_index(bres)
    for key, metric in _metric_index(cres).items():
        other = bmetrics.get(key)
        if other is None or not metric.samples or not other.samples:
            continue
        if metric.better == "equal":
            rule = policy.numerics_rule(metric.name)
            if rule is None:
                continue
            p = stats.parity(other.samples, metric.samples, rtol=rule.rtol, atol=rule.atol, steps=rule.steps or None)
            parity.append(ParityCheck(cand.id, base.id, key, p, rule.rtol, rule.atol))
            if p.bitwise:
                reasons.append(Reason(Severity.INFO, f"{key}: bitwise identical to production over {p.compared} steps",
                                      cell=cand.id, kind="numerics"))
            elif not p.within:
                reasons.append(Reason(Severity.BLOCKING,
                                      f"numerics drift in {key}: step {p.worst_index} differs by {p.worst_abs:.3g} "
                                      f"({p.worst_rel:.2%}); tolerance rtol={rule.rtol:g} atol={rule.atol:g}",
                                      cell=cand.id, test=metric.test, kind="numerics"))
            continue
        tags = dict(metric.tags)
        rule_p = policy.metric_rule(metric.name, tags, cand.device)
        cmp = stats.compare(other.samples, metric.samples, better=metric.better,
                            tolerance=rule_p.tolerance if rule_p else 0.05, confidence=policy.confidence,
                            resamples=policy.resamples, min_samples=policy.min_samples)
        comparisons.append(MetricComparison(cand.id, base.id, key, metric.unit, cand.device, cmp, rule_p is not None))
        if rule_p is None:
            continue
        if cmp.outcome is stats.Outcome.REGRESSION:
            reasons.append(Reason(Severity.BLOCKING, f"performance regression in {key}: {cmp.describe(metric.unit)}",
                                  cell=cand.id, test=metric.test, kind="regression"))
        elif cmp.outcome is stats.Outcome.INCONCLUSIVE:
            few = min(len(metric.samples), len(other.samples)) < policy.min_samples
            advice = (f"only {min(len(metric.samples), len(other.samples))} samples; need >= {policy.min_samples}"
                      if few else "noise too high to tell; add repeats (more steps/iterations) or a quieter runner")
            reasons.append(Reason(Severity.INCONCLUSIVE, f"{key}: {cmp.describe(metric.unit)}: {advice}",
                                  cell=cand.id, test=metric.test, kind="perf-inconclusive"))
    return comparisons, parity, reasons


def _apply_waivers(reasons: list[Reason], policy: Policy, today: dt.date) -> list[Reason]:
    out: list[Reason] = []
    flagged: set[int] = set()
    for reason in reasons:
        if reason.severity not in (Severity.BLOCKING, Severity.INCONCLUSIVE):
            out.append(reason)
            continue
        waiver = next((w for w in policy.waivers if w.matches(reason.cell, reason.test)), None)
        if waiver is None:
            out.append(reason)
        elif waiver.expires < today:
            out.append(reason)
            if id(waiver) not in flagged:
                flagged.add(id(waiver))
                out.append(Reason(Severity.INFO, f"waiver expired on {waiver.expires} and no longer counts: "
                                  f"{waiver.reason} {waiver.link}".strip(), cell=reason.cell, kind="waiver-expired"))
        else:
            out.append(replace(reason, severity=Severity.WAIVED,
                               message=f"{reason.message} -- waived until {waiver.expires}: {waiver.reason} "
                                       f"{waiver.link}".strip()))
    return out
