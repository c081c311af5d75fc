"""Wheel sources: turn a WheelSource (+ this host's pip configuration) into installer arguments,
and resolve the `nightly` channel to a concrete `.devYYYYMMDD` build."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from stackgate import proc
from stackgate.errors import ConfigError, InfraError
from stackgate.model import WheelSource

DEBIAN_MIRROR = "http://deb.debian.org/debian"  # where the local base image is bootstrapped from (debootstrap)


@dataclass(frozen=True)
class PipConfig:
    """The parts of pip's configuration an installer must honour: find-links, indexes, cert."""

    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    cert: str | None = None
    constraint: str | None = None  # a constraints file pip applies to every install on this host
    constraint_origin: str = ""  # where it is set: `global.constraint` (a pip.conf) or `:env:` (PIP_CONSTRAINT)


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
    """`pip config list` merges files and PIP_* variables; uv ignores them, so we pass them on. Asked
    once per process for one environment and one state of pip's configuration files (starting pip
    costs ~0.6 s; a bisect, a merge's tests and the test suite ask again and again)."""
    key = (tuple(sorted(env.items())), tuple(_stamp(p) for p in pip_config_files(env)))
    found = _PIP_CONFIGS.get(key)
    if found is None:
        try:
            text = proc.capture([*pip_command(), "config", "list"], env=env, timeout_s=60)
        except InfraError:
            return PipConfig()
        found = _PIP_CONFIGS[key] = parse_pip_config(text)
    return found


_PIP_CONFIGS: dict[tuple[object, ...], PipConfig] = {}


def pip_config_files(env: Mapping[str, str]) -> list[Path]:
    """The files pip reads its configuration from (pip's `get_configuration_files`): global (each XDG
    config dir's pip/pip.conf, /etc/pip.conf), user (~/.pip/pip.conf, $XDG_CONFIG_HOME/pip/pip.conf),
    site (the interpreter's prefix) and $PIP_CONFIG_FILE."""
    home = Path(env.get("HOME") or Path.home())
    dirs = (env.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":")
    files = [*(Path(d) / "pip" / "pip.conf" for d in dirs if d), Path("/etc/pip.conf"), home / ".pip" / "pip.conf",
             Path(env.get("XDG_CONFIG_HOME") or home / ".config") / "pip" / "pip.conf", Path(sys.prefix) / "pip.conf"]
    if env.get("PIP_CONFIG_FILE"):
        files.append(Path(env["PIP_CONFIG_FILE"]))
    return files


def _stamp(path: Path) -> tuple[str, int, int]:
    try:
        st = path.stat()
    except OSError:
        return (str(path), -1, -1)
    return (str(path), st.st_mtime_ns, st.st_size)


def parse_pip_config(text: str) -> PipConfig:
    values: dict[str, str] = {}
    origins: dict[str, str] = {}
    for line in text.splitlines():
        match = re.match(r"^([^.]*)\.([a-z\-]+)='(.*)'$", line.strip())
        if match:
            values.setdefault(match.group(2), match.group(3))
            origins.setdefault(match.group(2), f"{match.group(1)}.{match.group(2)}")
    return PipConfig(
        index_url=values.get("index-url"),
        extra_index_urls=tuple(values.get("extra-index-url", "").split()),
        find_links=tuple(values.get("find-links", "").split()),
        cert=values.get("cert"),
        constraint=values.get("constraint"),
        constraint_origin=origins.get("constraint", ""),
    )


_CONSTRAINED = re.compile(r"The user requested \(constraint\) (\S+)")
_NOT_OFFERED = re.compile(r"No matching distribution found for (\S+)", re.I)


def host_config_problem(output: str, host: PipConfig) -> str | None:
    """Why pip could not produce a stack that the resolution found, when the cause is this host's pip
    configuration rather than the stack (a constraint file pip applies to every install, an index or
    mirror that lacks the version): the message names the cause, where it is set and how to run
    without it. None when the output shows no such cause (the stack's own dependencies conflict)."""
    capped = _CONSTRAINED.findall(output)
    if capped:
        where = (f"{host.constraint_origin} = {host.constraint}" if host.constraint else "a pip constraint")
        how = ("PIP_CONSTRAINT=/dev/null in the environment lifts it for one run" if host.constraint else
               "find it with `pip config list`")
        return (f"this host's pip configuration keeps the stack out: The user requested (constraint) "
                f"{', '.join(sorted(set(capped)))}, from {where} (`pip config list`); {how}, or remove it from "
                "that file. Not a verdict on the candidate")
    missing = _NOT_OFFERED.findall(output)
    if missing:
        return (f"pip on this host finds no {', '.join(sorted(set(missing)))} although the resolution did: this "
                "host's pip configuration (index-url, extra-index-url, find-links: `pip config list`) or a mirror "
                "lacks it. Not a verdict on the candidate")
    return None


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


