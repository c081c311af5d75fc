"""Content-understanding trainer: a ViT-style transformer under FSDP2 (`fully_shard`) with mixed
precision and activation checkpointing; distributed checkpoint save, then resume gives an identical
next-step loss. Peak memory and step time are recorded."""

from __future__ import annotations

import os
import resource
from pathlib import Path

import pytest
import record
from clocks import StepClock, record_step_times


def _build(ctx, cfg):
    torch = ctx.torch
    from torch import nn
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.utils.checkpoint import checkpoint

    dim, depth, patch = cfg["dim"], cfg["depth"], 8

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1 = nn.LayerNorm(dim)
            self.attn = nn.MultiheadAttention(dim, 4, batch_first=True)
            self.norm2 = nn.LayerNorm(dim)
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

        def _inner(self, x):
            h = self.norm1(x)
            x = x + self.attn(h, h, h, need_weights=False)[0]
            return x + self.mlp(self.norm2(x))

        def forward(self, x):
            return checkpoint(self._inner, x, use_reentrant=False)  # activation checkpointing

    class ViT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.patch = nn.Conv2d(3, dim, patch, stride=patch)
            self.pos = nn.Parameter(torch.zeros(1, (32 // patch) ** 2, dim))
            self.blocks = nn.ModuleList(Block() for _ in range(depth))
            self.norm = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, 10)

        def forward(self, x):
            x = self.patch(x).flatten(2).transpose(1, 2) + self.pos
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x).mean(1))

    torch.manual_seed(0)
    model = ViT().to(ctx.device)
    mp = MixedPrecisionPolicy(param_dtype=getattr(torch, cfg["param_dtype"]), reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, opt


def _batch(ctx, step: int):
    torch = ctx.torch
    gen = torch.Generator().manual_seed(10_000 + 100 * step + ctx.rank)
    x = torch.randn(16, 3, 32, 32, generator=gen)
    y = (x[:, 0].mean((1, 2)) > 0).long() + 2 * (x[:, 1].mean((1, 2)) > 0).long()
    return x.to(ctx.device), y.to(ctx.device)


def _step(ctx, model, opt, step: int):
    torch = ctx.torch
    x, y = _batch(ctx, step)
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x).float(), y)
    loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
    opt.step()
    full = loss.detach().clone()
    ctx.dist.all_reduce(full)
    gnorm = gnorm.full_tensor() if hasattr(gnorm, "full_tensor") else gnorm
    return float(full) / ctx.world_size, float(gnorm)


def train_and_resume(ctx) -> dict:
    torch = ctx.torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    cfg = ctx.config
    if ctx.device_type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    model, opt = _build(ctx, cfg)
    losses, grad_norms = [], []
    clock = StepClock(torch, ctx.device_type)
    for step in range(cfg["steps"]):
        clock.start()
        loss, gnorm = _step(ctx, model, opt, step)
        clock.stop()
        losses.append(loss)
        grad_norms.append(gnorm)
    ckpt = Path(cfg["ckpt_dir"])
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(ckpt))
    next_loss, _ = _step(ctx, model, opt, cfg["steps"])

    fresh, fresh_opt = _build(ctx, cfg)
    msd, osd = get_state_dict(fresh, fresh_opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=str(ckpt))
    set_state_dict(fresh, fresh_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    resumed_loss, _ = _step(ctx, fresh, fresh_opt, cfg["steps"])
    if ctx.device_type == "cuda":
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"losses": losses, "grad_norms": grad_norms, "clock": clock.to_json(), "next_loss": next_loss,
            "resumed_loss": resumed_loss, "peak_mib": peak}


@pytest.mark.distributed
def test_vit_fsdp2_mixed_precision_dcp_resume(dist, expect, quick, tmp_path: Path) -> None:
    nproc = int(os.environ.get("STACKGATE_NPROC_PER_NODE", "2"))
    shared = os.environ.get("STACKGATE_SHARED_DIR")
    ckpt = (Path(shared) / "vit-dcp" if shared else tmp_path / "vit-dcp")
    cfg = {"dim": 64, "depth": 4, "steps": 8 if quick else 50, "ckpt_dir": str(ckpt),
           "param_dtype": os.environ.get("STACKGATE_PARAM_DTYPE", "bfloat16")}
    results = dist("test_vit_fsdp:train_and_resume", nproc=nproc, **cfg)
    rank0 = next((r for r in results if r["rank"] == 0), None)
    if rank0 is None:
        return
    v = rank0["value"]
    record.metric("vit.loss", v["losses"], "", test="vit_fsdp", better="equal")
    record.metric("vit.grad_norm", v["grad_norms"], "", test="vit_fsdp", better="equal")
    ranks = [v["clock"], *(r["value"]["clock"] for r in results if r["rank"] != 0 and r.get("value"))]
    record_step_times("vit.step_time", ranks, test="vit_fsdp")
    record.metric("vit.peak_memory", max(r["value"]["peak_mib"] for r in results), "MiB", test="vit_fsdp",
                  better="lower")
    losses = v["losses"]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3, f"loss did not go down: {losses}"
    assert v["resumed_loss"] == pytest.approx(v["next_loss"], rel=1e-6, abs=1e-7), (
        f"resume from DCP gave next-step loss {v['resumed_loss']!r}, uninterrupted run {v['next_loss']!r}")
