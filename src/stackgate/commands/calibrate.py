"""`stackgate calibrate`: A/A runs of the production stack on this runner, the noise of each gated
metric, and the tolerance and repeats it recommends (stored in the history for the gate's power)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from dataclasses import replace
from functools import partial
from typing import Any

from stackgate import calibrate as cal
from stackgate import comparison, history
from stackgate.backends.base import EnvHandle
from stackgate.backends.choose import REAL, Machinery
from stackgate.commands import production_runs
from stackgate.console import Console, Printer
from stackgate.errors import InfraError
from stackgate.model import Cell, CellResult, aa
from stackgate.options import Options
from stackgate.policy import Policy
from stackgate.repeats import gated_keys, gated_tests
from stackgate.report.data import now
from stackgate.report.files import atomic_write
from stackgate.runner import Attempt, Runner, together_here


def calibrate(opts: Options, env: Mapping[str, str], *, runs: int, target: float, allow: float,
              say: Printer | None = None, machinery: Machinery = REAL) -> int:
    """`stackgate calibrate`: A/A runs of the production stack on this runner (see `calibrate`)."""
    console = Console(say)
    say = console.say
    runs_here = production_runs.start(opts, env, console, machinery, what="calibrate", name="calibrate")
    loaded, prods, backend, runner, where = (runs_here.loaded, runs_here.cells, runs_here.backend, runs_here.runner,
                                             runs_here.where)
    run_id = where.root.name
    report: dict[str, Any] = {"run_id": run_id, "target": target, "allow": allow, "runs": runs, "pools": {}}
    together = together_here(loaded.policy, backend)
    try:
        for cell in prods:
            handle = runs_here.environment(cell)
            found, dropped = _aa_runs(runner, cell, handle, runs, loaded.policy)
            advise = partial(cal.recommend, target=target, allow=allow, confidence=loaded.policy.confidence,
                             confirms=loaded.policy.confirm_repeats > 1)  # for this runner's noise, as measured
            rows = []  # (noise, recommendation, what the other per-run summary would need, or "")
            for key in sorted(gated_keys(cell, found, loaded.policy)):
                metric = next(m for f in found for m in f.metrics if m.key == key)
                rule = loaded.policy.metric_rule(metric.name, dict(metric.tags), cell.device)
                summary = rule.summary if rule is not None else "median"
                series = [next((m.samples for m in f.metrics if m.key == key), ()) for f in found]
                measured = cal.noise(key, series, summary, metric.better, metric.unit)
                if measured is None:
                    continue
                other = "best" if summary == "median" else "median"
                alt = cal.noise(key, series, other, metric.better)
                hint = ""
                if alt is not None and alt.sigma < measured.sigma / 2:
                    needs = advise(alt).repeats
                    hint = (f"each run's {other} sample moved {alt.sigma:.1%}: with summary = \"{other}\" "
                            f"in its [[performance.metric]] rule, repeats = {needs} would do")
                rows.append((measured, advise(measured), hint))
            say(f"\ncalibration of pool {cell.pool.name} ({cell.stack.label}, {runs} A/A runs):")
            if dropped:
                say(f"  {dropped} A/A pair(s) taken while the runner was busy beyond max_pressure = "
                    f"{loaded.policy.max_pressure:.0%} were not used")
            run_s = _run_seconds(found)
            for measured, rec, hint in rows:
                say(f"  {rec.describe(target)}")
                if run_s:
                    few = measured.pairs - measured.apart < FEW_PAIRS  # then: the same noise from enough pairs
                    more = advise(replace(measured, pairs=FEW_PAIRS + measured.apart)) if few else None
                    say(f"    {_cost(rec, run_s, more, together)}")
                if hint:
                    say(f"    {hint}")
            history.record_calibration(opts.history, pool=cell.pool.name, run_id=run_id, recorded=now(),
                                       noise=[(n.metric, n.sigma, n.pairs - n.apart) for n, _, _ in rows])
            report["pools"][cell.pool.name] = [{**n.to_json(), "recommended_tolerance": r.tolerance,
                                                "recommended_repeats": r.repeats,
                                                **({"recommended_confirm_repeats": r.confirm} if r.confirms else {}),
                                                "pairs_disturbed": dropped,
                                                **({"run_s": run_s, **_seconds(r, run_s, together)} if run_s else {}),
                                                "pairing": "concurrent" if together else "sequential"}
                                               for n, r, _ in rows]
        atomic_write(where.calibration, json.dumps(report, indent=1))
    finally:
        runs_here.close()
    say(f"calibration: {where.calibration}; stored in {opts.history}")
    return 0


FEW_PAIRS = 10  # A/A pairs kept below which the noise's 80% bound is wide (1.27x the noise at 10; 2.1x at 2)


def _run_seconds(found: list[CellResult]) -> float:
    """The median wall time of one run of the gated tests on this runner: the A/A runs after the first
    (which runs the whole suite; the rest, as the gate's repeats do, only the gated tests); 0 if unknown."""
    timed = [r.duration_s for r in found[1:] or found if r.duration_s > 0]
    return round(statistics.median(timed), 2) if timed else 0.0


def _cost(rec: cal.Recommendation, run_s: float, more: cal.Recommendation | None = None,
          together: bool = False) -> str:
    """What the recommendation costs in wall time per candidate beside production, so that a team can
    weigh a quieter runner or a wider target against it; and, when few A/A pairs measured the noise,
    what the same noise measured from more would cost (`more`)."""
    cost = _seconds(rec, run_s, together)
    runs = "pairs run at the same time" if together else "runs (production and a candidate)"
    text = (f"cost on this runner, at {run_s:.1f} s a run of the gated tests: a comparison the repeats settle "
            f"takes {'' if together else '2 x '}{rec.repeats} {runs}, about {_minutes(cost['settled_s'])}")
    if rec.confirms and rec.confirm > rec.repeats:
        text += (f"; one confirmed (left unsettled, or before a NO-GO) {'' if together else '2 x '}{rec.confirm} "
                 f"{'pairs' if together else 'runs'}, about {_minutes(cost['confirmed_s'])}")
    text += "; the runs needed grow with the noise squared: a runner half as noisy needs about a quarter as many"
    if more is not None and more.repeats < rec.repeats:
        text += (f"; and they are planned at the noise's upper bound, which {rec.pairs - rec.apart} A/A pair(s) leave "
                 f"wide: were the same noise measured from {FEW_PAIRS} pairs (`--runs {2 * FEW_PAIRS}` or more), "
                 f"repeats = {more.repeats}, about {_minutes(_seconds(more, run_s, together)['settled_s'])}")
    return text


def _seconds(rec: cal.Recommendation, run_s: float, together: bool = False) -> dict[str, float]:
    """The wall time of a comparison the repeats settle, and of one confirmed: both stacks' runs, one
    after the other, or side by side (`together`: pairing = "concurrent", `run_s` measured that way)."""
    sides = 1 if together else 2
    return {"settled_s": round(sides * rec.repeats * run_s, 1), "confirmed_s": round(sides * rec.confirm * run_s, 1)}


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _ran(result: CellResult, made: int, cell: Cell) -> None:
    if not result.status.ran_suite:
        raise InfraError(f"calibration run {made} of {cell.id} did not run its tests: {result.status.value}"
                         f": {result.reason[:300]}")


def _aa_runs(runner: Runner, cell: Cell, handle: EnvHandle, runs: int, policy: Policy) -> tuple[list[CellResult], int]:
    """`runs` A/A runs of the production cell, in pairs (0, 1), (2, 3), ...; a pair taken while the runner
    was busy beyond `max_pressure` is not used and another is run in its place, up to `pressure_reruns`
    times (as the gate replaces the pairs of its repeats). With pairing = "concurrent" the gate's pairs
    run at the same time, and so do these: a first run alone finds the gated tests (as the gate's main
    runs do, and, like them, it is not one of the pairs). Returns the runs of the pairs kept, and how
    many pairs were dropped."""
    kept: list[CellResult] = []
    select: tuple[str, ...] = ()
    dropped = made = 0
    planned = runs
    together = together_here(policy, runner.backend)
    if together:
        first = runner.attempt(Attempt(cell, aa(0)), handle, step=f"A/A run 0 (the whole suite) of {cell.id}")
        _ran(first, 0, cell)
        select, made, planned = gated_tests(cell, [first], policy), 1, runs + 1
    while made < planned:
        if together:
            pair = [Attempt(cell, aa(made), select=select), Attempt(cell, aa(made + 1), select=select)]
            found = runner.run_together([pair], turn=made // 2)
        else:
            found = [runner.attempt(Attempt(cell, aa(made), select=select), handle,
                                    step=f"A/A run {made + 1}/{planned} of {cell.id}")]
        for result in found:
            made += 1
            _ran(result, made, cell)
            kept.append(result)
        select = select or gated_tests(cell, kept, policy)
        if (len(kept) % 2 == 0 and gated_keys(cell, kept[-2:], policy, busy_only=True)
                and comparison.disturbed([(kept[-2], kept[-1])], policy.max_pressure)[1]):
            del kept[-2:]
            dropped += 1
            if dropped <= policy.pressure_reruns:
                planned += 2
    if dropped and len(kept) < 4:
        raise InfraError(f"the runner was busy beyond max_pressure = {policy.max_pressure:.0%} during {dropped} of "
                         f"{made // 2} A/A pairs of {cell.id}: fewer than 2 quiet pairs are left to calibrate with",
                         hint="calibrate on a quieter runner (each run's interference is in results.jsonl), or raise "
                              "[performance] max_pressure / pressure_reruns in the policy")
    return kept, dropped
