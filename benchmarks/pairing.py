"""`python benchmarks/pairing.py [--rounds 3] [--runs 20] [--hog 0]`: how noisy are the gate's run pairs
when each pair's two runs are taken one after the other (`pairing = "sequential"`, the default) and when
they are taken at the same time, each on its own share of the CPUs (`pairing = "concurrent"`, duet
benchmarking)?

Side by side, in one sitting, alternating: `stackgate calibrate --runs RUNS --target 0.05 --allow 0.01`
on the sensitivity suite and matrix (the same stack on both sides, `summary = "best"`, CPU clock, 3 s of
steps a run) under each pairing, ROUNDS times. For each calibration it prints the noise of the A/A pairs,
the pairs standing apart, what calibrate then recommends (repeats, confirm_repeats) and what a settled and
a confirmed comparison would cost in wall time; then the medians per pairing and their ratio. With `--hog
N`, N busy loops are switched on and off during every calibration (the sensitivity benchmark's hog). A
benchmark: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from sensitivity import POLICY, Hog, _stackgate  # noqa: E402 - the benchmark next to this one

PAIRINGS = ("sequential", "concurrent")


def calibrate(work: Path, suite: Path, pairing: str, index: int, runs: int, hog: int) -> dict[str, float]:
    (suite / "stackgate-policy.toml").write_text(POLICY.format(repeats=1, tolerance=0.03, summary="best",
                                                               tags='tags = { clock = "cpu" }', pairing=pairing))
    run_id = f"cal-{pairing}-{index}"
    start = time.monotonic()
    with Hog(hog, seed=index):
        proc = _stackgate("calibrate", work, suite, run_id, 3.0, "--runs", str(runs), "--target", "0.05",
                          "--allow", "0.01")
    found = work / run_id / "calibration.json"
    if proc.returncode != 0 or not found.exists():
        sys.exit(f"calibrate ({pairing}) failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    row = next(r for pool in json.loads(found.read_text())["pools"].values() for r in pool
               if r["metric"].startswith("workload.step_time"))
    return {"sigma": row["sigma"], "pairs": row["pairs"], "apart": row["apart"], "repeats": row["recommended_repeats"],
            "confirm": row.get("recommended_confirm_repeats", 0), "run_s": row.get("run_s", 0.0),
            "settled_s": row.get("settled_s", 0.0), "confirmed_s": row.get("confirmed_s", 0.0),
            "took_s": time.monotonic() - start}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="calibrations per pairing, alternating")
    ap.add_argument("--runs", type=int, default=20, help="A/A runs per calibration")
    ap.add_argument("--hog", type=int, default=0, help="busy loops switched on and off during each calibration")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="stackgate-pairing-"))
    suite = work / "suite"
    shutil.copytree(HERE / "sensitivity_suite", suite)
    found: dict[str, list[dict[str, float]]] = {p: [] for p in PAIRINGS}
    print(f"{'pairing':<11} {'round':>5} {'noise':>6} {'apart':>5} {'repeats':>7} {'confirm':>7} {'run':>6} "
          f"{'settled':>8} {'confirmed':>9} {'took':>6}")
    for index in range(args.rounds):
        for pairing in PAIRINGS if index % 2 == 0 else PAIRINGS[::-1]:  # counterbalanced, as the gate's pairs
            r = calibrate(work, suite, pairing, index, args.runs, args.hog)
            found[pairing].append(r)
            print(f"{pairing:<11} {index:>5} {r['sigma']:>6.1%} {r['apart']:>5.0f} {r['repeats']:>7.0f} "
                  f"{r['confirm']:>7.0f} {r['run_s']:>5.1f}s {r['settled_s']:>7.0f}s {r['confirmed_s']:>8.0f}s "
                  f"{r['took_s']:>5.0f}s", flush=True)
    med = {p: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for p, rows in found.items()}
    print(f"\nmedians over {args.rounds} calibration(s) of {args.runs} A/A runs each"
          + (f", {args.hog} busy loops switched on and off" if args.hog else ", quiet") + ":")
    for p in PAIRINGS:
        m = med[p]
        print(f"  {p:<11} noise {m['sigma']:.2%}, repeats {m['repeats']:.0f}, confirm_repeats {m['confirm']:.0f}, "
              f"a run {m['run_s']:.1f} s, settled {m['settled_s']:.0f} s, confirmed {m['confirmed_s']:.0f} s")
    s, c = med["sequential"], med["concurrent"]
    if c["sigma"] > 0 and c["settled_s"] > 0:
        print(f"  sequential / concurrent: noise {s['sigma'] / c['sigma']:.1f}x, "
              f"settled comparison's wall time {s['settled_s'] / c['settled_s']:.1f}x")
    print(f"reports: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
