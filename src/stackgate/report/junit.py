"""junit.xml: a testsuite per cell, a testcase per cell x test; not-run and pruned cells appear as
skipped testcases so nothing silently disappears. The gated performance comparisons are a testsuite
of their own, read as the other reports read them (the metric's own terms: ratio, percent change of
the value, better or worse), regressions first."""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from stackgate.model import CellResult, Status
from stackgate.report.data import RunReport, performance_rows
from stackgate.report.files import atomic_write
from stackgate.stats import Outcome

_INVALID_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _clean(text: str) -> str:
    return _INVALID_XML.sub("?", text)


def _suite(root: ET.Element, name: str, result: CellResult | None, totals: dict[str, int]) -> None:
    """One testsuite per cell result (a main run, or a rollback against one candidate)."""
    suite = ET.SubElement(root, "testsuite", name=name)
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if result is not None and result.status is Status.SKIPPED and not result.tests:
        case = ET.SubElement(suite, "testcase", classname=name, name="cell", time="0")
        ET.SubElement(case, "skipped", message=_clean(result.reason))
        counts["tests"] += 1
        counts["skipped"] += 1
    elif result is None or not result.tests:
        case = ET.SubElement(suite, "testcase", classname=name, name="cell", time="0")
        status = result.status.value if result else "no-result"
        el = ET.SubElement(case, "error", message=_clean(f"{status}: {result.reason if result else ''}"))
        el.text = _clean(result.log_tail[-5000:] if result else "")
        counts["tests"] += 1
        counts["errors"] += 1
    else:
        for t in result.tests:
            case = ET.SubElement(suite, "testcase", classname=name, name=_clean(t.name), time=f"{t.duration_s:.3f}")
            counts["tests"] += 1
            if t.outcome == "failed":
                el = ET.SubElement(case, "failure", message=_clean(t.message.splitlines()[0] if t.message else "failed"))
                el.text = _clean(t.message)
                counts["failures"] += 1
            elif t.outcome == "error":
                el = ET.SubElement(case, "error", message=_clean(t.message.splitlines()[0] if t.message else "error"))
                el.text = _clean(t.message)
                counts["errors"] += 1
            elif t.outcome == "skipped":
                ET.SubElement(case, "skipped", message=_clean(t.message))
                counts["skipped"] += 1
        if result.status.value not in ("passed", "failed"):
            case = ET.SubElement(suite, "testcase", classname=name, name="cell-status", time="0")
            ET.SubElement(case, "error", message=_clean(f"{result.status.value}: {result.reason}"))
            counts["tests"] += 1
            counts["errors"] += 1
    for k, n in counts.items():
        suite.set(k, str(n))
        totals[k] += n
    suite.set("time", f"{result.duration_s:.3f}" if result else "0")


def _performance(root: ET.Element, report: RunReport, totals: dict[str, int]) -> None:
    """A testcase per gated comparison: a regression fails, an undecided one is skipped with its reason,
    the rest pass; each carries its reading as properties. Ungated ones decide nothing: counted only."""
    gated, ungated = performance_rows(report.evidence.comparisons)
    if not gated:
        return
    suite = ET.SubElement(root, "testsuite", name="performance", time="0")
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", name="ungated-comparisons", value=f"{len(ungated)} (report.md lists them)")
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for c in gated:
        k = c.comparison
        case = ET.SubElement(suite, "testcase", classname=f"performance.{c.cell}", name=_clean(c.metric), time="0")
        fields = {"production": f"{k.base_median:.4g} {c.unit}".strip(), "candidate": f"{k.cand_median:.4g} {c.unit}".strip(),
                  "ratio": f"{k.ratio:.4g}", "change": f"{k.value_change():+.4f}", "reading": k.reading(),
                  "tolerance": f"{k.tolerance:.0%} worse", "outcome": k.outcome.value}
        case_props = ET.SubElement(case, "properties")
        for name, value in fields.items():
            ET.SubElement(case_props, "property", name=name, value=_clean(value))
        text = _clean(f"{c.metric}: {k.describe(c.unit)}")
        counts["tests"] += 1
        if k.outcome is Outcome.REGRESSION:
            ET.SubElement(case, "failure", message=text)
            counts["failures"] += 1
        elif k.outcome is Outcome.INCONCLUSIVE:
            ET.SubElement(case, "skipped", message=f"inconclusive: {text}")
            counts["skipped"] += 1
        else:
            ET.SubElement(case, "system-out").text = text
    for name, n in counts.items():
        suite.set(name, str(n))
        totals[name] += n


def render(report: RunReport) -> ET.ElementTree:
    root = ET.Element("testsuites", name=f"stackgate {report.matrix}")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for cell, result in report.result_rows():
        _suite(root, cell.id, result, totals)
    for rollback in report.rollbacks:  # production reading each candidate's artifacts
        _suite(root, rollback.cell_id, rollback, totals)
    _performance(root, report, totals)
    known = [(f"{k.cell} {k.test}", f"pre-existing failure (fails in production too): candidate {k.candidate}; "
                                     f"production {k.production}") for k in report.evidence.preexisting]
    harness = [(f"{r.cell} {r.test}", r.message) for r in report.gate.verdict.reasons if r.kind == "harness-failure"]
    for group, items in (("preexisting-failures", known), ("harness-failures", harness),
                         ("not-run-here", [(n.cell.id, n.reason) for n in report.not_here]),
                         ("pruned", [(p.cell.id, "; ".join(p.reasons)) for p in report.pruned])):
        if not items:
            continue
        suite = ET.SubElement(root, "testsuite", name=group, tests=str(len(items)), skipped=str(len(items)),
                              failures="0", errors="0", time="0")
        for cell_id, reason in items:
            case = ET.SubElement(suite, "testcase", classname=group, name=cell_id, time="0")
            ET.SubElement(case, "skipped", message=_clean(reason))
        totals["tests"] += len(items)
        totals["skipped"] += len(items)
    for k, n in totals.items():
        root.set(k, str(n))
    return ET.ElementTree(root)


def write(report: RunReport, path: Path) -> None:
    tree = render(report)
    ET.indent(tree)
    buffer = io.BytesIO()
    tree.write(buffer, encoding="utf-8", xml_declaration=True)
    atomic_write(path, buffer.getvalue())
