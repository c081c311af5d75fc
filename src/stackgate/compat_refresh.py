"""`stackgate compat refresh --index URL`: derive each torch release's CUDA variants, Pythons and
PyPI default build from wheel indexes, instead of keeping them by hand.

A PEP 503 index lists `torch-<version>[+<variant>]-<python>-<abi>-<platform>.whl`: a local label is a
variant (`+cu130`, `+cpu`); a wheel without one is the build that index serves by default, whose
CUDA is read from its metadata (PEP 658 `<wheel>.metadata`, else the wheel itself): the CUDA runtime
wheel it requires (`nvidia-cuda-runtime==13.2.*` -> cu132). Only final releases count; only Linux
x86_64 wheels decide the default. The result is compared with compat.toml row by row; `--write`
rewrites the rows that differ (the rest of the file, comments included, stays as it is).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from stackgate import proc, sources
from stackgate.compat import CompatTable
from stackgate.errors import InfraError
from stackgate.model import WheelSource

_RUNTIME = re.compile(r"^Requires-Dist:\s*nvidia-cuda-runtime(?:-cu[0-9]+)?\s*[=~]=\s*([0-9]+)\.([0-9]+)", re.I | re.M)


@dataclass(frozen=True)
class Row:
    """What the indexes say of one release series ("2.15")."""

    series: str
    cuda: tuple[str, ...]
    python: tuple[str, ...]
    pypi_default: str  # "" when no index serves an unlabelled Linux x86_64 wheel

    def toml(self) -> str:
        return (f'[torch."{self.series}"]\ncuda = [{", ".join(repr(c).replace(chr(39), chr(34)) for c in self.cuda)}]\n'
                f'python = [{", ".join(chr(34) + p + chr(34) for p in self.python)}]\n'
                + (f'pypi_default = "{self.pypi_default}"\n' if self.pypi_default else ""))


def _python_of(interpreter: str, abi: str) -> str | None:
    found = re.fullmatch(r"cp([0-9])([0-9]+)", interpreter)
    if not found:
        return None
    return f"{found.group(1)}.{found.group(2)}" + ("t" if abi.endswith("t") else "")


def _read(location: str, member_suffix: str = "") -> str:
    """A text file at a URL or path (an index page, a .metadata file)."""
    if location.startswith(("http://", "https://")):
        with urllib.request.urlopen(location, timeout=60) as response:
            return str(response.read().decode("utf-8", "replace"))
    path = Path(urllib.parse.urlparse(location).path if location.startswith("file://") else location)
    return path.read_text(encoding="utf-8", errors="replace")


def default_variant(location: str, index: str, version: Version, python: str) -> str:
    """The CUDA variant of an unlabelled wheel, from its metadata: cuXY, or cpu when it requires no
    CUDA runtime. The metadata is its PEP 658 `.metadata` file, else the wheel itself when it is on
    disk, else what uv resolves `torch==<version>` to from that index for Linux x86_64 (the same
    resolver the gate uses)."""
    try:
        metadata = _read(location + ".metadata")
    except (OSError, ValueError):
        path = Path(urllib.parse.urlparse(location).path if location.startswith("file://") else location)
        if path.is_file() and path.stat().st_size:
            with zipfile.ZipFile(path) as whl:
                name = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
                metadata = whl.read(name).decode("utf-8", "replace")
        else:
            return _resolved_variant(index, version, python, location)
    found = _RUNTIME.search(metadata)
    return f"cu{found.group(1)}{found.group(2)}" if found else "cpu"


def _resolved_variant(index: str, version: Version, python: str, location: str) -> str:
    from stackgate.resolve import cuda_of
    with tempfile.TemporaryDirectory(prefix="stackgate-refresh-") as tmp:
        wanted = Path(tmp) / "requirements.in"
        wanted.write_text(f"torch=={version}\n")
        result = proc.run([sys.executable, "-m", "uv", "pip", "compile", str(wanted), "--python-version",
                           python.rstrip("t"), "--python-platform", "x86_64-manylinux_2_28", "--index-url", index,
                           "--no-header", "--no-annotate", "--quiet"],
                          env={**os.environ, "UV_PYTHON_DOWNLOADS": "never"}, timeout_s=600)
    if not result.ok:
        raise InfraError(f"cannot read the metadata of {location} (no PEP 658 .metadata file), and uv could not "
                         f"resolve torch=={version} from {index}", hint=result.tail[-600:])
    cuda = cuda_of([line.strip() for line in result.tail.splitlines()])
    return f"cu{cuda.replace('.', '')}" if cuda else "cpu"


def derive(wheels: Iterable[tuple[str, str, str]], only: Sequence[str] = ()) -> dict[str, Row]:
    """Series -> Row from (file name, location, index) of torch wheels (`only`: just these series)."""
    variants: dict[str, set[str]] = {}
    pythons: dict[str, set[str]] = {}
    defaults: dict[str, tuple[Version, str, str, str]] = {}  # series -> newest release: version, wheel, index, python
    for name, location, index in wheels:
        try:
            _, version, _, tags = parse_wheel_filename(name)
        except InvalidWheelFilename:
            continue
        if version.is_prerelease or version.is_devrelease or version.is_postrelease:
            continue
        series = f"{version.major}.{version.minor}"
        if only and series not in only:
            continue
        for tag in tags:
            python = _python_of(tag.interpreter, tag.abi)
            if python:
                pythons.setdefault(series, set()).add(python)
        if version.local:
            variants.setdefault(series, set()).add(str(version.local))
        elif any(t.platform.endswith("x86_64") and t.platform.startswith(("manylinux", "linux")) for t in tags) \
                and (series not in defaults or version > defaults[series][0]):
            defaults[series] = (version, location, index,
                                next((p for t in tags if (p := _python_of(t.interpreter, t.abi))), "3.11"))
    rows = {}
    for series in sorted(set(variants) | set(defaults), key=Version):
        default = default_variant(*defaults[series][1:3], defaults[series][0], defaults[series][3]) \
            if series in defaults else ""
        found = variants.get(series, set()) | ({default} if default else set())
        rows[series] = Row(series, tuple(sorted(found, key=_variant_order)),
                           tuple(sorted(pythons.get(series, set()), key=_python_order)), default)
    return rows


def _variant_order(tag: str) -> tuple[int, str]:
    return (0, tag) if tag == "cpu" else (1, tag.rjust(8, "0"))


def _python_order(text: str) -> tuple[int, int, str]:
    major, minor = text.rstrip("t").split(".")
    return (int(major), int(minor), text)


def list_torch_wheels(indexes: Sequence[str]) -> list[tuple[str, str, str]]:
    """Every torch wheel the indexes list (their `<index>/torch/` pages): name, location, index."""
    out: list[tuple[str, str, str]] = []
    for given in indexes:
        url = given if given.startswith(("http://", "https://", "file://")) else Path(given).absolute().as_uri()
        listing = sources.list_wheels(WheelSource(index_url=url, inherit_pip_config=False), sources.PipConfig(),
                                      remote=True)
        if listing.unlisted:
            raise InfraError(f"cannot list the torch wheels of {url}: {'; '.join(listing.unlisted)}")
        if not listing.found:
            raise InfraError(f"{url}/torch/ lists no torch wheel", hint="pass the index root (the URL pip's "
                                                                          "--index-url takes)")
        out += [(name, location, url) for name, location in listing.found]
    return out


def differences(table: CompatTable, rows: dict[str, Row]) -> list[str]:
    """What the table says that the indexes do not (the series they list)."""
    out = []
    for series, row in rows.items():
        have = table.torch.get(series)
        if have is None:
            out.append(f'[torch."{series}"] is missing')
            continue
        if tuple(v.tag for v in have.cuda) != row.cuda:
            out.append(f'[torch."{series}"] cuda = {[v.tag for v in have.cuda]}, the index: {list(row.cuda)}')
        if have.python != row.python:
            out.append(f'[torch."{series}"] python = {list(have.python)}, the index: {list(row.python)}')
        shown = have.pypi_default.tag if have.pypi_default else ""
        if row.pypi_default and shown != row.pypi_default:
            out.append(f'[torch."{series}"] pypi_default = "{shown}", the index serves "{row.pypi_default}" '
                       "by default")
    return out


def rewrite(text: str, rows: dict[str, Row]) -> str:
    """compat.toml with each listed series' row replaced (comments outside the rows kept), new series
    appended."""
    lines = text.splitlines()
    out: list[str] = []
    seen: set[str] = set()
    skipping = False
    for line in lines:
        header = re.fullmatch(r'\s*\[torch\."([^"]+)"\]\s*(#.*)?', line)
        if header and header.group(1) in rows:
            out += rows[header.group(1)].toml().rstrip("\n").splitlines()
            seen.add(header.group(1))
            skipping = True
            continue
        if skipping and (line.strip().startswith("[") or not line.strip()):
            skipping = False
        if skipping and re.match(r"\s*(cuda|python|pypi_default)\s*=", line):
            continue
        out.append(line)
    for series, row in rows.items():
        if series not in seen:
            out += ["", *row.toml().rstrip("\n").splitlines()]
    return "\n".join(out) + "\n"
