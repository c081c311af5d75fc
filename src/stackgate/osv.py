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
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion
from packaging.version import Version as Pep440
from pydantic import ValidationError

from stackgate.boundary import osv as osv_record
from stackgate.boundary.base import describe
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
    unclassified: str = ""  # why its ranges could not be evaluated (versions its ecosystem cannot order)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.advisory, self.ecosystem, self.package)

    def to_json(self) -> dict[str, Any]:
        return {"advisory": self.advisory, "aliases": list(self.aliases), "package": self.package,
                "ecosystem": self.ecosystem, "installed": self.installed, "severity": self.severity,
                "fixed": self.fixed, "summary": self.summary,
                **({"unclassified": self.unclassified} if self.unclassified else {})}



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


def _affected_by_range(events: Sequence[osv_record.Event], ecosystem: str, installed: Any) -> tuple[bool, str | None]:
    """(affected, the first `fixed` above the installed version) under one ECOSYSTEM range (OSV's
    evaluation: events in version order; `introduced` opens, `fixed` closes at, `last_affected` after)."""
    points = []
    for event in events:
        for kind, value in event.points():
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
    affected: tuple[osv_record.Affected, ...]
    origin: str  # the file (and zip member) it came from, for errors

    def findings(self, package: Package) -> Iterator[tuple[bool, str | None, str]]:
        """(affected, fixed, why unordered) for each of this record's entries about `package`. A range
        whose versions (or the installed one) its ecosystem cannot order is never skipped: it counts
        as a hit that cannot be classified (`why unordered` says why), like an unrated advisory."""
        try:
            installed = _sort_key(package.ecosystem, package.version)
            unordered = ""
        except ValueError as exc:
            installed, unordered = None, f"the installed version {package.version!r} cannot be ordered ({exc})"
        for entry in self.affected:
            if entry.package.ecosystem != package.ecosystem or _name(package.ecosystem, entry.package.name) != \
                    _name(package.ecosystem, package.name):
                continue
            hit, fixed, why = package.version in entry.versions, None, ""
            for rng in entry.ranges:
                if rng.type not in ("ECOSYSTEM", "SEMVER"):
                    continue  # GIT ranges name commits: a built package has none to compare
                if unordered:
                    why = unordered
                    continue
                try:
                    affected, first_fix = _affected_by_range(rng.events, package.ecosystem, installed)
                except (ValueError, TypeError) as exc:  # a version its ecosystem cannot order
                    why = f"a range of {self.id} cannot be ordered ({str(exc)[:120]})"
                    continue
                hit = hit or affected
                fixed = fixed or first_fix
            yield hit, fixed, why


def _name(ecosystem: str, name: str) -> str:
    return str(canonicalize_name(name)) if ecosystem == "PyPI" else name


def _rating(record: osv_record.Record) -> str:
    own = record.database_specific.severity if record.database_specific is not None else None
    if own is not None and level(own) != "UNRATED":
        return level(own)
    import cvss
    best = "UNRATED"
    for score in record.severity:
        vector = score.score
        try:
            if score.type == "CVSS_V4":
                rated = level(str(cvss.CVSS4(vector).severity))
            elif score.type == "CVSS_V3":
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
                ecosystem = entry.package.ecosystem
                key = (ecosystem.split(":", maxsplit=1)[0], _name(ecosystem, entry.package.name))
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
                if any(hit for hit, _, _ in verdicts):
                    fixed = next((f for hit, f, _ in verdicts if hit and f), None)
                    out.append(Finding(advisory.id, advisory.aliases, package.name, package.ecosystem,
                                       package.version, self.severity(advisory), fixed, advisory.summary))
                elif any(why for _, _, why in verdicts):  # unclassified: reported, counted like UNRATED
                    why = next(w for _, _, w in verdicts if w)
                    out.append(Finding(advisory.id, advisory.aliases, package.name, package.ecosystem,
                                       package.version, "UNRATED", None, advisory.summary, unclassified=why))
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
                record = osv_record.Record.model_validate_json(blob)
            except ValidationError as exc:
                what = "is not JSON" if exc.errors()[0]["type"] == "json_invalid" else "is not an OSV record"
                raise ConfigError(f"vulnerability database: {origin} {what} ({describe(exc)})",
                                  hint="remove the file or restore it from the OSV export; see "
                                       "https://ossf.github.io/osv-schema/") from None
            if record.withdrawn:
                continue
            names = (*record.aliases, *record.upstream)
            summary = (record.summary or record.details.split("\n")[0])[:200]
            advisories.append(Advisory(record.id, names, summary, _rating(record), tuple(record.affected), origin))
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
