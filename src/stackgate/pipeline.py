"""The pipeline: load -> expand -> select -> plan -> prepare -> run cells -> collect -> decide -> report."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
import secrets
import shlex
import shutil
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packaging.version import Version

from stackgate import (
    bundle,
    errors,
    gate,
    history,
    masking,
    matrix,
    probe,
    proc,
    resolve,
    results,
    rundir,
    sources,
    suite_deps,
)
from stackgate import compat as compat_mod
from stackgate.backends.base import ATTEMPT_PREFIX, Backend, EnvHandle, Execution, PrepareFailed, RunContext, run_cell
from stackgate.bundled import BUNDLED_SUITE
from stackgate.console import Console
from stackgate.errors import ConfigError, ExitCode, InfraError
from stackgate.model import (
    Cell,
    CellResult,
    Decision,
    NotHere,
    Role,
    RunnerPool,
    Severity,
    SlurmSpec,
    Status,
    Verdict,
    WheelSource,
)
from stackgate.options import Options, parse_shard
from stackgate.plan import plan_envs, run_order
from stackgate.policy import Policy, load_for_suite
from stackgate.report import html_report, json_report, junit, markdown
from stackgate.report.data import RunReport, counts, now, stack_diffs
from stackgate.report.files import atomic_write
from stackgate.suite import PLATFORM_CHECKS, Layout, SuiteSpec, node_commands
from stackgate.suite_deps import SuiteDeps
from stackgate.versions import parse_torch

Printer = Callable[[str], None]


@dataclass(frozen=True)
class Loaded:
    table: compat_mod.CompatTable
    spec: matrix.MatrixSpec
    production: matrix.Production
    pools: dict[str, RunnerPool]
    policy: Policy
    source: WheelSource
    host_pip: sources.PipConfig
    torch: tuple[Version, ...]
    deps: SuiteDeps  # discovered; local projects are built by `build_suite_deps` before resolution


def load(opts: Options, env: Mapping[str, str], local: matrix.LocalHost) -> Loaded:
    cfg = opts.config_dir
    table = compat_mod.load_compat(cfg / "compat.toml")
    spec = matrix.load_matrix(opts.matrix)
    production = matrix.load_production(cfg / "production.toml")
    pools = matrix.assign_runner(matrix.load_pools(cfg / "fleet.toml", local), opts.pool, cfg / "fleet.toml")
    suite_path = opts.suite or BUNDLED_SUITE
    if not suite_path.exists():
        raise ConfigError(f"suite path {suite_path} does not exist", hint="--suite PATH to your pytest suite")
    policy = load_for_suite(suite=suite_path, bundled_suite=BUNDLED_SUITE, config_dir=cfg, explicit=opts.policy,
                            platform_checks=opts.platform_checks, platform_files=PLATFORM_CHECKS)
    if opts.repeats is not None:
        policy = replace(policy, repeats=opts.repeats)
    if opts.confirm_repeats is not None:
        policy = replace(policy, confirm_repeats=opts.confirm_repeats)
    source = spec.source
    if opts.index_url or opts.find_links or opts.extra_index_url:
        source = replace(source, index_url=opts.index_url or source.index_url,
                         find_links=tuple(opts.find_links) + source.find_links,
                         extra_index_urls=tuple(opts.extra_index_url) + source.extra_index_urls)
    if opts.nightly_index:  # PyTorch's layout: one index per variant, URL/<variant>/torch/
        base = opts.nightly_index.rstrip("/")
        source = replace(source, extra_index_urls=source.extra_index_urls + tuple(
            f"{base}/{v}" for v in matrix.wheel_target(spec).variants), pre=True)
    host_pip = sources.read_pip_config(env)
    wanted = (opts.candidate,) if opts.candidate else spec.torch
    versions = []
    for text in wanted:
        if text == "nightly":
            versions.append(sources.resolve_nightly(source, host_pip, opts.nightly_version, matrix.wheel_target(spec)))
        else:
            versions.append(parse_torch(text, what="candidate torch version"))
    for v in versions:
        if table.release(v) is None:
            raise ConfigError(f"torch {v} is not a release known to {table.path}",
                              hint=f"add a [torch.\"{v.major}.{v.minor}\"] row, or pick one of "
                                   f"{', '.join(sorted(table.torch))}")
        if v.public and Version(v.public) < Version(production.torch.public):
            raise ConfigError(f"candidate torch {v} is older than production {production.torch} "
                              f"({production.path})", hint="a rollback test is the production run; pass a newer candidate")
    deps = suite_deps.discover(suite_path, opts.suite_requirements, opts.suite_install)
    return Loaded(table, spec, production, pools, policy, source, host_pip, tuple(versions), deps)


def expand(loaded: Loaded, pools: Mapping[str, RunnerPool] | None = None) -> matrix.Expansion:
    """The matrix over `pools` (default: the loaded ones), pruned, paired, and with "required"
    resolved once from the matrix globs and the policy."""
    expansion = matrix.expand(loaded.spec, pools if pools is not None else loaded.pools, loaded.production,
                              loaded.table, torch_versions=loaded.torch, source=loaded.source)
    return matrix.require(expansion, loaded.policy.required_cells,
                          where=(loaded.policy.path, loaded.policy.required_cells_line))


def suite_spec(opts: Options, *, platform_checks: bool, host: Mapping[str, str] | None = None) -> SuiteSpec:
    """The suite and how it runs; its environment beyond the contract is what the user passes: the
    `--suite-env` pairs, and the `--pass-env` names' values from `host` (see `masking`)."""
    explicit = parse_suite_env(opts.suite_env)
    given = {k for k, _ in explicit}
    host = host or {}
    passed = tuple((k, host[k]) for k in opts.pass_env if k in host and k not in given)
    return SuiteSpec(path=(opts.suite or BUNDLED_SUITE).resolve(), pytest_args=tuple(opts.pytest_args),
                     profile=opts.profile, timeout_s=opts.timeout, platform_checks=platform_checks,
                     env=explicit + passed)


