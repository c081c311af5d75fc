"""`python benchmarks/disturbance.py REPORTS [--metric workload.step_time] [--clock cpu] [--summary best]`: do the
interference figures each run records (PSI `some`, steal) tell which runs of a gated metric came out
slow? Reads every run under REPORTS (a `stackgate run` reports folder, e.g. the one
`benchmarks/sensitivity.py` prints at its end) and, per run folder and role (production, candidate),
takes each run's best step of the metric (the gate's `summary = "best"`; `--summary median`: its median
step, the gate's default) and its distance from that role's median of them in that folder (positive = worse: a run slowed by something the two stacks do
not differ in). Prints, for bands of PSI `some` and of steal, how many runs fell there, their median
distance and how many lay more than 5% above their role's median, then the rank correlation of each
figure with the distance. A signal worth gating by (re-running the runs it marks) shows slow runs
concentrated in its top band and a clear positive correlation. A benchmark: it prints figures and
asserts nothing."""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from stackgate import stats

SLOW = math.log(1.05)
BANDS = {"some": (0.0, 0.1, 0.3, 0.5, 1.01), "steal": (0.0, 0.0001, 0.002, 0.01, 1.01),
         "interference": (0.0, 0.1, 0.3, 0.6, 1.01)}


@dataclass(frozen=True)
class Run:
    some: float
    steal: float
    interference: float  # the largest of PSI some, steal and throttling: what max_pressure is held against
    distance: float  # log of the run's best step over its role's median best step in its folder; > 0: worse


def best_steps(folder: Path, metric: str, clock: str | None,
               summary: str = "best") -> list[tuple[str, float, dict[str, float]]]:
    """(role, the run's `summary` step as a cost: lower is better, pressure) for each run in one run folder
    that recorded the metric."""
    series = {"clock": clock} if clock else {}  # one series: the metric tagged with its clock alone
    out = []
    for line in (folder / "results.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        pressure = row.get("environment", {}).get("pressure")
        if not pressure:
            continue
        for m in row.get("metrics", []):
            if m["name"] == metric and m.get("tags", {}) == series and m.get("samples"):
                better = m.get("better", "lower")
                best = stats.run_summaries([m["samples"]], summary, better)[0]
                out.append((row["role"], best if better == "lower" else 1 / best, pressure))
    return out


def runs_under(reports: Path, metric: str, clock: str | None, summary: str = "best") -> list[Run]:
    runs = []
    for results in sorted(reports.rglob("results.jsonl")):
        steps = best_steps(results.parent, metric, clock, summary)
        for role in {r for r, _, _ in steps}:
            mine = [(best, p) for r, best, p in steps if r == role]
            if len(mine) < 3:
                continue
            middle = statistics.median(best for best, _ in mine)
            runs += [Run(p.get("some") or 0.0, p.get("steal") or 0.0, p.get("interference") or 0.0,
                         math.log(best / middle)) for best, p in mine]
    return runs


def ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0.0] * len(values)
    i = 0
    while i < len(order):  # ties share their mean rank
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2
        i = j + 1
    return out


def spearman(x: list[float], y: list[float]) -> float | None:
    rx, ry = ranks(x), ranks(y)
    if len(set(rx)) < 2 or len(set(ry)) < 2:
        return None
    return statistics.correlation(rx, ry)


def table(runs: list[Run], figure: str) -> None:
    edges = BANDS[figure]
    print(f"\n{figure:>6} band {'runs':>6} {'median distance':>16} {'> +5% slow':>11}")
    for low, high in itertools.pairwise(edges):
        band = [r for r in runs if low <= getattr(r, figure) < high]
        if not band:
            continue
        slow = sum(r.distance > SLOW for r in band)
        label = f"{low:.2%}-{min(high, 1):.2%}"
        print(f"{label:>18} {len(band):>6} {math.expm1(statistics.median(r.distance for r in band)):>+15.2%} "
              f"{f'{slow}/{len(band)}':>11}")
    rho = spearman([getattr(r, figure) for r in runs], [r.distance for r in runs])
    print(f"rank correlation of {figure} with the distance: {'n/a (one value)' if rho is None else f'{rho:+.2f}'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", type=Path)
    ap.add_argument("--metric", default="workload.step_time")
    ap.add_argument("--clock", default="cpu", help="the metric's clock tag ('' for the untagged, wall, series)")
    ap.add_argument("--summary", default="best", choices=("best", "median"))
    args = ap.parse_args()
    runs = runs_under(args.reports, args.metric, args.clock or None, args.summary)
    if not runs:
        print(f"under {args.reports}, no role of a run folder recorded {args.metric} with its pressure in 3 runs or more")
        return 2
    slow = sum(r.distance > SLOW for r in runs)
    print(f"{len(runs)} runs of {args.metric}[clock={args.clock or 'wall'}]; {slow} more than 5% above their "
          f"role's median; distance {math.expm1(min(r.distance for r in runs)):+.1%} .. {math.expm1(max(r.distance for r in runs)):+.1%}")
    for figure in BANDS:
        table(runs, figure)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
