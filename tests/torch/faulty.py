"""Distributed functions that fail on purpose (used by test_faults.py through the suite's launcher)."""

from __future__ import annotations

import os
import time


def crash_rank1(ctx) -> int:
    x = ctx.torch.ones(4)
    ctx.dist.all_reduce(x)
    if ctx.rank == 1:
        os._exit(17)  # a rank dies mid-run
    ctx.dist.all_reduce(x)
    return 0


def hang_rank1(ctx) -> int:
    if ctx.rank == 1:
        time.sleep(3600)  # a rank hangs
    ctx.dist.all_reduce(ctx.torch.ones(4))
    return 0


def ok(ctx) -> float:
    x = ctx.torch.full((4,), float(ctx.rank + 1))
    ctx.dist.all_reduce(x)
    return float(x[0])
