from __future__ import annotations

import datetime as dt
import json
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

from stackgate import conclude, gate, history, selftest
from stackgate.model import ROLLBACK, NotHere, TestOutcome
from stackgate.policy import load_policy
from stackgate.report import html_report, markdown
from stackgate.report.data import RunReport, stack_diffs

ROOT = Path(__file__).resolve().parents[2]
EVIL = "<script>alert(1)</script> | **bold** `x` \x1b[31mred\x1b[0m nul\x00byte"


def _report(fail: bool = False) -> RunReport:
    rec = selftest.recorded("cuda")
    prod, cand = rec.production, rec.candidate
    pres, cres = rec.results[prod.id], rec.candidate_result
    site = "/venv/lib/python3.11/site-packages"
    pres = replace(pres, environment={"torch": "2.13.0", "packages": ["torch==2.13.0", "numpy==2.0"], "mapped_libraries": {
        "libgomp": [{"path": f"{site}/torch/lib/libgomp.so.1", "origin": "env"}],
        "libstdc++": [{"path": "/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.30", "origin": "system"}]}})
    cres = replace(cres, environment={"torch": "2.14.1", "packages": ["torch==2.14.1", "numpy==2.0", "triton==3.8"],
                                      "mapped_libraries": {"libgomp": [{"path": f"/opt/base/lib/libgomp.so.1|{EVIL}",
                                                                        "origin": "outside"}]}},
                   warnings=(f"FutureWarning: {EVIL}",))
    if fail:
        cres = replace(cres, tests=(*cres.tests, TestOutcome(f"test_evil.py::test_{EVIL}", "failed", 1.0, EVIL)))
    results = {prod.id: pres, cand.id: cres, **{k: v for k, v in rec.results.items() if v.phase == ROLLBACK}}
    away = (NotHere(replace(cand, required=False), "pool p4d is not this machine"),)
    outcome = gate.decide((prod, cand), away, results, load_policy(ROOT / "matrix" / "policy.toml"),
                          dt.date(2026, 11, 29))
    return RunReport("run-1", "upgrade-torch", "stable", "t0", "t1", outcome, 1, (prod, cand), results, away, (),
                     stack_diffs((prod, cand), results), {},
                     {"recsys.step_time": [history.TrendPoint("a", "2026-11-27T10:00:00Z", "candidate", 100.0),
                                           history.TrendPoint("a", "2026-11-27T10:00:00Z", "production", 99.0),
                                           history.TrendPoint("run-1", "2026-11-29T10:00:00Z", "candidate", 101.0)]})


def test_all_four_reports_are_written_and_json_follows_its_schema(tmp_path: Path) -> None:
    report = _report()
    conclude.write_reports(report, tmp_path, 0, str(tmp_path / "summary.md"))
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["schema_version"] == 1 and data["verdict"] == "GO" and data["decision"] == "GO"
    assert {c["role"] for c in data["cells"]} == {"production", "candidate"}
    assert data["not_run_here"][0]["reason"] == "pool p4d is not this machine"
    assert data["stack_diff"][0]["facts"][0] == {"what": "torch", "production": "2.13.0", "candidate": "2.14.1"}
    assert {"name": "triton", "production": None, "candidate": "3.8", "kind": "added"} in data["stack_diff"][0]["packages"]
    # what each stack's processes had mapped, with its origin (#43)
    facts = {f["what"]: (f["production"], f["candidate"]) for f in data["stack_diff"][0]["facts"]}
    assert facts["mapped libgomp"] == ("torch/lib/libgomp.so.1 (env)", f"/opt/base/lib/libgomp.so.1|{EVIL} (outside)")
    assert facts["mapped libstdc++"] == ("/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.30 (system)", "-")
    md = (tmp_path / "report.md").read_text()
    assert "| mapped libgomp | torch/lib/libgomp.so.1 (env) |" in md and "<script>" not in md
    assert any(c["gated"] and c["outcome"] == "ok" for c in data["comparisons"])
    assert (tmp_path / "summary.md").read_text().startswith("# stackgate upgrade-torch: GO")


def test_junit_is_valid_and_counts_cells_tests_and_not_run(tmp_path: Path) -> None:
    report = _report(fail=True)
    conclude.write_reports(report, tmp_path, 1, None)
    root = ET.parse(tmp_path / "junit.xml").getroot()
    assert root.tag == "testsuites"
    cases = list(root.iter("testcase"))
    assert int(root.get("tests")) == len(cases)
    assert int(root.get("failures")) == 1
    assert any(c.get("classname") == "not-run-here" for c in cases)
    assert sum(int(s.get("tests")) for s in root.iter("testsuite")) == len(cases)
    rollback = [s for s in root.iter("testsuite") if "@rollback-" in (s.get("name") or "")]
    assert len(rollback) == 1 and int(rollback[0].get("tests")) >= 3  # production read the candidate's artifacts
    assert all(c.get("classname") == rollback[0].get("name") for c in rollback[0].iter("testcase"))


