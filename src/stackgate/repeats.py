"""Pure planning of the attempts after the main runs: the reruns that confirm a candidate's new
failures, the interleaved repeats of the performance-gated tests and their confirmation, and each
candidate's rollback. Nothing here runs anything: each function returns attempts (or the tests they
select) from the results recorded so far."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence

from stackgate import comparison, stats
from stackgate.confirm import is_failure
from stackgate.model import PLAIN, ROLLBACK, Cell, CellResult, Phase, PhaseKind, Role, repeat
from stackgate.policy import Policy
from stackgate.rundir import results
from stackgate.runner import Attempt
from stackgate.suite import SuiteSpec, platform_check

WHOLE_SUITE = "*"
Selection = dict[str, tuple[str, ...]]  # cell id -> the tests to repeat (WHOLE_SUITE: all of them)


def gated_keys(cell: Cell, found: Sequence[CellResult], policy: Policy, *, busy_only: bool = False) -> set[str]:
    """The metrics the policy gates by their samples (not thresholds) on this cell's device; with
    `busy_only`, those of them whose pairs taken beyond max_pressure are dropped (`Policy.pressure_limit`)."""
    return {m.key for result in found for m in result.metrics if m.better != "equal"
            and (rule := policy.metric_rule(m.name, dict(m.tags), cell.device)) is not None
            and rule.method != "threshold" and not (busy_only and math.isinf(policy.pressure_limit(dict(m.tags))))}


def gated_tests(cell: Cell, found: Sequence[CellResult], policy: Policy) -> tuple[str, ...]:
    """The tests that recorded the metrics the policy gates by their samples on this cell's device."""
    return tests_of(gated_keys(cell, found, policy), found)


def tests_of(keys: Collection[str], found: Sequence[CellResult]) -> tuple[str, ...]:
    """The tests that recorded these metrics (the whole suite when a suite does not say which test did)."""
    nodeids = set()
    for result in found:
        for m in result.metrics:
            if m.key in keys:
                if not m.nodeid:
                    return (WHOLE_SUITE,)
                nodeids.add(m.nodeid)
    return tuple(sorted(nodeids))


def merge_tests(a: Sequence[str], b: Sequence[str]) -> tuple[str, ...]:
    """Both selections of tests to repeat: the whole suite when either is."""
    both = {*a, *b}
    return (WHOLE_SUITE,) if WHOLE_SUITE in both else tuple(sorted(both))


def repeat_order(cells: Sequence[Cell], by_id: Mapping[str, Cell], rounds: range) -> list[tuple[int, Cell]]:
    """Interleaved, pair by pair, and counterbalanced: odd repeats run the candidates first, even ones
    production first (the main run is P C), so P C | C P | P C ... : drift on the runner hits both sides,
    and so does whatever favours the first (or second) run of a pair."""
    order = []
    bases = [c for c in cells if c.role is Role.PRODUCTION]
    for r in rounds:
        for base in bases:
            group = [(r, base)] + [(r, c) for c in cells if c.role is Role.CANDIDATE and by_id.get(c.baseline) is base]
            order += group[1:] + group[:1] if r % 2 else group
    return order


def rollbacks(cells: Sequence[Cell], by_id: Mapping[str, Cell], finished: Mapping[str, CellResult]) -> list[Attempt]:
    """Production reading each candidate's artifacts: for every candidate that ran its suite (and so
    wrote them)."""
    out = []
    for cand in cells:
        base = by_id.get(cand.baseline)
        ran = finished.get(cand.id)
        if cand.role is Role.CANDIDATE and base is not None and ran is not None and ran.status.ran_suite:
            out.append(Attempt(base, ROLLBACK, against=cand))
    return out


def plain_reruns(cells: Sequence[Cell], finished: Mapping[str, CellResult], suite: SuiteSpec) -> list[Attempt]:
    """The fidelity rerun: each production cell's tests of a user's `suite` that failed in its main run
    (not the bundled platform checks beside them), once more as plain pytest in production's
    environment. A failure is pre-existing only when it fails there too; one that passes there was made
    by the harness."""
    out = []
    for cell in cells:
        ran = finished.get(cell.id)
        if cell.role is not Role.PRODUCTION or ran is None or not ran.status.ran_suite:
            continue
        failed = tuple(sorted(t.name for t in ran.tests if is_failure(t.outcome) and not platform_check(suite, t.name)))
        if failed:
            out.append(Attempt(cell, PLAIN, select=failed))
    return out


