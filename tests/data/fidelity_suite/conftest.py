"""Fixtures as a real trainer suite has them: a process group set up for a module and torn down after
it (the next module starts from no group at all), and a free port per rendezvous."""

import socket
from collections.abc import Iterator

import pytest
import torch.distributed as dist


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def group() -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"tcp://localhost:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
