"""Collectives, nccl-tests style: exact-value correctness on seeded inputs (count of wrong
elements), then time per message size with warm-up and repeats, algbw and busbw."""

from __future__ import annotations

import os
import time

import busbw
import loader
import pytest
import record
import torch

DTYPES = {"float32": "float32", "bfloat16": "bfloat16"}


def _sync(ctx) -> None:
    if ctx.device_type == "cuda":
        ctx.torch.cuda.synchronize()


def _seeded(ctx, rank: int, count: int, dtype):
    """Small integers: exactly representable in bf16 and summed exactly for world sizes up to 16."""
    torch = ctx.torch
    gen = torch.Generator().manual_seed(1234 + rank)
    return torch.randint(-8, 9, (count,), generator=gen).to(dtype).to(ctx.device)


def _ulp_wrong(got, want, ulps: int) -> int:
    if ulps == 0:
        return int((got != want).sum())
    eps = torch.finfo(want.dtype).eps
    tol = ulps * eps * want.abs().clamp(min=1.0)
    return int(((got.float() - want.float()).abs() > tol.float()).sum())


def correctness(ctx) -> dict:
    """Every collective, every dtype: the number of wrong elements on this rank."""
    torch, dist = ctx.torch, ctx.dist
    n, r = ctx.world_size, ctx.rank
    count = 1024
    wrong: dict[str, int] = {}
    for dname in ("float32", "bfloat16"):
        dtype = getattr(torch, dname)
        inputs = [_seeded(ctx, k, count * n, dtype) for k in range(n)]
        mine = inputs[r]
        total = torch.stack([x.float() for x in inputs]).sum(0)

        x = mine.clone()
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
        wrong[f"all_reduce.sum.{dname}"] = _ulp_wrong(x, total.to(dtype), 0)

        x = mine.clone()
        dist.all_reduce(x, op=dist.ReduceOp.AVG)
        wrong[f"all_reduce.avg.{dname}"] = _ulp_wrong(x, (total / n).to(dtype), 2)  # 2 ulp, as nccl-tests

        out = torch.empty(count * n * n, dtype=dtype, device=ctx.device)
        dist.all_gather_into_tensor(out, mine)
        wrong[f"all_gather.{dname}"] = _ulp_wrong(out, torch.cat(inputs), 0)

        out = torch.empty(count, dtype=dtype, device=ctx.device)
        dist.reduce_scatter_tensor(out, mine, op=dist.ReduceOp.SUM)
        wrong[f"reduce_scatter.{dname}"] = _ulp_wrong(out, total[r * count:(r + 1) * count].to(dtype), 0)

        out = torch.empty(count * n, dtype=dtype, device=ctx.device)
        dist.all_to_all_single(out, mine)
        want = torch.cat([inputs[k][r * count:(r + 1) * count] for k in range(n)])
        wrong[f"all_to_all.{dname}"] = _ulp_wrong(out, want, 0)

        x = mine.clone()
        dist.broadcast(x, src=0)
        wrong[f"broadcast.{dname}"] = _ulp_wrong(x, inputs[0], 0)
    # what this rank really loaded, after its first collectives (a rank can load what the launcher did not)
    return {"wrong": wrong, "mapped": loader.what_is_mapped()}


