"""Production under watch (#44): the promoted stacks re-checked between upgrades. Each check reads what
the promotion recorded (the history's promotion rows, the promoted run's report and each stack's
pylock.toml) against today's world (an OSV database on disk, the policy's allow-list, the registry's
tags, the locked wheels on disk) and returns a `Check`; nothing here runs a stack or decides a
candidate. `commands/watch.py` gathers the inputs, `report` renders what they found."""

from __future__ import annotations

import fnmatch
import html
import json
import math
import statistics
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from stackgate import osv
from stackgate.boundary import pylock as pylock_boundary
from stackgate.history import Promotion
from stackgate.installer import file_sha256
from stackgate.policy import DriftRule, Waiver
from stackgate.report.markdown import md_escape

# clean, findings; not-run: an input is missing (exit 2); error: the infrastructure failed it (exit 3);
# skipped: asked not to (--no-canary); recording: the canary's baseline is still being built (fewer
# earlier canaries than the policy compares with)
State = Literal["clean", "findings", "not-run", "error", "skipped", "recording"]
CHECKS = ("advisories", "allow-list", "rollback", "drift")


@dataclass(frozen=True)
class Finding:
    subject: str  # what it is about: a package, an allow-list entry, a tag, a wheel
    message: str
    fix: str = ""  # what to do about it

    def to_json(self) -> dict[str, str]:
        return {"subject": self.subject, "message": self.message, "fix": self.fix}


@dataclass(frozen=True)
class Check:
    name: str
    state: State
    detail: str  # what was looked at (a clean check says what it checked; a check not run says why)
    findings: tuple[Finding, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "state": self.state, "detail": self.detail,
                "findings": [f.to_json() for f in self.findings]}


def _check(name: str, findings: Sequence[Finding], detail: str) -> Check:
    return Check(name, "findings" if findings else "clean", detail, tuple(findings))


# ------------------------------------------------------------------------------------ what is in force
@dataclass(frozen=True)
class Promoted:
    """One promotion (one run, the tags it moved), as the history recorded it."""

    run_id: str
    at: str
    steps: tuple[Promotion, ...]

    @property
    def run_dir(self) -> str:
        """Where the promoted run lives, as the promotion recorded it ("" before schema version 2)."""
        return self.steps[0].run_dir


def in_force(promotions: Iterable[Promotion]) -> list[Promoted]:
    """The promotions no rollback undid, oldest first: the last is production, the one before it what
    `promote --rollback` goes back to."""
    standing: list[Promoted] = []
    for step in promotions:
        if step.action == "rollback":
            if standing:
                standing.pop()
            continue
        if standing and (standing[-1].run_id, standing[-1].at) == (step.run_id, step.at):
            last = standing.pop()
            standing.append(Promoted(last.run_id, last.at, (*last.steps, step)))
        else:
            standing.append(Promoted(step.run_id, step.at, (step,)))
    return standing


@dataclass(frozen=True)
class ProductionStack:
    """One promoted stack: its lock, its image (by digest, "" for a venv stack), its SBOM and the
    advisories its promotion's scan already named."""

    label: str
    lock: Path
    image: str = ""
    packages: tuple[osv.Package, ...] = ()
    known: frozenset[str] = field(default_factory=frozenset)  # "<advisory or alias> <package>" at promotion
    scanned: bool = False  # the promoted run scanned it (else everything is new to this watch)


def lock_packages(lock: pylock_boundary.PyLock) -> list[osv.Package]:
    return [osv.Package("PyPI", p.name, p.version) for p in lock.packages]


# ----------------------------------------------------------------------------------------- advisories
def _known(stack: ProductionStack, f: osv.Finding) -> bool:
    return any(f"{name} {f.package}" in stack.known for name in (f.advisory, *f.aliases))