def build_suite_deps(opts: Options, loaded: Loaded, env: Mapping[str, str], say: Printer) -> SuiteDeps:
    """The suite's local projects as wheels (cached by source digest), before anything resolves."""
    deps = loaded.deps
    if not deps.empty:
        say(f"suite requirements: {'; '.join(deps.sources)}")
    return suite_deps.build_projects(deps, opts.cache_dir, env, exclude=(opts.reports, opts.cache_dir), say=say)


def make_backend(opts: Options, loaded: Loaded, env: Mapping[str, str], say: Printer,
                 deps: SuiteDeps | None = None) -> Backend:
    """The environment backend (`_environments`), started through Slurm for the pools whose cells
    are Slurm jobs (`--launcher slurm`, or `launcher = "slurm"` in fleet.toml)."""
    backend = _environments(opts, loaded, env, say, deps)
    if slurm_pools(opts, loaded):
        from stackgate.backends.slurm import SlurmBackend
        return SlurmBackend(backend, forced=SlurmSpec() if opts.launcher == "slurm" else None, env=env, say=say)
    return backend


def slurm_pools(opts: Options, loaded: Loaded) -> set[str]:
    """The pools run here whose cells are Slurm jobs."""
    if opts.launcher == "local":
        return set()
    return {n for n, p in loaded.pools.items() if p.is_local and (opts.launcher == "slurm" or p.slurm is not None)}


def _environments(opts: Options, loaded: Loaded, env: Mapping[str, str], say: Printer,
                  deps: SuiteDeps | None) -> Backend:
    """`docker` when asked for, or by default whenever an engine answers (and cells start locally);
    `venv` otherwise (with a notice)."""
    from stackgate.backends.venv import VenvBackend
    if opts.backend == "auto" and slurm_pools(opts, loaded):
        say("notice: Slurm jobs run the stack's venv on the nodes: using the venv backend")
        return VenvBackend(opts.cache_dir, loaded.table, loaded.host_pip, env, deps=deps, say=say)
    if opts.backend in ("docker", "auto"):
        from stackgate.backends import docker

        made = docker.create(opts.cache_dir, loaded.table, loaded.host_pip, env, allow_bootstrap=opts.bootstrap_base,
                             mirror=opts.debian_mirror, ca_bundle=opts.ca_bundle, say=say, deps=deps,
                             auto=opts.backend == "auto")
        if not isinstance(made, str):
            return made
        if opts.backend == "docker":
            raise InfraError(made, hint="start the Docker engine, or use --backend venv")
        say(f"notice: {made}; falling back to the venv backend")
    return VenvBackend(opts.cache_dir, loaded.table, loaded.host_pip, env, deps=deps, say=say)


def new_run_id(matrix_name: str) -> str:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{re.sub(r'[^a-z0-9]+', '-', matrix_name.lower())}-{secrets.token_hex(2)}"


class Progress:
    """One line per test result while a cell runs: which cell, which test, elapsed time."""

    _RESULT = re.compile(r"^(\S+::\S+)\s+(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)")

    def __init__(self, say: Printer) -> None:
        self.say = say
        self.cell = ""
        self.start = time.monotonic()

    def begin(self, cell: str) -> None:
        self.cell, self.start = cell, time.monotonic()

    def line(self, text: str) -> None:
        m = self._RESULT.match(text)
        if m:
            elapsed = time.monotonic() - self.start
            self.say(f"  [{self.cell} {int(elapsed) // 60:02d}:{int(elapsed) % 60:02d}] {m.group(1)} {m.group(2)}")


