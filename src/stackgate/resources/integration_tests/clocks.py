"""Each training step on three clocks, and how they become metrics.

- wall: `time.perf_counter()` around the step (what a user waits for; everything the runner's other
  jobs do to us is in it);
- cpu: `time.process_time()` of the rank's process around the step: the CPU time of all its threads
  (the intra-op pool and the communication threads included). Time spent waiting for the CPU, or for
  a peer that was descheduled, is not in it: on a shared CPU runner this is the clock to gate;
- device (CUDA): milliseconds between two CUDA events recorded around the step on the current
  stream: the GPU's own time, to gate on GPU runners.

Ranks: each rank times its own steps; a step's cpu and device time is the largest over this
node's ranks (a collective step is as slow as its slowest rank); wall time is rank 0's.

A metric says its clock with the tag `clock` ("cpu" or "device"; no tag: wall), so the policy
gates the clock it names (`tags = { clock = "cpu" }`). A user's suite does the same with
`record.metric(..., clock="cpu")`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import record


class StepClock:
    def __init__(self, torch: Any, device_type: str) -> None:
        self.torch = torch
        self.cuda = device_type == "cuda"
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.device: list[float] = []
        self._events: list[tuple[Any, Any]] = []

    def start(self) -> None:
        if self.cuda:
            begin = self.torch.cuda.Event(enable_timing=True)
            begin.record()
            self._events.append((begin, None))
        self._t = (time.perf_counter(), time.process_time())

    def stop(self) -> None:
        """After the step's work (on CUDA: synchronises, so the wall time covers the device's work)."""
        if self.cuda:
            end = self.torch.cuda.Event(enable_timing=True)
            end.record()
            self._events[-1] = (self._events[-1][0], end)
            self.torch.cuda.synchronize()
        wall, cpu = self._t
        self.wall.append((time.perf_counter() - wall) * 1e3)
        self.cpu.append((time.process_time() - cpu) * 1e3)

    def to_json(self) -> dict[str, list[float]]:
        device = [begin.elapsed_time(end) for begin, end in self._events if end is not None]
        return {"wall_ms": self.wall, "cpu_ms": self.cpu, "device_ms": device}


def _slowest(ranks: Sequence[dict[str, list[float]]], key: str, skip: int) -> list[float]:
    series = [r[key][skip:] or r[key] for r in ranks if r.get(key)]
    return [max(step) for step in zip(*series)] if series else []


def record_step_times(name: str, ranks: Sequence[dict[str, list[float]]], *, test: str, skip: int = 2) -> list[float]:
    """`name` (wall, rank 0 = ranks[0]), `name[clock=cpu]` and on CUDA `name[clock=device]` (the
    slowest rank per step), without the first `skip` (warm-up) steps. Returns the wall times."""
    wall = ranks[0]["wall_ms"][skip:] or ranks[0]["wall_ms"]
    record.metric(name, wall, "ms", test=test, better="lower")
    for key, clock in (("cpu_ms", "cpu"), ("device_ms", "device")):
        found = _slowest(ranks, key, skip)
        if found:
            record.metric(name, found, "ms", test=test, better="lower", clock=clock)
    return wall
