"""Known vulnerabilities from an OSV database on disk: no network at run time.

The database is what the OSV project publishes per ecosystem (`PyPI/all.zip`, `Debian/all.zip`) or
any directory of OSV JSON records: air-gapped fleets mirror exactly that. A package matches a record's
`affected` entry by ecosystem and name, and its version by the entry's `versions` list or its ranges
(`introduced` / `fixed` / `last_affected` events, ordered by the ecosystem's own rules: PEP 440 for
PyPI, dpkg's order for Debian, from python-debian). Severity is the record's own rating
(`database_specific.severity`, GitHub's), else the rating of its CVSS vector (the `cvss` library), else
the rating of a record it names (`aliases`, `upstream`: a Debian advisory names its CVEs) found in the
same database; else "UNRATED".
"""

from __future__ import annotations

import functools
import json
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion
from packaging.version import Version as Pep440

from stackgate.boundary.environment import Environment
from stackgate.errors import ConfigError

LEVELS = ("UNRATED", "LOW", "MODERATE", "HIGH", "CRITICAL")
_SPELLINGS = {"MEDIUM": "MODERATE", "NONE": "LOW", "IMPORTANT": "HIGH"}


def level(name: str) -> str:
    """A severity's canonical name (CVSS "Medium" is GitHub's "MODERATE")."""
    upper = name.strip().upper()
    upper = _SPELLINGS.get(upper, upper)
    return upper if upper in LEVELS else "UNRATED"


def at_least(severity: str, threshold: str) -> bool:
    return LEVELS.index(level(severity)) >= LEVELS.index(level(threshold))


@dataclass(frozen=True)
class Package:
    """One package of a stack's SBOM: `ecosystem` is "PyPI" or "Debian:12" (source package names)."""

    ecosystem: str
    name: str
    version: str


@dataclass(frozen=True)
class Finding:
    advisory: str
    aliases: tuple[str, ...]
    package: str
    ecosystem: str
    installed: str
    severity: str
    fixed: str | None  # the first fixed version above the installed one; None: no fix published
    summary: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.advisory, self.ecosystem, self.package)

    def to_json(self) -> dict[str, Any]:
        return {"advisory": self.advisory, "aliases": list(self.aliases), "package": self.package,
                "ecosystem": self.ecosystem, "installed": self.installed, "severity": self.severity,
                "fixed": self.fixed, "summary": self.summary}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Finding:
        return cls(str(raw["advisory"]), tuple(raw.get("aliases") or ()), str(raw["package"]),
                   str(raw["ecosystem"]), str(raw["installed"]), str(raw["severity"]), raw.get("fixed"),
                   str(raw.get("summary", "")))


def _sort_key(ecosystem: str, version: str) -> Any:
    """A version's place in its ecosystem's order; ValueError for one that has none."""
    if ecosystem == "PyPI":
        try:
            return Pep440(version)
        except InvalidVersion as exc:
            raise ValueError(str(exc)) from None
    if ecosystem.split(":", maxsplit=1)[0] == "Debian":
        from debian.debian_support import Version as Dpkg
        return Dpkg(version)
    raise ValueError(f"no version order for ecosystem {ecosystem}")


def _affected_by_range(events: Sequence[dict[str, str]], ecosystem: str, installed: Any) -> tuple[bool, str | None]:
    """(affected, the first `fixed` above the installed version) under one ECOSYSTEM range (OSV's
    evaluation: events in version order; `introduced` opens, `fixed` closes at, `last_affected` after)."""
    points = []
    for event in events:
        for kind, value in event.items():
            if kind not in ("introduced", "fixed", "last_affected", "limit"):
                continue
            points.append((kind, None if value == "0" and kind == "introduced" else _sort_key(ecosystem, value), value))
    points.sort(key=lambda p: (0,) if p[1] is None else (1, p[1]))  # `introduced: "0"` is before everything
    affected = False
    for kind, at, _ in points:
        if kind == "introduced":
            affected = affected or at is None or installed >= at
        elif at is not None and (installed > at if kind == "last_affected" else installed >= at):
            affected = False  # fixed at (or limited at) `at`, or affected up to `at` only
    fixes = [at_raw for kind, at, at_raw in points if kind == "fixed" and at is not None and at > installed]
    return affected, (fixes[0] if fixes else None)


