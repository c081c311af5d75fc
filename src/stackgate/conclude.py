"""The end of every run and merge: `gate.decide` over the run directory's results, the reports
(each atomically, before the history is touched), the history's record, the console's verdict and
why, and the exit code."""

from __future__ import annotations

import contextlib
import datetime as dt
import signal
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from stackgate import errors, gate, history, matrix, osv, supply
from stackgate.console import Printer
from stackgate.errors import ConfigError, ExitCode
from stackgate.evidence import GateOutcome
from stackgate.inputs import Loaded
from stackgate.model import Cell, Decision, Role, Severity, Verdict
from stackgate.options import Options
from stackgate.report import html_report, json_report, junit, markdown
from stackgate.report.data import RunReport, counts, now, performance_rows, stack_diffs
from stackgate.rundir import RunDir, manifest, results


def decide_and_report(opts: Options, env: Mapping[str, str], loaded: Loaded, chosen: matrix.Expansion,
                      run_id: str, run_dir: Path, started: str, say: Printer,
                      extra_problems: Sequence[str] = ()) -> tuple[int, str | None]:
    """The gate's verdict on what the run directory holds, the four reports (written first), the
    history's record, and the console's summary: (exit code, why the history failed, if it did)."""
    read = results.read_all(run_dir)
    all_results = read.results
    manifest.record_stacks(run_dir, all_results)
    database = loaded.policy.supply.database
    scans = supply.scan(chosen.cells, all_results, osv.load(database) if database is not None else None)
    outcome = gate.decide(chosen.cells, chosen.not_here, all_results, loaded.policy, dt.date.today(),
                          (*read.problems, *extra_problems), scans, _canaries(opts, chosen.cells))
    report = RunReport(
        run_id=run_id, matrix=loaded.spec.name, channel=loaded.spec.channel, started=started, finished=now(),
        gate=outcome, gating_exit_code=loaded.policy.inconclusive_exit_code, cells=chosen.cells,
        results=all_results, not_here=chosen.not_here, pruned=chosen.pruned,
        diffs=stack_diffs(chosen.cells, all_results), options=opts.describe(),
        trends={}, host_probe=_manifest_probe(run_dir), power=_power(opts, loaded, outcome, chosen.cells),
        vuln_db=str(database or ""),
    )
    code = exit_code(report)
    history_error = None
    try:  # the reports go to disk first: a broken history database never costs the report
        report = replace(report, trends=history.trends(opts.history, channel=loaded.spec.channel,
                                                        matrix=loaded.spec.name,
                                                        current=(run_id, started, list(all_results.values())),
                                                        suite=run_definition(opts)),
                         nightly=_nightly_marks(opts, loaded, run_id, outcome.verdict.decision.value))
    except (sqlite3.Error, OSError) as exc:
        history_error = f"cannot read the history database {opts.history}: {exc}"
    write_reports(report, run_dir, code, env.get("GITHUB_STEP_SUMMARY"))
    try:
        history.record(opts.history, run_id=run_id, matrix=loaded.spec.name, channel=loaded.spec.channel,
                       started=started, finished=report.finished, decision=outcome.verdict.decision.value,
                       verdict=report.gating_verdict, candidate=", ".join(str(v) for v in loaded.torch),
                       results=list(all_results.values()), summary=counts(report), suite=run_definition(opts))
    except (sqlite3.Error, OSError) as exc:
        history_error = history_error or f"cannot record the run in the history database {opts.history}: {exc}"
    # the exit a pipeline gets: a history that cannot be written ends the run with exit 3 (the caller raises)
    shown = (f"exit {code}" if history_error is None or code == 3
             else f"exit 3, not {code}: the history database failed, below")
    say(f"\n{outcome.verdict.decision.value} (gating verdict {report.gating_verdict}, {shown})")
    for line in why_lines(outcome.verdict):
        say(line)
    known = outcome.evidence.preexisting
    if known:
        counted = "not blocking" if loaded.policy.preexisting_failures == "go" else "INCONCLUSIVE by the policy"
        say(f"pre-existing failures ({len(known)}: they fail in production too, so the upgrade did not cause them; "
            f"{counted}):")
        for k in known[:5]:
            say(f"  - {k.cell} {k.test}: candidate {k.candidate[:120]}; production {k.production[:120]}")
        if len(known) > 5:
            say(f"  ... and {len(known) - 5} more in report.md")
    for line in performance_lines(outcome):
        say(line)
    for r in outcome.verdict.reasons:
        if r.kind == "pool-drift":  # beside the comparisons: the pool moved since production's last canary
            say(f"  {r.cell}: {r.message}")
    for key, entry in report.power.items():
        if "note" in entry:
            say(f"gate power: {key}: {entry['note']}")
    for line in supply_lines(outcome, str(database or "")):
        say(line)
    say(f"reports: {run_dir}/report.md report.json junit.xml report.html")
    return code, history_error


