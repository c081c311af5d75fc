"""`stackgate bisect`: the first bad nightly between a good and a bad one, by binary search over the
dates that have wheels for the selected cells. Each step is a real `stackgate run` of just those
cells (and, with `--test`, just those tests) with `--nightly-version <date>`, reusing environments
from the cache. The state is written after every step (`reports/<bisect-id>/bisect.json`), so an
interrupted bisect continues with `--resume <bisect-id>`; `bisect.md` reports every step and ends
with the first bad date, the last good one and the commit range between them (each wheel's
`torch.version.git_version`, read from the wheel itself).

A step that gives neither GO nor NO-GO (an infrastructure error, a guard) is skipped, like
`git bisect skip`: the search goes on without that date, and the report says so.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from packaging.version import Version

from stackgate import fleet, matrix, nightly
from stackgate.boundary import report as report_json
from stackgate.boundary.probe import BisectState, read_bisect
from stackgate.compat import CompatTable
from stackgate.console import stdout_line
from stackgate.errors import ConfigError, ExitCode
from stackgate.model import MAIN, Cell, CellResult, Role
from stackgate.options import Options
from stackgate.report.files import atomic_write, strip_control
from stackgate.rundir import RunDir, results
from stackgate.versions import parse_torch

STATE = "bisect.json"
GOOD, BAD, SKIP = "good", "bad", "skip"


@dataclass
class Step:
    version: str
    run_id: str
    outcome: str  # good | bad | skip
    exit_code: int
    git_version: str = ""


@dataclass
class Bisect:
    bisect_id: str
    good: str
    bad: str
    candidates: list[str]  # dates with wheels for the selected cells, oldest first (both ends included)
    without_wheels: list[str] = field(default_factory=list)  # dates in the range with none: skipped
    steps: list[Step] = field(default_factory=list)
    only: list[str] = field(default_factory=list)
    tests: list[str] = field(default_factory=list)

    def outcome(self, version: str) -> str | None:
        found = [s.outcome for s in self.steps if s.version == version]
        return found[-1] if found else None

    def to_json(self) -> dict[str, Any]:
        return {"bisect_id": self.bisect_id, "good": self.good, "bad": self.bad, "candidates": self.candidates,
                "without_wheels": self.without_wheels, "only": self.only, "tests": self.tests,
                "steps": [s.__dict__ for s in self.steps]}

    @staticmethod
    def of(found: BisectState) -> Bisect:
        """bisect.json as read (`boundary.probe.BisectState`)."""
        return Bisect(found.bisect_id, found.good, found.bad, list(found.candidates), list(found.without_wheels),
                      [Step(s.version, s.run_id, s.outcome, s.exit_code, s.git_version) for s in found.steps],
                      list(found.only), list(found.tests))


def next_version(state: Bisect) -> str | None:
    """The next date to run: both ends first, then the middle of what is still open between the
    newest good and the oldest bad; None when the first bad date is found (or cannot be)."""
    for end in (state.good, state.bad):
        if state.outcome(end) is None:
            return end
    low, high = bounds(state)
    if low is None or high is None:
        return None
    open_ = [v for v in state.candidates[state.candidates.index(low) + 1:state.candidates.index(high)]
             if state.outcome(v) is None]
    return open_[len(open_) // 2] if open_ else None


def bounds(state: Bisect) -> tuple[str | None, str | None]:
    """The newest good date before the oldest bad one, and that bad one."""
    bad = [v for v in state.candidates if state.outcome(v) == BAD]
    if not bad:
        return None, None
    high = bad[0]
    good = [v for v in state.candidates[:state.candidates.index(high)] if state.outcome(v) == GOOD]
    return (good[-1] if good else None), high


def step_outcome(code: int, found: Iterable[CellResult], decision: str = "") -> str:
    """good: GO; bad: NO-GO (the gate's decision, not the exit code: INCONCLUSIVE exits 1 too) because
    a candidate's tests failed, which the run confirmed by rerunning them (a failure that a rerun does
    not repeat is flaky: INCONCLUSIVE); anything else (a build that failed, a guard, an infrastructure
    error, INCONCLUSIVE) says nothing about the regression: skip."""
    candidates = [r for r in found if r.role is Role.CANDIDATE and r.phase == MAIN]
    if code == int(ExitCode.GO):
        return GOOD
    if (code == int(ExitCode.NO_GO) and decision in ("", "NO-GO") and candidates
            and all(r.status.ran_suite for r in candidates)):
        return BAD
    return SKIP


def _decision(run_dir: Path) -> str:
    """The gate's decision of a finished step ("" when it wrote no readable report: the step is skipped)."""
    try:
        return report_json.read(run_dir).decision
    except ConfigError:
        return ""


