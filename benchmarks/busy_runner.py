"""`python benchmarks/busy_runner.py [--runs N] [--hog K] [-- stackgate run args]`: the README's main
command (`stackgate run --matrix matrix/upgrade.toml` by default) once on a quiet machine, then N
times with K busy loops beside it (the benchmark starts and stops them itself), from the repository
root. Prints one row per run: verdict, exit code, wall time, the largest interference a run of each
cell recorded, the performance runs discarded for interference and the rounds that replaced them,
then the hog runs' GO count and their wall time against the quiet run's. A benchmark: it prints
figures and asserts nothing. Targets (#22): GO in N of N with the hog, wall time <= 1.5x quiet.
"""

from __future__ import annotations

import argparse
import json
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
    rounds = proc.stdout.count("\ninterference: 1 more interleaved run")
    deciding = [r["message"][:160] for r in data["reasons"] if r["severity"] in ("blocking", "inconclusive")]
    return Run(data["decision"], proc.returncode, wall, busiest, discarded, rounds, deciding)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--hog", type=int, default=2, help="busy loops beside each hog run")
    ap.add_argument("--reports", default="reports/busy-runner")
    ap.add_argument("extra", nargs="*", help="more `stackgate run` arguments (after --)")
    args = ap.parse_args()
    reports = Path(args.reports)
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
