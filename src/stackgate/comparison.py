"""A candidate's metrics against its production partner's: the performance comparisons (over the
main run and the interleaved repeats) and the numerics checks, each with the reasons it gives the
gate. `gate.decide` is the one caller that decides; `unsettled` tells the attempt loop what the runs
so far cannot settle."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

from stackgate import calibrate, pressure, stats
from stackgate.evidence import MetricComparison, ParityCheck
from stackgate.model import Cell, CellResult, Metric, PhaseKind, Reason, Severity
from stackgate.policy import MetricRule, NumericsRule, Policy
from stackgate.rundir import results


def _metric_index(result: CellResult) -> dict[str, Metric]:
    return {m.key: m for m in result.metrics}


NOTABLE = 0.10  # interference worth naming in an INCONCLUSIVE's advice (a quiet run here measures ~4%)
Pair = tuple[CellResult, CellResult]  # (production, candidate): one run of each, side by side


def repeat_pairs(cand: Cell, base: Cell, recorded: Mapping[str, CellResult]) -> list[Pair]:
    """The interleaved repeats of the performance-gated tests: (production, candidate) run r, for each
    round both ran (a round made for another pair of the same production cell has no partner here)."""
    theirs = results.rounds(recorded, base, PhaseKind.REPEAT)
    mine = results.rounds(recorded, cand, PhaseKind.REPEAT)
    return [(theirs[r], c) for r, c in mine.items() if r in theirs and theirs[r].status.ran_suite and c.status.ran_suite]


def compared_pairs(bres: CellResult, cres: CellResult, repeats: Sequence[Pair], policy: Policy) -> list[Pair]:
    """The run pairs a gated metric is compared over: the main runs and the repeats, or, with pairing =
    "concurrent", the repeats alone once there are any (each pair's runs taken at the same time; the
    main runs, one after the other, would bring back the drift those pairs cancel)."""
    return list(repeats) if policy.concurrent and repeats else [(bres, cres), *repeats]


def _was_pinned(pair: Pair) -> bool:
    """Both runs of the pair were given their own CPUs: they ran at the same time (`Runner.run_together`)."""
    return all(r.environment.cpus for r in pair)


def interference(result: CellResult) -> float | None:
    found = pressure.of_result(result.environment)
    return found.interference if found is not None else None


def disturbed(pairs: Sequence[Pair], limit: float) -> tuple[list[Pair], list[Pair]]:
    """The pairs whose runs were both taken under interference at most `limit` (kept), and the others
    (either side above it: the pair is dropped whole, so the rest stay pairs). A run that could not
    measure interference is kept, as before there was a measure."""
    kept: list[Pair] = []
    dropped: list[Pair] = []
    for pair in pairs:
        over = any((x := interference(r)) is not None and x > limit for r in pair)
        (dropped if over else kept).append(pair)
    return kept, dropped


def _run_name(result: CellResult) -> str:
    return "main run" if result.phase.kind is not PhaseKind.REPEAT else f"repeat {result.phase.round}"


def _pressure_seen(kept: Sequence[Pair], dropped: Sequence[Pair], limit: float) -> str:
    """What the runner's interference was, for an INCONCLUSIVE's advice."""
    sides = []
    for side, index in (("candidate", 1), ("production", 0)):
        seen = [x for pair in kept if (x := interference(pair[index])) is not None]
        if seen:
            busy = sum(x > NOTABLE for x in seen)
            sides.append(f"{side} up to {max(seen):.0%}" + (f" (above {NOTABLE:.0%} in {busy} of {len(seen)} runs)"
                                                           if busy else ""))
    text = f"the runner's CPU interference during the runs used: {', '.join(sides)}" if sides else ""
    if dropped:
        text += (f"{'; ' if text else ''}{len(dropped)} run pair(s) taken above {limit:.0%} "
                 f"(max_pressure) were not used")
    return text


def _busy_runs(dropped: Sequence[Pair]) -> str:
    def seen(result: CellResult) -> str:
        found = pressure.of_result(result.environment)
        return found.describe() if found is not None else "not measured"

    return "; ".join(f"{_run_name(b)}: production {seen(b)}, candidate {seen(c)}" for b, c in dropped)


def _dropped_note(cand: Cell, pairs: Sequence[Pair], dropped: Sequence[Pair], limit: float,
                  metrics: Sequence[str]) -> Reason:
    return Reason(Severity.INFO, f"{len(dropped)} of {len(pairs)} run pair(s) not used for {', '.join(metrics)}: "
                  f"taken while the runner was busy beyond max_pressure = {limit:.0%} ({_busy_runs(dropped)})",
                  cell=cand.id, kind="pressure-discarded")


def _kept_note(cand: Cell, pairs: Sequence[Pair], busy: Sequence[Pair], policy: Policy, metrics: Sequence[str]) -> Reason:
    return Reason(Severity.INFO, f"{len(busy)} of {len(pairs)} run pair(s) taken while the runner was busy beyond "
                  f"max_pressure = {policy.max_pressure:.0%} are used for {', '.join(metrics)}: interference is not "
                  f"shown to move their clock (`[performance] pressure_clocks` = {list(policy.pressure_clocks)}: the "
                  f"pairs of the others are dropped; docs/performance.md) ({_busy_runs(busy)})", cell=cand.id,
                  kind="pressure-kept")


def _noise_advice(cmp: stats.Comparison, policy: Policy) -> str:
    """What the pairs' own noise says an INCONCLUSIVE needs: about how many interleaved runs, or that
    no practical number will do (the change seen sits at the tolerance, or the runner is too noisy), or,
    for the sign test's interval, that only more pairs narrow it (`calibrate.runs_to_settle`: 0)."""
    runs = calibrate.runs_to_settle(cmp, policy.confidence)
    if runs == 0:
        return (f"{cmp.apart} of the {cmp.pairs} run pairs stand apart from the rest, so the interval is the sign "
                "test's: its ends are the pairs' own ratios, ranked, and only more pairs narrow it (no run count "
                "can be estimated for it): more interleaved runs (`[performance] confirm_repeats`, "
                "`noise_budget_s`), or a quieter runner (`stackgate calibrate` measures one)")
    seen = f"the pairs' log ratios spread {cmp.noise:.1%} in this run"
    change, tolerance = stats.percent(cmp.change), f"{cmp.tolerance:.1%}"
    if runs is None:
        return (f"{seen}; at that noise a change of {change} against the {tolerance} tolerance is not settled by "
                "100 interleaved runs: use a quieter runner (`stackgate calibrate` measures one)")
    return (f"{seen}; at that noise about {runs} interleaved runs would settle a change of {change} against the "
            f"{tolerance} tolerance ~90% of the time, if the change is what they saw (`[performance] confirm_repeats "
            f"= {runs}` makes that many when the first runs cannot settle it), or use a quieter runner "
            "(`stackgate calibrate` measures one)")