def _canaries(opts: Options, cells: Sequence[Cell]) -> list[history.Canary]:
    """The newest watch canary of each production cell of the run (none when the history cannot be read:
    its failure is reported where the run is recorded)."""
    try:
        return history.last_canaries(opts.history, [c.id for c in cells if c.role is Role.PRODUCTION])
    except (sqlite3.Error, OSError, ConfigError):
        return []


def run_definition(opts: Options) -> str:
    """The suite half of a run definition (the matrix is the other): "bundled", or the suite's path."""
    return str(opts.suite.resolve()) if opts.suite is not None else "bundled"


def performance_lines(outcome: GateOutcome, ungated: int = 3) -> list[str]:
    """The gated comparisons, and the largest ungated changes, as a reader reads them."""
    gated, rest = performance_rows(outcome.evidence.comparisons)
    out = [f"performance: {c.cell} {c.metric}: {c.comparison.base_median:.4g} -> {c.comparison.cand_median:.4g} "
           f"{c.unit} ({c.comparison.reading()}; {c.comparison.outcome.value})".replace("  ", " ") for c in gated]
    out += [f"not gated: {c.cell} {c.metric}: {c.comparison.base_median:.4g} -> {c.comparison.cand_median:.4g} "
            f"{c.unit} ({c.comparison.reading()})".replace("  ", " ") for c in rest[:ungated]]
    if len(rest) > ungated:
        out.append(f"  ... and {len(rest) - ungated} more ungated comparisons in report.md")
    return out


def supply_lines(outcome: GateOutcome, database: str) -> list[str]:
    """One line per candidate stack's scan: what was found, or that it was not scanned."""
    out = []
    for pair in outcome.evidence.supply:
        scan = pair.candidate
        if not scan.scanned:
            out.append(f"vulnerabilities: {scan.stack} not scanned ({scan.why_not})")
            continue
        out.append(f"vulnerabilities: {scan.stack} against {database}: {len(scan.findings)} finding(s) "
                   f"({len(pair.inherited)} inherited, {len(pair.added)} added, {len(pair.removed)} fixed by the "
                   f"upgrade)")
    return out


def _power(opts: Options, loaded: Loaded, outcome: GateOutcome, cells: Sequence[Cell]) -> dict[str, Any]:
    """What the gate can detect, per gated comparison: from the pool's calibration (if any), with the
    runs the policy makes, and from the noise its pairs showed in this run, with the runs made (a
    runner noisier than when it was calibrated shows here as a larger change detected, and, beyond what
    the calibrated noise explains (`calibrate.noisier`), as a note that says to calibrate again)."""
    from stackgate import calibrate as cal
    pools = {c.id: c.pool.name for c in cells}
    try:
        noise = {p: history.calibration(opts.history, p) for p in set(pools.values())}
    except (sqlite3.Error, OSError):
        noise = {}
    # a performance NO-GO rests on at least `confirm_repeats` runs: a regression seen over fewer is confirmed
    runs = max(loaded.policy.repeats, loaded.policy.confirm_repeats)
    confidence = loaded.policy.confidence
    out: dict[str, Any] = {}
    for comparison in outcome.evidence.comparisons:
        found = comparison.comparison
        calibrated = noise.get(pools.get(comparison.cell, ""), {}).get(comparison.metric)
        seen = found.method == "paired" and found.pairs >= 2
        if not comparison.gated or (calibrated is None and not seen):
            continue
        entry: dict[str, Any] = {"tolerance": found.tolerance}
        if calibrated is not None:
            sigma = calibrated.sigma
            entry.update(sigma=round(sigma, 6), repeats=runs, detects=round(cal.detectable(sigma, runs, found.tolerance,
                                                                                            confidence), 4),
                         calibrated=calibrated.recorded, calibrated_pairs=calibrated.pairs)
        if seen:
            entry.update(seen=round(found.noise, 6), pairs=found.pairs,
                         detects_seen=round(cal.detectable(found.noise, found.pairs, found.tolerance, confidence), 4))
        if calibrated is not None and seen and cal.noisier(found.noise, found.pairs, calibrated.sigma,
                                                           calibrated.pairs):
            entry["note"] = (f"this run's {found.pairs} pairs spread {found.noise:.1%}, more than the "
                             f"{calibrated.sigma:.1%} stackgate calibrate measured on pool "
                             f"{pools[comparison.cell]} at {calibrated.recorded} explains: the runner is noisier "
                             f"than when calibrated, and at this noise the runs the policy makes settle fewer "
                             f"changes (one at the target may come out INCONCLUSIVE, not NO-GO); calibrate again, "
                             f"close to the runs it gates")
        out[f"{comparison.cell} {comparison.metric}"] = entry
    return out


