"""Run history in an embedded SQLite database (default reports/history.sqlite)."""

from __future__ import annotations

import contextlib
import json
import math
import sqlite3
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from stackgate.boundary import history as rows_boundary
from stackgate.boundary.environment import Environment
from stackgate.boundary.history import Row
from stackgate.errors import ConfigError
from stackgate.model import MAIN, CellResult

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  run_id TEXT PRIMARY KEY, matrix TEXT, channel TEXT, started TEXT, finished TEXT,
  decision TEXT, verdict TEXT, candidate TEXT, summary TEXT
);
CREATE TABLE IF NOT EXISTS promotions (
  at TEXT, who TEXT, action TEXT, run_id TEXT, stack TEXT, image TEXT, tag TEXT, previous TEXT,
  production_toml TEXT, previous_toml TEXT, run_dir TEXT DEFAULT ''
);
CREATE TABLE IF NOT EXISTS watches (
  at TEXT, run_id TEXT, check_name TEXT, state TEXT, findings INTEGER, detail TEXT
);
CREATE TABLE IF NOT EXISTS canaries (
  at TEXT, run_id TEXT, pool TEXT, cell_id TEXT, suite TEXT, profile TEXT, metric TEXT, median REAL,
  baseline REAL, shift REAL, flagged INTEGER
);
CREATE TABLE IF NOT EXISTS calibration (
  pool TEXT, metric TEXT, sigma REAL, pairs INTEGER, run_id TEXT, recorded TEXT,
  PRIMARY KEY (pool, metric, run_id)
);
CREATE TABLE IF NOT EXISTS cells (
  run_id TEXT, cell_id TEXT, role TEXT, torch TEXT, status TEXT,
  PRIMARY KEY (run_id, cell_id)
);
CREATE TABLE IF NOT EXISTS definitions (
  run_id TEXT PRIMARY KEY, suite TEXT
);
CREATE TABLE IF NOT EXISTS metrics (
  run_id TEXT, cell_id TEXT, role TEXT, metric TEXT, unit TEXT, median REAL, n INTEGER,
  PRIMARY KEY (run_id, cell_id, metric)
);
"""

TREND_METRICS = ("recsys.step_time", "vit.step_time", "recsys.throughput", "vit.peak_memory",
                 "avg_busbw[collective=all_reduce*", "compile.time")


RunRow = rows_boundary.RunRow  # a row of `runs`, as `stackgate history` lists it


# PRAGMA user_version of what this stackgate writes; a newer database is refused. 2: promotions.run_dir
# (where the promoted run lives: `stackgate watch` reads its report and locks there)
SCHEMA_VERSION = 2


@contextlib.contextmanager
def connect(path: Path) -> Iterator[sqlite3.Connection]:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.text_factory = rows_boundary.text  # a text cell that is not UTF-8 is garbage in its row, not a crash
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise ConfigError(f"the history database {path} was written by a newer stackgate (schema version "
                              f"{version}; this one reads up to {SCHEMA_VERSION})",
                              hint="upgrade stackgate, or pass another --history PATH")
        conn.executescript(SCHEMA)
        columns = [row[1] for row in conn.execute("PRAGMA table_info(promotions)")]
        if "run_dir" not in columns:  # a version 1 database: its promotions name no run directory
            conn.execute("ALTER TABLE promotions ADD COLUMN run_dir TEXT DEFAULT ''")
        if version < SCHEMA_VERSION:
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        yield conn
        conn.commit()
    finally:
        conn.close()


def record(path: Path, *, run_id: str, matrix: str, channel: str, started: str, finished: str, decision: str,
           verdict: str, candidate: str, results: Sequence[CellResult], summary: dict[str, int],
           suite: str = "") -> None:
    """One run: its verdict, cells and metrics; `suite` (with the matrix, its run definition: trends
    compare runs of the same definition only)."""
    with connect(path) as conn:
        conn.execute("INSERT OR REPLACE INTO runs VALUES (?,?,?,?,?,?,?,?,?)",
                     (run_id, matrix, channel, started, finished, decision, verdict, candidate, json.dumps(summary)))
        conn.execute("INSERT OR REPLACE INTO definitions VALUES (?,?)", (run_id, suite))
        conn.execute("DELETE FROM metrics WHERE run_id = ?", (run_id,))
        conn.executemany("INSERT OR REPLACE INTO metrics VALUES (?,?,?,?,?,?,?)", _metric_rows(run_id, results))
        conn.execute("DELETE FROM cells WHERE run_id = ?", (run_id,))
        conn.executemany("INSERT OR REPLACE INTO cells VALUES (?,?,?,?,?)",
                         [(run_id, r.cell_id, r.role.value, r.cell.stack.torch,
                           r.status.value) for r in results if r.phase == MAIN])


def _metric_rows(run_id: str, results: Sequence[CellResult]) -> list[tuple[str, str, str, str, str, float, int]]:
    rows = []
    for result in results:
        if result.phase != MAIN:  # repeats and rollbacks are evidence for the gate, not trend points
            continue
        for m in result.metrics:
            if m.samples and m.better != "equal" and all(math.isfinite(s) for s in m.samples):
                rows.append((run_id, result.cell_id, result.role.value, m.key, m.unit,
                             statistics.median(m.samples), len(m.samples)))
        rows += [(run_id, result.cell_id, result.role.value, key, "bytes", float(size), 1)
                 for key, size in stack_sizes(result.environment)]
    return rows


def stack_sizes(environment: Environment) -> list[tuple[str, int]]:
    """The stack's image and environment sizes and its ten largest packages, as the run recorded them
    (the supply chain's size check, `supply.py`): kept in the history beside the metrics."""
    out = [(f"stack.{key}", value) for key, value in (("image_size", environment.image_size),
                                                      ("env_size", environment.env_size)) if value]
    largest = sorted(environment.package_sizes.items(), key=lambda kv: -kv[1])[:10]
    return out + [(f"stack.package_size[package={name}]", size) for name, size in largest]


def runs(path: Path, limit: int = 20, matrix: str | None = None, skipped: list[str] | None = None) -> list[RunRow]:
    if not path.exists():
        return []
    with connect(path) as conn:
        query = "SELECT run_id, matrix, channel, started, decision, candidate, summary FROM runs"
        args: tuple[object, ...] = ()
        if matrix:
            query += " WHERE matrix = ?"
            args = (matrix,)
        query += " ORDER BY started DESC, run_id DESC LIMIT ?"
        return rows_boundary.rows(RunRow, conn.execute(query, (*args, limit)).fetchall(), "runs", skipped)


@dataclass(frozen=True)
class Nightly:
    version: str  # the candidate torch, e.g. 2.15.0.dev20261124
    run_id: str
    decision: str
    finished: str
    cells: tuple[tuple[str, str], ...] = ()  # (cell id, status) of the run's candidate cells


def nightlies(path: Path, matrix: str | None = None, skipped: list[str] | None = None) -> list[Nightly]:
    """The latest verdict of each nightly build the history has, oldest build first."""
    if not path.exists():
        return []
    with connect(path) as conn:
        query = "SELECT candidate, run_id, decision, finished FROM runs WHERE channel = 'nightly'"
        args: tuple[object, ...] = ()
        if matrix:
            query += " AND matrix = ?"
            args = (matrix,)
        latest: dict[str, tuple[str, str, str]] = {}
        found = conn.execute(query + " ORDER BY finished, run_id", args).fetchall()
        for row in rows_boundary.rows(rows_boundary.NightlyRun, found, "runs", skipped):
            if "dev" in row.candidate and "," not in row.candidate:
                latest[row.candidate] = (row.run_id, row.decision, row.finished)
        out = []
        for version, (run_id, decision, finished) in latest.items():
            cells = tuple((c.cell_id, c.status) for c in rows_boundary.rows(rows_boundary.CellRow, conn.execute(
                "SELECT cell_id, status FROM cells WHERE run_id = ? AND role = 'candidate' ORDER BY cell_id",
                (run_id,)).fetchall(), "cells", skipped))
            out.append(Nightly(version, run_id, decision, finished, cells))
    return sorted(out, key=lambda n: dev_key(n.version))


def dev_key(version: str) -> tuple[str, str]:
    date = version.split("dev", 1)[1][:8] if "dev" in version else ""
    return (date, version)


def standing(marks: Sequence[Nightly]) -> tuple[Nightly | None, Nightly | None]:
    """The last green nightly (the newest whose latest run was GO) and the first red one after it
    (the oldest NO-GO after it; of all nightlies, when none is green)."""
    ordered = sorted(marks, key=lambda n: dev_key(n.version))
    green = [n for n in ordered if n.decision == "GO"]
    last = green[-1] if green else None
    red = next((n for n in ordered if n.decision == "NO-GO"
                and (last is None or dev_key(n.version) > dev_key(last.version))), None)
    return last, red


def last_green(path: Path, matrix: str | None = None, skipped: list[str] | None = None) -> Nightly | None:
    return standing(nightlies(path, matrix, skipped))[0]


@dataclass(frozen=True)
class TrendPoint:
    run_id: str
    started: str
    role: str  # "production" | "candidate"
    value: float  # the metric's median over that role's main cells of the run


def trends(path: Path, *, channel: str, matrix: str, limit: int = 10,
           current: tuple[str, str, Sequence[CellResult]] | None = None,
           suite: str | None = None) -> dict[str, list[TrendPoint]]:
    """Each key metric over the last runs of the same channel and run definition (matrix, and `suite`
    when given: a run recorded without one is not of it, and a user suite's report never shows the
    bundled suite's metrics), production and candidate apart; `current` (run id, started, results) adds
    the run being reported before it is recorded."""
    rows: list[tuple[str, str, str, str, float]] = []  # run, started, role, metric, median
    if path.exists():
        with connect(path) as conn:
            query = ("SELECT runs.run_id, runs.started FROM runs LEFT JOIN definitions ON runs.run_id = "
                     "definitions.run_id WHERE channel = ? AND matrix = ?")
            args: tuple[object, ...] = (channel, matrix)
            if suite is not None:
                query += " AND definitions.suite = ?"
                args += (suite,)
            found = rows_boundary.rows(rows_boundary.RunStarted, conn.execute(
                query + " ORDER BY started DESC, runs.run_id DESC LIMIT ?", (*args, limit)).fetchall(), "runs", None)
            for run in reversed(found):
                if current is not None and run.run_id == current[0]:
                    continue
                rows += [(run.run_id, run.started, m.role, m.metric, m.median) for m in rows_boundary.rows(
                    rows_boundary.MetricRow, conn.execute("SELECT role, metric, median FROM metrics WHERE run_id = ?",
                                                          (run.run_id,)).fetchall(), "metrics", None)]
    if current is not None:
        rows += [(current[0], current[1], row[2], row[3], row[5]) for row in _metric_rows(current[0], current[2])]
    out: dict[str, dict[tuple[str, str], list[float]]] = {}
    runs_started: dict[str, str] = {}
    for run_id, started, role, metric, median in rows:
        if any(metric.startswith(prefix.rstrip("*")) for prefix in TREND_METRICS):
            out.setdefault(metric, {}).setdefault((run_id, role), []).append(float(median))
            runs_started[run_id] = started
    return {metric: [TrendPoint(run, runs_started[run], role, statistics.median(values))
                     for (run, role), values in by_run.items()] for metric, by_run in out.items()}


def record_calibration(path: Path, *, pool: str, run_id: str, recorded: str,
                       noise: Sequence[tuple[str, float, int]]) -> None:
    """`stackgate calibrate`'s A/A noise per gated metric, for this pool: (metric, sigma, the A/A pairs
    sigma comes from)."""
    with connect(path) as conn:
        conn.executemany("INSERT OR REPLACE INTO calibration VALUES (?,?,?,?,?,?)",
                         [(pool, metric, sigma, pairs, run_id, recorded) for metric, sigma, pairs in noise])


@dataclass(frozen=True)
class Calibrated:
    """A pool's calibrated noise of one metric: sigma from `pairs` A/A pairs (those not apart), and when."""

    sigma: float
    pairs: int
    recorded: str


def calibration(path: Path, pool: str) -> dict[str, Calibrated]:
    """The latest calibrated noise per metric key of a pool."""
    if not path.exists():
        return {}
    with connect(path) as conn:
        rows = conn.execute("SELECT metric, sigma, pairs, recorded FROM calibration WHERE pool = ? "
                            "ORDER BY recorded ASC, run_id ASC", (pool,)).fetchall()
    return {r.metric: Calibrated(r.sigma, r.pairs, r.recorded)
            for r in rows_boundary.rows(rows_boundary.CalibrationRow, rows, "calibration", None)}


# one step of `stackgate promote` (action "promote" or "rollback"): who, when, which run proved the
# image, the tag it moved and what it pointed at before, and production.toml before and after
Promotion = rows_boundary.PromotionRow


def record_promotion(path: Path, steps: Sequence[Promotion]) -> None:
    with connect(path) as conn:
        conn.executemany("INSERT INTO promotions VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                         [tuple(s.model_dump().values()) for s in steps])


def _all(path: Path, kind: type[Row], table: str) -> list[Row]:
    """Every row of `table` (a name of this module's schema), oldest first, as `kind`."""
    if not path.exists():
        return []
    with connect(path) as conn:
        rows = conn.execute(f"SELECT * FROM {table} ORDER BY rowid").fetchall()
    return rows_boundary.rows(kind, rows, table, None)


def promotions(path: Path) -> list[Promotion]:
    """Every promotion and rollback, oldest first."""
    return _all(path, Promotion, "promotions")


Watch = rows_boundary.WatchRow


def record_watch(path: Path, rows: Sequence[Watch]) -> None:
    """One row per check of a `stackgate watch` (`run_id`: the promoted run it watched)."""
    with connect(path) as conn:
        conn.executemany("INSERT INTO watches VALUES (?,?,?,?,?,?)", [tuple(r.model_dump().values()) for r in rows])


def watches(path: Path) -> list[Watch]:
    """Every watch's checks, oldest first: production across time."""
    return _all(path, Watch, "watches")


Canary = rows_boundary.CanaryRow


def record_canary(path: Path, rows: Sequence[Canary]) -> None:
    """One row per gated metric of a `stackgate watch` canary of production (`baseline`, `shift`: what it
    was compared with, None before there was enough history; `flagged`: 1 when the pool moved)."""
    with connect(path) as conn:
        conn.executemany("INSERT INTO canaries VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                         [tuple(r.model_dump().values()) for r in rows])


def canary_baseline(path: Path, *, cell_id: str, suite: str, profile: str, metric: str, limit: int) -> list[float]:
    """The medians of the last `limit` canaries of this production cell, suite and profile, newest first."""
    if not path.exists():
        return []
    with connect(path) as conn:
        found = conn.execute("SELECT median FROM canaries WHERE cell_id = ? AND suite = ? AND profile = ? AND metric = ? "
                             "ORDER BY rowid DESC LIMIT ?", (cell_id, suite, profile, metric, limit)).fetchall()
    return [float(v) for (v,) in found if isinstance(v, (int, float)) and math.isfinite(v)]


def last_canaries(path: Path, cell_ids: Sequence[str]) -> list[Canary]:
    """The rows of the newest canary of each of these production cells (what a gate run on their pool
    reads: has the pool moved since?)."""
    if not path.exists() or not cell_ids:
        return []
    out: list[Canary] = []
    with connect(path) as conn:
        for cell_id in dict.fromkeys(cell_ids):
            newest = conn.execute("SELECT run_id FROM canaries WHERE cell_id = ? ORDER BY rowid DESC LIMIT 1",
                                  (cell_id,)).fetchone()
            if newest is not None:
                out += rows_boundary.rows(Canary, conn.execute(
                    "SELECT * FROM canaries WHERE cell_id = ? AND run_id = ? ORDER BY rowid", (cell_id, newest[0]))
                    .fetchall(), "canaries", None)
    return out
