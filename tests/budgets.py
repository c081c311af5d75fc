"""Where the harness's own test time goes, printed at the end of every run: each tier's seconds, the
files over their budget (tests/budgets.toml; named, never failed), and `--fast`, the inner loop (the
unit tier with its property-based tests).

A file's time is the wall time of its tests' setup, call and teardown: a session fixture (a venv, an
image) counts in the first file that asks for it, as it does in CI."""

from __future__ import annotations

import os
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
BUDGETS = ROOT / "tests" / "budgets.toml"
TIERS = ("unit", "torch", "docker", "registry", "slurm", "gpu")


@dataclass(frozen=True)
class Budgets:
    """Each file's budget: its own line, else its tier's (a file outside every tier has none: named)."""

    tier_s: dict[str, float]
    file_s: dict[str, float]

    def of(self, path: str) -> float:
        return self.file_s.get(path, self.tier_s.get(tier_of(path), 0.0))


def load_budgets(path: Path = BUDGETS) -> Budgets:
    """The per-file budgets (the file's `total` is the whole of CI's, which .ci/run reads)."""
    data = tomllib.loads(path.read_text())
    return Budgets({k: float(v) for k, v in data["tier"].items()}, {k: float(v) for k, v in data.get("file", {}).items()})


def file_of(nodeid: str) -> str:
    """The test file of a node id (`tests/unit/test_x.py::test_y[z]` -> `tests/unit/test_x.py`)."""
    return nodeid.split("::", 1)[0]


def tier_of(path: str) -> str:
    """The tier is the directory: tests/<tier>/... (a path relative to the repository)."""
    parts = Path(path).parts
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"


@dataclass
class Clock:
    """Seconds per test file, and how many tests each ran."""

    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    tests: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, report: pytest.TestReport) -> None:
        path = file_of(report.nodeid)
        self.seconds[path] += report.duration
        if report.when == "call" or (report.when == "setup" and report.skipped):
            self.tests[path] += 1

    def by_tier(self) -> dict[str, tuple[int, int, float]]:
        tiers: dict[str, tuple[int, int, float]] = {}
        for path, took in self.seconds.items():
            files, tests, seconds = tiers.get(tier_of(path), (0, 0, 0.0))
            tiers[tier_of(path)] = (files + 1, tests + self.tests[path], seconds + took)
        return tiers

    def over(self, budgets: Budgets) -> list[tuple[str, float, float]]:
        return sorted(((p, s, budgets.of(p)) for p, s in self.seconds.items() if s > budgets.of(p)),
                      key=lambda row: row[1] - row[2], reverse=True)


_CLOCK = Clock()  # one pytest run per process: the run's clock


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fast", action="store_true",
                     help="the inner loop: only the unit tier (fakes at our seams) and its property-based tests")


def select_fast(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`--fast`: every test outside tests/unit is deselected (and said so)."""
    if not config.getoption("--fast"):
        return
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        (keep if tier_of(file_of(item.nodeid)) == "unit" else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep


def share_of(path: str) -> str:
    """Which tests one pytest-xdist worker runs one after the other: every test of the Docker and
    registry tiers (one engine: their images are session fixtures, and their tests count the engine's
    `sg-` containers and networks), every test of the Slurm tier (one cluster), and each other file on
    its own (its module fixtures: caches, wheels), as `--dist loadfile` would."""
    tier = tier_of(path)
    if tier in ("docker", "registry"):
        return "engine"
    return "slurm" if tier == "slurm" else path


def schedule(config: pytest.Config, items: list[pytest.Item], budgets: Budgets | None = None) -> None:
    """On a pytest-xdist worker: the shares ordered by their budget, the longest first (the controller
    hands shares out in the workers' collection order, so the short unit files fill the end of the run
    instead of one long file keeping a worker busy after the other is done)."""
    if not hasattr(config, "workerinput"):  # a plain pytest run keeps its collection order
        return
    budgets = budgets or load_budgets()
    cost: dict[str, float] = defaultdict(float)
    for path in {file_of(item.nodeid) for item in items}:
        cost[share_of(path)] += budgets.of(path)
    order = {share: rank for rank, share in enumerate(sorted(cost, key=lambda share: (-cost[share], share)))}
    items.sort(key=lambda item: order[share_of(file_of(item.nodeid))])  # stable: a share keeps its order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """`--dist loadfile`, by share (`share_of`) instead of by file. (pytest-xdist's own `loadgroup`, whose
    groups ride on a suffix of each test's id, put one group's tests on both workers under pytest 9.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByShare(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return share_of(file_of(nodeid))

    return ByShare(config, log)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _CLOCK.add(report)


def summary(budgets: Budgets) -> list[str]:
    """The lines printed at the end of a run: each tier's time, then every file over its budget."""
    rows = _CLOCK.by_tier()
    lines = [f"{'tier':<9} {'files':>5} {'tests':>5} {'seconds':>8}"]
    for tier in (*TIERS, *sorted(set(rows) - set(TIERS))):
        if tier in rows:
            files, tests, seconds = rows[tier]
            lines.append(f"{tier:<9} {files:>5} {tests:>5} {seconds:>8.1f}")
    lines.append(f"{'all':<9} {sum(f for f, _, _ in rows.values()):>5} {sum(t for _, t, _ in rows.values()):>5} "
                 f"{sum(s for _, _, s in rows.values()):>8.1f}")
    over = _CLOCK.over(budgets)
    lines += [f"OVER BUDGET {path}: {seconds:.1f} s of {budget:.0f} s (tests/budgets.toml)"
              for path, seconds, budget in over]
    if not over:
        lines.append("every test file within its budget (tests/budgets.toml)")
    return lines


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _CLOCK.seconds or hasattr(terminalreporter.config, "workerinput"):  # the controller sums the workers'
        return
        return
    lines = summary(load_budgets())
    terminalreporter.section("test time by tier, and files over their budget (named, never failed)")
    for line in lines:
        terminalreporter.write_line(line)
    out = os.environ.get("STACKGATE_TEST_TIMES")
    if out:  # .ci/run prints it again beside its stage times
        Path(out).write_text("\n".join(lines) + "\n")
