"""`python benchmarks/measure_length.py [--python PATH] [--measure 0,3,10] [--runs 12]`: how much does
each run's summary of the sensitivity workload move from run to run, as a function of how long the run
measures?

Runs the sensitivity workload itself (`sensitivity_suite/test_workload.py`, under pytest, in a fresh
process each time, in the interpreter `--python` that has torch and pytest) `--runs` times for each
length `--measure` (seconds of steps; 0 is its minimum, 300 steps), the lengths interleaved in a random
order so that drift on the runner hits them all. For each length it prints the time a run's steps
covered, and for each run's fastest step and median step (CPU clock, as the gate reads it) the spread
about 0 of two consecutive runs' log ratio (how an A/A pair of the gate would move) and the range over
all runs. A benchmark: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SUITE = Path(__file__).resolve().parent / "sensitivity_suite" / "test_workload.py"


def one_run(python: str, measure: float, out: Path) -> list[float]:
    out.unlink(missing_ok=True)
    env = {**os.environ, "STACKGATE_RESULTS": str(out), "SENSITIVITY_MEASURE_S": str(measure)}
    subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(SUITE)], env=env, check=True,
                   capture_output=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return next(r["samples"] for r in rows if r.get("tags", {}).get("clock") == "cpu")


def spread(values: list[float]) -> float:
    logs = [math.log(values[i + 1] / values[i]) for i in range(0, len(values) - 1, 2)]
    return math.sqrt(math.fsum(x * x for x in logs) / len(logs))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", default=sys.executable, help="an interpreter with torch and pytest")
    ap.add_argument("--measure", default="0,3,10", help="seconds of steps per run, comma-separated")
    ap.add_argument("--runs", type=int, default=12, help="runs per length (pairs: consecutive runs)")
    args = ap.parse_args()
    lengths = [float(m) for m in args.measure.split(",")]
    runs: dict[float, list[list[float]]] = {m: [] for m in lengths}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "metrics.jsonl"
        for _ in range(args.runs):
            for m in random.sample(lengths, len(lengths)):
                runs[m].append(one_run(args.python, m, out))
    print(f"{'measure':>8} {'covers':>7} {'fastest: pair spread':>21} {'fastest: range (ms)':>20} "
          f"{'median: pair spread':>20}")
    for m, found in runs.items():
        best, middle = [min(r) for r in found], [statistics.median(r) for r in found]
        covers = statistics.median(math.fsum(r) / 1000 for r in found)
        print(f"{m:7g}s {covers:6.2f}s {spread(best):21.2%} {min(best):9.3f}-{max(best):.3f} "
              f"{spread(middle):20.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
