"""A small FSDP2 + all-reduce + DCP job, one rank of `torchrun --nproc-per-node 2`."""

import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.fsdp import fully_shard


def main(ckpt: str) -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(20):
        opt.zero_grad()
        loss = model(torch.randn(16, 64)).square().mean()
        loss.backward()
        opt.step()
    total = torch.ones(1024)
    dist.all_reduce(total)
    assert total[0].item() == dist.get_world_size()
    dcp.save({"model": model.state_dict()}, checkpoint_id=ckpt)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
    sys.stdout.flush()
    os._exit(0)
