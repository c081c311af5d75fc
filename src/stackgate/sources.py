"""Wheel sources: turn a WheelSource (+ this host's pip configuration) into installer arguments,
and resolve the `nightly` channel to a concrete `.devYYYYMMDD` build."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from stackgate import proc
from stackgate.errors import ConfigError, InfraError
from stackgate.model import WheelSource


@dataclass(frozen=True)
class PipConfig:
    """The parts of pip's configuration an installer must honour: find-links, indexes, cert."""

    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    cert: str | None = None


def pip_command() -> list[str]:
    """A pip to ask: this interpreter's, else the one on PATH (uv-made venvs, such as nox's, have none)."""
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    for name in ("pip3", "pip"):
        found = shutil.which(name)
        if found:
            return [found]
    raise InfraError("no pip found to read the host's pip configuration or download wheels",
                     hint="install pip (python3 -m ensurepip) or pass --find-links/--index-url explicitly")


def read_pip_config(env: Mapping[str, str]) -> PipConfig:
    """`pip config list` merges files and PIP_* variables; uv ignores them, so we pass them on."""
    try:
        text = proc.capture([*pip_command(), "config", "list"], env=env, timeout_s=60)
    except InfraError:
        return PipConfig()
    return parse_pip_config(text)


def parse_pip_config(text: str) -> PipConfig:
    values: dict[str, str] = {}
    for line in text.splitlines():
        match = re.match(r"^[^.]*\.([a-z\-]+)='(.*)'$", line.strip())
        if match:
            values.setdefault(match.group(1), match.group(2))
    return PipConfig(
        index_url=values.get("index-url"),
        extra_index_urls=tuple(values.get("extra-index-url", "").split()),
        find_links=tuple(values.get("find-links", "").split()),
        cert=values.get("cert"),
    )


def installer_args(source: WheelSource, host: PipConfig) -> list[str]:
    """uv pip install arguments for this source."""
    index = source.index_url or (host.index_url if source.inherit_pip_config else None)
    extras = list(source.extra_index_urls) + (list(host.extra_index_urls) if source.inherit_pip_config else [])
    links = list(source.find_links) + (list(host.find_links) if source.inherit_pip_config else [])
    args: list[str] = []
    if index:
        args += ["--index-url", index]
    for url in extras:
        args += ["--extra-index-url", url]
    for link in links:
        args += ["--find-links", link]
    if extras or links or index:
        args += ["--index-strategy", "unsafe-best-match"]
    if source.pre:
        args += ["--prerelease", "allow"]
    return args


@dataclass(frozen=True)
class Target:
    """What a wheel must be built for: the cells' Pythons, CUDA variants and CPU architecture."""

    pythons: tuple[str, ...] = ("3.11",)
    variants: tuple[str, ...] = ()  # cu130, cpu, ...; empty: any
    arch: str = "x86_64"

    def accepts(self, filename: str) -> bool:
        try:
            _, version, _, tags = parse_wheel_filename(filename)
        except InvalidWheelFilename:
            return False
        local = str(version.local) if version.local else ""
        if self.variants and local and local not in self.variants:
            return False
        interpreters = {f"cp{p.rstrip('t').replace('.', '')}" for p in self.pythons}
        return any(tag.interpreter in interpreters and tag.platform.endswith(self.arch)
                   and tag.platform.startswith(("manylinux", "linux")) for tag in tags)


def local_wheels(source: WheelSource, host: PipConfig, project: str = "torch") -> list[tuple[str, str]]:
    """(file name, location) of `project`'s wheels in the source's find-links directories and
    file:// indexes (PEP 503: `<index>/<project>/index.html`). A location is a path or a URL."""
    found: list[tuple[str, str]] = []
    dirs = list(source.find_links) + (list(host.find_links) if source.inherit_pip_config else [])
    for d in dirs:
        path = Path(d[7:] if d.startswith("file://") else d)
        if path.is_dir():
            found += [(p.name, str(p)) for p in path.glob(f"{project}-*.whl")]
    indexes = [source.index_url, *source.extra_index_urls]
    if source.inherit_pip_config:
        indexes += [host.index_url, *host.extra_index_urls]
    for url in indexes:
        if url and url.startswith("file://"):
            page = Path(urllib.parse.urlparse(url).path) / project / "index.html"
            if page.is_file():
                for href, name in re.findall(r'href="([^"]+)"[^>]*>\s*(' + re.escape(project) + r'-[^<]+\.whl)\s*<',
                                             page.read_text(errors="replace")):
                    found.append((name, urllib.parse.urljoin(page.as_uri(), href.split("#")[0])))
    return found


def _local_wheel_names(source: WheelSource, host: PipConfig) -> list[str]:
    return [name for name, _ in local_wheels(source, host)]


def local_torch_versions(source: WheelSource, host: PipConfig, target: Target | None = None) -> list[Version]:
    """torch versions with a wheel for `target` (any target when None) in the source's local places."""
    found: set[Version] = set()
    for name in _local_wheel_names(source, host):
        if target is not None and not target.accepts(name):
            continue
        try:
            found.add(parse_wheel_filename(name)[1])
        except InvalidWheelFilename:
            continue
    return sorted(found)


def resolve_nightly(source: WheelSource, host: PipConfig, explicit: str | None = None,
                    target: Target | None = None) -> Version:
    """The newest `.dev` torch the source offers for the target (Python tag, platform, CUDA
    variant), or the explicit `--nightly-version`. A newer build for another Python or platform is
    never picked."""
    if explicit:
        from stackgate.versions import parse_torch
        return parse_torch(explicit, what="nightly version")
    target = target or Target()
    devs = [v for v in local_torch_versions(source, host, target) if v.dev is not None]
    if not devs:
        others = [v for v in local_torch_versions(source, host) if v.dev is not None]
        raise ConfigError(
            f"the nightly channel found no .dev torch build for Python {', '.join(target.pythons)} on "
            f"{target.arch}" + (f" ({', '.join(target.variants)})" if target.variants else "")
            + " in the configured wheel source"
            + (f"; there are builds for other targets: {', '.join(str(v) for v in others[-3:])}" if others else ""),
            hint="pass --find-links DIR (a wheelhouse with torch-X.Y.Z.devYYYYMMDD wheels) or "
                 "--nightly-version 2.15.0.devYYYYMMDD with --index-url URL",
        )
    return Version(max(devs).public)  # each cell asks for its own variant of that date
