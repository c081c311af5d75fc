"""One error module: every fatal class has its exit code; `cli.main` is the one catch site."""

from __future__ import annotations

import enum
from pathlib import Path


class ExitCode(enum.IntEnum):
    GO = 0
    NO_GO = 1
    CONFIG = 2
    INFRA = 3


class StackgateError(Exception):
    """Base class: a message that says what, where and what to try."""

    exit_code: ExitCode = ExitCode.CONFIG

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint

    def render(self) -> str:
        text = f"error: {self}"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


class ConfigError(StackgateError):
    """Bad input: a TOML file, a command-line value, an impossible request. Exit 2."""

    exit_code = ExitCode.CONFIG

    def __init__(
        self,
        message: str,
        *,
        path: Path | str | None = None,
        line: int | None = None,
        hint: str | None = None,
    ) -> None:
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line else f"{path}: "
        super().__init__(where + message, hint=hint)
        self.path = path
        self.line = line


class InfraError(StackgateError):
    """The machinery failed: Docker down, disk full, installer unreachable, no runner. Exit 3."""

    exit_code = ExitCode.INFRA


def disk_full(path: Path | str, exc: OSError | None = None) -> InfraError:
    """One line for an exhausted disk: which path, and how much its filesystem has left."""
    import errno
    import shutil
    where = Path(path)
    probe = where if where.exists() else where.parent
    try:
        free = f"{shutil.disk_usage(probe).free // 1024} KiB free"
    except OSError:
        free = "free space unknown"
    what = "disk full" if exc is None or exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
    return InfraError(f"{what}: cannot write {where} ({free} on its filesystem)",
                      hint="free space there (or point --reports / --cache-dir elsewhere), then --resume the run: "
                           "cells whose evidence was not written run again")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or a CI cancel (SIGTERM), raised in the main thread. Exit 128 + signal:
    130 for SIGINT, 143 for SIGTERM, after the report is written from the cells that finished."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum
