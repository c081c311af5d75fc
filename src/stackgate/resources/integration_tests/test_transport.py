"""Transport verification: which network NCCL chose, from its own log, against the pool's
expectation. A silent fallback from EFA/IB to sockets fails here."""

from __future__ import annotations

import os
from pathlib import Path

import nccl_log
import pytest
import record


def allreduce_once(ctx) -> dict:
    x = ctx.torch.ones(1 << 20, device=ctx.device)
    ctx.dist.all_reduce(x)
    if ctx.device_type == "cuda":
        ctx.torch.cuda.synchronize()
    return {"sum": float(x[0])}


@pytest.mark.distributed
def test_nccl_transport_matches_pool(dist, expect, tmp_path: Path) -> None:
    if expect.device != "cuda":
        pytest.skip(f"CPU runner: collectives use gloo over TCP; expected transport is {expect.transport!r}")
    env = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
    if expect.transport == "efa":
        env["NCCL_NET"] = os.environ.get("NCCL_NET", "AWS Libfabric")  # no silent fallback
    nproc = int(os.environ.get("STACKGATE_NPROC_PER_NODE", "1"))
    dist("test_transport:allreduce_once", nproc=nproc, extra_env=env)
    text = "\n".join(p.read_text(errors="replace") for p in (tmp_path / "ranks").glob("rank*.log"))
    found = nccl_log.parse(text)
    record.environment({"nccl_transport": {"version": found.version, "network": found.network,
                                           "provider": found.ofi_provider, "plugin": found.plugin,
                                           "transports": sorted(found.transports)}})
    ok, why = found.matches(expect.transport)
    assert ok, why
