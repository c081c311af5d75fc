"""`python benchmarks/reference_gauge.py [--seconds 60] [--python PATH]`: would a reference workload,
timed beside the suite, see the slowdowns that PSI, steal and throttling do not?

Two processes run at the same time for `--seconds`: the sensitivity workload's step (100 units of a
64x64 matmul and tanh, one thread, its CPU time per step) in an interpreter with torch (`--python`,
default this one), and a pure-Python reference kernel (its thread's CPU time per call), first back to
back, then for a tenth of the time (the kernel, then a sleep: the cost a gauge beside a real suite could
afford). For windows of 0.5, 2 and 5 s it prints how far the workload's best step moved, how closely the
reference followed it (correlation of the logs), and the spread of adjacent windows' log ratios (a
pair of runs, as the gate pairs them) raw and divided by the reference's: a gauge worth gating by would
cut the second well below the first. Then the workload twice at once, one process pinned to each of two
CPUs (`twin`): how closely their best steps follow each other, the spread of their log ratio (a pair
taken at the same time, as `pairing = "concurrent"` takes it) against that of adjacent windows of one
process (a pair taken one after the other). A benchmark: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORK = """
import json, sys, time, torch
torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
a, b = torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g)
out, end = [], time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    t, s = time.monotonic(), time.process_time()
    x = a
    for _ in range(100):
        x = torch.tanh(x @ b)
    out.append((t, time.process_time() - s))
json.dump(out, open(sys.argv[2], "w"))
"""

REFERENCE = """
import json, sys, time
out, end, pause = [], time.monotonic() + float(sys.argv[1]), float(sys.argv[3])
while time.monotonic() < end:
    t, s = time.monotonic(), time.thread_time()
    x = 0
    for i in range(20000):
        x = (x * 31 + i) & 0xFFFFFFFF
    spent = time.thread_time() - s
    out.append((t, spent))
    if pause:
        time.sleep(spent * pause)
json.dump(out, open(sys.argv[2], "w"))
"""


def windows(series: list[tuple[float, float]], start: float, end: float, width: float, best: bool) -> list[float]:
    """Per window of `width` seconds: the fastest step (the workload, as summary = "best" reads a run)
    or the median call (the reference)."""
    out = []
    at = start
    while at + width <= end:
        inside = [v for t, v in series if at <= t < at + width]
        if inside:
            out.append(min(inside) if best else statistics.median(inside))
        at += width
    return out


def log_windows(first: list[tuple[float, float]], second: list[tuple[float, float]], span: tuple[float, float],
                width: float, second_best: bool) -> tuple[list[float], list[float]] | None:
    """Both series' windows over the same span, as logs (the first's best step; the second's best step or
    median call), cut to the same length; None when fewer than 6 windows."""
    one = [math.log(x) for x in windows(first, *span, width, best=True)]
    two = [math.log(x) for x in windows(second, *span, width, best=second_best)]
    n = min(len(one), len(two))
    return (one[:n], two[:n]) if n >= 6 else None


def adjacent(logs: list[float]) -> list[float]:
    """Windows 0 and 1, 2 and 3, ...: as a pair of runs taken one after the other, their log ratios."""
    return [logs[i + 1] - logs[i] for i in range(0, len(logs) - 1, 2)]


def measure(python: str, seconds: float, pause: float, folder: Path) -> None:
    work, ref = folder / "work.json", folder / "ref.json"
    procs = [subprocess.Popen([python, "-c", WORK, str(seconds), str(work)]),
             subprocess.Popen([sys.executable, "-c", REFERENCE, str(seconds + 3), str(ref), str(pause)])]
    for proc in procs:
        proc.wait()
    w, r = json.loads(work.read_text()), json.loads(ref.read_text())
    start, end = max(w[0][0], r[0][0]) + 1, min(w[-1][0], r[-1][0])
    duty = sum(v for _, v in r) / (r[-1][0] - r[0][0])
    print(f"\nreference {'back to back' if not pause else 'with pauses'}: {len(r)} calls, "
          f"{duty:.0%} of a core; workload {len(w)} steps")
    print(f"{'window':>7} {'best step moved':>16} {'correlation':>12} {'pair spread raw':>16} {'/ reference':>12}")
    for width in (0.5, 2.0, 5.0):
        found = log_windows(w, r, (start, end), width, second_best=False)
        if found is None:
            continue
        ww, rr = found
        raw = adjacent(ww)
        norm = [raw[k] - (rr[2 * k + 1] - rr[2 * k]) for k in range(len(raw))]
        print(f"{width:6.1f}s {math.exp(max(ww) - min(ww)) - 1:15.0%} {statistics.correlation(ww, rr):12.2f} "
              f"{statistics.stdev(raw):16.2%} {statistics.stdev(norm):12.2%}")


def twin(python: str, seconds: float, folder: Path) -> None:
    """The workload in two processes at once, one pinned to each of the first two CPUs: how far do their
    windows' best steps move together (what a pair of runs taken at the same time, pairing =
    "concurrent", would see), against adjacent windows of one process (a pair taken one after the
    other)?"""
    cpus = sorted(os.sched_getaffinity(0))[:2]
    if len(cpus) < 2:
        print("\ntwin: needs two CPUs")
        return
    outs = [folder / f"twin{c}.json" for c in cpus]
    procs = [subprocess.Popen(["taskset", "-c", str(c), python, "-c", WORK, str(seconds), str(o)])
             for c, o in zip(cpus, outs, strict=True)]
    for proc in procs:
        proc.wait()
    a, b = (json.loads(o.read_text()) for o in outs)
    start, end = max(a[0][0], b[0][0]) + 1, min(a[-1][0], b[-1][0])
    print(f"\ntwin: the workload on CPU {cpus[0]} and on CPU {cpus[1]} at once, {len(a)} and {len(b)} steps")
    print(f"{'window':>7} {'best step moved':>16} {'correlation':>12} {'together, rms':>14} {'(core bias)':>12} "
          f"{'one after the other, rms':>25}")
    for width in (0.5, 3.0, 5.0):
        found = log_windows(a, b, (start, end), width, second_best=True)
        if found is None:
            continue
        wa, wb = found
        together = [x - y for x, y in zip(wa, wb, strict=True)]
        apart = adjacent(wa) + adjacent(wb)

        def rms(v: list[float]) -> float:
            return math.sqrt(math.fsum(x * x for x in v) / len(v))

        print(f"{width:6.1f}s {math.exp(max(wa) - min(wa)) - 1:15.0%} {statistics.correlation(wa, wb):12.2f} "
              f"{rms(together):14.2%} {statistics.fmean(together):+12.2%} {rms(apart):25.2%}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--python", default=sys.executable, help="an interpreter with torch, for the workload")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        measure(args.python, args.seconds, 0.0, Path(folder))
        measure(args.python, args.seconds, 9.0, Path(folder))  # sleep 9x the call: a tenth of a core
        twin(args.python, args.seconds, Path(folder))
    started = time.strftime("%Y-%m-%d %H:%M")
    print(f"\n(measured {started}; the machine's noise changes over minutes: compare runs of one session)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
