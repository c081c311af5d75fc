"""`nox -s sensitivity -- [--trials K] [--repeats N] [--tolerance T] [--summary best|median]
[--plants 0,0.01,0.05,0.1]`:
plant a known slowdown (real extra work in the candidate, see sensitivity_suite/test_workload.py)
and run the real gate K times per planted change; print how often it says NO-GO for a regression
of workload.step_time. Targets on this CPU machine: 5% detected in >= 90% of trials, 0% and 1%
flagged in <= 5%. Production and candidate are the same stack (2.13.0+cpu, sensitivity-matrix.toml),
so the planted work is the only difference. A benchmark: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
POLICY = """[required]
all_tests = true

[performance]
repeats = {repeats}

[[performance.metric]]
name = "workload.step_time"
tolerance = {tolerance}
summary = "{summary}"
devices = ["cpu"]
"""


def trial(work: Path, suite: Path, planted: float, repeats: int, index: int) -> tuple[bool, bool, float | None, float]:
    run_id = f"p{planted}-t{index}"
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "stackgate", "run", "--backend", "venv", "--suite", str(suite),
                           "--matrix", str(HERE / "sensitivity-matrix.toml"),
                           "--no-platform-checks", "--no-rollback", "--suite-env", f"PLANTED_SLOWDOWN={planted}",
                           "--repeats", str(repeats), "--reports", str(work), "--run-id", run_id],
                          capture_output=True, text=True, check=False)
    took = time.monotonic() - start
    report = work / run_id / "report.json"
    if not report.exists():
        sys.exit(f"trial failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    data = json.loads(report.read_text())
    flagged = any(r["kind"] == "regression" and "workload.step_time" in r["message"] for r in data["reasons"]
                  if r["severity"] == "blocking")
    unsure = any(r["kind"] == "perf-inconclusive" for r in data["reasons"] if r["severity"] == "inconclusive")
    change = next((c["change"] for c in data["comparisons"] if c["metric"] == "workload.step_time"), None)
    return flagged, unsure, change, took


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tolerance", type=float, default=0.025)
    ap.add_argument("--plants", default="0,0.01,0.05,0.1")
    ap.add_argument("--summary", choices=("median", "best"), default="best",
                    help="how each run is summarised (the metric rule's `summary`; default best)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="stackgate-sensitivity-"))
    suite = work / "suite"
    shutil.copytree(HERE / "sensitivity_suite", suite)
    (suite / "stackgate-policy.toml").write_text(POLICY.format(repeats=args.repeats, tolerance=args.tolerance,
                                                                           summary=args.summary))
    plants = [float(p) for p in args.plants.split(",")]
    rows: dict[float, list[tuple[bool, bool, float | None, float]]] = {p: [] for p in plants}
    for index in range(args.trials):  # plants interleaved, so that drift over the hour hits all of them
        for planted in plants:
            rows[planted].append(trial(work / "reports", suite, planted, args.repeats, index))
            print(f"trial {index} planted {planted:+.0%}: {rows[planted][-1]}", flush=True)
    print(f"\nrepeats {args.repeats}, tolerance {args.tolerance:.1%}, summary {args.summary}, "
          f"{args.trials} trials per planted change")
    print(f"{'planted':>8} {'NO-GO rate':>11} {'INCONCLUSIVE':>13} {'median change seen':>19} {'trial time':>11}")
    for planted, found in rows.items():
        changes = [c for _, _, c, _ in found if c is not None]
        rate = sum(f for f, _, _, _ in found) / len(found)
        unsure = sum(u for _, u, _, _ in found) / len(found)
        print(f"{planted:+8.0%} {rate:11.0%} {unsure:13.0%} "
              f"{statistics.median(changes) if changes else float('nan'):+19.1%} "
              f"{statistics.median(t for _, _, _, t in found):10.0f}s")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