@dataclass(frozen=True)
class Advisory:
    id: str
    aliases: tuple[str, ...]
    summary: str
    rating: str  # of this record alone (may be UNRATED: then the database looks at what it names)
    affected: tuple[dict[str, Any], ...]
    origin: str  # the file (and zip member) it came from, for errors

    def findings(self, package: Package) -> Iterator[tuple[bool, str | None]]:
        """(affected, fixed) for each of this record's entries about `package`."""
        try:
            installed = _sort_key(package.ecosystem, package.version)
        except ValueError:
            return
        for entry in self.affected:
            about = entry.get("package") or {}
            if str(about.get("ecosystem", "")) != package.ecosystem or _name(package.ecosystem,
                                                                              str(about.get("name", ""))) != \
                    _name(package.ecosystem, package.name):
                continue
            listed = [str(v) for v in entry.get("versions") or ()]
            hit, fixed = package.version in listed, None
            for rng in entry.get("ranges") or ():
                if rng.get("type") not in ("ECOSYSTEM", "SEMVER"):
                    continue  # GIT ranges name commits: a built package has none to compare
                try:
                    affected, first_fix = _affected_by_range(rng.get("events") or (), package.ecosystem, installed)
                except ValueError:
                    continue  # a version in the record that its ecosystem cannot order: skip the range
                hit = hit or affected
                fixed = fixed or first_fix
            yield hit, fixed


def _name(ecosystem: str, name: str) -> str:
    return str(canonicalize_name(name)) if ecosystem == "PyPI" else name


def _rating(record: dict[str, Any]) -> str:
    own = (record.get("database_specific") or {}).get("severity")
    if isinstance(own, str) and level(own) != "UNRATED":
        return level(own)
    import cvss
    best = "UNRATED"
    for score in record.get("severity") or ():
        vector = str(score.get("score", ""))
        try:
            if score.get("type") == "CVSS_V4":
                rated = level(str(cvss.CVSS4(vector).severity))
            elif score.get("type") == "CVSS_V3":
                rated = level(str(cvss.CVSS3(vector).severities()[0]))
            else:
                continue
        except (cvss.CVSSError, ValueError, KeyError, IndexError):
            continue
        if LEVELS.index(rated) > LEVELS.index(best):
            best = rated
    return best


class Database:
    """The advisories of an OSV database, indexed by (ecosystem family, package name)."""

    def __init__(self, root: Path, advisories: Iterable[Advisory]) -> None:
        self.root = root
        self.by_id: dict[str, Advisory] = {}
        self.index: dict[tuple[str, str], list[Advisory]] = {}
        for advisory in advisories:
            self.by_id[advisory.id] = advisory
            for entry in advisory.affected:
                about = entry.get("package") or {}
                ecosystem = str(about.get("ecosystem", ""))
                key = (ecosystem.split(":", maxsplit=1)[0], _name(ecosystem, str(about.get("name", ""))))
                if advisory not in self.index.setdefault(key, []):
                    self.index[key].append(advisory)

    def __len__(self) -> int:
        return len(self.by_id)

    def severity(self, advisory: Advisory) -> str:
        if advisory.rating != "UNRATED":
            return advisory.rating
        named = [self.by_id[n].rating for n in advisory.aliases if n in self.by_id]
        named += [self.by_id[f"DEBIAN-{n}"].rating for n in advisory.aliases if f"DEBIAN-{n}" in self.by_id]
        return max(named, key=LEVELS.index, default="UNRATED")

    def scan(self, packages: Iterable[Package]) -> list[Finding]:
        """Every advisory that affects one of `packages`, with its first fix above the installed version."""
        out = []
        for package in packages:
            candidates = self.index.get((package.ecosystem.split(":")[0], _name(package.ecosystem, package.name)), [])
            for advisory in candidates:
                verdicts = list(advisory.findings(package))
                if not any(hit for hit, _ in verdicts):
                    continue
                fixed = next((f for hit, f in verdicts if hit and f), None)
                out.append(Finding(advisory.id, advisory.aliases, package.name, package.ecosystem, package.version,
                                   self.severity(advisory), fixed, advisory.summary))
        out.sort(key=lambda f: (-LEVELS.index(f.severity), f.package, f.advisory))
        return out


