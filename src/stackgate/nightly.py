"""The nightly channel: what the wheel source offers per date, the guards a nightly must pass before
anything is built, and each nightly's git commit.

PyTorch nightlies are `torch-X.Y.0.devYYYYMMDD+<variant>`; each variant is built and uploaded on
its own, so a date can lack one; torchvision/torchaudio/triton nightlies pin torch's exact date;
`torch.version.git_version` names the commit the nightly was cut from. The guards:
- age: the nightly is at most N days old (`--nightly-max-age`, default 3, as PyTorch's own binary
  validation);
- variant: each cell's Python tag, platform and CUDA variant has a wheel of that date;
- companions: the companion packages the stack installs have a build of that date.
A cell that fails one is `no-build` with the reason (INCONCLUSIVE), never silently pruned.
"""

from __future__ import annotations

import datetime as dt
import io
import re
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from stackgate.compat import CompatTable
from stackgate.model import Cell, Role, WheelSource
from stackgate.sources import PipConfig, Target, list_wheels

COMPANIONS = ("torchvision", "torchaudio", "triton", "pytorch-triton")
_DATE = re.compile(r"dev([0-9]{8})")
DEFAULT_MAX_AGE_DAYS = 3


def build_date(version: Version | str) -> dt.date | None:
    """The date of a `.devYYYYMMDD` build; None for a release."""
    found = _DATE.search(str(version))
    if found is None:
        return None
    try:
        return dt.datetime.strptime(found.group(1), "%Y%m%d").date()
    except ValueError:
        return None


@dataclass(frozen=True)
class Wheel:
    filename: str
    location: str  # a path or a URL
    version: Version

    @property
    def variant(self) -> str:
        return str(self.version.local) if self.version.local else ""


class Wheels(list[Wheel]):
    """The wheels a source offers, and the pages that could not be read (`complete` is False then:
    a wheel missing from the list may still exist)."""

    def __init__(self, found: Iterable[Wheel] = (), unlisted: Sequence[str] = ()) -> None:
        super().__init__(found)
        self.unlisted = tuple(unlisted)

    @property
    def complete(self) -> bool:
        return not self.unlisted


def wheels(source: WheelSource, host: PipConfig, project: str = "torch") -> Wheels:
    listing = list_wheels(source, host, project, remote=True)
    out = []
    for name, location in listing.found:
        try:
            _, version, _, _ = parse_wheel_filename(name)
        except InvalidWheelFilename:
            continue
        out.append(Wheel(name, location, version))
    return Wheels(out, listing.unlisted)


def default_variant(table: CompatTable, cell: Cell) -> str | None:
    """The CUDA variant PyPI serves without a local label for the cell's torch series."""
    release = table.release(cell.stack.torch)
    return release.pypi_default.tag if release and release.pypi_default else None


def for_cell(found: Iterable[Wheel], cell: Cell, public: str, table: CompatTable) -> Wheel | None:
    """The wheel of torch `public` that `cell` would install: its Python tag, this platform and its
    CUDA variant (the variant PyPI serves by default may carry no local label)."""
    want = cell.stack.cuda.tag
    pypi_default = default_variant(table, cell)
    target = Target(pythons=(cell.stack.python,), variants=(want,))
    for wheel in found:
        if wheel.version.public != public or not target.accepts(wheel.filename):
            continue
        if wheel.variant == want or (not wheel.variant and want == pypi_default):
            return wheel
    return None


def guard(cells: Sequence[Cell], found: Sequence[Wheel], *, today: dt.date, max_age_days: int,
          table: CompatTable, companions: Mapping[str, Sequence[Wheel]]) -> dict[str, str]:
    """Cell id -> why it cannot run this nightly (candidate cells of a `.dev` torch only)."""
    out: dict[str, str] = {}
    for cell in cells:
        version = cell.stack.torch
        built = build_date(version)
        if cell.role is not Role.CANDIDATE or built is None:
            continue
        age = (today - built).days
        if age > max_age_days:
            out[cell.id] = (f"nightly {version.public} is {age} days old (built {built}); the limit is "
                            f"{max_age_days} days (--nightly-max-age)")
            continue
        if for_cell(found, cell, version.public, table) is None and _complete(found):
            same_day = sorted({w.variant or "(no label)" for w in found if w.version.public == version.public})
            out[cell.id] = (f"no torch {version.public} wheel for {cell.stack.cuda.tag}, Python {cell.stack.python} on "
                            "this platform in the wheel source" + (f" (that date has: {', '.join(same_day)})"
                                                                   if same_day else ""))
            continue
        for name, offered in companions.items():
            made = [w for w in offered if build_date(w.version) == built]
            if not made and _complete(offered):
                newest = max((w.version for w in offered if build_date(w.version)), default=None)
                out[cell.id] = (f"{name}: no build for torch {version.public} (date {built}) in the wheel source"
                                + (f"; its newest is {newest}, made for another date" if newest else ""))
                break
    return out


def _complete(found: Sequence[Wheel]) -> bool:
    """Only a complete listing can say a wheel is missing (an index that could not be read might have it)."""
    return not isinstance(found, Wheels) or found.complete


def companions_wanted(requirements: Iterable[str]) -> list[str]:
    """The companion packages among what the stack installs."""
    names = []
    for text in requirements:
        try:
            name = str(canonicalize_name(Requirement(text).name))
        except InvalidRequirement:
            continue
        if name in COMPANIONS and name not in names:
            names.append(name)
    return names


def git_version(wheel: Wheel) -> str:
    """`torch.version.git_version` of a torch wheel, read from the archive (nothing installed)."""
    location = wheel.location
    if location.startswith(("http://", "https://")):
        with urllib.request.urlopen(location, timeout=300) as response:  # the configured index
            data = response.read()
        archive = zipfile.ZipFile(io.BytesIO(data))
    else:
        path = Path(urllib.parse.urlparse(location).path) if location.startswith("file:") else Path(location)
        archive = zipfile.ZipFile(path)
    with archive:
        text = archive.read("torch/version.py").decode(errors="replace")
    found = re.search(r"^git_version\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return found.group(1) if found else ""
