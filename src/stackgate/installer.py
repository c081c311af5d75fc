"""What every installer run shares (uv and pip, for venvs, images' wheelhouses and the suite's
requirements): how its output tells the machinery's failures from the stack's."""

from __future__ import annotations

import re

_NETWORK = re.compile(r"Failed to fetch|error sending request|tcp connect error|Connection refused|timed out|"
                      r"Temporary failure in name resolution|NewConnectionError|ConnectTimeoutError|"
                      r"Network is unreachable|Could not fetch URL", re.I)
_NO_SPACE = re.compile(r"No space left on device|\[Errno 28\]")


def is_network_failure(output: str) -> bool:
    """An installer's output says it could not reach an index: the machinery failed, not the stack.
    Every backend classifies install failures with this."""
    return bool(_NETWORK.search(output))


def is_disk_full(output: str) -> bool:
    """An installer's (or a node's) output says the disk filled up: the machinery failed, not the stack."""
    return bool(_NO_SPACE.search(output))
