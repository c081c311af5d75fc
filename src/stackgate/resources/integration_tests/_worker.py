"""One rank of a distributed test, started by torchrun (see `launch.py`).

    python -m torch.distributed.run ... _worker.py MODULE:FUNCTION OUTDIR CONFIG_JSON

The rank sends its stdout/stderr to OUTDIR/rank<R>.log (one contiguous block per rank), sets up the
process group with an explicit timeout, arms a stack dump for hangs, runs FUNCTION(ctx) and writes
OUTDIR/rank<R>.json with the returned value or the traceback.
"""

from __future__ import annotations

import datetime as dt
import faulthandler
import importlib
import json
import os
import sys
import time
import traceback
import warnings
from pathlib import Path


class Context:
    def __init__(self, config: dict) -> None:
        import torch
        import torch.distributed as dist

        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.config = config
        self.device_type = config.get("device", "cpu")
        if self.device_type == "cuda":
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
            self.backend = config.get("backend", "nccl")
        else:
            self.device = torch.device("cpu")
            self.backend = config.get("backend", "gloo")
        self.dist = dist
        self.torch = torch

    def log(self, message: str) -> None:
        print(f"[rank {self.rank}] {message}", flush=True)


def main() -> int:
    target, outdir, config_text = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    config = json.loads(config_text)
    rank = int(os.environ.get("RANK", "0"))
    outdir.mkdir(parents=True, exist_ok=True)
    log = (outdir / f"rank{rank}.log").open("w", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    timeout_s = float(config.get("timeout_s", 120))
    faulthandler.enable(file=log)
    faulthandler.dump_traceback_later(max(timeout_s - 5, 5), exit=False, file=log)

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    module_name, func_name = target.split(":")
    result: dict = {"rank": rank, "ok": False}
    started = time.monotonic()
    ctx = None
    try:
        ctx = Context(config)
        ctx.dist.init_process_group(ctx.backend, timeout=dt.timedelta(seconds=timeout_s),
                                    **({"device_id": ctx.device} if ctx.device_type == "cuda" else {}))
        func = getattr(importlib.import_module(module_name), func_name)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result["value"] = func(ctx)
        result["warnings"] = sorted({(w.category.__name__, str(w.message)[:500], w.filename, w.lineno)
                                     for w in caught})
        result["ok"] = True
    except BaseException:  # noqa: BLE001 - every failure is reported to the parent test
        result["error"] = traceback.format_exc()
        print(result["error"], flush=True)
    finally:
        result["duration_s"] = time.monotonic() - started
        (outdir / f"rank{rank}.json").write_text(json.dumps(result, default=str))
        faulthandler.cancel_dump_traceback_later()
        if ctx is not None and ctx.dist.is_initialized():
            try:
                ctx.dist.destroy_process_group()
            except Exception as exc:  # noqa: BLE001 - reported in the rank log, after the result
                print(f"[rank {rank}] destroy_process_group failed: {exc!r}", flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter finalization: with gloo over TCP, C++ static destructors sometimes abort
    # ("terminate called without an active exception") after the rank has finished and written its
    # result, which made torchrun report a failure for a test that passed. Failures before this
    # point still exit non-zero with their traceback in the rank log.
    os._exit(code)
