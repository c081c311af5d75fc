"""Writing reports: atomically (a temp file in the same directory, then rename), and with control
characters (NUL, ANSI colour sequences, ...) stripped from text formats that quote test output."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def strip_control(text: str) -> str:
    """Text without ANSI escape sequences and C0 control characters (tab, newline, CR stay)."""
    return _CONTROL.sub("", _ANSI.sub("", text))


def atomic_write(path: Path, data: str | bytes) -> None:
    """Readers see the old file or the new one, never half of one."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