@dataclass(frozen=True)
class Listing:
    """A project's wheels a source offers: (file name, location: a path or a URL), and the index or
    find-links pages that could not be read (then the listing may be incomplete)."""

    found: tuple[tuple[str, str], ...]
    unlisted: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        return not self.unlisted


_ANCHOR = r'href="([^"]+)"[^>]*>\s*({project}-[^<]+\.whl)\s*<'


def _anchors(html: str, base: str, project: str) -> list[tuple[str, str]]:
    return [(name, urllib.parse.urljoin(base, href.split("#")[0]))
            for href, name in re.findall(_ANCHOR.format(project=re.escape(project)), html)]


def list_wheels(source: WheelSource, host: PipConfig, project: str = "torch", *, remote: bool = False) -> Listing:
    """`project`'s wheels in the source's find-links directories and PEP 503 indexes
    (`<index>/<project>/`): file:// always; http(s) pages too with `remote` (the nightly channel)."""
    found: list[tuple[str, str]] = []
    unlisted: list[str] = []
    dirs = list(source.find_links) + (list(host.find_links) if source.inherit_pip_config else [])
    pages: list[tuple[str, str]] = []  # (url of the page, what it is for the message)
    for d in dirs:
        if d.startswith(("http://", "https://")):
            pages.append((d, d))
            continue
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
                found += _anchors(page.read_text(errors="replace"), page.as_uri(), project)
        elif url and url.startswith(("http://", "https://")):
            pages.append((f"{url.rstrip('/')}/{project}/", url))
    for page_url, label in pages if remote else ():
        try:
            with urllib.request.urlopen(page_url, timeout=30) as response:  # a configured index or page
                found += _anchors(response.read().decode(errors="replace"), page_url, project)
        except (OSError, ValueError) as exc:
            unlisted.append(f"{label} ({exc})")
    return Listing(tuple(found), tuple(unlisted))


def torch_versions(names: Iterable[str], target: Target | None = None) -> list[Version]:
    """torch versions among wheel file names, with a wheel for `target` (any target when None)."""
    found: set[Version] = set()
    for name in names:
        if target is not None and not target.accepts(name):
            continue
        try:
            found.add(parse_wheel_filename(name)[1])
        except InvalidWheelFilename:
            continue
    return sorted(found)


def newest_nightly(source: WheelSource, host: PipConfig, explicit: str | None = None,
                   target: Target | None = None) -> Version:
    """The newest `.dev` torch the source offers for the target (Python tag, platform, CUDA
    variant), or the explicit `--nightly-version`. A newer build for another Python or platform is
    never picked."""
    if explicit:
        from stackgate.versions import parse_torch
        return parse_torch(explicit, what="nightly version")
    target = target or Target()
    listing = list_wheels(source, host, remote=True)
    names = [name for name, _ in listing.found]
    devs = [v for v in torch_versions(names, target) if v.dev is not None]
    if not devs:
        others = [v for v in torch_versions(names) if v.dev is not None]
        raise ConfigError(
            f"the nightly channel found no .dev torch build for Python {', '.join(target.pythons)} on "
            f"{target.arch}" + (f" ({', '.join(target.variants)})" if target.variants else "")
            + " in the configured wheel source"
            + (f"; there are builds for other targets: {', '.join(str(v) for v in others[-3:])}" if others else "")
            + (f"; could not list: {'; '.join(listing.unlisted)}" if listing.unlisted else ""),
            hint="pass --find-links DIR (a wheelhouse with torch-X.Y.Z.devYYYYMMDD wheels) or "
                 "--nightly-version 2.15.0.devYYYYMMDD with --index-url URL",
        )
    return Version(max(devs).public)  # each cell asks for its own variant of that date