def run(opts: Options, env: Mapping[str, str], say: Printer | None = None) -> int:
    console = Console(say)
    say = console.say
    local = matrix.detect_local()
    loaded = load(opts, env, local)
    chosen = matrix.select(expand(loaded), opts.only, parse_shard(opts.shard))
    if not chosen.cells:
        away = "; ".join(f"{n.cell.id}: {n.reason}" for n in chosen.not_here[:3])
        raise ConfigError(f"the matrix {opts.matrix} has zero cells that can run on this machine"
                          + (f" (--only {' '.join(opts.only)})" if opts.only else ""),
                          hint=(f"not run here: {away}" if away else "check --only and the matrix axes")
                          + f"; pruned: {len(chosen.pruned)}")

    blocked = nightly_guards(opts, loaded, chosen.cells, say)
    if blocked and loaded.spec.fallback == "last-green" and not opts.nightly_version:
        green = history.last_green(opts.history, loaded.spec.name)
        if green is not None:
            say(f"the newest nightly fails a guard ({next(iter(blocked.values()))}); the matrix falls back to "
                f"the last green nightly, {green.version} (run {green.run_id}; its age is not held against it)")
            return run(replace(opts, nightly_version=green.version, nightly_max_age=36500), env, say)
        say("the newest nightly fails a guard and the history has no green nightly to fall back to")
    for cell_id, why in blocked.items():
        say(f"  no build: {cell_id}: {why}")
    # before anything is resolved or built for a host that cannot run it
    probes = probe_pools(chosen.cells, say, remote=slurm_pools(opts, loaded))
    unfit = {p.pool: p for p in probes if not p.ok}
    runnable = tuple(c for c in chosen.cells if c.pool.name not in unfit and c.id not in blocked)
    deps = build_suite_deps(opts, loaded, env, say)
    say(f"resolving the requirements of {len(plan_envs(runnable))} stack(s)")
    resolutions = resolve.resolve_all([p.stack for p in plan_envs(runnable)], loaded.table, loaded.host_pip, env,
                                      deps)
    backend = make_backend(opts, loaded, env, say, deps)
    if opts.resume:
        run_dir = results.resume_dir(opts.reports, opts.resume)
        run_id = opts.resume
    else:
        run_id = opts.run_id or new_run_id(loaded.spec.name)
        run_dir = opts.reports / run_id
    owner = rundir.claim(run_dir)  # before anything is written: a second run of this id exits 2
    try:
        if not opts.resume and (run_dir / results.RESULTS).exists():
            raise ConfigError(f"run {run_id} already has results in {run_dir}", hint="use --resume to continue it")
        defined = definition(opts, loaded)
        selected = bundle.selection(pools=opts.pool, only=opts.only, shard=opts.shard)
        if opts.resume:
            bundle.check_resume(run_dir, defined, selected)
            # this run owns the directory now, so what still carries its id was left by the run that died
            ended = proc.end_marked({"STACKGATE_RUN_ID": run_id})
            if ended:
                say(f"resume: ended {len(ended)} process(es) the dead run {run_id} left running: "
                    + "; ".join(f"pid {pid} ({cmd[:80]})" for pid, cmd in ended[:5]))
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            if not opts.resume or probes:
                bundle.write_manifest(run_dir, defined=defined, selected=selected, cells=[c.id for c in chosen.cells],
                                      host_probe={p.pool: p.to_json() for p in probes},
                                      options=bundle.defining_options(opts.describe(), Path.cwd()))
        except OSError as exc:
            raise InfraError(f"cannot create {run_dir}: {exc.strerror}") from None
        torn = results.repair_tail(run_dir)
        if torn is not None:
            say(f"repaired a torn last line of {results.RESULTS} (kept in {results.TORN}): {torn[:120]}")
        done = results.read(run_dir)
        started = now()
        say(f"stackgate {loaded.spec.name}: run {run_id}, {len(chosen.cells)} cell(s) here, "
            f"{len(chosen.not_here)} not run here, {len(chosen.pruned)} pruned -> {run_dir}")
        for left in chosen.not_here:
            say(f"  not run here: {left.cell.id}")

        for cell in chosen.cells:  # a host that does not match its pool, or is unhealthy, runs nothing
            found = unfit.get(cell.pool.name)
            if found is not None and (cell.id not in done or done[cell.id].status.is_machinery):
                results.append(run_dir, CellResult(cell.id, cell.role, Status(found.status), reason="; ".join(
                    found.evidence), cell=cell.to_json(), environment={"host_probe": found.to_json()}))
            elif cell.id in blocked and (cell.id not in done or done[cell.id].status.is_machinery):
                results.append(run_dir, CellResult(cell.id, cell.role, Status.NO_BUILD, reason=blocked[cell.id],
                                                   cell=cell.to_json()))
        done = results.read(run_dir)
        suite = suite_spec(opts, platform_checks=opts.platform_checks, host=env)
        say(f"suite {suite.path}; policy: {loaded.policy.origin}")
        progress = Progress(say)
        ctx = RunContext(run_id=run_id, run_dir=run_dir, suite=suite, on_line=progress.line,
                         suite_deps={} if deps.empty else deps.describe(), select=tuple(opts.tests),
                         mask=masking.Masker.of(env, suite.env))
        interrupted: KeyboardInterrupt | None = None
        try:
            _run_cells(backend, runnable, ctx, done, opts, progress, console, resolutions, loaded.policy)
        except KeyboardInterrupt as exc:
            interrupted = exc
            stopped = proc.stop_all()
            say(f"interrupted: stopped {stopped} process tree(s); writing the report from the cells that finished "
                f"(continue with --resume {run_id})")
        finally:
            backend.close()
        with _signals_held() if interrupted is not None else contextlib.nullcontext():
            code, history_error = _decide_and_report(opts, env, loaded, chosen, run_id, run_dir, started, say)
        if interrupted is not None:
            raise interrupted
        if history_error:
            raise InfraError(history_error + f" (the reports are written: {run_dir})",
                             hint="check the file, or pass --history PATH to use another database")
        return code
    finally:
        owner.release()


def dry_run(opts: Options, env: Mapping[str, str], say: Printer | None = None) -> int:
    """`stackgate run --dry-run`: what each cell would run, in run order: with Slurm, the job script
    and each node's script; else each node's command. Nothing is resolved, built, submitted or
    written (the venv paths shown are where the environments will be)."""
    from stackgate.backends import slurm
    from stackgate.backends.venv import VenvBackend
    console = Console(say)
    say = console.say
    loaded = load(opts, env, matrix.detect_local())
    chosen = matrix.select(expand(loaded), opts.only, parse_shard(opts.shard))
    remote = slurm_pools(opts, loaded)
    forced = SlurmSpec() if opts.launcher == "slurm" else None
    run_dir = opts.reports / (opts.run_id or "RUN_ID")
    suite = suite_spec(opts, platform_checks=opts.platform_checks, host=env)
    ctx = RunContext(run_id=run_dir.name, run_dir=run_dir, suite=suite)
    say(f"dry run of {loaded.spec.name}: {len(chosen.cells)} cell(s) here; nothing is built, submitted or written")
    if loaded.deps.projects:
        say("  (the suite's local projects are built at run time: the venv paths below leave them out)")
    venvs = VenvBackend(opts.cache_dir, loaded.table, loaded.host_pip, env, deps=replace(loaded.deps, projects=()))
    for cell in run_order(chosen.cells):
        workdir = run_dir / "cells" / cell.id
        python = venvs.root_for(cell.stack)[0] / "bin" / "python"
        exe = Execution(cell, workdir, artifacts_dir(run_dir, cell), workdir / "shared", suite.path, "DRYRUN")
        spec = slurm.spec_for(cell, forced) if cell.pool.name in remote else None
        layout = Layout(python=str(python), out=workdir, artifacts=exe.artifacts, shared=exe.shared, suite=suite.path,
                        endpoint=f"${slurm.ENDPOINT}" if spec else ("127.0.0.1:PORT" if cell.topology.nodes > 1 else ""))
        say(f"\n== {cell.id}: " + (f"Slurm job(s), partition {spec.partition or '(default)'}" if spec else "local"))
        for group in node_commands(cell, ctx, layout):
            if spec is not None:
                files = slurm.render(spec, group, exe, seconds=suite.timeout_s, port=29400)
                say(f"$ sbatch --parsable {workdir / 'slurm' / next(iter(files))}")
                for name, text in files.items():
                    say(f"--- {workdir / 'slurm' / name}\n{text.rstrip()}")
                continue
            for command in group:
                say(f"--- node {command.node} ({command.label}), in {command.cwd}")
                say("\n".join(f"{k}={v}" for k, v in sorted(command.env.items())) + "\n" + shlex.join(command.argv))
    return 0


