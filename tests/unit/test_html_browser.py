"""The HTML report rendered by a real headless Chromium (Debian's chromium package). Issue 24's
acceptance: the README main command's recorded report (the selftest's recording: both stacks' real
metrics), checked from the DOM as Chromium laid it out (a measuring script is appended to a copy of the
page; the report itself carries no script): every plot has tick labels on both axes that do not overlap, no
text leaves its plot, and trend plots show only metrics the run's own suite recorded."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from stackgate import gate, history, selftest, shipped
from stackgate.boundary.results import from_json as result_from_json
from stackgate.model import MAIN, Role
from stackgate.policy import load_policy
from stackgate.report import html_report
from stackgate.report.data import RunReport, stack_diffs

from .test_reports import _report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
MEASURE = """<script>
window.addEventListener('load', () => {
  const out = [];
  for (const fig of document.querySelectorAll('figure.plot')) {
    const svg = fig.querySelector('svg'), box = svg.getBoundingClientRect();
    const texts = [...svg.querySelectorAll('text')];
    const outside = texts.filter(t => { const r = t.getBoundingClientRect();
      return r.left < box.left - 0.5 || r.right > box.right + 0.5 || r.top < box.top - 0.5 || r.bottom > box.bottom + 0.5; });
    const labels = axis => [...svg.querySelectorAll(`g[id^="${axis}tick_"] text`)];
    const ticks = axis => labels(axis).map(t => t.textContent);
    const overlap = axis => { const r = labels(axis).map(t => t.getBoundingClientRect()); const bad = [];
      for (let i = 0; i < r.length; i++) for (let j = i + 1; j < r.length; j++)
        if (r[i].left < r[j].right && r[j].left < r[i].right && r[i].top < r[j].bottom && r[j].top < r[i].bottom)
          bad.push(labels(axis)[i].textContent + '/' + labels(axis)[j].textContent);
      return bad; };
    out.push({titles: texts.map(t => t.textContent), x: ticks('x'), y: ticks('y'),
              outside: outside.map(t => t.textContent), overlapping: [...overlap('x'), ...overlap('y')]});
  }
  const pre = document.createElement('pre'); pre.id = 'measured'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def _chromium() -> str:
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install Debian's chromium for the browser test")
        pytest.skip("chromium not installed (apt-get install chromium)")
    return CHROMIUM


def _dom(page: Path, tmp_path: Path) -> str:
    proc = subprocess.run([_chromium(), *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000",
                           "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def _readme_report(tmp_path: Path, earlier: bool = True) -> RunReport:
    """The README main command's recorded run (production 2.13.0+cpu, candidate 2.14.1 on the CPU pool)
    with a history: an earlier run of the same definition, and one of a user's suite on the same matrix;
    or, `earlier` False, the first run of a fresh clone (each trend has one date)."""
    rec = selftest.recorded("cpu")
    rows = [result_from_json(json.loads(line)) for line in
            shipped.resource("selftest", "recorded-cpu.jsonl").read_text().splitlines() if line.strip()]
    raw = {r.role: r for r in rows if r.phase == MAIN}
    results = {rec.production.id: dataclasses.replace(raw[Role.PRODUCTION], cell_id=rec.production.id),
               rec.candidate.id: dataclasses.replace(raw[Role.CANDIDATE], cell_id=rec.candidate.id)}
    cells = (rec.production, rec.candidate)
    outcome = gate.decide(cells, (), results, load_policy(shipped.MATRIX_DIR / "policy.toml"), dt.date(2026, 12, 1))
    db = tmp_path / "history.sqlite"
    before = (("earlier", "2026-11-28T09:00:00Z", "bundled", None),
              ("user", "2026-11-30T09:00:00Z", "/home/me/suite", "other"))
    for run_id, started, suite, metrics in before if earlier else ():
        mine = [dataclasses.replace(r, metrics=tuple(dataclasses.replace(m, name=f"{metrics}.step_time")
                                                     for m in r.metrics) if metrics else r.metrics)
                for r in results.values()]
        history.record(db, run_id=run_id, matrix="upgrade-torch", channel="stable", started=started, finished="",
                       decision="GO", verdict="GO", candidate="2.14.1", results=mine, summary={}, suite=suite)
    trends = history.trends(db, channel="stable", matrix="upgrade-torch", suite="bundled",
                            current=("now", "2026-12-01T09:00:00Z", list(results.values())))
    return RunReport("now", "upgrade-torch", "stable", "2026-12-01T09:00:00Z", "2026-12-01T09:04:00Z", outcome, 1,
                     cells, results, (), (), stack_diffs(cells, results), {}, trends)


@pytest.mark.browser
@pytest.mark.parametrize("earlier", [True, False], ids=["with-history", "first-run"])
def test_every_plot_has_ticks_on_both_axes_keeps_its_text_and_trends_its_own_metrics(tmp_path: Path,
                                                                                     earlier: bool) -> None:
    report = _readme_report(tmp_path, earlier)
    page = tmp_path / "report.html"
    html_report.write(report, page)
    measured_page = tmp_path / "measured.html"
    measured_page.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    dom = _dom(measured_page, tmp_path)
    found = re.search(r'<pre id="measured">(.*?)</pre>', dom, re.S)
    assert found, dom[-2000:]
    figures = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<")
                         .replace("&gt;", ">"))
    assert len(figures) >= 6, [f["titles"][:3] for f in figures]
    for fig in figures:
        assert len(fig["x"]) >= 2 and len(fig["y"]) >= 2, fig  # tick labels on both axes
        assert not fig["outside"], fig  # no text overflows its plot box
        assert not fig["overlapping"], fig  # no two tick labels of an axis on top of each other
        assert len(set(fig["x"])) == len(fig["x"]) and len(set(fig["y"])) == len(fig["y"]), fig  # each tick says where it is (a first run's one date
        # once drew five "01-01" ticks: matplotlib widens a single date to +-2 years)
    busbw = [f for f in figures if any("bus bandwidth by message size" in t for t in f["titles"])]
    assert busbw and all(x.endswith(("B", "KiB", "MiB", "GiB")) for f in busbw for x in f["x"]), busbw
    trends = [f for f in figures if any(t.startswith("trend: ") for t in f["titles"])]
    recorded = {m.key for r in report.results.values() for m in r.metrics}
    shown = {t[len("trend: "):] for f in trends for t in f["titles"] if t.startswith("trend: ")}
    assert shown and shown <= recorded and not any(s.startswith("other.") for s in shown), shown
    assert all("this run" in f["titles"] and {"production", "candidate"} <= set(f["titles"]) for f in trends)
    assert all(any("Dec 01" in x or "2026-12-01" in x for x in f["x"] + f["titles"]) for f in trends), trends
    shot = tmp_path / "report.png"
    subprocess.run([_chromium(), *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,1600",
                    f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120, check=False)
    assert shot.exists() and shot.stat().st_size > 10_000


@pytest.mark.browser
def test_quoted_text_stays_text_in_the_browser(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    html_report.write(_report(fail=True), page)
    dom = _dom(page, tmp_path)
    assert "<span class=\"verdict\" id=\"verdict\"" in dom and ">NO-GO</span>" in dom
    assert "<script>alert(1)</script>" not in dom  # quoted text stayed text