def advisories(stacks: Sequence[ProductionStack], db: osv.Database | None, why_no_db: str) -> Check:
    """Production's SBOM against today's database: what is new since the promotion, fixable first,
    with the upgrade that fixes it. What the promotion already knew is counted, not repeated."""
    if db is None:
        return Check("advisories", "not-run", why_no_db)
    found: list[tuple[osv.Finding, str]] = []
    known = 0
    for stack in stacks:
        for f in db.scan(stack.packages):
            if _known(stack, f):
                known += 1
            else:
                found.append((f, stack.label))
    found.sort(key=lambda pair: (pair[0].fixed is None, -osv.LEVELS.index(pair[0].severity), pair[0].package))
    out = [Finding(f"{f.package} {f.installed}",
                   f"{f.advisory} ({f.severity}) in {f.package} {f.installed} [{f.ecosystem}], stack {label}: "
                   f"{f.summary}" + ("" if all(s.scanned for s in stacks) else
                                     " (the promoted run was not scanned: new to this watch)"),
                   f"upgrade {f.package} to >= {f.fixed}" if f.fixed else "no fix published yet")
           for f, label in found]
    count = sum(len(s.packages) for s in stacks)
    return _check("advisories", out, f"{count} packages of {len(stacks)} stack(s) against {db.root} "
                                     f"({len(db)} advisories): {len(out)} new since the promotion, {known} known then")


# ----------------------------------------------------------------------------------------- allow-list
def outdated_allowances(stacks: Sequence[ProductionStack], allow: Sequence[Waiver], db: osv.Database | None,
                        policy: Path, why_no_db: str) -> Check:
    """An allow-list entry waives an advisory "no fix available"; once a fix is published in a version
    the stack could move to, the entry is outdated and fails, naming itself and the fix."""
    if db is None:
        return Check("allow-list", "not-run", why_no_db)
    out = []
    for entry in allow:
        where = f"{policy}:{entry.line}" if entry.line else str(policy)
        for stack in stacks:
            if not fnmatch.fnmatchcase(stack.label, entry.stacks):
                continue
            chosen = [p for p in stack.packages if fnmatch.fnmatchcase(p.name, entry.package)]
            for f in db.scan(chosen):
                if entry.advisory in (f.advisory, *f.aliases) and f.fixed:
                    out.append(Finding(f"[[vulnerabilities.allow]] {entry.advisory} ({where})",
                                       f"the allow-list entry for {entry.advisory} in {f.package} {f.installed} "
                                       f"(stack {stack.label}; \"{entry.reason}\") is outdated: {f.package} "
                                       f"{f.fixed} fixes it",
                                       f"move {f.package} to >= {f.fixed} with the next upgrade, then remove the "
                                       f"entry at {where}"))
    return _check("allow-list", out, f"{len(allow)} allow-list entr{'y' if len(allow) == 1 else 'ies'} of {policy} "
                                     f"against {db.root}")


# ------------------------------------------------------------------------------------------- rollback
Head = Callable[[str, str], "str | None"]  # (repository, tag) -> the digest it names, or None: no such tag


def _lock_problems(lock: Path, what: str) -> list[Finding]:
    """A venv stack rolls out (and back) from its lock and the wheels beside it: each must be there,
    byte for byte."""
    if not lock.is_file():
        return [Finding(str(lock), f"{what}: its pylock.toml is gone", "restore the promotion's directory "
                                                                           "from its backup, or promote again")]
    out = []
    for package in pylock_boundary.read(lock).packages:
        for wheel in package.wheels:
            path = lock.parent / wheel.path
            if not path.is_file():
                out.append(Finding(str(path), f"{what}: {wheel.name} ({package.name} {package.version}) is gone",
                                   "restore it from the promotion's backup (its sha256 is in the lock)"))
            elif file_sha256(path) != wheel.hashes.sha256:
                out.append(Finding(str(path), f"{what}: {wheel.name} is not the wheel the lock names (sha256 "
                                              "differs)", "restore the tested wheel; never install this one"))
    return out