def unsettled(cand: Cell, base: Cell, recorded: Mapping[str, CellResult], policy: Policy) -> dict[str, str]:
    """The gated, sampled metrics of a candidate that the runs so far cannot settle, each with why:
    an interval that straddles the tolerance, or a regression seen over fewer than the policy's
    `confirm_repeats` runs (the steps of one run are blind to run-to-run noise, so one run never
    makes a performance NO-GO when confirmation is on). Metric key -> why."""
    runs, comparisons = _sampled_gates(cand, base, recorded, policy)
    out = {}
    for c in comparisons:
        if c.comparison.outcome is stats.Outcome.INCONCLUSIVE:
            out[c.metric] = f"{c.comparison.describe(c.unit)}: cannot tell over {runs} run(s)"
        elif c.comparison.outcome is stats.Outcome.REGRESSION and runs < policy.confirm_repeats:
            out[c.metric] = f"{c.comparison.describe(c.unit)}: a regression over {runs} run(s), to confirm"
    return out


def worth_more_runs(cand: Cell, base: Cell, recorded: Mapping[str, CellResult], policy: Policy,
                    watching: Collection[str] = ()) -> tuple[dict[str, str], dict[str, str]]:
    """The gated metrics that one more interleaved round is for, each with why, and those more runs would
    not settle, each with why not. For: an INCONCLUSIVE that more runs can settle at the noise its pairs
    show (a paired one whose change, at that noise, 100 runs would not settle is the other kind: more
    rounds would only spend the runner's time); a regression over fewer than `confirm_repeats` runs; and
    a regression of a metric in `watching` (those the rounds began for): the rounds stop early only when
    a metric settles within tolerance, so they never make a false NO-GO likelier than one look at their end."""
    runs, comparisons = _sampled_gates(cand, base, recorded, policy)
    more, hopeless = {}, {}
    for c in comparisons:
        cmp = c.comparison
        seen = cmp.describe(c.unit)
        if cmp.outcome is stats.Outcome.INCONCLUSIVE:
            settle = calibrate.runs_to_settle(cmp, policy.confidence)  # (0: the sign test's, no figure)
            if settle is None:
                hopeless[c.metric] = (f"{seen}: cannot tell over {runs} run(s), and at its pairs' noise "
                                      f"({cmp.noise:.1%}) 100 runs would not settle it")
            else:
                more[c.metric] = f"{seen}: cannot tell over {runs} run(s)" + (
                    f"; about {settle} would at its pairs' noise ({cmp.noise:.1%})" if settle else "")
        elif cmp.outcome is stats.Outcome.REGRESSION and (runs < policy.confirm_repeats or c.metric in watching):
            more[c.metric] = (f"{seen}: a regression over {runs} run(s); the rounds go on to the end of the budget "
                              "(they stop early only for a metric settled within tolerance)")
    return more, hopeless


