"""report.md: verdict first, then why, what changed, the matrix, comparisons. Also the GitHub step summary."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stackgate.evidence import MetricComparison
from stackgate.model import Severity
from stackgate.report import supply_section
from stackgate.report.data import RunReport, blocking_findings, counts, notes, performance_rows, stack_image_rows
from stackgate.report.files import atomic_write, strip_control
from stackgate.stats import percent

ICON = {"GO": "GO ✅", "NO-GO": "NO-GO ❌", "INCONCLUSIVE": "INCONCLUSIVE ⚠️"}


def md_escape(text: object) -> str:
    """Escape table/markup characters and HTML so quoted log text cannot change the document."""
    s = str(text).replace("\r", " ").replace("\n", " ")
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    for ch in "\\`*_[]|#":
        s = s.replace(ch, "\\" + ch)
    return s


def render(report: RunReport) -> str:
    v = report.gate.verdict
    lines = [f"# stackgate {md_escape(report.matrix)}: {ICON[v.decision.value]}", ""]
    lines.append(f"Run `{report.run_id}` · channel {md_escape(report.channel)} · {report.started} → {report.finished}"
                 f" · gating verdict **{report.gating_verdict}**")
    lines.append("")
    c = counts(report)
    lines.append("Cells: " + ", ".join(f"{k} {n}" for k, n in sorted(c.items()) if n))
    lines.append("")
    blocking = [r for r in v.reasons if r.severity in (Severity.BLOCKING, Severity.INCONCLUSIVE, Severity.WAIVED)]
    if blocking:
        lines += ["## Why", "", "| severity | cell | test | reason |", "|---|---|---|---|"]
        lines += [f"| {r.severity.value} | {md_escape(r.cell)} | {md_escape(r.test)} | {md_escape(r.message)} |"
                  for r in blocking]
        lines.append("")
    known = report.evidence.preexisting
    if known:
        lines += ["## Pre-existing failures (fail in production too: not caused by the upgrade)", "",
                  "| cell | test | candidate | production |", "|---|---|---|---|"]
        lines += [f"| {md_escape(k.cell)} | {md_escape(k.test)} | {md_escape(k.candidate)} | {md_escape(k.production)} |"
                  for k in known]
        lines.append("")
    ev = report.evidence
    if ev.comparisons:
        head = ["| cell | metric | production | candidate | change (candidate vs production) | 95% CI of the change | "
                "tolerance | outcome |", "|---|---|---|---|---|---|---|---|"]
        gated, ungated = performance_rows(ev.comparisons)
        lines += ["## Performance (candidate vs production)", ""]
        if gated:
            lines += [*head, *(_perf_row(c) for c in gated), ""]
        if ungated:
            lines += [f"<details><summary>{len(ungated)} ungated comparison(s): shown, never deciding</summary>", "",
                      *head, *(_perf_row(c) for c in ungated), "", "</details>", ""]
    for d in report.diffs:
        lines += [f"## What changed: {md_escape(d.production_cell)} → {md_escape(d.candidate_cell)}", "",
                  "| | production | candidate |", "|---|---|---|"]
        lines += [f"| {md_escape(w)} | {md_escape(a)} | {md_escape(b)} |" for w, a, b in d.facts if a != b or w == "torch"]
        if d.packages:
            shown = d.packages[:25]
            lines += ["", f"{len(d.packages)} package(s) differ" + (" (first 25)" if len(d.packages) > 25 else "") + ":",
                      "", "| package | production | candidate |", "|---|---|---|"]
            lines += [f"| {md_escape(p.name)} | {md_escape(p.production or '-')} | {md_escape(p.candidate or '-')} |"
                      for p in shown]
        lines.append("")
    lines += supply_section.markdown(report.evidence.supply, report.vuln_db, blocking_findings(report), md_escape)
    if report.power:
        lines += ["## Gate power", "", "What a regression must exceed to be caught ~90% of the time: from the noise "
                  "`stackgate calibrate` measured on this pool, with the runs the policy makes, and from the noise "
                  "the pairs showed in this run, with the runs made.", "",
                  "| cell and metric | tolerance | calibrated noise (when) | runs | detects | noise in this run | runs made "
                  "| detects |", "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {md_escape(k)} | {v['tolerance']:.1%} | {_power_cells(v, 'sigma', 'repeats', 'detects')} | "
                  f"{_power_cells(v, 'seen', 'pairs', 'detects_seen')} |" for k, v in report.power.items()]
        lines.append("")
        drift = [f"- **{md_escape(k)}**: {md_escape(v['note'])}" for k, v in report.power.items() if "note" in v]
        lines += [*drift, ""] if drift else []
    if report.host_probe:
        lines += ["## Host probe", "", "| pool | status | evidence |", "|---|---|---|"]
        lines += [f"| {md_escape(pool)} | {md_escape(str(found.get('status')))} | "
                  f"{md_escape('; '.join(found.get('evidence', []))[:600])} |" for pool, found in report.host_probe.items()]
        lines.append("")
    images = stack_image_rows(report.results)
    if images:
        lines += ["## Stack images (what ran: roll out these, by digest)", "", "| stack | image | image id | cells |",
                  "|---|---|---|---|"]
        lines += [f"| {md_escape(r.stack)} | `{md_escape(r.image)}` | `{md_escape(r.image_id[:19])}` | "
                  f"{len(r.cells)} |" for r in images]
        lines.append("")
    lines += ["## Matrix", "", "| cell | role | required | status | tests | time | reason |", "|---|---|---|---|---|---|---|"]
    for cell, result in report.result_rows():
        if result is None:
            lines.append(f"| {md_escape(cell.id)} | {cell.role.value} | {cell.required} | no result | | | |")
            continue
        passed = sum(t.outcome == "passed" for t in result.tests)
        lines.append(f"| {md_escape(cell.id)} | {cell.role.value} | {'yes' if cell.required else 'no'} | "
                     f"{result.status.value} | {passed}/{len(result.tests)} | {result.duration_s:.0f}s | "
                     f"{md_escape(result.reason[:200])} |")
    for r in report.rollbacks:
        passed = sum(t.outcome == "passed" for t in r.tests)
        lines.append(f"| {md_escape(r.cell_id)} | rollback | yes | {r.status.value} | {passed}/{len(r.tests)} | "
                     f"{r.duration_s:.0f}s | {md_escape(r.reason[:200])} |")
    for n in report.not_here:
        lines.append(f"| {md_escape(n.cell.id)} | {n.cell.role.value} | {'yes' if n.cell.required else 'no'} | "
                     f"not run here | | | {md_escape(n.reason)} |")
    lines.append("")
    if report.pruned:
        lines += ["<details><summary>Pruned cells (cannot exist)</summary>", "", "| cell | rule |", "|---|---|"]
        lines += [f"| {md_escape(p.cell.id)} | {md_escape('; '.join(p.reasons))} |" for p in report.pruned]
        lines += ["", "</details>", ""]
    if ev.parity:
        lines += ["## Numerics", "", "| cell | metric | bitwise | within tolerance | worst step | worst diff |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {md_escape(p.cell)} | {md_escape(p.metric)} | {p.parity.bitwise} | {p.parity.within} | "
                  f"{'-' if p.parity.bitwise else p.parity.worst_index} | {p.parity.worst_abs:.3g} |" for p in ev.parity]
        lines.append("")
    if ev.new_warnings:
        lines += ["## New warnings in the candidate (upgrade work items)", ""]
        for cell_id, warns in ev.new_warnings.items():
            lines += [f"- {md_escape(cell_id)}: {md_escape(w)}" for w in warns]
        lines.append("")
    if report.nightly:
        lines += ["## Nightly channel", ""]
        lines += [f"- last green nightly: {md_escape(report.nightly['last_green'])}" if "last_green" in report.nightly
                  else "- no green nightly in the history yet"]
        if "first_red_after" in report.nightly:
            lines.append(f"- first red nightly after it: {md_escape(report.nightly['first_red_after'])}")
        lines.append("")
    if report.trends:
        lines += ["## Trends (last runs of this matrix and suite)", ""]
        for metric, points in report.trends.items():
            for role in ("production", "candidate"):
                mine = [p for p in points if p.role == role]
                if mine:
                    lines.append(f"- {md_escape(metric)} ({role}): " + " → ".join(
                        f"{p.value:.4g}" + (" (this run)" if p.run_id == report.run_id else "") for p in mine))
        lines.append("")
    info = notes(report)
    if info:
        lines += ["## Notes", ""] + [f"- {md_escape(r.cell)}: {md_escape(r.message)}" for r in info] + [""]
    return "\n".join(lines)


def _perf_row(cmp: MetricComparison) -> str:
    k = cmp.comparison
    low, high = k.value_interval
    ci = f"[{percent(low)}, {percent(high)}]" if math.isfinite(k.low) and math.isfinite(k.high) else "n/a"
    return (f"| {md_escape(cmp.cell)} | {md_escape(cmp.metric)} | {k.base_median:.4g} {md_escape(cmp.unit)} | "
            f"{k.cand_median:.4g} | {md_escape(k.reading())} | {ci} | "
            f"{f'{k.tolerance:.0%} worse' if cmp.gated else 'not gated'} | {k.outcome.value if cmp.gated else '-'} |")


def write(report: RunReport, path: Path, step_summary: str | None) -> None:
    text = strip_control(render(report))
    atomic_write(path, text)
    if step_summary:
        with Path(step_summary).open("a", encoding="utf-8") as fh:
            fh.write(text + "\n")


def _power_cells(entry: Mapping[str, Any], noise: str, runs: str, detects: str) -> str:
    """Noise, runs and the change detected, or dashes where the report has no such figure."""
    if noise not in entry:
        return "- | - | -"
    found = entry[detects]
    caught = f">= {found:.1%}" if found != float("inf") else "nothing (fewer than 2 runs)"
    when = f" ({entry['calibrated'][:10]})" if noise == "sigma" and "calibrated" in entry else ""
    return f"{entry[noise]:.1%}{md_escape(when)} | {entry[runs]} | {caught}"