def calibrate(opts: Options, env: Mapping[str, str], *, runs: int, target: float, allow: float, say: Printer | None = None) -> int:
    """`stackgate calibrate`: A/A runs of the production stack on this runner (see `calibrate`)."""
    from stackgate import calibrate as cal
    console = Console(say)
    say = console.say
    loaded = load(opts, env, matrix.detect_local())
    chosen = matrix.select(expand(loaded), opts.only, None)
    prods = tuple(c for c in chosen.cells if c.role is Role.PRODUCTION)
    if not prods:
        raise ConfigError("no production cell runs on this machine: nothing to calibrate",
                          hint="pass --pool NAME (this runner's pool) or check --only")
    deps = build_suite_deps(opts, loaded, env, say)
    resolve.resolve_all([p.stack for p in plan_envs(prods)], loaded.table, loaded.host_pip, env, deps)
    backend = make_backend(opts, loaded, env, say, deps)
    run_id = opts.run_id or new_run_id(f"{loaded.spec.name}-calibrate")
    run_dir = opts.reports / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "build").mkdir(exist_ok=True)
    suite = suite_spec(opts, platform_checks=False, host=env)
    progress = Progress(say)
    ctx = RunContext(run_id=run_id, run_dir=run_dir, suite=suite, on_line=progress.line,
                     mask=masking.Masker.of(env, suite.env))
    report: dict[str, Any] = {"run_id": run_id, "target": target, "allow": allow, "runs": runs, "pools": {}}
    try:
        for cell in prods:
            with console.step(f"prepare {cell.stack.label}"):
                handle = backend.prepare(cell.stack, run_dir / "build" / f"{cell.stack.label}.log")
            ctx.mask.scrub(run_dir / "build")
            found: list[CellResult] = []
            select: tuple[str, ...] = ()
            for r in range(runs):
                run_ctx = replace(ctx, phase=f"aa{r}", select=select,
                                  artifacts=artifacts_dir(run_dir, cell) if r == 0 else None)
                with console.step(f"A/A run {r + 1}/{runs} of {cell.id}"):
                    result = _run_one(backend, cell, handle, run_ctx, progress, say)
                results.append(run_dir, result)
                if result.status not in (Status.PASSED, Status.FAILED):
                    raise InfraError(f"calibration run {r + 1} of {cell.id} did not run its tests: {result.status.value}"
                                     f": {result.reason[:300]}")
                found.append(result)
                select = select or gated_tests(cell, found, loaded.policy)
            rows = []  # (noise, recommendation, what the other per-run summary would need, or "")
            for key in sorted(gated_keys(cell, found, loaded.policy)):
                metric = next(m for f in found for m in f.metrics if m.key == key)
                rule = loaded.policy.metric_rule(metric.name, dict(metric.tags), cell.device)
                summary = rule.summary if rule is not None else "median"
                series = [next((m.samples for m in f.metrics if m.key == key), ()) for f in found]
                measured = cal.noise(key, series, summary, metric.better)
                if measured is None:
                    continue
                other = "best" if summary == "median" else "median"
                alt = cal.noise(key, series, other, metric.better)
                hint = ""
                if alt is not None and alt.sigma < measured.sigma / 2:
                    needs = cal.recommend(alt, target, allow, loaded.policy.confidence).repeats
                    hint = (f"each run's {other} sample moved {alt.sigma:.1%}: with summary = \"{other}\" "
                            f"in its [[performance.metric]] rule, repeats = {needs} would do")
                rows.append((measured, cal.recommend(measured, target, allow, loaded.policy.confidence), hint))
            say(f"\ncalibration of pool {cell.pool.name} ({cell.stack.label}, {runs} A/A runs):")
            for _, rec, hint in rows:
                say(f"  {rec.describe(target)}")
                if hint:
                    say(f"    {hint}")
            history.record_calibration(opts.history, pool=cell.pool.name, run_id=run_id, recorded=now(),
                                       noise=[(n.metric, n.sigma, n.pairs) for n, _, _ in rows])
            report["pools"][cell.pool.name] = [{**n.to_json(), "recommended_tolerance": r.tolerance,
                                                "recommended_repeats": r.repeats} for n, r, _ in rows]
    finally:
        backend.close()
    atomic_write(run_dir / "calibration.json", json.dumps(report, indent=1))
    say(f"calibration: {run_dir}/calibration.json; stored in {opts.history}")
    return 0


def nightly_guards(opts: Options, loaded: Loaded, cells: Sequence[Cell], say: Printer) -> dict[str, str]:
    """Cell id -> why it cannot run this nightly (see `nightly.guard`), before anything is resolved."""
    from stackgate import nightly
    candidates = [c for c in cells if c.role is Role.CANDIDATE and nightly.build_date(c.stack.torch)]
    if not candidates:
        return {}
    source = candidates[0].stack.source
    installs = [*(r.text for r in loaded.deps.requirements), *(r for c in candidates for r in c.stack.extra_requirements)]
    companions = {name: nightly.wheels(source, loaded.host_pip, name) for name in nightly.companions_wanted(installs)}
    found = nightly.wheels(source, loaded.host_pip)
    for page in (*found.unlisted, *(u for w in companions.values() for u in w.unlisted)):
        say(f"notice: could not list {page}: the nightly guards check only the age of what they cannot list")
    return nightly.guard(candidates, found, today=dt.datetime.now(dt.timezone.utc).date(),
                         max_age_days=opts.nightly_max_age, table=loaded.table, companions=companions)


