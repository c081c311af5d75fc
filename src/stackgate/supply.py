"""The stack's supply chain as evidence: known vulnerabilities of each stack's SBOM against an OSV
database on disk, the size of each stack against production's, and the CUDA libraries the loader can
reach. `scan` reads what the run recorded (results' environments) into one `PairScan` per candidate
stack beside its production stack; `reasons` turns them into the gate's reasons under the policy
(`gate.decide` calls it: it stays the one function that decides)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stackgate import osv
from stackgate.model import Cell, CellResult, Reason, Severity
from stackgate.policy import SupplyRules
from stackgate.rundir.results import stack_pairs

MB = 1_000_000
LOADER_LIBRARIES = ("libnccl", "libcudnn", "libcudart")


@dataclass(frozen=True)
class StackScan:
    stack: str  # the stack's label
    scanned: bool
    why_not: str = ""  # when not scanned: no database, or no SBOM recorded
    asked: bool = False  # a database was given (not scanned then is missing evidence, not a choice)
    findings: tuple[osv.Finding, ...] = ()
    packages: int = 0
    unread: tuple[str, ...] = ()  # SBOM lines with no version to match (`name @ file://...`)
    image_size: int = 0
    env_size: int = 0
    package_sizes: Mapping[str, int] = field(default_factory=dict)
    loader: Mapping[str, Sequence[str]] = field(default_factory=dict)  # library -> copies the loader can reach
    cuda: bool = False  # a CUDA build (sizes compare like with like)

    def to_json(self) -> dict[str, Any]:
        return {"stack": self.stack, "scanned": self.scanned, "why_not": self.why_not,
                "findings": [f.to_json() for f in self.findings], "packages": self.packages,
                "unread": list(self.unread), "image_size": self.image_size, "env_size": self.env_size,
                "largest_packages": dict(sorted(self.package_sizes.items(), key=lambda kv: -kv[1])[:10]),
                "loader_copies": {k: list(v) for k, v in self.loader.items()}}


@dataclass(frozen=True)
class PairScan:
    """A candidate stack beside its production stack; `cell`: the first candidate cell of the pair
    (its reasons name it)."""

    cell: str
    production: StackScan
    candidate: StackScan

    def _keys(self, scan: StackScan) -> set[tuple[str, str, str]]:
        return {f.key for f in scan.findings}

    @property
    def added(self) -> tuple[osv.Finding, ...]:
        base = self._keys(self.production)
        return tuple(f for f in self.candidate.findings if f.key not in base)

    @property
    def inherited(self) -> tuple[osv.Finding, ...]:
        base = self._keys(self.production)
        return tuple(f for f in self.candidate.findings if f.key in base)

    @property
    def removed(self) -> tuple[osv.Finding, ...]:
        mine = self._keys(self.candidate)
        return tuple(f for f in self.production.findings if f.key not in mine)

    def to_json(self) -> dict[str, Any]:
        return {"cell": self.cell, "production": self.production.to_json(), "candidate": self.candidate.to_json(),
                "added": [f.to_json() for f in self.added], "inherited": [f.to_json() for f in self.inherited],
                "fixed_by_upgrade": [f.to_json() for f in self.removed]}


def _stack_scan(cell: Cell, result: CellResult, db: osv.Database | None, why_no_db: str) -> StackScan:
    env = result.environment
    packages, unread = osv.sbom(env)
    common: dict[str, Any] = {
        "stack": cell.stack.label, "packages": len(packages), "unread": tuple(unread),
        "image_size": env.image_size or 0, "env_size": env.env_size or 0,
        "package_sizes": dict(env.package_sizes),
        "loader": {k: tuple(v.competing) for k, v in env.loader_copies.items()},
        "cuda": cell.stack.cuda.tag != "cpu"}
    if db is None:
        return StackScan(scanned=False, why_not=why_no_db, **common)
    if not packages:
        return StackScan(scanned=False, asked=True, why_not="the run recorded no SBOM of this stack (no `pip freeze`)",
                         **common)
    return StackScan(scanned=True, asked=True, findings=tuple(db.scan(packages)), **common)


def scan(cells: Sequence[Cell], results: Mapping[str, CellResult], db: osv.Database | None,
         why_no_db: str = "no vulnerability database given: `--vuln-db PATH` or [vulnerabilities] database"
         ) -> tuple[PairScan, ...]:
    """One PairScan per (production stack, candidate stack) whose cells both have a result."""
    return tuple(PairScan(cand.id, _stack_scan(base, bres, db, why_no_db), _stack_scan(cand, cres, db, why_no_db))
                 for base, cand, bres, cres in stack_pairs(cells, results))


def _subject(finding: osv.Finding, stack: str) -> tuple[tuple[str, str], ...]:
    return (("advisory", finding.advisory), ("aliases", " ".join(finding.aliases)), ("package", finding.package),
            ("stack", stack))


def _about(f: osv.Finding) -> str:
    fix = f"upgrade {f.package} to >= {f.fixed}" if f.fixed else "no fixed version published"
    return f"{f.advisory} ({f.severity}) in {f.package} {f.installed} [{f.ecosystem}]: {f.summary[:120]} -- {fix}"


def _counts(rules: SupplyRules, f: osv.Finding) -> bool:
    """A finding the threshold cares about: rated at or above it (an unrated one only if the policy
    says so), with a fixed version to move to."""
    rated = rules.unrated == "block" if f.severity == "UNRATED" else osv.at_least(f.severity, rules.threshold)
    return rated and (f.fixed is not None or bool(f.unclassified))  # (unclassified: whether a fix exists is unknown)


def vulnerability_reasons(pair: PairScan, rules: SupplyRules) -> list[Reason]:
    if not pair.candidate.scanned:  # by choice (no database): said; with a database given: missing evidence
        return [Reason(Severity.INCONCLUSIVE if pair.candidate.asked else Severity.INFO,
                       f"vulnerabilities: stack {pair.candidate.stack} was not scanned: {pair.candidate.why_not}",
                       cell=pair.cell, kind="not-scanned")]
    out = []
    stack = pair.candidate.stack
    if not pair.production.scanned:  # new or inherited cannot be told apart: never a NO-GO, never a GO
        return [Reason(Severity.INCONCLUSIVE, f"the candidate has {_about(f)}; production was not scanned "
                       f"({pair.production.why_not}), so whether the upgrade added it cannot be told", cell=pair.cell,
                       kind="vulnerability-unclassified", subject=_subject(f, stack))
                for f in pair.candidate.findings if _counts(rules, f)]
    inherited_severity = {"go": Severity.INFO, "inconclusive": Severity.INCONCLUSIVE,
                          "no-go": Severity.BLOCKING}[rules.inherited]
    for f in pair.inherited:
        if _counts(rules, f):
            out.append(Reason(inherited_severity, f"inherited from production (the upgrade did not add it): {_about(f)}",
                              cell=pair.cell, kind="vulnerability-inherited", subject=_subject(f, stack)))
    for f in pair.added:
        if _counts(rules, f) and f.unclassified:
            out.append(Reason(Severity.INCONCLUSIVE, f"new in the candidate, unclassified ({f.unclassified}): "
                              f"{_about(f)}", cell=pair.cell, kind="vulnerability-unclassified",
                              subject=_subject(f, stack)))
        elif _counts(rules, f):
            out.append(Reason(Severity.BLOCKING, f"new in the candidate: {_about(f)}", cell=pair.cell,
                              kind="vulnerability", subject=_subject(f, stack)))
    for f in pair.removed:
        if _counts(rules, f):
            out.append(Reason(Severity.INFO, f"fixed by the upgrade: {f.advisory} ({f.severity}) in production's "
                              f"{f.package} {f.installed} [{f.ecosystem}]: {f.summary[:120]} -- the candidate is not "
                              "affected", cell=pair.cell, kind="vulnerability-fixed",
                              subject=_subject(f, stack)))
    return out


def _grown(pair: PairScan) -> list[tuple[str, int]]:
    before, after = pair.production.package_sizes, pair.candidate.package_sizes
    growth = [(name, after.get(name, 0) - before.get(name, 0)) for name in set(before) | set(after)]
    return sorted((g for g in growth if g[1] >= MB), key=lambda g: -g[1])[:3]  # a few KB is no growth


def size_reasons(pair: PairScan, rules: SupplyRules) -> list[Reason]:
    prod, cand = pair.production, pair.candidate
    what, a, b = ("image", prod.image_size, cand.image_size) if prod.image_size and cand.image_size else (
        "environment", prod.env_size, cand.env_size)
    if not (a and b):
        return [Reason(Severity.INFO, f"size: not compared ({'production' if not a else 'the candidate'} recorded no "
                       "size: the platform checks measure it)", cell=pair.cell, kind="size-unmeasured")]
    if prod.cuda != cand.cuda:
        return [Reason(Severity.INFO, f"size: {what} {a / MB:.0f} MB -> {b / MB:.0f} MB, not gated: production is a "
                       f"{'CUDA' if prod.cuda else 'CPU'} build and the candidate a {'CUDA' if cand.cuda else 'CPU'} "
                       "build (their CUDA libraries differ by design)", cell=pair.cell, kind="size")]
    growth = b - a
    if growth <= rules.max_growth * a and growth <= rules.max_growth_bytes:
        return []
    grew = ", ".join(f"{name} +{delta / MB:.0f} MB" for name, delta in _grown(pair)) or "no package recorded growth"
    severity = Severity.BLOCKING if rules.size_over == "no-go" else Severity.INCONCLUSIVE
    return [Reason(severity, f"size: the candidate's {what} grew {growth / MB:+.0f} MB ({growth / a:+.1%}: "
                   f"{a / MB:.0f} MB -> {b / MB:.0f} MB), beyond the policy's {rules.max_growth:.0%} or "
                   f"{rules.max_growth_bytes / MB:.0f} MB; grew most: {grew}", cell=pair.cell, kind="size")]


def loader_reasons(pair: PairScan) -> list[Reason]:
    """More than one copy of a CUDA library the loader can reach in the candidate (the platform check
    fails too: this names the copies in the supply-chain section)."""
    out = []
    for lib, copies in sorted(pair.candidate.loader.items()):
        if len(copies) > 1:
            out.append(Reason(Severity.INFO, f"loader: {len(copies)} copies of {lib} reachable: {', '.join(copies[:4])}",
                              cell=pair.cell, kind="loader-copies"))
    return out


def reasons(pairs: Sequence[PairScan], rules: SupplyRules) -> list[Reason]:
    out = []
    for pair in pairs:
        out += vulnerability_reasons(pair, rules)
        out += size_reasons(pair, rules)
        out += loader_reasons(pair)
    return out