def _records(path: Path) -> Iterator[tuple[str, bytes]]:
    if path.suffix == ".zip":
        try:
            with zipfile.ZipFile(path) as archive:
                for member in archive.namelist():
                    if member.endswith(".json"):
                        yield f"{path}:{member}", archive.read(member)
        except (zipfile.BadZipFile, OSError) as exc:
            raise ConfigError(f"vulnerability database {path}: not a readable zip ({exc})",
                              hint="give the OSV project's per-ecosystem all.zip, or a directory of its JSON "
                                   "records") from None
    else:
        yield str(path), path.read_bytes()


@functools.lru_cache(maxsize=4)
def load(root: Path) -> Database:
    """Every OSV record under `root` (JSON files and zips of them); a withdrawn record is left out. A
    missing path, an empty database or a record that is not OSV JSON is a ConfigError: a gate that
    scanned nothing must never read as "no vulnerabilities"."""
    if not root.exists():
        raise ConfigError(f"vulnerability database {root} does not exist",
                          hint="give a directory of OSV JSON records or the OSV project's all.zip files "
                               "(`--vuln-db PATH` or [vulnerabilities] database in the policy)")
    files = sorted(p for p in (root.rglob("*") if root.is_dir() else [root])
                   if p.is_file() and p.suffix in (".json", ".zip"))
    advisories = []
    for path in files:
        for origin, blob in _records(path):
            try:
                record = json.loads(blob)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise ConfigError(f"vulnerability database: {origin} is not JSON ({exc})",
                                  hint="remove the file or restore it from the OSV export") from None
            if not isinstance(record, dict) or not isinstance(record.get("id"), str) \
                    or not isinstance(record.get("affected", []), list):
                raise ConfigError(f"vulnerability database: {origin} is not an OSV record (no `id`/`affected`)",
                                  hint="see https://ossf.github.io/osv-schema/")
            if record.get("withdrawn"):
                continue
            names = tuple(str(n) for n in (*(record.get("aliases") or ()), *(record.get("upstream") or ())))
            summary = str(record.get("summary") or str(record.get("details") or "").split("\n")[0])[:200]
            advisories.append(Advisory(record["id"], names, summary, _rating(record),
                                       tuple(e for e in record.get("affected") or () if isinstance(e, dict)), origin))
    if not advisories:
        raise ConfigError(f"vulnerability database {root} holds no OSV record",
                          hint="a mirror of the OSV export is a directory of <ID>.json files or the all.zip files")
    return Database(root, advisories)


def sbom(environment: Environment) -> tuple[list[Package], list[str]]:
    """The packages a result's environment recorded of its stack (`stack_packages`: pip freeze;
    `os_packages`: Debian source packages with `os_release`), and what of it could not be read."""
    out: list[Package] = []
    unread = []
    for line in environment.stack_packages:
        name, sep, version = str(line).partition("==")
        if sep:
            out.append(Package("PyPI", name.strip(), version.strip()))
        elif line:
            unread.append(str(line))  # `name @ file://...`: no version to match
    release = environment.os_release
    for line in environment.os_packages:
        name, sep, version = str(line).partition("==")
        if sep and release:
            out.append(Package(release, name, version))
    return out, unread


def dpkg_sources(status: str) -> list[str]:
    """`source==version` of every installed Debian package in a dpkg status file (what Debian's OSV
    records name: a binary package `libc6` is source `glibc`; `Source: x (v)` when the versions differ)."""
    from debian import deb822
    out = set()
    for para in deb822.Packages.iter_paragraphs(status.splitlines(keepends=True), use_apt_pkg=False):
        if "install ok installed" not in para.get("Status", ""):
            continue
        source, version = para.get("Source", para.get("Package", "")), para.get("Version", "")
        name, _, inner = source.partition(" ")
        if inner.startswith("(") and inner.endswith(")"):
            version = inner[1:-1]
        if name and version:
            out.add(f"{name}=={version}")
    return sorted(out)


def os_release(text: str) -> str:
    """The OSV ecosystem of an /etc/os-release ("Debian:12"); "" for a system OSV has no Debian data for."""
    fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    ident, version = fields.get("ID", "").strip('"'), fields.get("VERSION_ID", "").strip('"')
    return f"Debian:{version}" if ident == "debian" and version else ""
