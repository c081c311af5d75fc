"""Recommendation trainer: a transformer over dense + sparse features. Embedding tables are sharded
row-wise across ranks and lookups are exchanged with all_to_all; the dense part runs under DDP."""

from __future__ import annotations

import os

import pytest
import record
from clocks import StepClock, record_step_times


def train(ctx) -> dict:
    torch, dist = ctx.torch, ctx.dist
    import torch.distributed.nn.functional as dnn
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    cfg = ctx.config
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True, warn_only=True)
    n, r = ctx.world_size, ctx.rank
    tables, rows, dim, batch, dense_in = cfg["tables"], cfg["rows"], cfg["dim"], cfg["batch"], 13
    shard = rows // n
    # this rank's rows of every table (row-wise sharding): rows [r*shard, (r+1)*shard)
    full = torch.randn(tables, rows, dim, generator=torch.Generator().manual_seed(7)) * 0.1
    local = nn.Parameter(full[:, r * shard:(r + 1) * shard].clone().to(ctx.device))
    del full

    class Dense(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Sequential(nn.Linear(dense_in, dim), nn.ReLU(), nn.Linear(dim, dim))
            layer = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=2 * dim, dropout=0.0, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
            self.head = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, 1))

        def forward(self, dense, sparse):
            tokens = torch.cat([self.proj(dense).unsqueeze(1), sparse], dim=1)
            return self.head(self.encoder(tokens).mean(1)).squeeze(-1)

    model = DDP(Dense().to(ctx.device), device_ids=[ctx.local_rank] if ctx.device_type == "cuda" else None)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    emb_opt = torch.optim.SGD([local], lr=0.5)
    teacher = torch.randn(dense_in, generator=torch.Generator().manual_seed(3))

    def lookup(ids):  # ids: [batch, tables] global row ids, on this rank
        all_ids = torch.empty(n * batch, tables, dtype=ids.dtype, device=ctx.device)
        dist.all_gather_into_tensor(all_ids, ids)
        owner = all_ids // shard
        local_rows = (all_ids - r * shard).clamp(0, shard - 1)
        mask = (owner == r).unsqueeze(-1).to(local.dtype)
        t_index = torch.arange(tables, device=ctx.device).expand_as(local_rows)
        partial = local[t_index, local_rows] * mask  # [n*batch, tables, dim], zeros for others' rows
        received = dnn.all_to_all_single(torch.empty_like(partial), partial.contiguous())
        return received.view(n, batch, tables, dim).sum(0)

    losses, grad_norms = [], []
    clock = StepClock(torch, ctx.device_type)
    for step in range(cfg["steps"]):
        gen = torch.Generator().manual_seed(1000 * step + r)
        dense = torch.randn(batch, dense_in, generator=gen)
        ids = torch.randint(0, rows, (batch, tables), generator=gen)
        label = ((dense @ teacher) + (ids[:, 0] % 2) * 0.5 > 0).float()
        dense, ids, label = dense.to(ctx.device), ids.to(ctx.device), label.to(ctx.device)
        clock.start()
        opt.zero_grad()
        emb_opt.zero_grad()
        logits = model(dense, lookup(ids))
        loss = nn.functional.binary_cross_entropy_with_logits(logits, label)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
        opt.step()
        emb_opt.step()
        clock.stop()
        reduced = loss.detach().clone()
        dist.all_reduce(reduced)
        losses.append(float(reduced) / n)
        grad_norms.append(float(gnorm))
    return {"losses": losses, "grad_norms": grad_norms, "clock": clock.to_json(), "batch": batch}


@pytest.mark.distributed
def test_recsys_ddp_sharded_embeddings(dist, quick) -> None:
    nproc = int(os.environ.get("STACKGATE_NPROC_PER_NODE", "2"))
    steps = 12 if quick else 150  # ~9 ms steps on CPU: the median of many is what makes run-to-run noise small
    cfg = {"tables": 4, "rows": 4096, "dim": 32, "batch": 64, "steps": steps}
    results = dist("test_recsys:train", nproc=nproc, **cfg)
    rank0 = next((r for r in results if r["rank"] == 0), None)
    if rank0 is None:
        return
    v = rank0["value"]
    losses = v["losses"]
    world = nproc * int(os.environ.get("STACKGATE_NNODES", "1"))
    record.metric("recsys.loss", losses, "", test="recsys", better="equal")
    record.metric("recsys.grad_norm", v["grad_norms"], "", test="recsys", better="equal")
    ranks = [rank0["value"]["clock"], *(r["value"]["clock"] for r in results if r["rank"] != 0 and r.get("value"))]
    warm = record_step_times("recsys.step_time", ranks, test="recsys")
    record.metric("recsys.throughput", [v["batch"] * world / (t / 1e3) for t in warm], "samples/s", test="recsys",
                  better="higher")
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < first, f"loss did not go down: first {first:.4f}, last {last:.4f}"
