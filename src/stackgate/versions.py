"""Versions are parsed once, at the edge, with `packaging`; never compared as strings."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from functools import total_ordering

from packaging.version import InvalidVersion, Version

from stackgate.errors import ConfigError

_VARIANT = re.compile(r"^(cpu|cu([0-9]{2,3})|rocm[0-9.]+)$")
_DRIVER = re.compile(r"^[0-9]{3,4}(\.[0-9]{1,3}){0,2}$")
_PYTHON = re.compile(r"^3\.[0-9]{1,2}t?$")
_NIGHTLY = re.compile(r"^dev([0-9]{8})$")


def parse_torch(text: str, *, what: str = "torch version") -> Version:
    """`2.14.1`, `2.13.0+cpu`, `2.15.0.dev20261120`, `2.14.0rc2` -> Version."""
    try:
        version = Version(text)
    except InvalidVersion:
        raise ConfigError(
            f"unparseable {what} {text!r}",
            hint="use a PEP 440 version such as 2.14.1, 2.13.0+cpu or 2.15.0.dev20261120",
        ) from None
    if len(version.release) < 2:
        raise ConfigError(f"{what} {text!r} needs at least major.minor", hint="for example 2.14.1")
    return version


def release_series(version: Version) -> str:
    """`2.14.1+cu130` -> `2.14` (the key of compat tables)."""
    return f"{version.major}.{version.minor}"


def nightly_date(version: Version) -> dt.date | None:
    """The build date of a `.devYYYYMMDD` nightly, else None."""
    if version.dev is None:
        return None
    match = _NIGHTLY.match(f"dev{version.dev}")
    if not match:
        return None
    try:
        return dt.datetime.strptime(match.group(1), "%Y%m%d").date()
    except ValueError:
        return None


@total_ordering
@dataclass(frozen=True)
class CudaVariant:
    """A wheel's accelerator variant: `cpu`, `cu126`, `cu130`..."""

    tag: str

    @classmethod
    def parse(cls, text: str) -> CudaVariant:
        tag = text.strip().lower()
        if re.fullmatch(r"[0-9]{2}\.[0-9]", tag):  # "13.0" -> cu130, "12.6" -> cu126
            major, minor = tag.split(".")
            tag = f"cu{major}{minor}"
        if not _VARIANT.match(tag):
            raise ConfigError(f"unknown CUDA variant {text!r}", hint="use cpu, cu126, cu130, ... or 13.0")
        return cls(tag)

    @property
    def is_cuda(self) -> bool:
        return self.tag.startswith("cu")

    @property
    def cuda_version(self) -> Version | None:
        """cu130 -> 13.0; cu126 -> 12.6; cpu -> None."""
        if not self.is_cuda:
            return None
        digits = self.tag[2:]
        return Version(f"{digits[:-1]}.{digits[-1]}")

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, CudaVariant):
            return NotImplemented
        return _variant_key(self) < _variant_key(other)

    def __str__(self) -> str:
        return self.tag


def _variant_key(variant: CudaVariant) -> tuple[int, Version]:
    version = variant.cuda_version
    return (1, version) if version is not None else (0, Version("0"))


@total_ordering
@dataclass(frozen=True)
class Driver:
    """An NVIDIA driver version, compared numerically, printed as written (580.65.06, not 580.65.6)."""

    text: str

    @property
    def version(self) -> Version:
        return Version(self.text)

    @property
    def major(self) -> int:
        return self.version.major

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Driver):
            return NotImplemented
        return self.version < other.version

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Driver) and self.version == other.version

    def __hash__(self) -> int:
        return hash(self.version)

    def __str__(self) -> str:
        return self.text


def parse_driver(text: str) -> Driver:
    """NVIDIA driver versions: `580`, `580.65.06`, `525.60.13`."""
    text = str(text).strip()
    if not _DRIVER.match(text):
        raise ConfigError(f"unparseable NVIDIA driver version {text!r}", hint="for example 580.65.06")
    return Driver(text)


def parse_python(text: str) -> str:
    text = str(text).strip()
    if not _PYTHON.match(text):
        raise ConfigError(f"unparseable Python version {text!r}", hint="use major.minor, for example 3.11")
    return text