def selected(opts: Options, env: Mapping[str, str], version: str,
             only: Sequence[str]) -> tuple[CompatTable, list[Cell], list[nightly.Wheel]]:
    """The nightly cells `stackgate run --only ...` would run here, and the torch wheels their source offers."""
    from stackgate import inputs
    loaded = inputs.load(replace(opts, nightly_version=version), env, fleet.detect_local())
    cells = [c for c in matrix.select(inputs.expand(loaded), list(only), None).cells
             if nightly.build_date(c.stack.torch)]
    if not cells:
        raise ConfigError("no nightly cell of the matrix runs here" + (f" with --only {' '.join(only)}" if only else ""),
                          hint="check --only and the matrix (its torch axis must be \"nightly\")")
    return loaded.table, cells, nightly.wheels(cells[0].stack.source, loaded.host_pip)


def plan(opts: Options, env: Mapping[str, str], good: str, bad: str, bisect_id: str) -> Bisect:
    """The dates between `good` and `bad` that have a wheel for every selected cell (cells as
    `stackgate run` would select them); the others are kept to be reported."""
    lo, hi = parse_torch(good, what="--good"), parse_torch(bad, what="--bad")
    lo_date, hi_date = nightly.build_date(lo), nightly.build_date(hi)
    if lo_date is None or hi_date is None:
        raise ConfigError(f"--good {good} / --bad {bad}: both must be nightly builds (X.Y.Z.devYYYYMMDD)")
    if lo_date >= hi_date:
        raise ConfigError(f"--good {good} must be older than --bad {bad}")
    table, cells, found = selected(opts, env, bad, opts.only)
    candidates, missing = [], []
    day = lo_date
    while day <= hi_date:
        public = str(Version(f"{lo.base_version}.dev{day:%Y%m%d}"))
        if all(nightly.for_cell(found, c, public, table) is not None for c in cells):
            candidates.append(public)
        else:
            missing.append(public)
        day += dt.timedelta(days=1)
    for end, flag in ((str(Version(lo.public)), "--good"), (str(Version(hi.public)), "--bad")):
        if end not in candidates:
            raise ConfigError(f"{flag} {end}: the wheel source has no build of that date for "
                              f"{', '.join(sorted({c.id for c in cells}))}",
                              hint="pick dates the wheel source has for them (--find-links / --index-url)")
    return Bisect(bisect_id, candidates[0], candidates[-1], candidates, missing, only=list(opts.only),
                  tests=list(opts.tests))


def run(opts: Options, env: Mapping[str, str], *, good: str | None, bad: str | None, resume: str | None,
        say: Callable[[str], None] = stdout_line) -> int:
    if resume:
        home = opts.reports / resume
        if not (home / STATE).is_file():
            raise ConfigError(f"--resume {resume}: no bisect in {home}", hint="give the id printed when it started")
        state = Bisect.of(read_bisect(home / STATE))
        say(f"bisect {resume}: continuing after {len(state.steps)} step(s)")
    else:
        if not good or not bad:
            raise ConfigError("stackgate bisect needs --good VERSION and --bad VERSION (or --resume ID)")
        bisect_id = opts.run_id or f"bisect-{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}"
        home = opts.reports / bisect_id
        state = plan(opts, env, good, bad, bisect_id)
        home.mkdir(parents=True, exist_ok=True)
        say(f"bisect {bisect_id}: {len(state.candidates)} nightly date(s) with wheels between {state.good} and "
            f"{state.bad}" + (f"; without wheels for these cells (skipped): {', '.join(state.without_wheels)}"
                              if state.without_wheels else ""))
    write(state, home)
    step_opts = replace(opts, reports=home, rollback=False, platform_checks=False, resume=None,
                        nightly_max_age=36500, only=tuple(state.only), tests=tuple(state.tests))
    try:
        _search(state, home, step_opts, env, say)
    except KeyboardInterrupt:
        say(f"bisect interrupted after {len(state.steps)} finished step(s): continue with "
            f"`stackgate bisect --resume {state.bisect_id}` (and the same --matrix, --find-links, --suite options)")
        raise
    return finish(state, home, opts, env, say)


