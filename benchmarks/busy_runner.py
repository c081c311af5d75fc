"""`python benchmarks/busy_runner.py [--runs N] [--hog K] [-- stackgate run args]`: the README's main
command (`stackgate run --matrix matrix/upgrade.toml` by default) once on a quiet machine, then N
times with K busy loops beside it (the benchmark starts and stops them itself), from the repository
root. Prints one row per run: verdict, exit code, wall time, the largest interference a run of each
cell recorded, the performance runs discarded for interference and the rounds that replaced them
(`interference:` and `noise:` rounds), then the hog runs' GO count and their wall time against the
quiet run's. A benchmark: it prints figures and asserts nothing. Targets (#45): GO in 5 of 5 beside
2 busy loops and 3 of 3 beside 4, on both backends (`-- --backend venv`).

`--clocks ROUNDS`: which clock interference moves (#45). One run of the main command with ROUNDS
interleaved repeats while K busy loops switch on and off every `--period` seconds (60: about a
run's length, so that some runs are taken busy and others quiet), every pair kept (`max_pressure = 1.0`, no extra rounds); then, for each
bundled step time, on the CPU clock and on the wall clock, each run's median step (the
gate's summary) against its role's median, by band of the run's interference, and the rank
correlation of interference with that distance (`benchmarks/disturbance.py`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HOG = "while True: pass"


def start_hog(loops: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(loops)]


def stop_hog(hogs: list[subprocess.Popen[bytes]]) -> None:
    for hog in hogs:
        hog.kill()
        hog.wait()


@dataclass
class Run:
    decision: str
    exit: int
    wall_s: float
    busiest: dict[str, float]  # cell -> the largest interference one of its runs recorded
    discarded: list[str]
    rounds: int
    deciding: list[str]


def one_run(reports: Path, run_id: str, extra: list[str]) -> Run:
    argv = [sys.executable, "-m", "stackgate", "run", "--matrix", "matrix/upgrade.toml", "--reports", str(reports),
            "--run-id", run_id, *extra]
    start = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    wall = time.monotonic() - start
    report = reports / run_id / "report.json"
    data: dict[str, Any] = (json.loads(report.read_text()) if report.exists()
                            else {"decision": f"no report (exit {proc.returncode})", "reasons": []})
    rows = [json.loads(line) for line in (reports / run_id / "results.jsonl").read_text().splitlines()
            if line.strip()] if (reports / run_id / "results.jsonl").exists() else []
    busiest: dict[str, float] = {}
    for row in rows:
        seen = (row.get("environment", {}).get("pressure") or {}).get("interference")
        cell = row["cell_id"].split("@")[0]
        if seen is not None:
            busiest[cell] = max(busiest.get(cell, 0.0), seen)
    discarded = [r["message"] for r in data["reasons"] if r["kind"] == "pressure-discarded"]
    rounds = proc.stdout.count("\ninterference: 1 more interleaved run") + proc.stdout.count("\nnoise: 1 more interleaved run")
    deciding = [r["message"][:160] for r in data["reasons"] if r["severity"] in ("blocking", "inconclusive")]
    return Run(data["decision"], proc.returncode, wall, busiest, discarded, rounds, deciding)


def clocks(reports: Path, rounds: int, loops: int, period: float, extra: list[str]) -> None:
    from disturbance import BANDS, SLOW, runs_under, spearman
    from sensitivity import Hog

    policy = reports / "keep-every-pair.toml"
    reports.mkdir(parents=True, exist_ok=True)
    text = Path("matrix/policy.toml").read_text()
    policy.write_text(re.sub(r"(?m)^noise_budget_s = .*$", "noise_budget_s = 0",
                             re.sub(r"(?m)^max_pressure = .*$", "max_pressure = 1.0", text)))
    run_id = time.strftime("%Y%m%dT%H%M%S") + f"-clocks-hog{loops}"
    with Hog(loops, on_s=period, off_s=period, seed=rounds) as hog:
        found = one_run(reports, run_id, ["--repeats", str(rounds), "--policy", str(policy), *extra])
    print(_row(f"clocks hog{loops}", found))
    print(f"busy loops on for {hog.busy_s:.0f} s of {found.wall_s:.0f} s")
    edges = BANDS["interference"]
    heads = [f"{lo:.0%}-{min(hi, 1):.0%}" for lo, hi in itertools.pairwise(edges)]
    print(f"\n{'metric':28} {'clock':6} {'runs':>5} " + " ".join(f"{h + ': n, median, >5% slow':>28}" for h in heads)
          + "  rank corr.")
    for metric in ("recsys.step_time", "vit.step_time"):
        for clock in ("cpu", None):
            runs = runs_under(reports / run_id, metric, clock, "median")
            cells = []
            for lo, hi in itertools.pairwise(edges):
                band = [r for r in runs if lo <= r.interference < hi]
                cells.append(f"{len(band)}, {math.expm1(statistics.median(r.distance for r in band)):+.1%}, "
                             f"{sum(r.distance > SLOW for r in band)}/{len(band)}" if band else "-")
            rho = spearman([r.interference for r in runs], [r.distance for r in runs])
            print(f"{metric:28} {clock or 'wall':6} {len(runs):>5} " + " ".join(f"{c:>28}" for c in cells)
                  + f"  {'n/a' if rho is None else f'{rho:+.2f}':>10}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clocks", type=int, default=0, metavar="ROUNDS",
                    help="measure which clock interference moves, over ROUNDS interleaved repeats (see above)")
    ap.add_argument("--period", type=float, default=60.0,
                    help="--clocks: the busy loops run this many seconds, then pause as long (about a run's length, "
                         "so that some runs are taken busy and others quiet)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--hog", type=int, default=2, help="busy loops beside each hog run")
    ap.add_argument("--reports", default="reports/busy-runner")
    ap.add_argument("extra", nargs="*", help="more `stackgate run` arguments (after --)")
    args = ap.parse_args()
    reports = Path(args.reports)
    if args.clocks:
        clocks(reports, args.clocks, args.hog, args.period, args.extra)
        return 0
    stamp = time.strftime("%Y%m%dT%H%M%S")
    found = [("quiet", one_run(reports, f"{stamp}-quiet", args.extra))]
    print(_row(*found[-1]), flush=True)
    for i in range(args.runs):
        hogs = start_hog(args.hog)
        try:
            found.append((f"hog{args.hog} #{i + 1}", one_run(reports, f"{stamp}-hog{i + 1}", args.extra)))
        finally:
            stop_hog(hogs)
        print(_row(*found[-1]), flush=True)
    quiet = found[0][1].wall_s
    hogged = [r for _, r in found[1:]]
    if hogged:
        go = sum(r.decision == "GO" for r in hogged)
        walls = sorted(r.wall_s for r in hogged)
        print(f"\nwith {args.hog} busy loops: GO in {go} of {len(hogged)}; wall time median "
              f"{walls[len(walls) // 2]:.0f} s, max {walls[-1]:.0f} s = {walls[-1] / quiet:.2f}x the quiet run's "
              f"{quiet:.0f} s")
    return 0


def _row(name: str, r: Run) -> str:
    busiest = ", ".join(f"{'prod' if cell.startswith('prod-') else 'cand'} {x:.0%}" for cell, x in sorted(r.busiest.items()))
    text = (f"{name:10} {r.decision:13} exit {r.exit}  {r.wall_s:6.0f} s  interference (largest per cell): {busiest}; "
            f"{r.rounds} replacement round(s); {len(r.discarded)} discard note(s)")
    for line in [*r.deciding, *r.discarded]:
        text += f"\n           {line[:300]}"
    return text


if __name__ == "__main__":
    sys.exit(main())
