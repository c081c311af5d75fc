"""`nox -s sensitivity -- [--trials K] [--repeats N] [--confirm-repeats M] [--tolerance T] [--calibrate RUNS]
[--summary best|median] [--plants 0,0.01,0.05,0.1] [--clock cpu|wall] [--hog LOOPS] [--hog-plants PLANTS]
[--measure SECONDS]`:
plant a known slowdown (real extra work in the candidate, see sensitivity_suite/test_workload.py)
and run the real gate K times per planted change; print how often it says NO-GO for a regression
of workload.step_time. Targets on this CPU machine: 5% detected in >= 90% of trials, 0% and 1%
flagged in <= 5%. Production and candidate are the same stack (2.13.0+cpu, sensitivity-matrix.toml),
so the planted work is the only difference. `--clock` picks the clock the policy gates (the
workload records both; default cpu, the process's CPU time). `--hog LOOPS` starts that many busy
loops during every trial, switched on and off every few seconds (a random phase per trial), so that
some runs of a trial are disturbed and others not; with `--hog-plants 0,0.1` the --plants run quiet and
these run beside the hog, interleaved, at the same settings (both halves of #22's targets in one
sitting, one table each). `--measure` sets how long each run of the workload
steps (default 3 s; 0 gives its minimum, 300 steps). `--calibrate RUNS` first runs `stackgate calibrate
--runs RUNS --target 0.05 --allow 0.01` on the same suite, matrix and settings and takes the tolerance,
repeats and confirm_repeats it recommends for workload.step_time instead of --tolerance, --repeats and
--confirm-repeats (the protocol of #22's targets, in one command). It keeps each trial's reports and
says where. A benchmark: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
POLICY = """[required]
all_tests = true

[performance]
repeats = {repeats}
pairing = "{pairing}"

