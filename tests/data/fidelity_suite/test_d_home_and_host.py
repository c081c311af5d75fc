"""What trainer code takes for granted of the machine it runs on: a user name, a writable home and
cache, torch.hub's cache, and names that resolve."""

import datetime
import getpass
import os
import socket
from pathlib import Path

import torch
import torch.distributed as dist
from conftest import free_port


def test_the_user_has_a_name() -> None:
    assert getpass.getuser()


def test_home_cache_is_writable() -> None:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fidelity-suite"
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "written").write_text("ok")
    assert (cache / "written").read_text() == "ok"


def test_torch_hub_cache_is_writable() -> None:
    hub = Path(torch.hub.get_dir())
    hub.mkdir(parents=True, exist_ok=True)
    (hub / "fidelity-suite").write_text("ok")


def test_localhost_resolves_and_listens() -> None:
    with socket.socket() as server:
        server.bind(("localhost", 0))
        server.listen(1)
        with socket.create_connection(("localhost", server.getsockname()[1]), timeout=10):
            pass


def test_this_hosts_own_name_resolves() -> None:
    assert socket.gethostbyname(socket.gethostname())


def test_a_store_on_localhost_answers_within_its_timeout() -> None:
    """c10d's TCPStore looks up the name of each peer address (::ffff:127.0.0.1 here): a resolver that
    stalls on a name it does not know (Docker's embedded DNS on an internal network: 10 s) makes the
    client time out, where this machine's resolver says "not known" at once."""
    store = dist.TCPStore("localhost", free_port(), 1, True, timeout=datetime.timedelta(seconds=5),
                          wait_for_workers=False)
    store.set("key", "value")
    assert store.get("key") == b"value"