def pairs_that_ran(cells: Sequence[Cell], finished: Mapping[str, CellResult]) -> list[Cell]:
    """The candidates whose main run and whose production partner's both ran their suite."""
    ran = {c.id for c in cells if c.id in finished and finished[c.id].status.ran_suite}
    return [c for c in cells if c.role is Role.CANDIDATE and c.id in ran and c.baseline in ran]


def repeat_selection(pairs: Sequence[Cell], finished: Mapping[str, CellResult], policy: Policy) -> Selection:
    """What the interleaved repeats run: each pair's performance-gated tests."""
    return with_baselines({p: gated_tests(p, [finished[p.id], finished[p.baseline]], policy) for p in pairs})


def new_failures(pairs: Sequence[Cell], finished: Mapping[str, CellResult]) -> Selection:
    """What the reruns run: each candidate's tests that failed in its main run and that production ran
    without failing (passed, or skipped), for both stacks of the pair. A test that fails in production
    too is pre-existing, and one production did not collect is new: neither is rerun."""
    per_candidate = {}
    for cand in pairs:
        before = {t.name: t.outcome for t in finished[cand.baseline].tests}
        per_candidate[cand] = tuple(sorted(
            t.name for t in finished[cand.id].tests
            if is_failure(t.outcome) and t.name in before and not is_failure(before[t.name])))
    return with_baselines(per_candidate)


def next_round(finished: Mapping[str, CellResult]) -> int:
    """The number of the next repeat round: after every round recorded (each pair's runs keep one
    number per round, whichever pairs it was made for)."""
    return results.last_round(finished, PhaseKind.REPEAT) + 1


def short_of_quiet_runs(pairs: Sequence[Cell], by_id: Mapping[str, Cell], finished: Mapping[str, CellResult],
                       policy: Policy, replaced: Mapping[str, int]) -> tuple[Selection, dict[str, str]]:
    """The pairs that have fewer runs taken within `max_pressure` than the policy asked for (the runs
    made, less the rounds already made to replace disturbed ones: `replaced`, candidate id -> rounds),
    with their performance-gated tests; and for each, why (what was dropped)."""
    per_candidate, why = {}, {}
    for cand in pairs:
        base = by_id[cand.baseline]
        found = [finished[cand.id], finished[base.id]]
        keys = gated_keys(cand, found, policy, busy_only=True)  # (a metric on the CPU clock uses every pair)
        if not keys:
            continue
        runs = comparison.compared_pairs(finished[base.id], finished[cand.id],
                                         comparison.repeat_pairs(cand, base, finished), policy)
        kept, dropped = comparison.disturbed(runs, policy.max_pressure)
        if dropped and len(kept) < len(runs) - replaced.get(cand.id, 0):
            per_candidate[cand] = tests_of(keys, found)
            why[cand.id] = (f"{len(dropped)} of {len(runs)} run pair(s) taken while the runner was busy beyond "
                            f"max_pressure = {policy.max_pressure:.0%} ({', '.join(sorted(keys))})")
    select = with_baselines(per_candidate)
    return select, {k: v for k, v in why.items() if k in select}


def unsettled(pairs: Sequence[Cell], by_id: Mapping[str, Cell], finished: Mapping[str, CellResult],
              policy: Policy) -> tuple[Selection, dict[str, dict[str, str]]]:
    """What confirmation runs, and why: the tests of the gated metrics that the runs so far cannot
    settle (cell id -> metric -> the reason)."""
    why = {p.id: comparison.unsettled(p, by_id[p.baseline], finished, policy) for p in pairs}
    return with_baselines({p: tests_of(why[p.id], [finished[p.id], finished[p.baseline]]) for p in pairs}), why