def test_markdown_and_html_escape_everything_quoted(tmp_path: Path) -> None:
    report = _report(fail=True)
    assert report.gate.verdict.decision.value == "NO-GO"
    md = markdown.render(report)
    assert "<script>" not in md and "&lt;script&gt;" in md
    assert "\\| \\*\\*bold\\*\\*" in md  # table cells cannot be broken by quoted text
    page = html_report.render(report)
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    conclude.write_reports(report, tmp_path, 1, None)
    for name in ("report.md", "report.html", "junit.xml"):
        written = (tmp_path / name).read_text()
        assert "\x00" not in written and "\x1b" not in written, name  # control characters never reach a page
    assert "\\u001b[31mred" in (tmp_path / "report.json").read_text()  # escaped, not lost, in JSON
    assert 'id=\'verdict\'' in page and ">NO-GO<" in page
    assert page.count("<svg") >= 3  # busbw is absent here; loss, step-time and trend plots are present


def test_history_persists_and_yields_trends(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite"
    report = _report()
    for i in range(3):
        history.record(db, run_id=f"r{i}", matrix="upgrade-torch", channel="stable", started=f"2026-11-2{i}",
                       finished="", decision="GO", verdict="GO", candidate="2.14.1",
                       results=list(report.results.values()), summary={"passed": 2})
    rows = history.runs(db)
    assert [r.run_id for r in rows] == ["r2", "r1", "r0"]
    trend = history.trends(db, channel="stable", matrix="upgrade-torch")
    assert [p.run_id for p in trend["recsys.step_time"] if p.role == "candidate"] == ["r0", "r1", "r2"]
    assert [p.started for p in trend["recsys.step_time"] if p.role == "production"] == [
        "2026-11-20", "2026-11-21", "2026-11-22"]
    assert history.trends(db, channel="nightly", matrix="upgrade-torch") == {}


def test_trends_keep_to_the_run_definition_and_the_runs_own_metrics(tmp_path: Path) -> None:
    """Issue 24: a user suite's report shows no trend of the bundled suite's metrics from earlier runs
    of the same matrix; runs of its own suite are its trend."""
    db = tmp_path / "h.sqlite"
    report = _report()
    for i in range(2):
        history.record(db, run_id=f"bundled{i}", matrix="upgrade-torch", channel="stable", started=f"2026-11-2{i}",
                       finished="", decision="GO", verdict="GO", candidate="2.14.1",
                       results=list(report.results.values()), summary={}, suite="bundled")
    mine = [replace(r, metrics=()) for r in report.results.values()]  # a plain suite records no metric
    history.record(db, run_id="user0", matrix="upgrade-torch", channel="stable", started="2026-11-25", finished="",
                   decision="GO", verdict="GO", candidate="2.14.1", results=mine, summary={}, suite="/work/mysuite")
    assert history.trends(db, channel="stable", matrix="upgrade-torch", suite="/work/mysuite",
                          current=("user1", "2026-11-26", mine)) == {}
    trend = history.trends(db, channel="stable", matrix="upgrade-torch", suite="bundled",
                           current=("bundled2", "2026-11-26", list(report.results.values())))
    assert [p.run_id for p in trend["recsys.step_time"] if p.role == "candidate"] == ["bundled0", "bundled1",
                                                                                      "bundled2"]


def test_the_stack_diff_shows_a_change_in_the_suites_own_packages() -> None:
    """A suite's local project appears in a venv's freeze as `name @ file:///...whl`: its version comes
    from the wheel's name, so a changed team package is a change in the diff like any other."""
    rec = selftest.recorded("cuda")
    prod, cand = rec.production, rec.candidate
    wheel = "recsys-kit @ file:///root/.cache/stackgate/projects/recsys_kit-{h}/recsys_kit-{v}-py3-none-any.whl"
    results = {prod.id: replace(rec.results[prod.id], environment={
                   "packages": ["torch==2.13.0", "einops==0.8.1", wheel.format(h="a1", v="0.3.0")]}),
               cand.id: replace(rec.candidate_result, environment={
                   "packages": ["torch==2.14.1", "einops==0.8.2", wheel.format(h="b2", v="0.4.0")]})}
    changes = {(p.name, p.production, p.candidate) for p in stack_diffs((prod, cand), results)[0].packages}
    assert changes == {("torch", "2.13.0", "2.14.1"), ("einops", "0.8.1", "0.8.2"), ("recsys-kit", "0.3.0", "0.4.0")}
