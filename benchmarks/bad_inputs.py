"""`nox -s bad-inputs`: at least 10,000 generated bad inputs (tests/hostile.py) pushed through the
real readers, the gate and the file-reading commands; per entry point: cases, crashes, hangs, false
GOs, and the time taken. Exit 1 if any crash, hang or false GO (the first few are printed)."""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests import hostile

PER_ENTRY = {"suite records -> gate": 2500, "JUnit (node 1 of 2) -> gate": 1000, "results.jsonl -> gate": 2000,
             "OSV record -> scan": 1000, "policy.toml -> load": 1500, "run --dry-run --policy": 300,
             "matrix show": 700, "history": 500, "promote --dry-run": 800, "merge (run.json, results.jsonl)": 150,
             "stacks.json -> run --stacks": 1000, "fleet.toml -> load": 500, "compat.toml -> load": 500,
             "watch (pylock.toml, canaries)": 400}


def run(entry: str, n: int, seed: int) -> tuple[Counter[str], list[str], float]:
    strategy, check = hostile.ENTRY_POINTS[entry]
    seen: Counter[str] = Counter()
    bad: list[str] = []

    @settings(max_examples=n, database=None, deadline=None, suppress_health_check=list(HealthCheck),
              phases=["generate"])
    @given(strategy())
    def each(value: Any) -> None:
        got = hostile.outcome(lambda: check(value))
        kind = "ok" if got == "ok" else got.split(":", 1)[0]
        seen[kind] += 1
        if kind != "ok" and len(bad) < 3:
            bad.append(f"{got} <- {value!r:.200}")

    start = time.perf_counter()
    each._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]
    each()
    return seen, bad, time.perf_counter() - start


def main() -> int:
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    print(f"{'entry point':30} {'cases':>7} {'crashes':>8} {'hangs':>6} {'false GOs':>10} {'s':>7}")
    total: Counter[str] = Counter()
    failures = []
    # one process per core: the entry points are independent (each its own seeded generator), and the
    # table comes out in this order whichever finishes first
    with ProcessPoolExecutor(max_workers=max(1, min(len(PER_ENTRY), os.cpu_count() or 1))) as pool:
        done = list(pool.map(run, PER_ENTRY, PER_ENTRY.values(), [seed] * len(PER_ENTRY)))
    for (entry, _), (seen, bad, took) in zip(PER_ENTRY.items(), done, strict=True):
        cases = sum(seen.values())
        total.update(seen)
        total["cases"] += cases
        print(f"{entry:30} {cases:7} {seen['crash']:8} {seen['hang']:6} {seen['false-go']:10} {took:7.1f}")
        failures += [f"{entry}: {b}" for b in bad]
    print(f"{'all':30} {total['cases']:7} {total['crash']:8} {total['hang']:6} {total['false-go']:10}")
    for line in failures:
        print("  " + line)
    return 1 if failures or total["cases"] < 10_000 else 0


if __name__ == "__main__":
    sys.exit(main())