def _sampled_gates(cand: Cell, base: Cell, recorded: Mapping[str, CellResult],
                   policy: Policy) -> tuple[int, list[MetricComparison]]:
    """The run pairs compared so far, and the candidate's gated comparisons by samples (not thresholds)
    over them (none until both stacks ran their suite)."""
    cres, bres = recorded.get(cand.id), recorded.get(base.id)
    if cres is None or bres is None or not (cres.status.ran_suite and bres.status.ran_suite):
        return 0, []
    pairs = repeat_pairs(cand, base, recorded)
    comparisons, _, _ = compare_pair(cand, base, cres, bres, policy, Severity.INFO, repeats=pairs)
    return (len(compared_pairs(bres, cres, pairs, policy)),
            [c for c in comparisons if c.gated and c.comparison.method != "threshold"])


def short_of_sign_test(cand: Cell, base: Cell, recorded: Mapping[str, CellResult],
                       policy: Policy) -> dict[str, tuple[str, int]]:
    """The gated, paired metrics of a candidate that the runs so far leave undecided while some of their
    pairs stand apart from the rest (a run slowed whole), or call a regression while one of those is on
    the worse side, over fewer pairs than the sign test needs to leave such a pair out
    (`stats.sign_test_pairs`: 9 at 95%). Below that the t interval holds the wrecked pair, which widens
    it (an INCONCLUSIVE) or moves it towards a NO-GO. A pair apart on the better side cannot have made a
    regression: without it the interval would only move further beyond the tolerance. Metric key ->
    (why, the pairs it has)."""
    cres, bres = recorded.get(cand.id), recorded.get(base.id)
    if cres is None or bres is None or not (cres.status.ran_suite and bres.status.ran_suite):
        return {}
    needed = stats.sign_test_pairs(policy.confidence)
    comparisons, _, _ = compare_pair(cand, base, cres, bres, policy, Severity.INFO,
                                     repeats=repeat_pairs(cand, base, recorded))
    return {c.metric: (f"{c.comparison.describe(c.unit)}: {c.comparison.apart} of {c.comparison.pairs} run pair(s) "
                       f"stand apart from the rest (a run slowed whole); the sign test leaves such a pair out from "
                       f"{needed} pairs", c.comparison.pairs)
            for c in comparisons
            if c.gated and c.comparison.method == "paired" and c.comparison.pairs < needed
            and _held_by_a_pair_apart(c.comparison)}


def _held_by_a_pair_apart(cmp: stats.Comparison) -> bool:
    if cmp.outcome is stats.Outcome.INCONCLUSIVE:
        return cmp.apart > 0
    return cmp.outcome is stats.Outcome.REGRESSION and cmp.apart_worse > 0


class _Indexes:
    """Each run's metrics by key, indexed once per comparison (not once per metric compared)."""

    def __init__(self) -> None:
        self._by_run: dict[int, tuple[CellResult, dict[str, Metric]]] = {}

    def __call__(self, result: CellResult) -> dict[str, Metric]:
        found = self._by_run.get(id(result))
        if found is None or found[0] is not result:
            found = self._by_run[id(result)] = (result, _metric_index(result))
        return found[1]


def _runs(key: str, pairs: Sequence[Pair], index: _Indexes) -> tuple[list[tuple[float, ...]], list[tuple[float, ...]]]:
    """A metric's samples per run, production and candidate, in pairs (main run, then each repeat)."""
    base_runs, cand_runs = [], []
    for b, c in pairs:
        bm, cm = index(b).get(key), index(c).get(key)
        if bm is not None and cm is not None and bm.samples and cm.samples:
            base_runs.append(bm.samples)
            cand_runs.append(cm.samples)
    return base_runs, cand_runs


