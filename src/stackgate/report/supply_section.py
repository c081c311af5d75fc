"""The supply chain in the reports: per candidate stack beside production, the vulnerability findings
(inherited first, then added by the upgrade, then fixed by it; blocking ones with the allow-list stub
to paste), the sizes, and the CUDA library copies the loader can reach. "Not scanned" is said as
such: never "no vulnerabilities"."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from stackgate.osv import Finding
from stackgate.supply import MB, PairScan, StackScan


def _row(f: Finding, where: str, esc: Callable[[object], str]) -> str:
    fix = f">= {f.fixed}" if f.fixed else "no fix published"
    return (f"| {where} | {esc(f.advisory)} | {esc(f.severity)} | {esc(f.package)} | {esc(f.installed)} | {esc(fix)} "
            f"| {esc(f.summary[:100])} |")


def _scanned(scan: StackScan) -> str:
    if not scan.scanned:
        return f"not scanned: {scan.why_not}"
    return f"scanned: {scan.packages} package(s), {len(scan.findings)} finding(s)"


def stub(findings: Sequence[Finding], stack: str) -> list[str]:
    """The allow-list entries a reviewer would paste into the policy for these findings."""
    out = []
    for f in findings:
        out += ["[[vulnerabilities.allow]]", f'id = "{f.advisory}"', f'package = "{f.package}"', f'stacks = "{stack}"',
                'reason = "why this finding is acceptable here (who decided)"', "review_by = 2027-01-31", ""]
    return out


def markdown(pairs: Sequence[PairScan], database: str, blocking: set[tuple[str, str, str]],
             esc: Callable[[object], str]) -> list[str]:
    if not pairs:
        return []
    lines = ["## Supply chain (vulnerabilities, size, CUDA libraries)", "",
             f"Vulnerability database: {esc(database) if database else 'none given: stacks not scanned'}", ""]
    for pair in pairs:
        lines += [f"### {esc(pair.production.stack)} → {esc(pair.candidate.stack)}", "",
                  f"- production: {esc(_scanned(pair.production))}", f"- candidate: {esc(_scanned(pair.candidate))}"]
        rows = ([_row(f, "inherited (in production too)", esc) for f in pair.inherited]
                + [_row(f, "added by the upgrade", esc) for f in pair.added]
                + [_row(f, "fixed by the upgrade", esc) for f in pair.removed])
        if rows:
            lines += ["", "| where | advisory | severity | package | installed | fixed in | summary |",
                      "|---|---|---|---|---|---|---|", *rows, ""]
        for what, a, b in (("image", pair.production.image_size, pair.candidate.image_size),
                           ("environment", pair.production.env_size, pair.candidate.env_size)):
            if a or b:
                lines.append(f"- {what} size: {a / MB:.0f} MB → {b / MB:.0f} MB")
        for scan in (pair.candidate,):
            largest = sorted(scan.package_sizes.items(), key=lambda kv: -kv[1])[:5]
            if largest:
                lines.append("- largest packages (candidate): " + ", ".join(f"{esc(n)} {s / MB:.0f} MB" for n, s in largest))
        for role, scan in (("production", pair.production), ("candidate", pair.candidate)):
            if scan.loader:
                lines.append(f"- CUDA libraries the loader reaches ({role}): " + "; ".join(
                    f"{esc(lib)} x{len(paths)}" for lib, paths in sorted(scan.loader.items())))
        mine = [f for f in pair.added if (f.advisory, f.package, pair.candidate.stack) in blocking]
        if mine:
            lines += ["", "To accept a blocking finding for a while, paste into the policy and fill in the reason:", "",
                      "```toml", *stub(mine, pair.candidate.stack), "```"]
        lines.append("")
    return lines
