"""A canary workload: a fixed amount of CPU work per step, timed on the process's CPU clock. CANARY_EXTRA
(a share, e.g. 0.3) adds that much more real work per step: a pool made slower, for `stackgate watch`'s
drift check (tests/torch/test_watch_canary.py, benchmarks/watch_drift.py). It knows nothing of stackgate
but the records contract: a JSON line per metric to $STACKGATE_RESULTS when that is set."""

import json
import os
import time
from pathlib import Path

import torch


def test_canary_step():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    a = torch.randn(192, 192)
    reps = round(30 * (1 + float(os.environ.get("CANARY_EXTRA", "0"))))
    samples = []
    for _ in range(15):
        t0 = time.process_time()
        for _ in range(reps):
            a = torch.tanh(a @ a)
        samples.append((time.process_time() - t0) * 1e3)
    assert torch.isfinite(a).all()
    out = os.environ.get("STACKGATE_RESULTS")
    if out:
        with Path(out).open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"kind": "metric", "name": "canary.step_time", "unit": "ms", "samples": samples,
                                 "better": "lower", "tags": {"clock": "cpu"}}) + "\n")