def bandwidth(ctx) -> dict:
    """Time each collective over message sizes; rank 0's per-iteration times."""
    torch, dist = ctx.torch, ctx.dist
    n = ctx.world_size
    cfg = ctx.config
    out: dict[str, dict[int, list[float]]] = {}
    for coll in cfg["collectives"]:
        out[coll] = {}
        for size in busbw.sizes(cfg["min_bytes"], cfg["max_bytes"], cfg.get("factor", 4)):
            count = max(size // 4, 1)
            if coll in ("reduce_scatter",):
                count = max(count // n, 1) * n
            x = torch.ones(count, dtype=torch.float32, device=ctx.device)
            if coll == "all_reduce":
                op = lambda x=x: dist.all_reduce(x)  # noqa: E731
            elif coll == "all_gather":
                o = torch.empty(count * n, device=ctx.device)
                op = lambda x=x, o=o: dist.all_gather_into_tensor(o, x)  # noqa: E731
            elif coll == "reduce_scatter":
                o = torch.empty(count // n, device=ctx.device)
                op = lambda x=x, o=o: dist.reduce_scatter_tensor(o, x)  # noqa: E731
            elif coll == "all_to_all":
                count = max(count // n, 1) * n
                x = torch.ones(count, device=ctx.device)
                o = torch.empty(count, device=ctx.device)
                op = lambda x=x, o=o: dist.all_to_all_single(o, x)  # noqa: E731
            else:
                op = lambda x=x: dist.broadcast(x, src=0)  # noqa: E731
            for _ in range(cfg["warmup"]):
                op()
            _sync(ctx)
            times = []
            for _ in range(cfg["iters"]):
                dist.barrier()
                t0 = time.perf_counter()
                op()
                _sync(ctx)
                times.append(time.perf_counter() - t0)
            # nccl-tests sizes: the whole buffer of one rank (all_gather: the output buffer)
            nbytes = count * 4 * (n if coll == "all_gather" else 1)
            out[coll][nbytes] = times
    return out


def _world_sizes() -> list[int]:
    """Processes per node to test: the harness derives them from the cell (STACKGATE_WORLD_SIZES);
    under plain pytest, 2 and the node's process count."""
    given = os.environ.get("STACKGATE_WORLD_SIZES")
    if given:
        return [int(n) for n in given.split(",") if n.strip()]
    per_node = int(os.environ.get("STACKGATE_NPROC_PER_NODE", "2"))
    return sorted({min(2, per_node), per_node})


@pytest.mark.distributed
@pytest.mark.parametrize("nproc", _world_sizes())
def test_collective_correctness(dist, nproc, expect) -> None:
    nnodes = int(os.environ.get("STACKGATE_NNODES", "1"))
    if expect.device == "cuda" and nproc > torch.cuda.device_count():
        pytest.fail(f"the cell asks for {nproc} processes per node but this node has "
                    f"{torch.cuda.device_count()} GPU(s): the runner does not match its pool")
    results = dist("test_collectives:correctness", nproc=nproc)
    bad = {}
    loaded = []
    roots = loader.stack_roots(expect.given)
    for res in results:
        for key, count in res["value"]["wrong"].items():
            if count:
                bad[f"rank{res['rank']}:{key}"] = count
        loaded += [f"rank {res['rank']}: {problem}"
                   for problem in loader.mapped_problems(loader.paths(res["value"]["mapped"]), roots)]
    world = nproc * nnodes
    record.metric("collective_wrong_elements", sum(bad.values()), "elements", test="collectives", better="equal",
                  world_size=world)
    assert not bad, f"wrong elements (0 ulp; 2 ulp for avg): {bad}"
    assert not loaded, "what the ranks loaded: " + "; ".join(loaded)


@pytest.mark.distributed
def test_collective_bandwidth(dist, expect, quick) -> None:
    nproc = int(os.environ.get("STACKGATE_NPROC_PER_NODE", "2"))
    gpu = expect.device == "cuda"
    max_bytes = int(os.environ.get("STACKGATE_BUSBW_MAX_BYTES", str((1 << 28) if gpu else (1 << 22))))
    if quick:
        max_bytes = min(max_bytes, 1 << 20)
    cfg = {"collectives": ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"],
           "min_bytes": 8, "max_bytes": max_bytes, "factor": 8 if quick else 4,
           "warmup": 2, "iters": 5 if quick else 10}
    results = dist("test_collectives:bandwidth", nproc=nproc, **cfg)
    n = nproc * int(os.environ.get("STACKGATE_NNODES", "1"))
    rank0 = next((r for r in results if r["rank"] == 0), None)
    if rank0 is None:
        return  # rank 0 lives on another node, which records
    for coll, per_size in rank0["value"].items():
        avg_bus = []
        for size, times in per_size.items():
            size = int(size)
            samples = [busbw.busbw_gbps(coll, size, t, n) for t in times]
            record.metric("busbw", samples, "GB/s", test="collective_bandwidth", better="higher",
                          collective=coll, size=size, world_size=n)
            record.metric("collective_time", [t * 1e6 for t in times], "us", test="collective_bandwidth",
                          better="lower", collective=coll, size=size, world_size=n)
            record.metric("algbw", [busbw.algbw_gbps(size, t) for t in times], "GB/s", test="collective_bandwidth",
                          better="higher", collective=coll, size=size, world_size=n)
            avg_bus.append(sum(samples) / len(samples))
        record.metric("avg_busbw", sum(avg_bus) / len(avg_bus), "GB/s", test="collective_bandwidth",
                      better="higher", collective=coll, world_size=n)
        if n > 1:  # with one rank nothing crosses a bus: busbw is 0 by definition, as in nccl-tests
            assert all(v > 0 for v in avg_bus), f"{coll}: zero bus bandwidth"