[[performance.metric]]
name = "workload.step_time"
tolerance = {tolerance}
summary = "{summary}"
devices = ["cpu"]
{tags}
"""


class Hog:
    """`loops` busy loops, on for `on_s` then off for `off_s`, from a random phase, until stopped."""

    def __init__(self, loops: int, on_s: float = 4.0, off_s: float = 4.0, seed: int = 0) -> None:
        self.loops, self.on_s, self.off_s = loops, on_s, off_s
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._cycle, daemon=True)
        self.busy_s = 0.0

    def __enter__(self) -> Hog:
        if self.loops:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.loops:
            self.thread.join()

    def _cycle(self) -> None:
        on = self.rng.random() < 0.5
        first = self.rng.uniform(0, self.on_s if on else self.off_s)
        while not self.stop.is_set():
            if on:
                procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.loops)]
                start = time.monotonic()
                self.stop.wait(first or self.on_s)
                for proc in procs:
                    proc.kill()
                    proc.wait()
                self.busy_s += time.monotonic() - start
            else:
                self.stop.wait(first or self.off_s)
            on, first = not on, 0.0


def trial(work: Path, suite: Path, planted: float, repeats: tuple[int, int | None], index: int,
          hog: int = 0, measure: float = 3.0) -> tuple[bool, bool, float | None, float]:
    run_id = f"p{planted}-t{index}" + (f"-hog{hog}" if hog else "")
    start = time.monotonic()
    with Hog(hog, seed=index * 100 + round(planted * 1000)):
        proc = _run(work, suite, planted, repeats, run_id, measure)
    took = time.monotonic() - start
    return (*_read(work, run_id, proc), took)


def _run(work: Path, suite: Path, planted: float, repeats: tuple[int, int | None], run_id: str,
         measure: float) -> subprocess.CompletedProcess[str]:
    first, confirm = repeats
    return _stackgate("run", work, suite, run_id, measure, "--suite-env", f"PLANTED_SLOWDOWN={planted}",
                      "--repeats", str(first), *(("--confirm-repeats", str(confirm)) if confirm else ()))


def _stackgate(command: str, work: Path, suite: Path, run_id: str, measure: float,
               *more: str) -> subprocess.CompletedProcess[str]:
    """`stackgate COMMAND` on the sensitivity suite and matrix, as every trial and the calibration run it."""
    return subprocess.run([sys.executable, "-m", "stackgate", command, "--backend", "venv", "--suite", str(suite),
                           "--matrix", str(HERE / "sensitivity-matrix.toml"), "--no-platform-checks",
                           "--no-rollback", "--suite-env", f"SENSITIVITY_MEASURE_S={measure}",
                           "--reports", str(work), "--run-id", run_id, *more],
                          capture_output=True, text=True, check=False)


def calibrated(work: Path, suite: Path, runs: int, measure: float) -> tuple[float, int, int]:
    """The tolerance, repeats and confirm_repeats `stackgate calibrate --target 0.05 --allow 0.01` recommends for
    workload.step_time on this machine, from RUNS A/A runs of the suite as the trials run it."""
    start = time.monotonic()
    proc = _stackgate("calibrate", work, suite, "calibration", measure, "--runs", str(runs), "--target", "0.05",
                      "--allow", "0.01")
    print(proc.stdout[proc.stdout.find("calibration of pool"):].rstrip(), flush=True)
    found = work / "calibration" / "calibration.json"
    if proc.returncode != 0 or not found.exists():
        sys.exit(f"calibrate failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    rows = [r for pool in json.loads(found.read_text())["pools"].values() for r in pool
            if r["metric"].startswith("workload.step_time")]
    if not rows:
        sys.exit(f"calibrate measured no workload.step_time:\n{proc.stdout[-2000:]}")
    print(f"calibrated in {time.monotonic() - start:.0f} s: tolerance {rows[0]['recommended_tolerance']:.1%}, "
          f"repeats {rows[0]['recommended_repeats']}, confirm_repeats {rows[0].get('recommended_confirm_repeats')}",
          flush=True)
    found = rows[0]
    return found["recommended_tolerance"], found["recommended_repeats"], found.get("recommended_confirm_repeats")


def _read(work: Path, run_id: str, proc: subprocess.CompletedProcess[str]) -> tuple[bool, bool, float | None]:
    report = work / run_id / "report.json"
    if not report.exists():
        sys.exit(f"trial failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    data = json.loads(report.read_text())
    flagged = any(r["kind"] == "regression" and "workload.step_time" in r["message"] for r in data["reasons"]
                  if r["severity"] == "blocking")
    unsure = any(r["kind"] in ("perf-inconclusive", "perf-pressure") for r in data["reasons"]
                 if r["severity"] == "inconclusive")
    gated = next((c for c in data["comparisons"] if c["metric"].startswith("workload.step_time") and c["gated"]), {})
    change = gated.get("change")
    rows = [json.loads(line) for line in (work / run_id / "results.jsonl").read_text().splitlines() if line.strip()]
    seen = [p["interference"] for r in rows if (p := r.get("environment", {}).get("pressure"))
            and p.get("interference") is not None]
    dropped = sum(r["kind"] == "pressure-discarded" for r in data["reasons"])
    noise = f", pairs' noise {gated['noise']:.1%}" if gated.get("noise") is not None else ""
    print(f"  {len(rows)} runs, interference {min(seen, default=0):.0%}-{max(seen, default=0):.0%}"
          f"{', pairs dropped for it' if dropped else ''}{noise}", flush=True)
    return flagged, unsure, change


def _table(rows: dict[float, list[tuple[bool, bool, float | None, float]]]) -> None:
    print(f"{'planted':>8} {'NO-GO rate':>11} {'INCONCLUSIVE':>13} {'median change seen':>19} {'trial time':>11}")
    for planted, found in rows.items():
        changes = [c for _, _, c, _ in found if c is not None]
        flagged, unsure = sum(f for f, _, _, _ in found), sum(u for _, u, _, _ in found)
        print(f"{planted:+8.0%} {f'{flagged}/{len(found)}':>11} {f'{unsure}/{len(found)}':>13} "
              f"{statistics.median(changes) if changes else float('nan'):+19.1%} "
              f"{statistics.median(t for _, _, _, t in found):10.0f}s")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--confirm-repeats", type=int, default=None,
                    help="runs for a comparison the repeats leave unsettled (default: the policy's, 5)")
    ap.add_argument("--tolerance", type=float, default=0.025)
    ap.add_argument("--calibrate", type=int, default=0, metavar="RUNS",
                    help="first calibrate with RUNS A/A runs and use the tolerance, repeats and "
                         "confirm_repeats it recommends")
    ap.add_argument("--plants", default="0,0.01,0.05,0.1")
    ap.add_argument("--summary", choices=("median", "best"), default="best",
                    help="how each run is summarised (the metric rule's `summary`; default best)")
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                    help="the clock the policy gates: the process's CPU time (default) or wall time")
    ap.add_argument("--hog", type=int, default=0, help="busy loops switched on and off during each trial")
    ap.add_argument("--hog-plants", default="", metavar="PLANTS",
                    help="also run these planted changes beside the hog (--hog loops, default 2), interleaved "
                         "with the quiet --plants, at the same settings")
    ap.add_argument("--pairing", choices=("sequential", "concurrent"), default="sequential",
                    help="the policy's [performance] pairing: each pair's runs one after the other (default) or "
                         "at the same time on shares of the CPUs (calibrate too)")
    ap.add_argument("--measure", type=float, default=3.0,
                    help="seconds each run of the workload steps for (default 3; 0: its minimum, 300 steps)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="stackgate-sensitivity-"))
    suite = work / "suite"
    shutil.copytree(HERE / "sensitivity_suite", suite)
    tags = 'tags = { clock = "cpu" }' if args.clock == "cpu" else ""
    policy = suite / "stackgate-policy.toml"
    policy.write_text(POLICY.format(repeats=args.repeats, tolerance=args.tolerance, summary=args.summary, tags=tags,
                                    pairing=args.pairing))
    if args.calibrate:
        args.tolerance, args.repeats, args.confirm_repeats = calibrated(work / "reports", suite, args.calibrate,
                                                                        args.measure)
        policy.write_text(POLICY.format(repeats=args.repeats, tolerance=args.tolerance, summary=args.summary,
                                        tags=tags, pairing=args.pairing))
    # (planted change, busy loops) per condition: --plants under --hog, or quiet with --hog-plants beside them
    hog_plants = [float(p) for p in args.hog_plants.split(",")] if args.hog_plants else []
    loops = args.hog or 2
    conditions = [(float(p), 0 if hog_plants else args.hog) for p in args.plants.split(",")]
    conditions += [(p, loops) for p in hog_plants]
    rows: dict[tuple[float, int], list[tuple[bool, bool, float | None, float]]] = {c: [] for c in conditions}
    for index in range(args.trials):  # conditions interleaved, so that drift over the hours hits all of them
        for planted, hog in conditions:
            rows[planted, hog].append(trial(work / "reports", suite, planted, (args.repeats, args.confirm_repeats),
                                            index, hog, args.measure))
            print(f"trial {index} planted {planted:+.0%}{f' beside {hog} busy loops' if hog else ''}: "
                  f"{rows[planted, hog][-1]}", flush=True)
    confirm = f", confirm_repeats {args.confirm_repeats}" if args.confirm_repeats else ""
    print(f"\npairing {args.pairing}, repeats {args.repeats}{confirm}, tolerance {args.tolerance:.1%}, "
          f"summary {args.summary}, clock {args.clock}, "
          f"{args.measure:g} s of steps per run, {args.trials} trials per planted change")
    for hog in sorted({h for _, h in conditions}):
        print("quiet" if not hog else f"{hog} busy loops switched on and off during each trial")
        _table({p: found for (p, h), found in rows.items() if h == hog})
    print(f"reports: {work / 'reports'} (each trial's report.json: its comparison, noise and gate power)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
