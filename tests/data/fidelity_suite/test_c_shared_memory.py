"""Tensors larger than 64 MB handed between processes through shared memory: DataLoader workers, and
children of the fork and spawn start methods."""

import multiprocessing

import torch
from torch.utils.data import DataLoader, Dataset

ELEMENTS = 24 * 1024 * 1024  # 96 MB of float32: more than a container's default /dev/shm (64 MB)


class Big(Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((ELEMENTS,), float(i))


def test_dataloader_workers_pass_tensors_larger_than_64mb() -> None:
    seen = [float(batch[-1]) for batch in DataLoader(Big(), batch_size=None, num_workers=2)]
    assert seen == [0.0, 1.0]


def _produce(queue, done) -> None:
    queue.put(torch.full((ELEMENTS,), 7.0))
    done.wait()


def _through(method: str) -> float:
    ctx = torch.multiprocessing.get_context(method)
    queue, done = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=_produce, args=(queue, done))
    child.start()
    try:
        got = queue.get(timeout=120)
        value = float(got.sum()) / ELEMENTS
    finally:
        done.set()
        child.join(60)
    assert child.exitcode == 0
    return value


def test_a_fork_child_shares_a_large_tensor() -> None:
    assert _through("fork") == 7.0


def test_a_spawn_child_shares_a_large_tensor() -> None:
    assert _through("spawn") == 7.0


def test_the_default_start_method_is_usable() -> None:
    assert multiprocessing.get_start_method() in ("fork", "spawn", "forkserver")
