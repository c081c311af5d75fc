"""Run ids and run directories. A run directory belongs to one live run: `claim` takes its lock (a
file lock the kernel drops when the owner dies, so a killed run never leaves a stale claim) before
anything is written, and a second run of the same id exits 2 naming the owner. Shared by run,
calibrate and merge."""

from __future__ import annotations

import datetime as dt
import fcntl
import os
import re
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path

from stackgate.errors import ConfigError, InfraError

OWNER = ".owner.lock"


def new_run_id(matrix_name: str) -> str:
    """`<UTC time>-<matrix name>-<4 hex>`: unique, and sorted by time."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{re.sub(r'[^a-z0-9]+', '-', matrix_name.lower())}-{secrets.token_hex(2)}"


@dataclass
class Claim:
    path: Path
    fd: int

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # the file stays: removing a lock file races with the next claimant
            self.fd = -1


def claim(run_dir: Path) -> Claim:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(run_dir / OWNER, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise InfraError(f"cannot create {run_dir}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = os.pread(fd, 400, 0).decode("utf-8", "replace").strip() or "another process"
        os.close(fd)
        raise ConfigError(f"run directory {run_dir} belongs to a live run: {owner}",
                          hint="pass another --run-id (or none: generated ids are unique), or wait for that run "
                               "to end before you --resume it") from None
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {stamp}\n".encode(), 0)
    return Claim(run_dir / OWNER, fd)
