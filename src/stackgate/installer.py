"""What every installer run shares (uv and pip, for venvs, images' wheelhouses and the suite's
projects): how its output tells the machinery's failures from the stack's, and one way to build a
cached directory (locked, staged, put in place whole)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from filelock import FileLock

_NETWORK = re.compile(r"Failed to fetch|error sending request|tcp connect error|Connection refused|timed out|"
                      r"Temporary failure in name resolution|NewConnectionError|ConnectTimeoutError|"
                      r"Network is unreachable|Could not fetch URL", re.I)
_NO_SPACE = re.compile(r"No space left on device|\[Errno 28\]")


def file_sha256(path: Path) -> str:
    """The sha256 of a file (a wheel), read in blocks."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def is_network_failure(output: str) -> bool:
    """An installer's output says it could not reach an index: the machinery failed, not the stack.
    Every backend classifies install failures with this."""
    return bool(_NETWORK.search(output))


def is_disk_full(output: str) -> bool:
    """An installer's (or a node's) output says the disk filled up: the machinery failed, not the stack."""
    return bool(_NO_SPACE.search(output))


@contextlib.contextmanager
def cached_dir(final: Path, say: Callable[[str], None] | None = None) -> Iterator[Path]:
    """Build a cached directory (a venv, a wheelhouse, a project's wheel) in a staging directory of this
    process, `<final>.partial-<pid>`, and put it in place only when the body completes: a failure or a
    kill never leaves a half-built `final`. What a killed build left (a pid that is gone) is removed
    first. The caller holds `final`'s lock (`cache_lock`) and has checked that it is not there yet."""
    for stale in final.parent.glob(f"{final.name}.partial-*"):
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(stale, ignore_errors=True)
            if say is not None:
                say(f"  removed {stale.name}, left by a build that was killed")
    staging = final.with_name(f"{final.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.parent.mkdir(parents=True, exist_ok=True)
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)


def cache_lock(final: Path) -> FileLock:
    """The lock that concurrent runs sharing a cache take around `final` (one build, the others wait)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(final.with_name(final.name + ".lock")))
