"""Issue 13's acceptance through the real CLI, on TEST WHEELS (tests/torch/nightly_wheels.py: the
local torch 2.13.0+cpu wheel repacked as 2.15.0.devYYYYMMDD+cpu builds with a made-up commit per
date; no real nightly can be reached from here). Dates are counted back from today, so the age
guard means the same thing whenever this runs. The suite (tests/data/nightly/suite) has a test that
fails from a planted date on."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.torch.nightly_wheels import SOURCE, build_nightlies, companion, git_version

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "nightly"
TODAY = dt.datetime.now(dt.timezone.utc).date()
TEST = "test_nightly_feature.py::test_feature_that_regresses"


def day(days_ago: int) -> str:
    return (TODAY - dt.timedelta(days=days_ago)).strftime("%Y%m%d")


@pytest.fixture(scope="module", autouse=True)
def own_caches(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The test wheels are made anew for every session (new paths, new hashes), so each session's
    environments and uv's copies of the wheels are new too: they live in this module's own caches and
    go when it ends, instead of piling up in the user's (~1 GB per dated environment)."""
    home = tmp_path_factory.mktemp("nightly-caches")
    saved = {k: os.environ.get(k) for k in ("STACKGATE_CACHE_DIR", "UV_CACHE_DIR")}
    os.environ.update(STACKGATE_CACHE_DIR=str(home / "stackgate"), UV_CACHE_DIR=str(home / "uv"))
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Nine dates (9 .. 1 days ago); the fifth has only a cu130 build, so 8 dates have +cpu wheels."""
    if not SOURCE.is_file():  # the machine's local CPU build (../shared/environment.md)
        message = f"the torch wheel the test nightlies are repacked from is missing: {SOURCE}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    home = tmp_path_factory.mktemp("nightlies")
    dates = [day(k) for k in range(9, 0, -1)]
    build_nightlies(home, [d for i, d in enumerate(dates) if i != 4])
    build_nightlies(home, [dates[4]], variant="cu130")
    return home


def stackgate(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stackgate", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=1800, check=False)


def nightly_run(cwd: Path, wheels: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return stackgate(cwd, "run", "--backend", "venv", "--matrix", str(DATA / "nightly-cpu.toml"), "--find-links",
                     str(wheels), "--suite", str(DATA / "suite"), "--no-platform-checks", "--no-rollback", *args)


def ctrl_c_reaches_it() -> None:
    """A shell that starts a job in the background without job control (`cmd &` in a CI script) makes
    it ignore SIGINT, and children inherit that: Python then installs no KeyboardInterrupt handler.
    A user's Ctrl-C reaches a stackgate started from a terminal, so the test starts it that way."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_bisect_finds_the_planted_first_bad_date_and_the_commit_range(wheels: Path, tmp_path: Path) -> None:
    planted = day(4)  # 8 dates with +cpu wheels between the ends; the regression starts 4 days ago
    common = ("--backend", "venv", "--matrix", str(DATA / "nightly-cpu.toml"), "--find-links", str(wheels),
              "--suite", str(DATA / "suite"), "--suite-env", f"PLANTED_REGRESSION={planted}", "--test", TEST)
    seen = []
    with subprocess.Popen([sys.executable, "-m", "stackgate", "bisect", "--good", f"2.15.0.dev{day(9)}", "--bad",
                           f"2.15.0.dev{day(1)}", *common, "--run-id", "b"], cwd=tmp_path, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True,
                          preexec_fn=ctrl_c_reaches_it) as first:  # noqa: PLW1509 - one signal call, no locks
        assert first.stdout is not None
        for line in first.stdout:  # interrupted (Ctrl-C) as its third step starts
            seen.append(line)
            if line.startswith("== bisect step 3:") and "(run " in line:
                first.send_signal(signal.SIGINT)
        assert first.wait(timeout=600) == 130, "".join(seen[-40:])
    assert "continue with `stackgate bisect --resume b`" in "".join(seen)
    assert len(json.loads((tmp_path / "reports" / "b" / "bisect.json").read_text())["steps"]) == 2

    proc = stackgate(tmp_path, "bisect", "--resume", "b", *common)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "bisect b: continuing after 2 step(s)" in proc.stdout
    state = json.loads((tmp_path / "reports" / "b" / "bisect.json").read_text())
    assert len(state["candidates"]) == 8 and state["without_wheels"] == [f"2.15.0.dev{day(5)}"]
    assert state["result"]["first_bad"] == f"2.15.0.dev{planted}"
    assert state["result"]["last_good"] == f"2.15.0.dev{day(5 + 1)}"  # day(5) has no +cpu wheel: skipped
    steps = state["steps"]
    assert [s["version"] for s in steps[:2]] == [f"2.15.0.dev{day(9)}", f"2.15.0.dev{day(1)}"]  # the two ends
    assert len(steps) - 2 <= 3, steps
    commits = state["result"]["commits"]
    assert commits == {f"2.15.0.dev{day(6)}": git_version(day(6)), f"2.15.0.dev{planted}": git_version(planted)}
    assert f"commit range: {git_version(day(6))}..{git_version(planted)}" in proc.stdout
    report = (tmp_path / "reports" / "b" / "bisect.md").read_text()
    assert f"**First bad:** `2.15.0.dev{planted}`" in report and "(skipped)" in report