def _kind_clash(key: str, metric: Metric | None, other: Metric | None, numerics: NumericsRule | None,
                rule: MetricRule | None) -> str:
    """Why a metric cannot be compared as recorded: production and the candidate record it with
    different units or directions, or a rule gates it as what it is not (a numerics rule on a
    performance metric, a performance rule on a numerics series). "" when it can."""
    if metric is not None and other is not None:
        if metric.unit != other.unit:
            return (f"{key}: production records it in {other.unit!r}, the candidate in {metric.unit!r}: values in "
                    "different units are not compared")
        if metric.better != other.better:
            return (f"{key}: production records it as better = {other.better!r}, the candidate as {metric.better!r}: "
                    "not compared")
    known = metric or other
    assert known is not None
    if numerics is not None and known.better != "equal":
        return (f"{key}: a numerics rule gates it, but it is recorded as better = {known.better!r} (a numerics "
                "trajectory is recorded as 'equal'): not compared")
    if rule is not None and known.better == "equal":
        return (f"{key}: a performance rule gates it, but it is recorded as better = 'equal' (a numerics series, "
                "not a measurement with a direction): not compared")
    return ""


def compare_pair(cand: Cell, base: Cell, cres: CellResult, bres: CellResult, policy: Policy,
                 missing: Severity, repeats: Sequence[Pair] = ()
                 ) -> tuple[list[MetricComparison], list[ParityCheck], list[Reason]]:
    comparisons, parity, reasons = [], [], []
    index = _Indexes()
    bmetrics, cmetrics = index(bres), index(cres)
    every = compared_pairs(bres, cres, repeats, policy)
    main_left_out = len(every) == len(repeats)  # concurrent pairs: compared without the main runs
    splits: dict[float, tuple[list[Pair], list[Pair]]] = {}  # interference limit -> (kept, dropped)
    dropped_for: list[str] = []  # the sampled gated metrics compared without the pairs taken beyond max_pressure
    kept_for: list[str] = []  # those compared over every pair: their clock is not one interference moves
    for key in sorted(set(bmetrics) | set(cmetrics)):
        metric, other = cmetrics.get(key), bmetrics.get(key)
        known = metric or other
        assert known is not None
        numerics = policy.numerics_rule(known.name)
        rule_p = policy.metric_rule(known.name, dict(known.tags), cand.device)
        gated = numerics is not None or rule_p is not None
        clash = _kind_clash(key, metric, other, numerics, rule_p)
        if clash:  # what the two stacks recorded, or what the rule expects, disagree: not comparable
            reasons.append(Reason(Severity.INCONCLUSIVE if gated else Severity.INFO, clash, cell=cand.id,
                                  test=known.test, kind="metric-mismatch"))
            continue
        if metric is None or other is None or not metric.samples or not other.samples:
            if gated:
                side = "candidate" if metric is None or not metric.samples else "production"
                reasons.append(Reason(missing, f"gated metric {key} has no samples in the {side} cell: "
                                      "nothing to compare", cell=cand.id, test=known.test, kind="missing-metric"))
            continue
        if numerics is not None:
            p = stats.parity(other.samples, metric.samples, rtol=numerics.rtol, atol=numerics.atol,
                             steps=numerics.steps or None)
            parity.append(ParityCheck(cand.id, base.id, key, p, numerics.rtol, numerics.atol))
            if p.bitwise:
                reasons.append(Reason(Severity.INFO, f"{key}: bitwise identical to production over {p.compared} steps",
                                      cell=cand.id, kind="numerics"))
            elif not p.within:
                what = p.problem or (f"step {p.worst_index} differs by {p.worst_abs:.3g} ({p.worst_rel:.2%})")
                reasons.append(Reason(Severity.BLOCKING,
                                      f"numerics drift in {key}: {what}; tolerance rtol={numerics.rtol:g} "
                                      f"atol={numerics.atol:g}", cell=cand.id, test=metric.test, kind="numerics"))
            continue
        if metric.better == "equal":
            continue  # an equal-series with no numerics rule is recorded, not judged
        if not all(math.isfinite(x) for x in (*metric.samples, *other.samples)):
            if rule_p is not None:
                reasons.append(Reason(Severity.INCONCLUSIVE, f"{key}: a sample is NaN or infinite: cannot compare",
                                      cell=cand.id, test=metric.test, kind="perf-inconclusive"))
            continue
        medians = (stats.median(other.samples), stats.median(metric.samples)) if rule_p is not None else ()
        if medians and min(medians) <= 0:  # (gated metrics only: the others are shown, not judged)
            reasons.append(Reason(Severity.INCONCLUSIVE, f"{key}: production's median {medians[0]:g}, the "
                                  f"candidate's {medians[1]:g}: a ratio of values that are zero or negative says "
                                  "nothing; the suite recorded no measurement", cell=cand.id, test=metric.test,
                                  kind="perf-inconclusive"))
            continue
        limit = policy.pressure_limit(dict(known.tags))
        kept, dropped = splits[limit] if limit in splits else splits.setdefault(limit, disturbed(every, limit))
        base_runs, cand_runs = _runs(key, kept, index)
        if not base_runs and not dropped and main_left_out:  # no concurrent pair recorded it: the main runs' steps
            base_runs, cand_runs = _runs(key, disturbed([(bres, cres)], limit)[0], index)
        if rule_p is not None and rule_p.method == "threshold":
            cmp = stats.threshold(other.samples, metric.samples, better=metric.better, tolerance=rule_p.tolerance)
        elif rule_p is not None and not base_runs:
            dropped_for.append(key)
            reasons.append(Reason(Severity.INCONCLUSIVE, f"{key}: all {len(every)} run pair(s) were taken while the "
                                  f"runner was busy beyond max_pressure = {policy.max_pressure:.0%}: no run to compare; use a quieter "
                                  "runner (or raise pressure_reruns)", cell=cand.id, test=metric.test,
                                  kind="perf-pressure"))
            continue
        elif rule_p is not None and len(base_runs) >= 2:  # interleaved repeats: per-run summaries, paired
            (dropped_for if math.isfinite(limit) else kept_for).append(key)
            cmp = stats.paired(base_runs, cand_runs, better=metric.better, tolerance=rule_p.tolerance,
                               confidence=policy.confidence, summary=rule_p.summary)
            cmp = replace(cmp, together=main_left_out and any(_was_pinned(p) for p in kept))
        elif rule_p is not None:  # the one quiet run: its steps
            (dropped_for if math.isfinite(limit) else kept_for).append(key)
            cmp = stats.compare(base_runs[0], cand_runs[0], better=metric.better, tolerance=rule_p.tolerance,
                                confidence=policy.confidence, resamples=policy.resamples,
                                min_samples=policy.min_samples)
        else:
            # ungated metrics are shown, not judged: a coarser interval is enough for the report
            cmp = stats.compare(other.samples, metric.samples, better=metric.better,
                                tolerance=rule_p.tolerance if rule_p else 0.05, confidence=policy.confidence,
                                resamples=policy.resamples if rule_p else min(policy.resamples, 200),
                                min_samples=policy.min_samples)
        comparisons.append(MetricComparison(cand.id, base.id, key, metric.unit, cand.device, cmp, rule_p is not None))
        if rule_p is None:
            continue
        if cmp.outcome is stats.Outcome.REGRESSION:
            reasons.append(Reason(Severity.BLOCKING, f"performance regression in {key}: {cmp.describe(metric.unit)}",
                                  cell=cand.id, test=metric.test, kind="regression"))
        elif cmp.outcome is stats.Outcome.INCONCLUSIVE:
            few = min(len(base_runs[0]), len(cand_runs[0])) < policy.min_samples
            if cmp.method == "paired":
                advice = f"noise too high to tell over {len(base_runs)} interleaved runs: " + _noise_advice(cmp, policy)
            elif few:
                advice = (f"only {min(len(base_runs[0]), len(cand_runs[0]))} samples; need >= {policy.min_samples} "
                          "(or gate it with method = \"threshold\")")
            else:
                advice = "noise too high to tell; set repeats (interleaved runs) or use a quieter runner"
            seen = _pressure_seen(kept, dropped, limit)
            reasons.append(Reason(Severity.INCONCLUSIVE, f"{key}: {cmp.describe(metric.unit)}: {advice}"
                                  + (f" ({seen})" if seen else ""), cell=cand.id, test=metric.test,
                                  kind="perf-inconclusive"))
    busy = disturbed(every, policy.max_pressure)[1]
    if dropped_for and busy:
        reasons.append(_dropped_note(cand, every, busy, policy.max_pressure, dropped_for))
    if kept_for and busy:
        reasons.append(_kept_note(cand, every, busy, policy, kept_for))
    return comparisons, parity, reasons
