"""results.jsonl: one line per finished cell, appended and fsynced the moment the cell ends, so a
killed run keeps what finished and `--resume RUN_ID` skips it.

A line torn by a kill is cut off before the next append (and kept in results.jsonl.torn); a line
that is not a result (bad JSON, a `null`, the wrong shape) never stops the run: `read` returns it as
a problem, and the report shows it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stackgate.boundary import results as boundary
from stackgate.errors import ConfigError, disk_full
from stackgate.model import Cell, CellResult, Phase, PhaseKind, Role, Status
from stackgate.rundir.layout import RESULTS, RunDir, runs_with_results

# a result line is bounded by what a cell may hand back (suite.MAX_RECORDS_BYTES per node, a 20 kB log
# tail); a longer line was not written by this harness and is not evidence
MAX_RESULT_LINE = 64 << 20


@dataclass(frozen=True)
class ResultLines:
    results: dict[str, CellResult] = field(default_factory=dict)
    problems: tuple[str, ...] = ()  # "results.jsonl:7: <why>: <the line, shortened>"


def append(run_dir: Path, result: CellResult) -> None:
    path = RunDir(run_dir).results
    line = json.dumps(result.to_json(), sort_keys=True) + "\n"
    try:
        with path.open("a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:  # a line cut short by a full disk is a torn line: cut before the next append
        raise disk_full(path, exc) from None


def repair_tail(run_dir: Path) -> str | None:
    """Cut a torn last line (a kill mid-write) so the next append starts a line of its own; the torn
    bytes are kept in results.jsonl.torn. Returns what was cut, or None."""
    path = RunDir(run_dir).results
    if not path.exists():
        return None
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return None
    keep = data.rfind(b"\n") + 1
    torn = data[keep:]
    with RunDir(run_dir).torn.open("ab") as fh:
        fh.write(torn + b"\n")
    with path.open("r+b") as fh:
        fh.truncate(keep)
        fh.flush()
        os.fsync(fh.fileno())
    return torn.decode("utf-8", errors="replace")


def read_all(run_dir: Path) -> ResultLines:
    """The last result per result id, and every line that is not a result."""
    path = RunDir(run_dir).results
    out: dict[str, CellResult] = {}
    problems: list[str] = []
    if not path.exists():
        return ResultLines()
    raws = path.read_bytes().split(b"\n")
    for number, raw in enumerate(raws, start=1):
        if not raw.strip():
            continue
        line = raw[:200].decode("utf-8", "backslashreplace")
        try:
            if len(raw) > MAX_RESULT_LINE:
                raise ValueError(f"a line of {len(raw)} bytes, more than the limit of {MAX_RESULT_LINE}")
            raw.decode("utf-8")  # strict: bytes that are not UTF-8 are not evidence
            result = boundary.parse_line(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            torn = number == len(raws)  # no newline after it: a write cut short by a kill
            why = "torn last line (killed mid-write)" if torn else f"not a result ({type(exc).__name__}: {exc})"
            problems.append(f"{RESULTS}:{number}: {why}: {line[:200]}")
            cell_id = boundary.cell_id_of(raw) if len(raw) <= MAX_RESULT_LINE else None
            if cell_id:  # that cell's evidence is unreadable: it is an error
                role = Role.PRODUCTION if cell_id.startswith("prod-") else Role.CANDIDATE
                out[cell_id] = CellResult(cell_id, role, Status.ERROR, reason=f"unreadable result: {problems[-1]}")
            continue
        out[result.cell_id] = result
    return ResultLines(out, tuple(problems))


def read(run_dir: Path) -> dict[str, CellResult]:
    """Last result per cell id; lines that are not results are left out (see `read_all`)."""
    return read_all(run_dir).results


def kept(recorded: Mapping[str, CellResult], result_id: str) -> CellResult | None:
    """The recorded result a resumed run keeps, or None: there is none, or the machinery failed it
    (an infra or host error, no nightly build), so it is run again."""
    found = recorded.get(result_id)
    return found if found is not None and not found.status.is_machinery else None


def last_round(recorded: Mapping[str, CellResult], kind: PhaseKind) -> int:
    """The highest round of a phase recorded in the run (0: none)."""
    return max((r.phase.round for r in recorded.values() if r.phase.kind is kind), default=0)


def rounds(recorded: Mapping[str, CellResult], cell: Cell, kind: PhaseKind) -> dict[int, CellResult]:
    """The cell's results in the rounds of one phase (repeats, reruns), by round: every round recorded
    in the run, whether or not this cell took part in all of them."""
    found = {r: recorded.get(cell.result_id(Phase(kind, r))) for r in range(1, last_round(recorded, kind) + 1)}
    return {r: result for r, result in found.items() if result is not None}


def resume_dir(reports: Path, run_id: str) -> Path:
    """The directory of a run to resume: one with results, or a run killed before its first cell
    finished (its manifest, run.json, is written before any cell runs)."""
    found = RunDir.of(reports, run_id)
    if not found.is_run():
        raise ConfigError(f"cannot resume run {run_id!r}: no {found.results}",
                          hint=f"runs with results: {', '.join(runs_with_results(reports)[-5:]) or 'none'}")
    return found.root


def stack_pairs(cells: Sequence[Cell], recorded: Mapping[str, CellResult]
                ) -> list[tuple[Cell, Cell, CellResult, CellResult]]:
    """(production cell, candidate cell, their results) once per pair of stacks whose main results both
    recorded an environment: the first candidate cell of each pair (what the stack diff and the supply
    chain compare)."""
    by_id = {c.id: c for c in cells}
    seen: set[tuple[str, str]] = set()
    out = []
    for cand in cells:
        base = by_id.get(cand.baseline)
        if cand.role is not Role.CANDIDATE or base is None or base.role is not Role.PRODUCTION:
            continue
        bres, cres = recorded.get(base.id), recorded.get(cand.id)
        if bres is None or cres is None or not bres.environment or not cres.environment:
            continue
        if (base.stack.label, cand.stack.label) not in seen:
            seen.add((base.stack.label, cand.stack.label))
            out.append((base, cand, bres, cres))
    return out