def probe_pools(cells: Sequence[Cell], say: Printer, remote: Collection[str] = ()) -> list[probe.ProbeResult]:
    """Probe this machine once for every GPU pool it runs cells of (see `probe`); not the pools
    whose cells run as Slurm jobs on other machines."""
    for name in sorted({c.pool.name for c in cells if c.pool.has_gpu and c.pool.name in remote}):
        say(f"host probe for pool {name}: skipped: its cells run as Slurm jobs on the cluster's nodes")
    pools = {c.pool.name: c.pool for c in cells if c.pool.has_gpu and c.pool.name not in remote}
    if not pools:
        return []
    facts = probe.gather()
    out = []
    for name, pool in sorted(pools.items()):
        needs = sorted({str(c.stack.cuda.cuda_version) for c in cells
                        if c.pool.name == name and c.stack.cuda.cuda_version is not None})
        found = probe.check(pool, facts, needs)
        say(f"host probe for pool {name}: {found.status}: {'; '.join(found.evidence)[:400]}")
        out.append(found)
    return out


def definition(opts: Options, loaded: Loaded) -> dict[str, str]:
    """What this run is (see `bundle.definition`): equal on every runner of one fleet run."""
    return bundle.definition(matrix=opts.matrix, config_dir=opts.config_dir, candidate=loaded.torch,
                             policy=loaded.policy, suite=opts.suite or BUNDLED_SUITE, profile=opts.profile,
                             pytest_args=(*opts.pytest_args, *(f"--test={t}" for t in opts.tests)),
                             platform_checks=opts.platform_checks,
                             suite_requirements=loaded.deps.fingerprint())


def merge(opts: Options, env: Mapping[str, str], paths: list[Path], say: Printer | None = None) -> int:
    """`stackgate merge`: one verdict over the bundles of a fleet run. The whole matrix is gated once;
    a required cell that no bundle ran is "not run" and makes the verdict INCONCLUSIVE, by pool."""
    console = Console(say)
    say = console.say
    loaded = load(opts, env, matrix.LocalHost())
    fleet = {n: replace(p, is_local=False) for n, p in loaded.pools.items()}  # the merge machine runs nothing
    everything = expand(loaded, fleet)
    defined = definition(opts, loaded)
    bundles = bundle.load_bundles(paths, defined)
    merged: dict[str, CellResult] = {}
    problems: list[str] = []
    for b in bundles:
        merged.update(b.read.results)
        problems += [f"{b.path.name}: {p}" for p in b.read.problems]
    ran_pools = sorted({p for b in bundles for p in b.pools.split()})
    cells = tuple(n.cell for n in everything.not_here if n.cell.id in merged)
    missing = tuple(NotHere(n.cell, f"not run: no bundle ran pool {n.cell.pool.name} (bundles ran: "
                                    f"{', '.join(ran_pools) or 'none'})")
                    for n in everything.not_here if n.cell.id not in merged)
    chosen = matrix.Expansion(cells=cells, not_here=missing, pruned=everything.pruned)
    run_id = opts.run_id or new_run_id(f"{loaded.spec.name}-merged")
    run_dir = opts.reports / run_id
    if (run_dir / results.RESULTS).exists():
        raise ConfigError(f"{run_dir} already holds results", hint="pass another --run-id or --reports")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        for result in merged.values():
            results.append(run_dir, result)
        bundle.write_manifest(run_dir, defined=defined, selected=bundle.selection(pools=ran_pools, only=(), shard=None),
                              cells=[c.id for c in cells], merged_from=[str(b.path) for b in bundles])
    except OSError as exc:
        raise InfraError(f"cannot write {run_dir}: {exc.strerror}") from None
    say(f"stackgate merge: {len(bundles)} bundle(s) (pools {', '.join(ran_pools) or 'none'}), {len(cells)} cell(s) "
        f"with results, {len(missing)} without -> {run_dir}")
    code, history_error = _decide_and_report(opts, env, loaded, chosen, run_id, run_dir, now(), say,
                                             extra_problems=problems)
    if history_error:
        raise InfraError(history_error + f" (the reports are written: {run_dir})")
    return code


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
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


def _decide_and_report(opts: Options, env: Mapping[str, str], loaded: Loaded, chosen: matrix.Expansion,
                       run_id: str, run_dir: Path, started: str, say: Printer,
                       extra_problems: Sequence[str] = ()) -> tuple[int, str | None]:
    read = results.read_all(run_dir)
    all_results = read.results
    outcome = gate.decide(chosen.cells, chosen.not_here, all_results, loaded.policy, dt.date.today(),
                          (*read.problems, *extra_problems))
    report = RunReport(
        run_id=run_id, matrix=loaded.spec.name, channel=loaded.spec.channel, started=started, finished=now(),
        gate=outcome, gating_exit_code=loaded.policy.inconclusive_exit_code, cells=chosen.cells,
        results=all_results, not_here=chosen.not_here, pruned=chosen.pruned,
        diffs=stack_diffs(chosen.cells, all_results), options=opts.describe(),
        trends={}, host_probe=_manifest_probe(run_dir), power=_power(opts, loaded, outcome, chosen.cells),
    )
    code = exit_code(report)
    history_error = None
    try:  # the reports go to disk first: a broken history database never costs the report
        report = replace(report, trends=history.trends(opts.history, channel=loaded.spec.channel,
                                                        matrix=loaded.spec.name,
                                                        current=(run_id, list(all_results.values()))),
                         nightly=_nightly_marks(opts, loaded, run_id, outcome.verdict.decision.value))
    except (sqlite3.Error, OSError) as exc:
        history_error = f"cannot read the history database {opts.history}: {exc}"
    write_reports(report, run_dir, code, env.get("GITHUB_STEP_SUMMARY"))
    try:
        history.record(opts.history, run_id=run_id, matrix=loaded.spec.name, channel=loaded.spec.channel,
                       started=started, finished=report.finished, decision=outcome.verdict.decision.value,
                       verdict=report.gating_verdict, candidate=", ".join(str(v) for v in loaded.torch),
                       results=list(all_results.values()), summary=counts(report))
    except (sqlite3.Error, OSError) as exc:
        history_error = history_error or f"cannot record the run in the history database {opts.history}: {exc}"
    say(f"\n{outcome.verdict.decision.value} (gating verdict {report.gating_verdict}, exit {code})")
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
    say(f"reports: {run_dir}/report.md report.json junit.xml report.html")
    return code, history_error