def rollback(current: Promoted, earlier: Promoted | None, stacks: Sequence[ProductionStack],
             earlier_locks: Sequence[Path], head: Head | None) -> Check:
    """`promote --rollback` must still be possible: the registry's `:production` (or the promoted tag)
    and `:previous` name the digests the history recorded (one manifest request each, no pull), and
    the locks and wheels of production and of the promotion before it are on disk as promoted."""
    out: list[Finding] = []
    looked: list[str] = []
    for step in current.steps:
        if not (step.tag and step.image):
            continue
        name, _, tag = step.tag.rpartition(":")
        wanted = [(tag, step.image)] + ([("previous", step.previous)] if step.previous else [])
        for each, image in wanted:
            looked.append(f"{name}:{each}")
            if head is None:
                return Check("rollback", "not-run", f"the promotion moved {step.tag}, but no registry client is "
                                                    "available here (the Docker engine)")
            digest = head(name, each)
            expected = image.rpartition("@")[2]
            if digest is None:
                out.append(Finding(f"{name}:{each}", f"{name}:{each} is gone from the registry"
                                   + (": `promote --rollback` has nothing to go back to" if each == "previous" else ""),
                                   f"re-push {image} as {name}:{each}"))
            elif digest != expected:
                out.append(Finding(f"{name}:{each}", f"{name}:{each} names {digest}, not {expected} as the "
                                                     f"promotion of run {current.run_id} recorded",
                                   f"point {name}:{each} at {image} again (or promote the run it now names)"))
    for stack in stacks:
        looked.append(str(stack.lock))
        out += _lock_problems(stack.lock, f"production's {stack.label}")
    for lock in earlier_locks:
        looked.append(str(lock))
        out += _lock_problems(lock, f"the rollback target's {lock.parent.name} (run {earlier.run_id if earlier else '?'})")
    before = f"; the promotion before it: run {earlier.run_id}" if earlier else "; no earlier promotion recorded"
    return _check("rollback", out, f"{len(looked)} tag(s) and lock(s) of run {current.run_id}{before}")


# ---------------------------------------------------------------------------------------------- drift
MAD_TO_SIGMA = 1.4826  # the median absolute deviation of a normal sample, scaled to its standard deviation


@dataclass(frozen=True)
class Measured:
    """One gated metric of production's canary on a pool: its median, and the medians of the earlier
    canaries of the same cell, suite and profile (newest first)."""

    pool: str
    cell_id: str
    metric: str
    median: float
    earlier: tuple[float, ...]


@dataclass(frozen=True)
class Shift:
    baseline: float  # the median of the earlier canaries
    sigma: float  # their spread: MAD x 1.4826
    change: float  # (median - baseline) / baseline
    flagged: bool


def shift(m: Measured, rule: DriftRule) -> Shift | None:
    """How far this canary is from its baseline (the last `rule.runs` canaries), or None with fewer
    than `rule.min_runs` of them. Flagged: beyond the tolerance AND beyond `spread_k` x the spread, so
    that neither a small shift on a quiet pool nor one noisy run on a noisy pool raises it."""
    past = m.earlier[:rule.runs]
    if len(past) < rule.min_runs:
        return None
    base = statistics.median(past)
    sigma = MAD_TO_SIGMA * statistics.median(abs(v - base) for v in past)
    change = (m.median - base) / base if base else math.inf
    return Shift(base, sigma, change, abs(change) > rule.tolerance and abs(m.median - base) > rule.spread_k * sigma)


def drift(measured: Sequence[Measured], failed: Sequence[tuple[str, str]], rule: DriftRule) -> Check:
    """Production's own drift on the pools it ran on here: a canary that moved beyond the rule is "the
    pool changed, not the stack"; a canary that did not pass its suite (`failed`: cell, why) is a
    finding of its own."""
    out = [Finding(f"canary {cell}", f"production's canary {cell} did not pass on this pool: {why}",
                   "production itself fails here now: look at the pool before gating anything on it")
           for cell, why in failed]
    compared = short = 0
    for m in measured:
        found = shift(m, rule)
        if found is None:
            short += 1
            continue
        compared += 1
        if found.flagged:
            out.append(Finding(f"pool {m.pool}: {m.metric}",
                               f"the pool changed, not the stack: production's canary {m.metric} on pool {m.pool} is "
                               f"{m.median:.4g} against {found.baseline:.4g}, the median of its last "
                               f"{min(len(m.earlier), rule.runs)} canaries ({found.change:+.1%}; their spread "
                               f"{found.sigma:.3g}; tolerance {rule.tolerance:.0%} and {rule.spread_k:g} x the spread)",
                               "look at the pool's machines (driver, clocks, a degraded node) before reading a "
                               "candidate's comparison on it; the next gate run on this pool says so beside it"))
    rule_text = (f"median of the last {rule.runs} canaries (at least {rule.min_runs}), MAD spread; flagged beyond "
                 f"{rule.tolerance:.0%} and {rule.spread_k:g} x the spread")
    detail = (f"{len(measured)} gated metric(s) of production's canary: {compared} compared, {short} with too few "
              f"earlier canaries; {rule_text}")
    if not measured and not failed:
        return Check("drift", "not-run", "production's canary recorded no gated metric: nothing to compare "
                                         "(the policy's [[performance.metric]] rules name what is gated)")
    if not compared and not out:
        return Check("drift", "recording", detail + ": this canary is recorded toward the baseline")
    return _check("drift", out, detail)


