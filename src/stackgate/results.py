"""results.jsonl: one line per finished cell, appended and flushed the moment the cell ends, so a
killed run keeps what finished and `--resume RUN_ID` skips it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from stackgate.errors import ConfigError
from stackgate.model import CellResult

RESULTS = "results.jsonl"


def append(run_dir: Path, result: CellResult) -> None:
    path = run_dir / RESULTS
    line = json.dumps(result.to_json(), sort_keys=True) + "\n"
    with path.open("a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def read(run_dir: Path) -> dict[str, CellResult]:
    """Last result per cell id; a torn last line (killed mid-write) is ignored."""
    path = run_dir / RESULTS
    out: dict[str, CellResult] = {}
    if not path.exists():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            result = CellResult.from_json(json.loads(line))
        except (ValueError, KeyError):
            continue
        out[result.cell_id] = result
    return out


def resume_dir(reports: Path, run_id: str) -> Path:
    run_dir = reports / run_id
    if not (run_dir / RESULTS).exists():
        known = sorted(p.name for p in reports.iterdir() if (p / RESULTS).exists()) if reports.exists() else []
        raise ConfigError(f"cannot resume run {run_id!r}: no {run_dir / RESULTS}",
                          hint=f"runs with results: {', '.join(known[-5:]) or 'none'}")
    return run_dir
