"""The one function that decides GO / NO-GO / INCONCLUSIVE, with every reason.

Inputs are data: the cells (run here and not), their results, the policy and today's date.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from stackgate import history, rules
from stackgate import supply as supply_chain
from stackgate.comparison import compare_pair, repeat_pairs
from stackgate.confirm import confirmation, is_failure, reruns
from stackgate.evidence import Evidence, GateOutcome, MetricComparison, ParityCheck, Preexisting
from stackgate.model import (
    PLAIN,
    ROLLBACK,
    Cell,
    CellResult,
    Decision,
    NotHere,
    Reason,
    Role,
    Severity,
    Status,
    TestOutcome,
    Verdict,
)
from stackgate.policy import Policy, Waiver
from stackgate.rundir.layout import COMPILE_CACHE, COMPILE_CACHE_VARS, RunDir


def _matches(name: str, globs: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, g) or fnmatch.fnmatchcase(name.rsplit("/", maxsplit=1)[-1], g) for g in globs)


def decide(cells: Sequence[Cell], not_here: Sequence[NotHere], results: Mapping[str, CellResult],
           policy: Policy, today: dt.date, problems: Sequence[str] = (),
           supply: Sequence[supply_chain.PairScan] = (), canaries: Sequence[history.Canary] = ()) -> GateOutcome:
    """Absence is evidence of nothing: every required cell, required test, gated metric and
    production partner either gives a decision or an INCONCLUSIVE reason naming what is missing.
    `problems` are results lines that could not be read: each makes the verdict INCONCLUSIVE.
    `supply`: each candidate stack's supply chain beside production's (`supply.scan`). `canaries`: the
    newest `stackgate watch` canary of each production cell (`history.last_canaries`): one that found
    the pool moved is said beside the comparisons of the candidates on that pool, deciding nothing."""
    reasons: list[Reason] = [Reason(Severity.INCONCLUSIVE, problem, kind="bad-record") for problem in problems]
    by_id: dict[str, Cell] = {c.id: c for c in cells}
    required = {c.id for c in cells if c.required}  # resolved once (matrix globs and policy) before the gate
    candidates = [c for c in cells if c.role is Role.CANDIDATE]
    if not candidates:
        reasons.append(Reason(Severity.INCONCLUSIVE, "no candidate cell ran here", kind="no-candidate"))
    # a production failure is judged against the candidates that ran beside it (pre-existing in each, or
    # fixed by the upgrade); a baseline that no candidate can be compared with keeps it as its own reason
    compared = {c.baseline for c in candidates if c.baseline in by_id and _ran_pair(c, results)}

    preexisting: list[Preexisting] = []
    for cell in cells:
        result = results.get(cell.id)
        is_required = cell.id in required
        if result is None:
            if is_required:
                reasons.append(Reason(Severity.INCONCLUSIVE, "required cell has no result (run interrupted?)",
                                      cell=cell.id, kind="missing-result"))
            continue
        baseline = results.get(cell.baseline) if cell.role is Role.CANDIDATE and _ran_pair(cell, results) else None
        again = (reruns(cell, results), reruns(by_id[cell.baseline], results)) if baseline is not None else None
        plain = results.get(by_id[cell.baseline].result_id(PLAIN)) if baseline is not None else None
        found, known = _cell_reasons(cell, result, is_required, policy, baseline=baseline,
                                     compared=cell.id in compared, again=again, plain=plain)
        reasons += found
        preexisting += known

    for away in not_here:
        reasons.append(Reason(Severity.INCONCLUSIVE if away.cell.required else Severity.INFO,
                              f"not run here: {away.reason}", cell=away.cell.id, kind="not-run-here"))

    comparisons: list[MetricComparison] = []
    parity: list[ParityCheck] = []
    new_warnings: dict[str, tuple[str, ...]] = {}
    for cand in candidates:
        cres = results.get(cand.id)
        if cres is None:
            continue  # reported above when required
        missing = Severity.INCONCLUSIVE if cand.id in required else Severity.INFO
        base = by_id.get(cand.baseline)
        if base is not None:
            found, known = _rollback_reasons(cand, results.get(base.result_id(ROLLBACK, cand)),
                                             results.get(base.id), policy)
            reasons += found
            preexisting += known
        if base is None:
            reasons.append(Reason(missing, "no production baseline to compare with (its cell was pruned or not "
                                  "selected)", cell=cand.id, kind="no-baseline"))
            continue
        bres = results.get(base.id)
        if bres is None:
            reasons.append(Reason(missing, f"production baseline {base.id} has no result: nothing to compare with",
                                  cell=cand.id, kind="no-baseline"))
            continue
        if not (bres.status.ran_suite and cres.status.ran_suite):
            continue  # a cell that did not run its suite has its own reason above
        c_cmp, c_par, c_reasons = compare_pair(cand, base, cres, bres, policy, missing,
                                               repeats=repeat_pairs(cand, base, results))
        comparisons += c_cmp
        parity += c_par
        reasons += c_reasons
        if policy.all_tests_required and cand.id in required:
            reasons += _same_tests(cand, cres, bres)
        fresh = tuple(w for w in cres.warnings if w not in set(bres.warnings))
        if fresh:
            new_warnings[cand.id] = fresh
            for w in fresh:
                reasons.append(Reason(Severity.INFO, f"new in candidate (upgrade work item): {w}", cell=cand.id,
                                      kind="new-warning"))
        reasons += [Reason(Severity.INFO, f"the pool changed, not the stack: production's canary on pool "
                                          f"{c.pool} ({c.at}, `stackgate watch`) measured {c.metric} {c.shift:+.1%} "
                                          f"from its baseline: read this comparison with that in mind",
                           cell=cand.id, kind="pool-drift")
                    for c in canaries if c.cell_id == base.id and c.flagged and c.shift is not None]

    reasons += supply_chain.reasons(supply, policy.supply)
    if policy.rules_must_match:
        reasons += rules.unmatched(candidates, results, policy)
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
                       Evidence(tuple(comparisons), tuple(parity), new_warnings, tuple(preexisting), tuple(supply)))


def _ran_pair(cand: Cell, results: Mapping[str, CellResult]) -> bool:
    """A candidate and its production baseline both ran their suites: their tests can be compared."""
    c, b = results.get(cand.id), results.get(cand.baseline)
    return c is not None and b is not None and c.status.ran_suite and b.status.ran_suite


def _first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[0][:300] if lines else ""


def _known_failure(rule: str, must_pass: bool, is_required: bool) -> Severity:
    """A failure in both stacks that the upgrade did not cause (pre-existing, or the harness's): listed
    in a cell that is not required; else INCONCLUSIVE when the test must pass or the policy's `rule`
    says so."""
    if not is_required:
        return Severity.INFO
    return Severity.INCONCLUSIVE if must_pass or rule == "inconclusive" else Severity.INFO


def _passes_plain(name: str, plain: CellResult | None) -> bool:
    """The test passed in production's fidelity rerun (plain pytest, outside the harness)."""
    return plain is not None and any(t.name == name and t.outcome == "passed" for t in plain.tests)


def _rollback_reasons(cell: Cell, rollback: CellResult | None, production: CellResult | None,
                      policy: Policy) -> tuple[list[Reason], list[Preexisting]]:
    """Production reading what this candidate wrote; the reasons name the candidate. A test that
    failed in production's own main run too (reading what production wrote) is pre-existing."""
    if rollback is None:
        return [], []
    out = []
    known = []
    caches = RunDir(Path()).stack_artifacts(*cell.comparison_key, cell.stack.label) / COMPILE_CACHE
    shared = (f"its checkpoints and exports, and the compile caches it filled: "
              f"{' and '.join(var for var, _ in COMPILE_CACHE_VARS)} in the run's {caches}")
    before = {t.name: t for t in production.tests} if production is not None and production.status.ran_suite else {}
    for t in rollback.tests:
        if t.outcome in ("failed", "error"):
            earlier = before.get(t.name)
            if earlier is not None and is_failure(earlier.outcome):
                known.append(Preexisting(cell.id, rollback.cell_id, t.name, f"{t.outcome}: {_first_line(t.message)}",
                                         f"{earlier.outcome}: {_first_line(earlier.message)}"))
                severity = Severity.INCONCLUSIVE if policy.preexisting_failures == "inconclusive" else Severity.INFO
                out.append(Reason(severity, f"pre-existing failure (rollback): fails in production's own run too: "
                                  f"{_first_line(t.message)}", cell=cell.id, test=t.name, kind="preexisting-failure"))
                continue
            out.append(Reason(Severity.BLOCKING, f"rollback: production fails on what the candidate left ({shared}): "
                              f"{_first_line(t.message)}", cell=cell.id, test=t.name, kind="rollback"))
    if rollback.status is Status.SKIPPED:
        out.append(Reason(Severity.INFO, f"rollback phase: {rollback.reason}", cell=cell.id, kind="rollback"))
    elif rollback.status is Status.FAILED and not any(t.outcome in ("failed", "error") for t in rollback.tests):
        out.append(Reason(Severity.BLOCKING, f"rollback phase failed with no failing test recorded: {rollback.reason}",
                          cell=cell.id, kind="rollback"))
    elif not rollback.status.ran_suite:
        out.append(Reason(Severity.INCONCLUSIVE, f"rollback phase {rollback.status.value}: {rollback.reason}",
                          cell=cell.id, kind="rollback"))
    return out, known


def _new_failure(cell: Cell, t: TestOutcome, bad: Severity, is_required: bool, policy: Policy,
                 again: tuple[Sequence[CellResult], Sequence[CellResult]] | None) -> Reason:
    """A test that failed in the candidate and not in production, judged by its reruns when the policy
    confirms failures: NO-GO only when it fails every time in the candidate and not in production."""
    what = f"{t.outcome}: {_first_line(t.message)}"
    if again is None or not policy.confirm_failures:
        return Reason(bad, what, cell=cell.id, test=t.name, kind="failed-test")
    kind, evidence = confirmation(t.name, *again)
    if kind == "flaky":
        severity = {"inconclusive": Severity.INCONCLUSIVE, "go": Severity.INFO, "no-go": bad}[policy.flaky_failures]
        return Reason(severity if is_required else Severity.INFO, f"{evidence}: {what}", cell=cell.id, test=t.name,
                      kind="flaky")
    if kind == "production-fails":
        return Reason(Severity.INCONCLUSIVE if is_required else Severity.INFO, f"{evidence}: {what}", cell=cell.id,
                      test=t.name, kind="production-fails")
    return Reason(bad, f"{what} ({evidence})", cell=cell.id, test=t.name, kind="failed-test")


def _cell_reasons(cell: Cell, result: CellResult, is_required: bool, policy: Policy, *,
                  baseline: CellResult | None = None, compared: bool = False,
                  again: tuple[Sequence[CellResult], Sequence[CellResult]] | None = None,
                  plain: CellResult | None = None) -> tuple[list[Reason], list[Preexisting]]:
    """A cell's own reasons, and the failures it shares with its production baseline (`baseline`: the
    partner's result, given when both ran their suites). A regression is a new failure, confirmed by
    its reruns (`again`: the candidate's and production's); a test that fails in both stacks is
    pre-existing: never blocking, and INCONCLUSIVE or not by the policy (a required test failing in
    production is a broken baseline: INCONCLUSIVE, as ever). `plain`: the baseline's fidelity rerun
    (production's failing tests as plain pytest): a failure in both stacks that passes there was made by
    the harness, and is never pre-existing."""
    out: list[Reason] = []
    known: list[Preexisting] = []
    is_prod = cell.role is Role.PRODUCTION
    # a failing baseline makes the comparison meaningless: the candidate cannot be judged
    bad = Severity.INCONCLUSIVE if is_prod else (Severity.BLOCKING if is_required else Severity.INFO)
    prefix = "production baseline: " if is_prod else ""
    if result.status.is_machinery:  # the machinery or the host failed, not the stack: no verdict on it
        what = {Status.INFRA_ERROR: "infrastructure error", Status.NO_BUILD: "no build (nightly guard)"}.get(
            result.status, f"{result.status.value} (host probe)")
        out.append(Reason(Severity.INCONCLUSIVE, f"{prefix}{what}: {result.reason}", cell=cell.id,
                          kind=f"cell-{result.status.value}"))
        return out, known
    if not result.status.ran_suite:
        # a cell whose records or JUnit could not be read is unreadable evidence: no waiver covers it
        kind = "unreadable-evidence" if result.environment.record_problems else f"cell-{result.status.value}"
        out.append(Reason(bad, f"{prefix}cell {result.status.value}: {result.reason}", cell=cell.id, kind=kind))
        return out, known
    links = result.environment.refused_links
    if links:  # what production left for this candidate to read points out of the run: not evidence
        out.append(Reason(Severity.INCONCLUSIVE, f"production's cross-version artifacts hold {len(links)} link(s) out "
                          "of the run directory, not copied (unreadable evidence): " + "; ".join(map(str, links[:3])),
                          cell=cell.id, kind="bad-artifact"))
    left = result.environment.leftover_processes
    if left:
        out.append(Reason(Severity.INFO, f"{len(left)} process(es) outlived the suite and were ended: "
                          + "; ".join(str(x)[:120] for x in left[:3]), cell=cell.id, kind="leftover-process"))
    wanted = list(policy.required_tests) + ([] if is_prod else list(policy.candidate_tests))
    failed = [t for t in result.tests if is_failure(t.outcome)]
    before = {t.name: t for t in baseline.tests} if baseline is not None else {}
    for t in failed:
        earlier = before.get(t.name)
        must_pass = _matches(t.name, wanted)
        if is_prod and compared and not must_pass:
            continue  # judged beside each candidate: pre-existing there, or fixed by the upgrade
        if earlier is not None and is_failure(earlier.outcome) and _passes_plain(t.name, plain):
            out.append(Reason(_known_failure(policy.harness_failures, must_pass, is_required),
                              f"harness failure (fails under stackgate in both stacks, passes as plain pytest in "
                              f"production's environment: not pre-existing, and the stack is not measured by it): "
                              f"candidate {t.outcome}: {_first_line(t.message)}; production {earlier.outcome}: "
                              f"{_first_line(earlier.message)}; plain pytest in production: passed",
                              cell=cell.id, test=t.name, kind="harness-failure"))
            continue
        if earlier is not None and is_failure(earlier.outcome):
            known.append(Preexisting(cell.id, cell.baseline, t.name, f"{t.outcome}: {_first_line(t.message)}",
                                     f"{earlier.outcome}: {_first_line(earlier.message)}"))
            out.append(Reason(_known_failure(policy.preexisting_failures, must_pass, is_required),
                              f"pre-existing failure (fails in production too, not caused by the upgrade): "
                              f"candidate {t.outcome}: {_first_line(t.message)}; production {earlier.outcome}: "
                              f"{_first_line(earlier.message)}", cell=cell.id, test=t.name, kind="preexisting-failure"))
            continue
        if not is_prod and earlier is not None:
            out.append(_new_failure(cell, t, bad, is_required, policy, again))
            continue
        out.append(Reason(bad, f"{prefix}{t.outcome}: {_first_line(t.message)}", cell=cell.id, test=t.name,
                          kind="failed-test"))
    if baseline is not None:
        mine = {t.name: t.outcome for t in result.tests}
        for t in baseline.tests:
            if not is_failure(t.outcome) or _matches(t.name, list(policy.required_tests)):
                continue  # (a required test failing in production is the baseline's own reason)
            if mine.get(t.name) == "passed":
                out.append(Reason(Severity.INFO, f"fixed by the upgrade: {t.outcome} in production, passes in the "
                                  f"candidate: {_first_line(t.message)}", cell=cell.id, test=t.name, kind="fixed"))
            elif not is_failure(mine.get(t.name, "")):
                out.append(Reason(Severity.INFO, f"{t.outcome} in production, "
                                  f"{'skipped' if t.name in mine else 'not run'} in the candidate: "
                                  f"{_first_line(t.message)}", cell=cell.id, test=t.name, kind="production-failure"))
    if result.status is Status.FAILED and not failed:
        out.append(Reason(bad, f"{prefix}cell failed but no failing test was recorded: {result.reason or 'no reason'}",
                          cell=cell.id, kind="failed-without-test"))
    if not is_required:
        return out, known
    for pattern in wanted:
        hits = [t for t in result.tests if _matches(t.name, [pattern])]
        if not hits:
            out.append(Reason(Severity.INCONCLUSIVE, f"required test {pattern} did not run", cell=cell.id,
                              test=pattern, kind="required-test-missing"))
        for t in hits:
            if t.outcome == "skipped":
                out.append(Reason(Severity.INCONCLUSIVE, f"required test was skipped: {_first_line(t.message)}",
                                  cell=cell.id, test=t.name, kind="required-test-skipped"))
    for pattern in policy.required_metrics:
        if not any(fnmatch.fnmatchcase(m.name, pattern) or fnmatch.fnmatchcase(m.key, pattern)
                   for m in result.metrics):
            out.append(Reason(Severity.INCONCLUSIVE, f"{prefix}required metric {pattern} was not recorded",
                              cell=cell.id, test=pattern, kind="missing-metric"))
    return out, known


def _same_tests(cand: Cell, cres: CellResult, bres: CellResult) -> list[Reason]:
    """A user suite's default policy: every test that passed in production must pass in the candidate."""
    out = []
    for t in bres.tests:
        if t.outcome != "passed":
            continue
        mine = next((c for c in cres.tests if c.name == t.name), None)
        if mine is None:
            out.append(Reason(Severity.INCONCLUSIVE, "passed in production but did not run in the candidate",
                              cell=cand.id, test=t.name, kind="required-test-missing"))
        elif mine.outcome == "skipped":
            out.append(Reason(Severity.INCONCLUSIVE, f"passed in production but was skipped in the candidate: "
                              f"{_first_line(mine.message)}", cell=cand.id, test=t.name, kind="required-test-skipped"))
    return out


def _apply_waivers(reasons: list[Reason], policy: Policy, today: dt.date) -> list[Reason]:
    """A waiver (or allow-list entry) in date turns a deciding reason WAIVED; past its date it no longer
    counts, said once: INFO for a waiver, BLOCKING for an allow-list entry (its review is due)."""
    out: list[Reason] = []
    flagged: set[int] = set()
    for reason in reasons:
        if reason.severity not in (Severity.BLOCKING, Severity.INCONCLUSIVE) or reason.kind in rules.UNWAIVABLE:
            out.append(reason)  # (no waiver ever covers missing or unreadable evidence)
            continue
        waiver = next((w for w in policy.waivers if w.covers(reason)), None)
        if waiver is None:
            out.append(reason)
        elif waiver.expires < today:
            out.append(reason)
            if id(waiver) not in flagged:
                flagged.add(id(waiver))
                out.append(_expired(waiver, reason))
        else:
            out.append(replace(reason, severity=Severity.WAIVED,
                               message=f"{reason.message} -- {'allowed' if waiver.advisory else 'waived'} until "
                                       f"{waiver.expires}: {waiver.reason} {waiver.link}".strip()))
    return out


def _expired(waiver: Waiver, reason: Reason) -> Reason:
    if not waiver.advisory:
        return Reason(Severity.INFO, f"waiver expired on {waiver.expires} and no longer counts: "
                      f"{waiver.reason} {waiver.link}".strip(), cell=reason.cell, kind="waiver-expired")
    where = f" (policy line {waiver.line})" if waiver.line else ""
    return Reason(Severity.BLOCKING, f"allow-list entry for {waiver.advisory}{where} was due for review on "
                  f"{waiver.expires} and no longer counts: review it (a new review_by, or remove it and fix the "
                  f"package); it said: {waiver.reason}", cell=reason.cell, kind="allow-expired",
                  subject=reason.subject)