# -------------------------------------------------------------------------------------------- report
@dataclass(frozen=True)
class WatchReport:
    run_id: str  # the promoted run production came from
    at: str
    checks: tuple[Check, ...]

    @property
    def exit_code(self) -> int:
        """0 clean, 1 findings, 2 a check could not run (its input is missing: configuration), 3 the
        infrastructure failed one (the canary's environment, say)."""
        if any(c.state == "error" for c in self.checks):
            return 3
        if any(c.state == "not-run" for c in self.checks):
            return 2
        return 1 if any(c.findings for c in self.checks) else 0

    @property
    def summary(self) -> str:
        findings = sum(len(c.findings) for c in self.checks)
        not_run = [c.name for c in self.checks if c.state in ("not-run", "error")]
        return (f"{findings} finding(s)" + (f"; not run: {', '.join(not_run)}" if not_run else "")
                + f" (production: run {self.run_id})")

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": 1, "kind": "watch", "run_id": self.run_id, "at": self.at,
                "exit_code": self.exit_code, "checks": [c.to_json() for c in self.checks]}


def markdown(report: WatchReport) -> str:
    lines = [f"# stackgate watch: {md_escape(report.summary)}", "", f"At {md_escape(report.at)}; exit "
             f"{report.exit_code}.", "", "| check | state | what was looked at |", "|---|---|---|"]
    lines += [f"| {c.name} | {c.state} | {md_escape(c.detail)} |" for c in report.checks]
    for c in report.checks:
        if c.findings:
            lines += ["", f"## {c.name}", "", "| subject | finding | what to do |", "|---|---|---|"]
            lines += [f"| {md_escape(f.subject)} | {md_escape(f.message)} | {md_escape(f.fix)} |" for f in c.findings]
    return "\n".join(lines) + "\n"


def html_page(report: WatchReport) -> str:
    esc = html.escape
    rows = "".join(f"<tr><td>{esc(c.name)}</td><td class='{esc(c.state)}'>{esc(c.state)}</td><td>{esc(c.detail)}</td>"
                   f"</tr>" for c in report.checks)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>stackgate watch</title></head><body>"
             f"<h1 id='summary'>stackgate watch: {esc(report.summary)}</h1><p>At {esc(report.at)}; exit "
             f"{report.exit_code}.</p><table><tr><th>check</th><th>state</th><th>what was looked at</th></tr>{rows}"
             "</table>"]
    for c in report.checks:
        if c.findings:
            items = "".join(f"<tr><td>{esc(f.subject)}</td><td>{esc(f.message)}</td><td>{esc(f.fix)}</td></tr>"
                            for f in c.findings)
            parts.append(f"<h2>{esc(c.name)}</h2><table><tr><th>subject</th><th>finding</th><th>what to do</th></tr>"
                         f"{items}</table>")
    return "".join(parts) + "</body></html>\n"


def junit(report: WatchReport) -> str:
    root = ET.Element("testsuites", name="stackgate watch")
    suite = ET.SubElement(root, "testsuite", name="watch", tests=str(len(report.checks)),
                          failures=str(sum(1 for c in report.checks if c.findings)),
                          errors=str(sum(1 for c in report.checks if c.state in ("not-run", "error"))),
                          skipped=str(sum(1 for c in report.checks if c.state == "skipped")))
    for c in report.checks:
        case = ET.SubElement(suite, "testcase", classname="watch", name=c.name)
        if c.state in ("not-run", "error"):  # a check that could not run is no pass
            ET.SubElement(case, "error", message=c.detail[:500])
        elif c.state == "skipped":
            ET.SubElement(case, "skipped", message=c.detail[:500])
        elif c.findings:
            failure = ET.SubElement(case, "failure", message=f"{len(c.findings)} finding(s)")
            failure.text = "\n".join(f"{f.message} -- {f.fix}" for f in c.findings)
    return ET.tostring(root, encoding="unicode") + "\n"


def json_text(report: WatchReport) -> str:
    return json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n"
