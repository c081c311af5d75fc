"""`stackgate watch`: the production in force (the last promotion no rollback undid, from the history)
re-checked: new advisories against its SBOM, allow-list entries whose advisory gained a fix, whether
the rollback `promote --rollback` promises still exists, and production's own drift on this pool (a
canary run of it against its earlier canaries). The report goes to
`<reports>/watch-<time>/` (Markdown, JSON, JUnit, HTML) and each check to the history. Exit 0 clean,
1 findings, 2 a check that cannot run (no database, no promotion), 3 infrastructure."""

from __future__ import annotations

import math
import shutil
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from stackgate import history, osv, promotion
from stackgate import watch as checks
from stackgate.backends.choose import REAL, Machinery
from stackgate.boundary import pylock as pylock_boundary
from stackgate.boundary.report import Report
from stackgate.commands import production_runs
from stackgate.conclude import run_definition
from stackgate.console import Console, Printer
from stackgate.errors import ConfigError, InfraError
from stackgate.model import MAIN, Status
from stackgate.options import Options
from stackgate.policy import DriftRule, load_policy
from stackgate.repeats import gated_keys
from stackgate.report.data import now
from stackgate.report.files import atomic_write
from stackgate.rundir.layout import RunDir
from stackgate.runner import Attempt

NO_DB = ("no vulnerability database: give --vuln-db PATH (a directory of OSV records or the OSV export's "
         "all.zip files) or [vulnerabilities] database in the policy")


def _registry_head() -> checks.Head:
    from stackgate.backends.docker import registry_tags
    return registry_tags().manifest_digest


def production_stacks(reports: Path, current: checks.Promoted) -> list[checks.ProductionStack]:
    """The stacks the promotion in force put into production: each one's lock (its PyPI packages), its
    image's Debian packages as its run recorded them, and what that run's scan already knew."""
    run_dir = _run_dir(reports, current)
    if not run_dir.is_dir():
        raise ConfigError(f"production comes from run {current.run_id}, but {run_dir} is gone: its report and "
                          "locks are what a watch reads", hint="restore the run directory, or pass --reports DIR")
    report = promotion.read_report(run_dir)
    out = []
    for stack in promotion.promoted(report):
        lock = RunDir(run_dir).promotion.stack(stack.label) / "pylock.toml"
        packages = (checks.lock_packages(pylock_boundary.read(lock)) if lock.is_file()
                    else [osv.Package("PyPI", *line.split("==", 1)) for line in stack.packages if "==" in line])
        for cell in report.cells:
            if cell.id in stack.cells:
                packages += [p for p in osv.sbom(cell.environment)[0] if p.ecosystem != "PyPI"]
                break
        scanned, known = _known(report, stack.label)
        out.append(checks.ProductionStack(stack.label, lock, stack.image, tuple(dict.fromkeys(packages)), known,
                                          scanned))
    return out


def _known(report: Report, label: str) -> tuple[bool, frozenset[str]]:
    for pair in report.supply_chain:
        scan = pair.candidate
        if scan is not None and scan.stack == label:
            return scan.scanned, frozenset(f"{name} {f.package}" for f in scan.findings
                                           for name in (f.advisory, *f.aliases))
    return False, frozenset()


def _run_dir(reports: Path, promoted: checks.Promoted) -> Path:
    """The promoted run's directory: where the promotion found it, else `<reports>/<run id>`."""
    return Path(promoted.run_dir) if promoted.run_dir else RunDir.of(reports, promoted.run_id).root


def _locks(reports: Path, promoted: checks.Promoted) -> list[Path]:
    run_dir = _run_dir(reports, promoted)
    labels = sorted({label for step in promoted.steps for label in step.stack.split(",") if label})
    return [RunDir(run_dir).promotion.stack(label) / "pylock.toml" for label in labels]


@dataclass(frozen=True)
class CanaryRun:
    run_id: str
    rule: DriftRule
    measured: tuple[checks.Measured, ...] = ()
    failed: tuple[tuple[str, str], ...] = ()  # (production cell, why it did not pass)


Canary = Callable[[Options, Mapping[str, str], Console], CanaryRun]


def run_canary(opts: Options, env: Mapping[str, str], console: Console, machinery: Machinery = REAL) -> CanaryRun:
    """Production's cells that run here, once each, as the matrix and suite say (`--profile quick` unless
    given), in a run directory of their own; each gated metric's median beside the medians of the
    earlier canaries of the same cell, suite and profile."""
    runs_here = production_runs.start(opts, env, console, machinery, what="watch: its canary runs production",
                                      name="canary")
    policy = runs_here.loaded.policy
    suite = run_definition(opts)
    measured: list[checks.Measured] = []
    failed: list[tuple[str, str]] = []
    try:
        for cell in runs_here.cells:
            handle = runs_here.environment(cell)
            result = runs_here.runner.attempt(Attempt(cell, MAIN), handle, step=f"canary: production {cell.id}")
            if result.status is not Status.PASSED:
                failed.append((cell.id, f"{result.status.value}: {result.reason[:300]}"))
                continue
            for key in sorted(gated_keys(cell, [result], policy)):
                samples = [v for m in result.metrics if m.key == key for v in m.samples if math.isfinite(v)]
                if samples:
                    earlier = history.canary_baseline(opts.history, cell_id=cell.id, suite=suite, profile=opts.profile,
                                                      metric=key, limit=policy.drift.runs)
                    measured.append(checks.Measured(cell.pool.name, cell.id, key, statistics.median(samples),
                                                    tuple(earlier)))
    finally:
        runs_here.close()
    return CanaryRun(runs_here.where.root.name, policy.drift, tuple(measured), tuple(failed))


