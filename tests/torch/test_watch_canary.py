"""#44's canary for real: `stackgate watch`'s drift check runs production's cell of the default matrix
(the 2.13.0+cpu venv) with a plain suite that times a fixed CPU workload, records each canary in the
history, and reads the earlier ones back as its baseline; four times the work (real extra work, through
--suite-env) is measured as more. Four times, and a wide band: a CPU clock beside a busy hyperthread sibling
(another test worker) reads up to ~1.6x the same work, so twice the work measured 1.32x once in CI."""

from __future__ import annotations

import os
from pathlib import Path

from stackgate import history, options
from stackgate.commands import watch
from stackgate.console import Console

ROOT = Path(__file__).resolve().parents[2]
METRIC = "canary.step_time[clock=cpu]"


def test_the_canary_runs_production_records_itself_and_measures_extra_work(tmp_path: Path, cache_dir: Path) -> None:
    def canary(extra: str) -> watch.CanaryRun:
        opts = options.read({"suite": str(ROOT / "tests" / "data" / "canary_suite"), "reports": str(tmp_path / "r"),
                             "cache_dir": str(cache_dir), "backend": "venv", "profile": "quick",
                             "suite_env": [f"CANARY_EXTRA={extra}"]}, dict(os.environ), tmp_path / "none.toml",
                            cwd=tmp_path)
        ran = watch.run_canary(opts, dict(os.environ), Console(lambda _: None))
        watch.record_canary(opts, f"t{extra}", ran)  # what `watch` records after each canary
        return ran

    first = canary("0")
    assert not first.failed, first.failed
    [m] = first.measured
    assert (m.metric, m.pool, m.earlier) == (METRIC, "local", ())
    assert m.cell_id == "prod-local-cpu-cpu-torch2.13.0-py3.11-1x2" and m.median > 0
    more = canary("3.0")
    [d] = more.measured
    assert d.earlier == (m.median,)  # the first canary, from the history: same cell, suite and profile
    assert 1.8 < d.median / m.median < 8, (m.median, d.median)  # four times the work, on the CPU clock
    rows = history.last_canaries(tmp_path / "r" / "history.sqlite", [m.cell_id])
    assert [(r.run_id, r.metric, r.baseline) for r in rows] == [(more.run_id, METRIC, None)]  # too few to compare
