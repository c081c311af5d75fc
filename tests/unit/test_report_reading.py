"""Issue 24: every change is stated in the metric's own terms (the algbw example of the issue: 0.2194
-> 1.611 GB/s reads +634%, better), and the performance tables put what decides first."""

from __future__ import annotations

from pathlib import Path

from stackgate import stats
from stackgate.evidence import MetricComparison
from stackgate.report import html_report, markdown
from stackgate.report.data import performance_rows


def _cmp(metric: str, base: float, cand: float, better: str, gated: bool = False) -> MetricComparison:
    found = stats.compare([base] * 5, [cand] * 5, better=better, tolerance=0.10)
    return MetricComparison("local-cpu", "prod-local-cpu", metric, "GB/s" if better == "higher" else "ms", "cpu",
                            found, gated)


def test_a_faster_bandwidth_reads_as_its_own_growth_and_better() -> None:
    faster = _cmp("algbw[size=1048576]", 0.2194, 1.611, "higher").comparison
    assert faster.reading() == "x7.34, +634% (better)"
    assert "0.2194 GB/s -> 1.611 GB/s (x7.34, +634% (better)" in faster.describe("GB/s")
    slower = _cmp("algbw[size=1024]", 0.00017, 0.000026, "higher").comparison
    assert slower.reading() == "x0.153, -84.7% (worse)"  # the gate's +553% "worse is positive" never shows
    assert "553" not in slower.describe("GB/s") and "worse-is-positive" not in slower.describe("GB/s")
    time = _cmp("recsys.step_time", 10.0, 12.0, "lower").comparison
    assert time.reading() == "x1.2, +20.0% (worse)"


def test_gated_rows_come_first_with_regressions_on_top_and_ungated_ones_are_collapsed() -> None:
    rows = [_cmp("algbw[size=1024]", 0.00017, 0.000026, "higher"), _cmp("vit.step_time", 10.0, 10.1, "lower", True),
            _cmp("recsys.step_time", 10.0, 20.0, "lower", True), _cmp("algbw[size=1048576]", 0.2194, 1.611, "higher")]
    gated, ungated = performance_rows(rows)
    assert [c.metric for c in gated] == ["recsys.step_time", "vit.step_time"]  # the regression first
    assert [c.metric for c in ungated] == ["algbw[size=1048576]", "algbw[size=1024]"]  # largest change first
    md_row = markdown._perf_row(ungated[0])
    assert "x7.34, +634% (better)" in md_row and "not gated" in md_row and "improvement" not in md_row
    table = html_report._perf_table(ungated)
    assert "<td class='better'>x7.34, +634% (better)</td>" in table
    assert "<td class='worse'>x0.153, -84.7% (worse)</td>" in table


def test_the_console_reads_changes_the_same_way() -> None:
    from stackgate import conclude
    from stackgate.evidence import Evidence, GateOutcome
    from stackgate.model import Decision, Verdict
    rows = (_cmp("recsys.step_time", 10.0, 10.2, "lower", True), _cmp("algbw[size=1048576]", 0.2194, 1.611, "higher"))
    lines = conclude.performance_lines(GateOutcome(Verdict(Decision.GO, ()), Evidence(rows)))
    assert lines[0] == "performance: local-cpu recsys.step_time: 10 -> 10.2 ms (x1.02, +2.0% (worse); ok)"
    assert lines[1] == "not gated: local-cpu algbw[size=1048576]: 0.2194 -> 1.611 GB/s (x7.34, +634% (better))"


def test_the_reports_open_with_what_decides() -> None:
    from .test_reports import _report
    report = _report(fail=True)
    text = markdown.render(report)
    assert text.index("## Why") < text.index("## Performance") < text.index("## What changed") < text.index("## Matrix")
    page = html_report.render(report)
    assert page.index("<h2>Why</h2>") < page.index("<h2>Performance</h2>") < page.index("<h2>Plots</h2>")


def test_junit_carries_the_gated_comparisons_in_the_same_terms(tmp_path: Path) -> None:
    import dataclasses
    import xml.etree.ElementTree as ET

    from stackgate.report import junit

    from .test_reports import _report
    report = _report()
    rows = (_cmp("vit.step_time", 10.0, 10.1, "lower", True), _cmp("recsys.step_time", 10.0, 20.0, "lower", True),
            _cmp("algbw[size=1048576]", 0.2194, 1.611, "higher"))
    gate = dataclasses.replace(report.gate, evidence=dataclasses.replace(report.evidence, comparisons=rows))
    report = dataclasses.replace(report, gate=gate)
    junit.write(report, tmp_path / "junit.xml")
    root = ET.parse(tmp_path / "junit.xml").getroot()
    [suite] = [s for s in root.iter("testsuite") if s.get("name") == "performance"]
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["recsys.step_time", "vit.step_time"]  # gated only, regression first
    assert suite.get("tests") == "2" and suite.get("failures") == "1"
    failure = cases[0].find("failure")
    assert failure is not None and "x2, +100% (worse)" in failure.get("message", "")
    props = {p.get("name"): p.get("value") for p in cases[0].iter("property")}
    assert props["reading"] == "x2, +100% (worse)" and props["outcome"] == "regression" and props["ratio"] == "2"
    assert cases[1].find("failure") is None and "x1.01, +1.0% (worse)" in (cases[1].findtext("system-out") or "")
    assert {p.get("name"): p.get("value") for p in suite.find("properties")}["ungated-comparisons"].startswith("1 ")
    assert int(root.get("tests")) == len(list(root.iter("testcase")))  # the totals count the new testcases


def test_tick_labels_keep_the_digits_that_tell_them_apart() -> None:
    from stackgate.report.plots import distinct_digits
    assert [f"{t:.{distinct_digits([265.6, 265.8, 266.0, 266.2])}g}" for t in (265.6, 265.8)] == ["265.6", "265.8"]
    assert f"{5480:.{distinct_digits([5460, 5480, 5500])}g}" == "5480"  # no 5.48e+03 below a million
    assert distinct_digits([0.09, 0.105, 0.12]) == 3 and distinct_digits([1e7, 2e7]) == 3


def test_trend_dates_never_repeat_a_tick_label() -> None:
    """A first run (one date), runs hours apart, runs a day and a half apart (hour ticks would read
    "12:00" twice), a week: every x tick label of the trend says a different time."""
    import re
    import warnings

    from stackgate.report import plots
    now = plots.timestamp("2026-12-02T04:01:37Z")
    for span_h in (0, 8, 20, 24, 36, 48, 150):
        series = [plots.Series("production", [(now - span_h * 3600, 1.0), (now, 1.1)])]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # matplotlib warns when its date locator finds no interval
            svg = plots.line("t", series, xlabel="run date (UTC)", ylabel="median", x_dates=True, current=now)
        ticks = [re.search(r"<text[^>]*>([^<]*)</text>", chunk).group(1)  # type: ignore[union-attr]
                 for chunk in svg.split('<g id="xtick_')[1:]]
        assert len(ticks) >= 2 and len(set(ticks)) == len(ticks), (span_h, ticks)
