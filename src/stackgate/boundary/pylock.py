"""A promotion's pylock.toml read back (`stackgate watch`): the packages production runs and the very
wheels, by sha256, that a rollback reinstalls. Only the fields stackgate writes and reads (PEP 751's
names); a lock that is not one is exit 2 at its line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import ConfigDict, Field

from stackgate import tomlfile
from stackgate.boundary.base import MAX_ITEMS, Count, Model, Name, Text

Items = Field(max_length=MAX_ITEMS)


class _Part(Model):
    model_config = ConfigDict(extra="ignore")  # PEP 751 has more than stackgate reads


class Hashes(_Part):
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class Wheel(_Part):
    name: Text
    path: Text
    size: Count | None = None
    hashes: Hashes


class Package(_Part):
    name: Name
    version: Name
    wheels: Annotated[list[Wheel], Items] = Field(default_factory=list)


class PyLock(_Part):
    lock_version: Name = Field(alias="lock-version")
    packages: Annotated[list[Package], Items] = Field(default_factory=list)


def read(path: Path) -> PyLock:
    return tomlfile.validate(tomlfile.load(path), PyLock)
