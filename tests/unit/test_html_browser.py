"""The HTML report rendered by a real headless Chromium (Debian's chromium package)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from stackgate.report import html_report

from .test_reports import _report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.mark.browser
def test_report_renders_in_headless_chromium_with_verdict_and_plots(tmp_path: Path) -> None:
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install Debian's chromium for the browser test")
        pytest.skip("chromium not installed (apt-get install chromium)")
    page = tmp_path / "report.html"
    html_report.write(_report(fail=True), page)
    profile = tmp_path / "profile"
    proc = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    assert "<span class=\"verdict\" id=\"verdict\"" in dom and ">NO-GO</span>" in dom
    assert dom.count("<svg") >= 3 and "polyline" in dom
    assert "<script>alert(1)</script>" not in dom  # quoted text stayed text
    shot = tmp_path / "report.png"
    subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--window-size=1200,1600",
                    f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120, check=False)
    assert shot.exists() and shot.stat().st_size > 10_000
