"""A process group that a module-scoped fixture owns, used by several tests (named to run first)."""

import torch
import torch.distributed as dist


def test_all_reduce_in_the_fixtures_group(group: None) -> None:
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t.tolist() == [1.0] * 4


def test_barrier_in_the_fixtures_group(group: None) -> None:
    dist.barrier()
    assert dist.get_world_size() == 1