def _power(opts: Options, loaded: Loaded, outcome: gate.GateOutcome, cells: Sequence[Cell]) -> dict[str, Any]:
    """What the gate can detect, per gated comparison, from the pool's calibration (if any)."""
    from stackgate import calibrate as cal
    pools = {c.id: c.pool.name for c in cells}
    out: dict[str, Any] = {}
    try:
        noise = {p: history.calibration(opts.history, p) for p in set(pools.values())}
    except (sqlite3.Error, OSError):
        return out
    # a performance NO-GO rests on at least `confirm_repeats` runs: a regression seen over fewer is confirmed
    runs = max(loaded.policy.repeats, loaded.policy.confirm_repeats)
    for comparison in outcome.evidence.comparisons:
        sigma = noise.get(pools.get(comparison.cell, ""), {}).get(comparison.metric)
        if not comparison.gated or sigma is None:
            continue
        tol = comparison.comparison.tolerance
        out[f"{comparison.cell} {comparison.metric}"] = {
            "sigma": round(sigma, 6), "repeats": runs, "tolerance": tol,
            "detects": round(cal.detectable(sigma, runs, tol, loaded.policy.confidence), 4)}
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
        found = bundle.read_manifest(run_dir).get("host_probe") or {}
    except ConfigError:
        return {}
    return dict(found) if isinstance(found, dict) else {}


def why_lines(verdict: Verdict, limit: int = 10) -> list[str]:
    """The reasons that decided the verdict (blocking for NO-GO, inconclusive for INCONCLUSIVE):
    the first `limit`, and how many more the report has."""
    severity = {Decision.NO_GO: Severity.BLOCKING, Decision.INCONCLUSIVE: Severity.INCONCLUSIVE}.get(verdict.decision)
    if severity is None:
        return []
    deciding = [r for r in verdict.reasons if r.severity is severity]
    lines = [f"why ({len(deciding)} {severity.value} reason(s)):"]
    for reason in deciding[:limit]:
        where = " ".join(x for x in (reason.cell, reason.test) if x)
        lines.append(f"  - [{reason.kind}] {where}: {reason.message[:300]}" if where
                     else f"  - [{reason.kind}] {reason.message[:300]}")
    if len(deciding) > limit:
        lines.append(f"  ... and {len(deciding) - limit} more in report.md")
    return lines


