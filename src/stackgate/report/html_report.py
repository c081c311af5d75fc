"""report.html: one self-contained file (inline CSS and SVG, no scripts, no network). Verdict first,
the matrix as a grid of coloured cells, plots, per-cell details. Everything quoted is escaped."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from pathlib import Path

from stackgate.evidence import MetricComparison
from stackgate.model import CellResult, Role, Severity
from stackgate.report import plots, supply_section
from stackgate.report.data import RunReport, blocking_findings, notes, performance_rows
from stackgate.report.files import atomic_write, strip_control
from stackgate.stats import percent

COLOURS = {"passed": "#2e7d32", "failed": "#c62828", "error": "#6a1b9a", "timeout": "#ef6c00", "oom": "#ad1457",
           "crashed": "#4e342e", "build-failed": "#37474f", "infra-error": "#455a64", "skipped": "#9e9e9e",
           "not-run-here": "#bdbdbd", "no-result": "#e0e0e0"}
VERDICT = {"GO": "#2e7d32", "NO-GO": "#c62828", "INCONCLUSIVE": "#ef6c00"}

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#212121;max-width:1200px}
h1{margin:0 0 4px}.verdict{display:inline-block;color:#fff;padding:6px 16px;border-radius:6px;font-size:28px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
.grid td.cell{color:#fff;font-family:monospace;font-size:12px}.muted{color:#757575}
details{margin:6px 0}pre{background:#f5f5f5;padding:8px;overflow:auto;max-height:320px;font-size:12px}
.plots{display:flex;flex-wrap:wrap;gap:16px}.plot{border:1px solid #eee;padding:6px}
td.better{color:#1b5e20;background:#e8f5e9}td.worse{color:#b71c1c;background:#ffebee}
"""


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _unit(result: CellResult, name: str) -> str:
    return next((m.unit for m in result.metrics if m.name == name and m.unit), "")


def _plots(report: RunReport) -> list[str]:
    out = []
    prod = {c.id: c for c in report.cells if c.role is Role.PRODUCTION}
    for cand in (c for c in report.cells if c.role is Role.CANDIDATE):
        base = prod.get(cand.baseline)
        cres, bres = report.results.get(cand.id), report.results.get(base.id) if base else None
        if cres is None or bres is None:
            continue
        for coll in ("all_reduce", "all_gather"):
            series = []
            for label, res in (("production", bres), ("candidate", cres)):
                pts = sorted((float(dict(m.tags)["size"]), _median(m.samples)) for m in res.metrics
                             if m.name == "busbw" and dict(m.tags).get("collective") == coll and m.samples
                             and "size" in dict(m.tags))
                series.append(plots.Series(label, pts))
            out.append(plots.line(f"{coll} bus bandwidth by message size ({cand.pool.name})", series,
                                  xlabel="message size", ylabel=f"bus bandwidth ({_unit(cres, 'busbw') or 'GB/s'})",
                                  x_sizes=True))
        for name, what in (("recsys.loss", "loss"), ("vit.loss", "loss"), ("recsys.step_time", "step time"),
                           ("vit.step_time", "step time")):
            series = []
            for label, res in (("production", bres), ("candidate", cres)):
                m = next((m for m in res.metrics if m.name == name and not dict(m.tags)), None)
                series.append(plots.Series(label, [(float(i), v) for i, v in enumerate(m.samples)] if m else []))
            unit = _unit(cres, name)
            out.append(plots.line(f"{name} per step ({cand.pool.name})", series, xlabel="step",
                                  ylabel=f"{what} ({unit})" if unit else what))
    current = next((plots.timestamp(p.started) for points in report.trends.values() for p in points
                    if p.run_id == report.run_id), None)
    for metric, points in report.trends.items():
        series = [plots.Series(role, [(plots.timestamp(p.started), p.value) for p in points if p.role == role],
                               marker=True) for role in ("production", "candidate")]
        out.append(plots.line(f"trend: {metric}", series, xlabel="run date (UTC)", ylabel="median",
                              x_dates=True, current=current))
    return [f"<figure class='plot'>{p}</figure>" for p in out if p]