def test_a_stale_nightly_is_inconclusive_with_the_reason(wheels: Path, tmp_path: Path) -> None:
    stale = tmp_path / "stale"
    stale.mkdir()
    shutil.copy(next(wheels.glob(f"torch-2.15.0.dev{day(9)}+cpu-*.whl")), stale)  # the newest there: 9 days old
    proc = nightly_run(tmp_path, stale, "--run-id", "stale")
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert f"nightly 2.15.0.dev{day(9)} is 9 days old" in proc.stdout and "the limit is 3 days" in proc.stdout
    report = json.loads((tmp_path / "reports" / "stale" / "report.json").read_text())
    assert report["decision"] == "INCONCLUSIVE"
    (cand,) = [c for c in report["cells"] if c["role"] == "candidate"]
    assert cand["status"] == "no-build" and "9 days old" in cand["reason"]


def test_a_date_missing_the_cells_variant_is_no_build(wheels: Path, tmp_path: Path) -> None:
    proc = nightly_run(tmp_path, wheels, "--nightly-version", f"2.15.0.dev{day(5)}", "--nightly-max-age", "30",
                       "--run-id", "novariant")
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "reports" / "novariant" / "report.json").read_text())
    (cand,) = [c for c in report["cells"] if c["role"] == "candidate"]
    assert cand["status"] == "no-build"
    assert f"no torch 2.15.0.dev{day(5)} wheel for cpu" in cand["reason"] and "that date has: cu130" in cand["reason"]


def test_a_companion_built_for_another_date_is_no_build(wheels: Path, tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    shutil.copy(next(wheels.glob(f"torch-2.15.0.dev{day(1)}+cpu-*.whl")), source)
    companion(source, "torchvision", f"0.30.0.dev{day(2)}", f"2.15.0.dev{day(2)}")  # made for yesterday's torch
    suite = tmp_path / "suite"
    shutil.copytree(DATA / "suite", suite)
    (suite / "requirements.txt").write_text("torchvision\n")
    proc = stackgate(tmp_path, "run", "--backend", "venv", "--matrix", str(DATA / "nightly-cpu.toml"), "--find-links",
                     str(source), "--suite", "suite", "--no-platform-checks", "--no-rollback", "--run-id", "comp")
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "reports" / "comp" / "report.json").read_text())
    (cand,) = [c for c in report["cells"] if c["role"] == "candidate"]
    assert cand["status"] == "no-build"
    assert f"torchvision: no build for torch 2.15.0.dev{day(1)}" in cand["reason"]
    assert f"0.30.0.dev{day(2)}" in cand["reason"]


def test_last_green_after_a_green_and_a_red_nightly(wheels: Path, tmp_path: Path) -> None:
    planted = day(1)
    green = nightly_run(tmp_path, wheels, "--nightly-version", f"2.15.0.dev{day(2)}", "--suite-env",
                        f"PLANTED_REGRESSION={planted}", "--run-id", "green")
    assert green.returncode == 0, green.stdout[-3000:] + green.stderr[-2000:]
    red = nightly_run(tmp_path, wheels, "--suite-env", f"PLANTED_REGRESSION={planted}", "--run-id", "red")
    assert red.returncode == 1, red.stdout[-3000:] + red.stderr[-2000:]
    assert f"2.15.0.dev{planted}" in red.stdout  # `nightly` resolved to the newest date
    shown = stackgate(tmp_path, "history", "--last-green", "--matrix", "nightly-cpu")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert shown.stdout.splitlines()[0] == f"2.15.0.dev{day(2)}"  # the first line, for a pipeline to pin
    assert f"first red after it: 2.15.0.dev{planted} (run red" in shown.stdout
    report = (tmp_path / "reports" / "red" / "report.md").read_text()
    assert f"last green nightly: 2.15.0.dev{day(2)} (run green)" in report
    assert f"first red nightly after it: 2.15.0.dev{planted} (run red)" in report

    # a matrix that falls back: the newest nightly fails a guard (too old for --nightly-max-age 0),
    # so the last green one runs instead
    fallback = tmp_path / "nightly-fallback.toml"
    fallback.write_text((DATA / "nightly-cpu.toml").read_text().replace('required = ["local-*"]',
                                                                         'required = ["local-*"]\nfallback = "last-green"'))
    again = stackgate(tmp_path, "run", "--backend", "venv", "--matrix", str(fallback), "--find-links", str(wheels),
                      "--suite", str(DATA / "suite"), "--no-platform-checks", "--no-rollback", "--nightly-max-age", "0",
                      "--suite-env", f"PLANTED_REGRESSION={planted}", "--run-id", "fallback")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
    assert f"falls back to the last green nightly, 2.15.0.dev{day(2)}" in again.stdout
    ran = json.loads((tmp_path / "reports" / "fallback" / "report.json").read_text())
    assert {c["stack"]["torch"] for c in ran["cells"] if c["role"] == "candidate"} == {f"2.15.0.dev{day(2)}"}