def parse_suite_env(items: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ConfigError(f"--suite-env {item!r} must be KEY=VALUE")
        out.append((key, value))
    return tuple(out)


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
    writers: tuple[tuple[str, Callable[[Path], None]], ...] = (
        ("report.json", lambda p: json_report.write(report, p, code)),
        ("report.md", lambda p: markdown.write(report, p, step_summary)),
        ("junit.xml", lambda p: junit.write(report, p)),
        ("report.html", lambda p: html_report.write(report, p)))
    for name, write in writers:
        try:
            write(run_dir / name)
        except OSError as exc:
            raise errors.disk_full(run_dir / name, exc) from None


class InfraProblem(Exception):
    """An environment could not be prepared because the machinery failed (an index out of reach, the
    engine gone): its cells are infra errors, never a verdict on the stack."""


Handle = EnvHandle | PrepareFailed | InfraProblem


def _run_cells(backend: Backend, cells: tuple[Cell, ...], ctx: RunContext, done: Mapping[str, CellResult],
               opts: Options, progress: Progress, console: Console,
               resolutions: Mapping[str, resolve.Resolution] | None = None, policy: Policy | None = None) -> None:
    say = console.say
    handles: dict[str, Handle] = {}
    plans = {p.stack.content_hash: p for p in plan_envs(cells)}
    log_dir = ctx.run_dir / "build"
    log_dir.mkdir(exist_ok=True)

    def handle_for(cell: Cell) -> Handle:
        key = cell.stack.content_hash
        if key not in handles:
            plan = plans[key]
            resolution = (resolutions or {}).get(key)
            if resolution is not None and not resolution.ok:
                say(f"  {plan.stack.label}: infrastructure problem: {resolution.problem}")
                handles[key] = InfraProblem(resolution.problem)
                return handles[key]
            say(f"prepare {backend.name} env for {plan.stack.label} ({len(plan.cells)} cell(s))")
            try:
                with console.step(f"prepare {plan.stack.label}"):
                    handle = backend.prepare(plan.stack, log_dir / f"{plan.stack.label}.log")
                say(f"  {'reused' if handle.reused else 'built'} {handle.ref} in {handle.prepare_s:.1f}s")
                handles[key] = handle
            except PrepareFailed as exc:
                say(f"  FAILED: {exc}")
                handles[key] = exc
            except InfraError as exc:  # both backends: the machinery, not the stack
                say(f"  infrastructure problem: {exc}")
                handles[key] = InfraProblem(str(exc) + (f" ({exc.hint})" if exc.hint else ""))
            ctx.mask.scrub(log_dir)  # the installer's log, once per environment
        return handles[key]

    ordered = run_order(cells)
    by_id = {c.id: c for c in cells}
    for cell in ordered:
        if cell.id in done and not done[cell.id].status.is_machinery:
            say(f"skip {cell.id}: finished in the resumed run ({done[cell.id].status.value})")
            continue
        handle = handle_for(cell)
        with console.step(f"run {cell.id}"):
            result = _run_one(backend, cell, handle, _phase_ctx(ctx, cell, by_id), progress, say)
        results.append(ctx.run_dir, result)
    if policy is not None:
        _run_repeats(backend, ordered, by_id, ctx, progress, console, handle_for, policy)
    finished = results.read(ctx.run_dir)
    if not opts.rollback:
        return
    # rollback per candidate that ran its suite (and so wrote artifacts): its production partner reads them
    for cand in ordered:
        base = by_id.get(cand.baseline)
        ran = finished.get(cand.id)
        if cand.role is not Role.CANDIDATE or base is None or ran is None or \
                ran.status not in (Status.PASSED, Status.FAILED):
            continue
        earlier = finished.get(base.result_id("rollback", cand))
        if earlier is not None and not earlier.status.is_machinery:  # infra and host errors are retried
            continue
        handle = handle_for(base)
        if isinstance(handle, (PrepareFailed, InfraProblem)):
            continue
        rollback = replace(ctx, phase="rollback", against=cand, artifacts=artifacts_dir(ctx.run_dir, cand))
        with console.step(f"run {base.result_id('rollback', cand)}"):
            result = _run_one(backend, base, handle, rollback, progress, say)
        results.append(ctx.run_dir, result)


def gated_keys(cell: Cell, found: Sequence[CellResult], policy: Policy) -> set[str]:
    """The metrics the policy gates by their samples (not thresholds) on this cell's device."""
    return {m.key for result in found for m in result.metrics if m.better != "equal"
            and (rule := policy.metric_rule(m.name, dict(m.tags), cell.device)) is not None
            and rule.method != "threshold"}


def gated_tests(cell: Cell, found: Sequence[CellResult], policy: Policy) -> tuple[str, ...]:
    """The tests that recorded the metrics the policy gates by their samples on this cell's device."""
    return tests_of(gated_keys(cell, found, policy), found)


def tests_of(keys: Collection[str], found: Sequence[CellResult]) -> tuple[str, ...]:
    """The tests that recorded these metrics (the whole suite when a suite does not say which test did)."""
    nodeids = set()
    for result in found:
        for m in result.metrics:
            if m.key in keys:
                if not m.nodeid:
                    return (WHOLE_SUITE,)
                nodeids.add(m.nodeid)
    return tuple(sorted(nodeids))


WHOLE_SUITE = "*"


def merge_tests(a: Sequence[str], b: Sequence[str]) -> tuple[str, ...]:
    """Both selections of tests to repeat: the whole suite when either is."""
    both = {*a, *b}
    return (WHOLE_SUITE,) if WHOLE_SUITE in both else tuple(sorted(both))


def repeat_order(cells: Sequence[Cell], by_id: Mapping[str, Cell], rounds: range) -> list[tuple[int, Cell]]:
    """Interleaved, pair by pair, and counterbalanced: odd repeats run the candidates first, even ones
    production first (the main run is P C), so P C | C P | P C ... : drift on the runner hits both sides,
    and so does whatever favours the first (or second) run of a pair."""
    order = []
    bases = [c for c in cells if c.role is Role.PRODUCTION]
    for r in rounds:
        for base in bases:
            group = [(r, base)] + [(r, c) for c in cells if c.role is Role.CANDIDATE and by_id.get(c.baseline) is base]
            order += group[1:] + group[:1] if r % 2 else group
    return order


def _run_repeats(backend: Backend, cells: Sequence[Cell], by_id: Mapping[str, Cell], ctx: RunContext,
                 progress: Progress, console: Console, handle_for: Callable[[Cell], Handle], policy: Policy) -> None:
    """The interleaved repeats of the performance-gated tests: `repeats` runs in all; then, for the
    pairs whose gated metrics those runs cannot settle, runs of just those metrics' tests up to
    `confirm_repeats` in all (decided once, on all of them: a first look can only settle a metric
    as within tolerance, so confirmation never makes a false NO-GO likelier)."""
    finished = results.read(ctx.run_dir)
    ran = {c.id for c in cells if c.id in finished and finished[c.id].status in (Status.PASSED, Status.FAILED)}
    pairs = [c for c in cells if c.role is Role.CANDIDATE and c.id in ran and c.baseline in ran]
    if not pairs:
        return
    if policy.repeats > 1:
        select = _with_baselines({p: gated_tests(p, [finished[p.id], finished[p.baseline]], policy) for p in pairs})
        if select:
            console.say(f"repeats: {policy.repeats - 1} more interleaved run(s) of the performance-gated tests "
                        f"({_listed(select)})")
        _repeat(backend, cells, by_id, select, range(1, policy.repeats), finished, ctx, progress, console, handle_for)
        finished = results.read(ctx.run_dir)
    if policy.confirm_repeats <= policy.repeats:
        return
    why = {p.id: gate.unsettled(p, by_id[p.baseline], finished, policy) for p in pairs}
    select = _with_baselines({p: tests_of(why[p.id], [finished[p.id], finished[p.baseline]]) for p in pairs})
    if not select:
        return
    console.say(f"confirm: {policy.confirm_repeats - policy.repeats} more interleaved run(s) of {_listed(select)}, "
                "because the runs so far cannot settle:")
    for cell_id, metrics in sorted(why.items()):
        for key, reason in sorted(metrics.items()):
            console.say(f"  {cell_id} {key}: {reason}")
    _repeat(backend, cells, by_id, select, range(policy.repeats, policy.confirm_repeats), finished, ctx, progress,
            console, handle_for)


def _with_baselines(per_candidate: Mapping[Cell, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """Cell id -> tests to repeat: each candidate's own, and for each production cell what any of its
    candidates needs (the pairs stay pairs)."""
    select: dict[str, tuple[str, ...]] = {}
    for cand, tests in per_candidate.items():
        if tests:
            select[cand.id] = tests
            select[cand.baseline] = merge_tests(select.get(cand.baseline, ()), tests)
    return select


def _listed(select: Mapping[str, tuple[str, ...]]) -> str:
    return ", ".join(sorted({t for tests in select.values() for t in tests}))


def _repeat(backend: Backend, cells: Sequence[Cell], by_id: Mapping[str, Cell], select: Mapping[str, tuple[str, ...]],
            rounds: range, finished: Mapping[str, CellResult], ctx: RunContext, progress: Progress, console: Console,
            handle_for: Callable[[Cell], Handle]) -> None:
    """Runs `rounds` of the selected tests, counterbalanced; a round already recorded (a resumed run) is kept."""
    for r, cell in repeat_order([c for c in cells if c.id in select], by_id, rounds):
        rid = cell.result_id(f"repeat{r}")
        earlier = finished.get(rid)
        if earlier is not None and not earlier.status.is_machinery:
            continue
        handle = handle_for(cell)
        if isinstance(handle, (PrepareFailed, InfraProblem)):
            continue
        chosen = () if select[cell.id] == (WHOLE_SUITE,) else select[cell.id]
        run_ctx = replace(_phase_ctx(ctx, cell, by_id), phase=f"repeat{r}", select=chosen)
        with console.step(f"run {rid}"):
            result = _run_one(backend, cell, handle, run_ctx, progress, console.say)
        results.append(ctx.run_dir, result)


def artifacts_dir(run_dir: Path, cell: Cell) -> Path:
    """Cross-version artifacts, one directory per candidate stack: production's main run writes
    `<pool>-<topology>/production-main/production/`; each candidate gets `<pool>-<topology>/<label>/`
    with a copy of production's artifacts to read and its own `candidate/` to write; that
    candidate's rollback (production reading it) uses the same directory."""
    pool, topo = cell.comparison_key
    group = run_dir / "artifacts" / f"{pool}-{topo}"
    if cell.role is Role.PRODUCTION:
        return group / "production-main"
    return group / cell.stack.label


def _phase_ctx(ctx: RunContext, cell: Cell, by_id: Mapping[str, Cell]) -> RunContext:
    """The main-phase context of a cell, with its artifacts directory ready."""
    target = artifacts_dir(ctx.run_dir, cell)
    target.mkdir(parents=True, exist_ok=True)
    base = by_id.get(cell.baseline)
    refused: tuple[str, ...] = ()
    if cell.role is Role.CANDIDATE and base is not None:
        written = artifacts_dir(ctx.run_dir, base) / "production"
        if written.is_dir():
            refused = copy_artifacts(written, target / "production", ctx.run_dir)
    return replace(ctx, phase="main", against=None, artifacts=target, refused_links=refused)


def copy_artifacts(source: Path, target: Path, run_dir: Path) -> tuple[str, ...]:
    """Copy what production wrote for a candidate to read, never following a link out of the run
    directory (a test could leave one to /etc/passwd, and the bundle would hold a copy of it): such a
    link is not copied, and is returned ("<path> -> <where it points>") as evidence that cannot be used."""
    refused: list[str] = []
    inside = run_dir.resolve()

    def ignore(folder: str, names: list[str]) -> set[str]:
        skip = set()
        for name in names:
            path = Path(folder) / name
            if path.is_symlink():
                where = path.resolve()
                if where != inside and inside not in where.parents:
                    refused.append(f"{path.relative_to(source)} -> {path.readlink()}")
                    skip.add(name)
        return skip

    shutil.copytree(source, target, dirs_exist_ok=True, symlinks=True, ignore=ignore)
    return tuple(refused)


def _run_one(backend: Backend, cell: Cell, handle: Handle, ctx: RunContext, progress: Progress,
             say: Printer) -> CellResult:
    label = ctx.result_id(cell)

    def did_not_run(status: Status, reason: str, log_tail: str = "") -> CellResult:
        return CellResult(cell_id=label, role=cell.role, status=status, reason=reason, log_tail=log_tail,
                          cell=cell.to_json(), phase=ctx.phase, against=ctx.against.id if ctx.against else "")

    if isinstance(handle, InfraProblem):
        return ctx.mask.result(did_not_run(Status.INFRA_ERROR, str(handle)))
    if isinstance(handle, PrepareFailed):
        return ctx.mask.result(did_not_run(Status.BUILD_FAILED, str(handle), handle.log_tail))
    say(f"run {label}")
    progress.begin(label)
    try:
        result = run_cell(backend, cell, handle, ctx)
    except InfraError as exc:
        result = did_not_run(Status.INFRA_ERROR, str(exc))
    environment = {**result.environment, "env_reused": handle.reused, "env_prepare_s": round(handle.prepare_s, 1)}
    if "packages" not in environment and handle.sbom.get("packages"):  # the environment's own SBOM
        environment["packages"] = handle.sbom["packages"]
    if ctx.suite_deps:
        environment["suite_requirements"] = ctx.suite_deps
    result = ctx.mask.result(replace(result, environment=environment))
    cell_dir = ctx.run_dir / "cells" / label
    for folder in (cell_dir, *cell_dir.glob(f"{ATTEMPT_PREFIX}*")):  # what the nodes and pytest wrote there
        ctx.mask.scrub(folder)
    say(f"  {label}: {result.status.value} in {result.duration_s:.0f}s {result.reason[:200]}")
    return result


__all__ = ["exit_code", "load", "run", "write_reports"]