def record_canary(opts: Options, at: str, run: CanaryRun) -> None:
    rows = []
    for m in run.measured:
        found = checks.shift(m, run.rule)
        rows.append(history.Canary(at=at, run_id=run.run_id, pool=m.pool, cell_id=m.cell_id,
                                   suite=run_definition(opts), profile=opts.profile, metric=m.metric, median=m.median,
                                   baseline=found.baseline if found else None, shift=found.change if found else None,
                                   flagged=int(bool(found and found.flagged))))
    history.record_canary(opts.history, rows)


def _in_force_config(opts: Options, current: checks.Promoted, out: Path) -> Options:
    """The canary runs the production in force: the promotion's production.toml, when the config
    directory's is not (yet) that one, in a copy of the config directory."""
    text = current.steps[0].production_toml
    mine = opts.config_dir / "production.toml"
    if not text or (mine.is_file() and mine.read_text() == text):
        return opts
    copy = out / "config"
    shutil.copytree(opts.config_dir, copy, dirs_exist_ok=True)
    (copy / "production.toml").write_text(text)
    return replace(opts, config_dir=copy)


def watch(opts: Options, env: Mapping[str, str], say: Printer | None = None,
          *, head: Callable[[], checks.Head] = _registry_head, canary: Canary | None = run_canary) -> int:
    """`canary`: None skips the drift check (`--no-canary`)."""
    console = Console(say)
    say = console.say
    recorded = history.promotions(opts.history)
    standing = checks.in_force(recorded)
    if not standing:
        why = ("every promotion it records was rolled back: production is what it was before any of them"
               if recorded else "no promotion recorded")
        raise ConfigError(f"{opts.history}: {why}: nothing in production to watch",
                          hint="`stackgate promote RUN` after a GO run records one (or pass --history PATH)")
    current, earlier = standing[-1], (standing[-2] if len(standing) > 1 else None)
    stacks = production_stacks(opts.reports, current)
    policy_path = opts.policy or opts.config_dir / "policy.toml"
    policy = load_policy(policy_path)
    database = opts.vuln_db or policy.supply.database
    db = osv.load(database) if database is not None else None
    moved = any(step.tag and step.image for step in current.steps)
    say(f"watch production: run {current.run_id} (promoted {current.at}), {', '.join(s.label for s in stacks)}")
    at = now()
    out = opts.reports / f"watch-{at.replace(':', '').replace('-', '')}"
    out.mkdir(parents=True, exist_ok=True)
    found: list[checks.Check] = [
        checks.advisories(stacks, db, NO_DB),
        checks.outdated_allowances(stacks, [w for w in policy.waivers if w.advisory], db, policy_path, NO_DB),
        checks.rollback(current, earlier, stacks, _locks(opts.reports, earlier) if earlier else [],
                        head() if moved else None),
    ]
    if canary is None:
        found.append(checks.Check("drift", "skipped", "--no-canary: production was not run on this pool"))
    else:
        try:
            ran = canary(_in_force_config(opts, current, out), env, console)
        except (ConfigError, InfraError) as exc:  # the other checks' findings are kept, and said
            state: checks.State = "not-run" if isinstance(exc, ConfigError) else "error"
            found.append(checks.Check("drift", state, f"the canary could not run: {exc.render()}"))
        else:
            found.append(checks.drift(ran.measured, ran.failed, ran.rule))
            record_canary(opts, at, ran)
    report = checks.WatchReport(current.run_id, at, tuple(found))
    for name, text in (("watch.json", checks.json_text(report)), ("watch.md", checks.markdown(report)),
                       ("watch.html", checks.html_page(report)), ("junit.xml", checks.junit(report))):
        atomic_write(out / name, text)
    history.record_watch(opts.history, [history.Watch(at=at, run_id=current.run_id, check_name=c.name, state=c.state,
                                                      findings=len(c.findings), detail=c.detail) for c in found])
    for c in found:
        say(f"  {c.name}: {c.state} -- {c.detail}")
        for f in c.findings:
            say(f"    {f.message} -- {f.fix}")
    say(f"watch: {report.summary}, exit {report.exit_code}; report in {out}")
    return report.exit_code