def _cell_details(cell_id: str, result: CellResult) -> str:
    rows = "".join(
        f"<tr><td>{escape(t.name)}</td><td style='color:{COLOURS.get(t.outcome, '#000')}'>{escape(t.outcome)}</td>"
        f"<td>{t.duration_s:.2f}s</td><td>{escape(t.message[:600])}</td></tr>" for t in result.tests)
    env = result.environment
    shown = env.to_json()
    facts = ", ".join(f"{k}={escape(str(shown[k]))}" for k in ("torch", "cuda", "nccl", "cudnn", "triton", "python",
                                                               "image_digest") if k in shown)
    warns = "".join(f"<li>{escape(w)}</li>" for w in result.warnings)
    tail = f"<pre>{escape(result.log_tail[-6000:])}</pre>" if result.status.value != "passed" and result.log_tail else ""
    return (f"<details><summary><code>{escape(cell_id)}</code> — {escape(result.status.value)} "
            f"{escape(result.reason[:200])} ({result.duration_s:.0f}s)</summary>"
            f"<p class='muted'>{facts}</p><table><tr><th>test</th><th>outcome</th><th>time</th><th>message</th></tr>"
            f"{rows}</table>{'<ul>' + warns + '</ul>' if warns else ''}{tail}</details>")


def _perf_table(rows: Sequence[MetricComparison]) -> str:
    """Each change in the metric's own terms, better or worse as a word and a colour."""
    out = ["<table><tr><th>cell</th><th>metric</th><th>production</th><th>candidate</th><th>change</th>"
           "<th>95% CI of the change</th><th>tolerance</th><th>outcome</th></tr>"]
    for c in rows:
        k = c.comparison
        low, high = k.value_interval
        ci = f"[{percent(low)}, {percent(high)}]" if math.isfinite(k.low) and math.isfinite(k.high) else "n/a"
        out.append(f"<tr><td><code>{escape(c.cell)}</code></td><td>{escape(c.metric)}</td><td>{k.base_median:.4g} "
                   f"{escape(c.unit)}</td><td>{k.cand_median:.4g} {escape(c.unit)}</td>"
                   f"<td class='{k.word}'>{escape(k.reading())}</td><td>{ci}</td>"
                   f"<td>{f'{k.tolerance:.0%} worse' if c.gated else 'not gated'}</td>"
                   f"<td>{escape(k.outcome.value) if c.gated else '-'}</td></tr>")
    return "".join(out) + "</table>"