def _nightly_marks(opts: Options, loaded: Loaded, run_id: str, decision: str) -> dict[str, str]:
    """For the nightly channel: the last green nightly and the first red one after it, counting
    this run (recorded after the reports are written)."""
    if loaded.spec.channel != "nightly":
        return {}
    this = ", ".join(str(v) for v in loaded.torch)
    marks = [m for m in history.nightlies(opts.history, loaded.spec.name) if m.version != this]
    green, red = history.standing([*marks, history.Nightly(this, run_id, decision, now())])
    out = {}
    if green is not None:
        out["last_green"] = f"{green.version} (run {green.run_id})"
    if red is not None:
        out["first_red_after"] = f"{red.version} (run {red.run_id})"
    return out


def _manifest_probe(run_dir: Path) -> dict[str, Any]:
    try:
        found = manifest.read(run_dir).host_probe
    except ConfigError:
        return {}
    return {pool: row.model_dump(mode="json") for pool, row in found.items()}


def why_lines(verdict: Verdict, limit: int = 10) -> list[str]:
    """The reasons that decided the verdict (blocking for NO-GO, inconclusive for INCONCLUSIVE):
    the first `limit`, and how many more the report has."""
    severity = {Decision.NO_GO: Severity.BLOCKING, Decision.INCONCLUSIVE: Severity.INCONCLUSIVE}.get(verdict.decision)
    groups = [("waived ({} reason(s) the policy lets pass, until their date):", Severity.WAIVED)]
    if severity is not None:
        groups.insert(0, (f"why ({{}} {severity.value} reason(s)):", severity))
    lines: list[str] = []
    for head, chosen in groups:
        picked = [r for r in verdict.reasons if r.severity is chosen]
        if not picked:
            continue
        lines.append(head.format(len(picked)))
        for reason in picked[:limit]:
            where = " ".join(x for x in (reason.cell, reason.test) if x)
            lines.append(f"  - [{reason.kind}] {where}: {reason.message[:300]}" if where
                         else f"  - [{reason.kind}] {reason.message[:300]}")
        if len(picked) > limit:
            lines.append(f"  ... and {len(picked) - limit} more in report.md")
    return lines


def exit_code(report: RunReport) -> int:
    if any(r.status.is_machinery for r in report.results.values()):
        return int(ExitCode.INFRA)  # the run could not decide; `--resume` retries those cells
    decision = report.gate.verdict.decision.value
    if decision == "GO":
        return int(ExitCode.GO)
    if decision == "NO-GO":
        return int(ExitCode.NO_GO)
    return report.gating_exit_code


def write_reports(report: RunReport, run_dir: Path, code: int, step_summary: str | None) -> None:
    """Each report atomically (a report is whole or absent); a full disk is one line of exit 3."""
    where = RunDir(run_dir)
    writers: tuple[tuple[Path, Callable[[Path], None]], ...] = (
        (where.report_json, lambda p: json_report.write(report, p, code)),
        (where.report_md, lambda p: markdown.write(report, p, step_summary)),
        (where.junit, lambda p: junit.write(report, p)),
        (where.report_html, lambda p: html_report.write(report, p)))
    for path, write in writers:
        try:
            write(path)
        except OSError as exc:
            raise errors.disk_full(path, exc) from None


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """After an interrupt, a second Ctrl-C or SIGTERM must not cut the report short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
