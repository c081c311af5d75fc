"""A CPU workload for the sensitivity benchmark: each step does a fixed number of work units (a
64x64 matmul and tanh each). In the candidate cell, PLANTED_SLOWDOWN (a fraction) adds real extra
units: 0.05 -> 105 units instead of 100. Knows nothing of stackgate beyond the documented contract
(STACKGATE_ROLE in, JSON lines to STACKGATE_RESULTS out).

It steps for MEASURE_S seconds of wall time (at least MIN_STEPS steps), not a fixed count: this kind of
runner has slow phases of a second or two in which every step is slow, on both cores at once and seen
by no PSI, steal or throttling counter, so a run whose steps all fall in one is slowed whole. Measured
here (12 A/A processes per length, interleaved; the spread about 0 of two runs' fastest-step log ratio):
300 steps (0.8 s) 9.2%, 1500 steps (3.7 s) 0.9%, 4500 steps (11 s) 0.75% (docs/performance.md)."""

import json
import os
import time

import torch

UNITS = 100
MIN_STEPS = 300
MEASURE_S = float(os.environ.get("SENSITIVITY_MEASURE_S", "3"))  # the benchmark's --measure


def test_workload() -> None:
    torch.set_num_threads(1)
    planted = float(os.environ.get("PLANTED_SLOWDOWN", "0")) if os.environ.get("STACKGATE_ROLE") == "candidate" else 0
    units = round(UNITS * (1 + planted))
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 64, generator=gen), torch.randn(64, 64, generator=gen)
    times, cpu = [], []
    begin = time.perf_counter()
    while len(times) < MIN_STEPS + 3 or time.perf_counter() - begin < MEASURE_S:
        start, start_cpu = time.perf_counter(), time.process_time()
        x = a
        for _ in range(units):
            x = torch.tanh(x @ b)
        times.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - start_cpu) * 1000)  # this process's CPU time: the clock the gate reads
    assert torch.isfinite(x).all()
    path = os.environ.get("STACKGATE_RESULTS")
    if path:
        nodeid = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
        with open(path, "a") as fh:  # noqa: PTH123 - a plain suite
            fh.write(json.dumps({"name": "workload.step_time", "unit": "ms", "samples": times[3:], "better": "lower",
                                 "nodeid": nodeid}) + "\n")
            fh.write(json.dumps({"name": "workload.step_time", "unit": "ms", "samples": cpu[3:], "better": "lower",
                                 "tags": {"clock": "cpu"}, "nodeid": nodeid}) + "\n")