def render(report: RunReport) -> str:
    v = report.gate.verdict
    decision = v.decision.value
    h = ["<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
         f"<title>stackgate {escape(report.matrix)}: {escape(decision)}</title><style>{CSS}</style></head><body>",
         f"<h1>stackgate — {escape(report.matrix)}</h1>",
         f"<p><span class='verdict' id='verdict' style='background:{VERDICT[decision]}'>{escape(decision)}</span> "
         f"<span class='muted'>gating verdict {escape(report.gating_verdict)} · run {escape(report.run_id)} · channel "
         f"{escape(report.channel)} · {escape(report.started)} → {escape(report.finished)}</span></p>"]
    reasons = [r for r in v.reasons if r.severity is not Severity.INFO]
    if reasons:
        h.append("<h2>Why</h2><table><tr><th>severity</th><th>cell</th><th>test</th><th>reason</th></tr>")
        h += [f"<tr><td>{escape(r.severity.value)}</td><td><code>{escape(r.cell)}</code></td><td>{escape(r.test)}</td>"
              f"<td>{escape(r.message)}</td></tr>" for r in reasons]
        h.append("</table>")
    known = report.evidence.preexisting
    if known:
        h.append("<h2>Pre-existing failures</h2><p class='muted'>failed in production too: not caused by the upgrade"
                 "</p><table><tr><th>cell</th><th>test</th><th>candidate</th><th>production</th></tr>")
        h += [f"<tr><td><code>{escape(k.cell)}</code></td><td>{escape(k.test)}</td><td>{escape(k.candidate)}</td>"
              f"<td>{escape(k.production)}</td></tr>" for k in known]
        h.append("</table>")
    ev = report.evidence
    if ev.comparisons:
        gated, ungated = performance_rows(ev.comparisons)
        h.append("<h2>Performance</h2>")
        if gated:
            h.append(_perf_table(gated))
        if ungated:
            h.append(f"<details><summary>{len(ungated)} ungated comparison(s): shown, never deciding</summary>"
                     f"{_perf_table(ungated)}</details>")
        drift = [f"<li><code>{escape(k)}</code>: {escape(v['note'])}</li>" for k, v in report.power.items() if "note" in v]
        if drift:
            h.append("<ul>" + "".join(drift) + "</ul>")
    for d in report.diffs:
        h.append(f"<h2>What changed</h2><p class='muted'>{escape(d.production_cell)} → {escape(d.candidate_cell)}</p>"
                 "<table><tr><th></th><th>production</th><th>candidate</th></tr>")
        h += [f"<tr><td>{escape(w)}</td><td>{escape(a)}</td><td>{escape(b)}</td></tr>" for w, a, b in d.facts]
        h.append("</table>")
        if d.packages:
            h.append(f"<details><summary>{len(d.packages)} package(s) differ</summary><table>")
            h += [f"<tr><td>{escape(p.name)}</td><td>{escape(p.production or '-')}</td><td>{escape(p.candidate or '-')}</td>"
                  f"</tr>" for p in d.packages]
            h.append("</table></details>")
    supply = supply_section.markdown(report.evidence.supply, report.vuln_db, blocking_findings(report), str)
    if supply:  # the same text as report.md's section, escaped once here
        h.append("<h2>Supply chain</h2><pre>" + escape("\n".join(supply[2:])) + "</pre>")
    # the matrix grid: one row per pool/topology, production and candidate side by side
    h.append("<h2>Matrix</h2><table class='grid'><tr><th>pool / topology</th><th>production</th><th>candidates</th></tr>")
    groups: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
    for cell, result in report.result_rows():
        status = result.status.value if result else "no-result"
        groups.setdefault(cell.comparison_key, []).append((cell.role.value, cell.id, status))
    for n in report.not_here:
        groups.setdefault(n.cell.comparison_key, []).append((n.cell.role.value, n.cell.id, "not-run-here"))
    for key in sorted(groups):
        def cells_html(role: str, key: tuple[str, str] = key) -> str:
            return "".join(f"<td class='cell' title='{escape(s)}' style='background:{COLOURS.get(s, '#000')}'>"
                           f"{escape(cid)}<br>{escape(s)}</td>" for r, cid, s in groups[key] if r == role)
        h.append(f"<tr><td>{escape(key[0])} {escape(key[1])}</td>{cells_html('production') or '<td></td>'}"
                 f"{cells_html('candidate')}</tr>")
    h.append("</table>")
    plots = _plots(report)
    if plots:
        h.append("<h2>Plots</h2><div class='plots'>" + "".join(plots) + "</div>")
    if ev.new_warnings:
        h.append("<h2>New warnings in the candidate</h2><ul>")
        h += [f"<li><code>{escape(cell)}</code>: {escape(w)}</li>" for cell, ws in ev.new_warnings.items() for w in ws]
        h.append("</ul>")
    info = notes(report)
    if info:
        h.append("<h2>Notes</h2><ul>")
        h += [f"<li><code>{escape(r.cell)}</code>: {escape(r.message)}</li>" for r in info]
        h.append("</ul>")
    h.append("<h2>Cells</h2>")
    for cell, result in report.result_rows():
        if result is not None:
            h.append(_cell_details(cell.id, result))
    for rollback in report.rollbacks:
        h.append(_cell_details(rollback.cell_id, rollback))
    if report.pruned:
        h.append("<h2>Pruned</h2><ul>")
        h += [f"<li><code>{escape(p.cell.id)}</code>: {escape('; '.join(p.reasons))}</li>" for p in report.pruned]
        h.append("</ul>")
    h.append("</body></html>")
    return "\n".join(h)


def write(report: RunReport, path: Path) -> None:
    atomic_write(path, strip_control(render(report)))