def worth_more(pairs: Sequence[Cell], by_id: Mapping[str, Cell], finished: Mapping[str, CellResult],
               policy: Policy, watching: Mapping[str, Collection[str]]
               ) -> tuple[Selection, dict[str, dict[str, str]], dict[str, dict[str, str]]]:
    """What a round beyond confirmation runs: the tests of the gated metrics it is for
    (`comparison.worth_more_runs`; `watching`: cell id -> the metrics earlier rounds were for); why,
    per cell and metric; and the unsettled metrics that more runs would not settle, with why not."""
    more, hopeless = {}, {}
    for p in pairs:
        more[p.id], hopeless[p.id] = comparison.worth_more_runs(p, by_id[p.baseline], finished, policy,
                                                                watching.get(p.id, ()))
    select = with_baselines({p: tests_of(more[p.id], [finished[p.id], finished[p.baseline]]) for p in pairs})
    return select, {k: v for k, v in more.items() if v}, {k: v for k, v in hopeless.items() if v}


def union(a: Selection, b: Selection) -> Selection:
    """Both selections, cell by cell (`merge_tests`)."""
    return {cell: merge_tests(a.get(cell, ()), b.get(cell, ())) for cell in {*a, *b}}


def last_round_s(finished: Mapping[str, CellResult]) -> float:
    """The time the last recorded round of repeats took, its runs one after the other: what the next
    round is expected to take."""
    last = results.last_round(finished, PhaseKind.REPEAT)
    return sum(r.duration_s for r in finished.values() if r.phase == repeat(last)) if last else 0.0


def short_of_sign_test(pairs: Sequence[Cell], by_id: Mapping[str, Cell], finished: Mapping[str, CellResult],
                       policy: Policy) -> tuple[Selection, dict[str, dict[str, str]], int]:
    """What runs after confirmation, and why: the tests of the gated metrics that a run pair standing
    apart may hold undecided or push into a regression, over fewer pairs than the sign test needs to
    leave it out (`comparison.short_of_sign_test`; cell id -> metric -> the reason); and the rounds that
    bring the fewest of them to that many."""
    short = {p.id: comparison.short_of_sign_test(p, by_id[p.baseline], finished, policy) for p in pairs}
    have = [n for metrics in short.values() for _, n in metrics.values()]
    rounds = stats.sign_test_pairs(policy.confidence) - min(have) if have else 0
    select = with_baselines({p: tests_of(short[p.id], [finished[p.id], finished[p.baseline]]) for p in pairs})
    return select, {cell: {k: why for k, (why, _) in metrics.items()} for cell, metrics in short.items()}, rounds


def with_baselines(per_candidate: Mapping[Cell, tuple[str, ...]]) -> Selection:
    """Cell id -> tests to repeat: each candidate's own, and for each production cell what any of its
    candidates needs (the pairs stay pairs)."""
    select: Selection = {}
    for cand, tests in per_candidate.items():
        if tests:
            select[cand.id] = tests
            select[cand.baseline] = merge_tests(select.get(cand.baseline, ()), tests)
    return select


def listed(select: Mapping[str, tuple[str, ...]]) -> str:
    return ", ".join(sorted({t for tests in select.values() for t in tests}))


def repeat_attempts(cells: Sequence[Cell], by_id: Mapping[str, Cell], select: Mapping[str, tuple[str, ...]],
                    rounds: range, phase: Callable[[int], Phase] = repeat) -> list[Attempt]:
    """`rounds` of the selected tests in `phase` (the repeats, or the reruns of new failures),
    counterbalanced (see `repeat_order`)."""
    return [Attempt(cell, phase(r), select=() if select[cell.id] == (WHOLE_SUITE,) else select[cell.id])
            for r, cell in repeat_order([c for c in cells if c.id in select], by_id, rounds)]


def by_round(attempts: Sequence[Attempt], by_id: Mapping[str, Cell]) -> list[list[Attempt]]:
    """The attempts that run at the same time with pairing = "concurrent": each round's runs of one
    production cell and of its candidates, in the order given."""
    groups: dict[tuple[int, str], list[Attempt]] = {}
    for a in attempts:
        base = a.cell.id if a.cell.role is Role.PRODUCTION else by_id[a.cell.baseline].id
        groups.setdefault((a.phase.round, base), []).append(a)
    return list(groups.values())
