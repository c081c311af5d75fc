"""Ranks started by torch.multiprocessing.spawn meet over gloo, by env:// and by file:// rendezvous,
after the fixture's group of the module before was torn down."""

import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import free_port

WORLD = 2


def _rank(rank: int, init_method: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=WORLD)
    t = torch.full((1024,), float(rank + 1))
    dist.all_reduce(t)
    dist.barrier()
    Path(out, f"rank{rank}").write_text(str(float(t[0])))
    dist.destroy_process_group()


def _check(out: Path) -> None:
    assert sorted(p.name for p in out.iterdir()) == ["rank0", "rank1"]
    assert {p.read_text() for p in out.iterdir()} == {str(float(sum(range(1, WORLD + 1))))}


def test_no_group_is_left_from_the_module_before() -> None:
    assert not dist.is_initialized()


def test_spawned_ranks_meet_by_env_rendezvous(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    mp.spawn(_rank, args=("env://", str(tmp_path)), nprocs=WORLD, join=True)
    _check(tmp_path)


def test_spawned_ranks_meet_by_file_rendezvous(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    mp.spawn(_rank, args=(f"file://{tmp_path / 'rendezvous'}", str(out)), nprocs=WORLD, join=True)
    _check(out)


def test_a_group_of_this_process_after_spawned_ones() -> None:
    os.environ.setdefault("MASTER_ADDR", "localhost")
    dist.init_process_group("gloo", init_method=f"tcp://localhost:{free_port()}", rank=0, world_size=1)
    try:
        assert dist.get_rank() == 0
    finally:
        dist.destroy_process_group()