def _search(state: Bisect, home: Path, step_opts: Options, env: Mapping[str, str],
            say: Callable[[str], None]) -> None:
    from stackgate.commands.run import run
    while (version := next_version(state)) is not None:
        index = len(state.steps) + 1
        run_id = f"step{index}-{version.split('dev', 1)[-1]}"
        say(f"\n== bisect step {index}: {version} (run {run_id})")
        code = run(replace(step_opts, nightly_version=version, run_id=run_id, history=home / "history.sqlite"),
                   env, say)
        step = RunDir.of(home, run_id)
        outcome = step_outcome(code, results.read(step.root).values(), _decision(step.root) or "unknown")
        state.steps.append(Step(version, run_id, outcome, code))
        say(f"== bisect step {index}: {version} is {outcome} (exit {code})")
        write(state, home)
        if version in (state.good, state.bad) and outcome != (GOOD if version == state.good else BAD):
            raise ConfigError(f"the {'good' if version == state.good else 'bad'} end, {version}, is {outcome} "
                              f"here (run {run_id})", hint=f"see {step.report_md}; pick other ends")


def finish(state: Bisect, home: Path, opts: Options, env: Mapping[str, str], say: Callable[[str], None]) -> int:
    low, high = bounds(state)
    if low is None or high is None:
        write(state, home)
        say("bisect: no first bad date could be found")
        return int(ExitCode.INFRA)
    table, cells, found = selected(opts, env, high, state.only)
    commits = {}
    for version in (low, high):
        wheel = nightly.for_cell(found, cells[0], version, table)
        commits[version] = nightly.git_version(wheel) if wheel is not None else ""
    for step in state.steps:
        step.git_version = step.git_version or commits.get(step.version, "")
    write(state, home, result=(low, high, commits))
    say(f"\nfirst bad: {high} (commit {commits[high] or '?'})\nlast good: {low} (commit {commits[low] or '?'})")
    if commits[low] and commits[high]:
        say(f"commit range: {commits[low]}..{commits[high]} "
            f"(https://github.com/pytorch/pytorch/compare/{commits[low]}...{commits[high]})")
    say(f"report: {home / 'bisect.md'}")
    return int(ExitCode.GO)


def write(state: Bisect, home: Path, result: tuple[str, str, Mapping[str, str]] | None = None) -> None:
    data = state.to_json()
    lines = [f"# Bisect {state.bisect_id}", "",
             f"Between `{state.good}` (good) and `{state.bad}` (bad): {len(state.candidates)} date(s) with wheels.", ""]
    if state.only or state.tests:
        lines += [f"Cells: `{' '.join(state.only) or 'all'}`; tests: `{' '.join(state.tests) or 'all'}`.", ""]
    if state.without_wheels:
        lines += ["Dates without wheels for these cells (skipped): "
                  + ", ".join(f"`{v}`" for v in state.without_wheels), ""]
    lines += ["| step | nightly | outcome | exit | run |", "|---|---|---|---|---|"]
    for i, s in enumerate(state.steps, 1):
        lines.append(f"| {i} | `{s.version}` | {s.outcome} | {s.exit_code} | `{strip_control(s.run_id)}` |")
    if result is not None:
        low, high, commits = result
        data["result"] = {"first_bad": high, "last_good": low, "commits": dict(commits)}
        lines += ["", f"**First bad:** `{high}` (commit `{commits.get(high) or '?'}`)",
                  f"**Last good:** `{low}` (commit `{commits.get(low) or '?'}`)"]
        if commits.get(low) and commits.get(high):
            lines.append(f"**Commit range:** `{commits[low]}..{commits[high]}`")
    atomic_write(home / STATE, json.dumps(data, indent=1))
    atomic_write(home / "bisect.md", "\n".join(lines) + "\n")
