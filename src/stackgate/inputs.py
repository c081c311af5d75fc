"""What every command opens first: the configuration (compat table, matrix, production, fleet,
policy, wheel source, candidate versions, the suite's requirements), the expanded matrix and the cells
selected to run here, the suite and how it runs, and the run's definition (equal on every runner of
one fleet run). Run, dry run, calibrate, merge and bisect all start here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packaging.version import Version

from stackgate import bundle, fleet, matrix, osv, sources, suite_deps
from stackgate import compat as compat_mod
from stackgate import given as given_mod
from stackgate.console import Printer
from stackgate.errors import ConfigError
from stackgate.model import RunnerPool, WheelSource
from stackgate.options import Options, flag_of
from stackgate.policy import Policy, load_for_suite
from stackgate.shipped import BUNDLED_SUITE
from stackgate.suite import PLATFORM_CHECKS, SuiteSpec
from stackgate.suite_deps import SuiteDeps
from stackgate.versions import parse_torch


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
    given: given_mod.Probed | None = None  # --candidate-python: the candidate is this interpreter, probed
    production_given: given_mod.Probed | None = None  # --production-python


def load(opts: Options, env: Mapping[str, str], local: fleet.LocalHost) -> Loaded:
    cfg = opts.config_dir
    table = compat_mod.load_compat(cfg / "compat.toml")
    spec = matrix.load_matrix(opts.matrix)
    production = matrix.load_production(cfg / "production.toml")
    pools = fleet.assign_runner(fleet.load_pools(cfg / "fleet.toml", local), opts.pool, cfg / "fleet.toml")
    suite_path = opts.suite or BUNDLED_SUITE
    if not suite_path.exists():
        raise ConfigError(f"suite path {suite_path} does not exist", hint="--suite PATH to your pytest suite")
    policy = load_for_suite(suite=suite_path, bundled_suite=BUNDLED_SUITE, config_dir=cfg, explicit=opts.policy,
                            platform_checks=opts.platform_checks, platform_files=PLATFORM_CHECKS)
    if opts.repeats is not None:
        policy = replace(policy, repeats=opts.repeats)
    if opts.confirm_repeats is not None:
        policy = replace(policy, confirm_repeats=opts.confirm_repeats)
    if opts.pairing is not None:
        policy = replace(policy, pairing=opts.pairing)
    if opts.vuln_db is not None:
        policy = replace(policy, supply=replace(policy.supply, database=opts.vuln_db))
    if policy.supply.database is not None:
        osv.load(policy.supply.database)  # a database that cannot be read is exit 2 before anything runs
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
    deps = suite_deps.discover(suite_path, opts.suite_requirements, opts.suite_install)
    candidate, baseline = _given(_with_declared(opts, spec))
    if candidate is not None:  # the candidate's identity is what its interpreter holds
        return Loaded(table, spec, production, pools, policy, source, host_pip, (candidate.torch,), deps, candidate,
                      baseline)
    wanted = (opts.candidate,) if opts.candidate else spec.torch
    versions = []
    for text in wanted:
        if text == "nightly":
            versions.append(sources.newest_nightly(source, host_pip, opts.nightly_version, matrix.wheel_target(spec)))
        else:
            versions.append(parse_torch(text, what="candidate torch version"))
    for v in versions:
        if table.release(v) is None:
            raise ConfigError(f"torch {v} is not a release known to {table.path}",
                              hint=f"add a [torch.\"{v.major}.{v.minor}\"] row, or pick one of "
                                   f"{', '.join(sorted(table.torch))}")
        oldest = baseline.torch if baseline is not None else production.torch
        if v.public and Version(v.public) < Version(oldest.public):
            raise ConfigError(f"candidate torch {v} is older than production {production.torch} "
                              f"({production.path})", hint="a rollback test is the production run; pass a newer candidate")
    return Loaded(table, spec, production, pools, policy, source, host_pip, tuple(versions), deps, None, baseline)


def _with_declared(opts: Options, spec: matrix.MatrixSpec) -> Options:
    """The matrix's `[[stack]]` tables, where the command line names no stack for that role."""
    for d in spec.stacks:
        given_here = (opts.candidate_python, opts.candidate_image) if d.role == "candidate" else (
            opts.production_python, opts.production_image)
        if any(v is not None for v in given_here):
            continue
        changes: dict[str, Any] = ({f"{d.role}_python": Path(d.ref)} if d.kind == given_mod.HOST
                                   else {f"{d.role}_image": d.ref, "image_python": d.python})
        where = f"{spec.path} [[stack]]"
        opts = replace(opts, **changes, sources={**opts.sources, **dict.fromkeys(changes, where)})
    return opts


def _given(opts: Options) -> tuple[given_mod.Probed | None, given_mod.Probed | None]:
    """The interpreters given as the candidate and the production stack, probed (never modified)."""
    for a, b in (("candidate_python", "candidate_image"), ("production_python", "production_image")):
        if getattr(opts, a) is not None and getattr(opts, b) is not None:
            raise ConfigError(f"{flag_of(a)} and {flag_of(b)} both name the stack: give one")
    candidate = baseline = None
    if opts.candidate_python is not None:
        candidate = given_mod.probe_host(opts.candidate_python)
        given_mod.check_declared(candidate, opts.candidate, "--candidate-python")
    if opts.candidate_image is not None:
        candidate = _probe_image(opts.candidate_image, opts.image_python)
        given_mod.check_declared(candidate, opts.candidate, "--candidate-image")
    if opts.production_python is not None:
        baseline = given_mod.probe_host(opts.production_python)
    if opts.production_image is not None:
        baseline = _probe_image(opts.production_image, opts.image_python)
    return candidate, baseline


def _probe_image(ref: str, python: str) -> given_mod.Probed:
    from stackgate.backends import docker
    return docker.probe_image(ref, python)


def expand(loaded: Loaded, pools: Mapping[str, RunnerPool] | None = None) -> matrix.Expansion:
    """The matrix over `pools` (default: the loaded ones), pruned, paired, and with "required"
    resolved once from the matrix globs and the policy."""
    expansion = matrix.expand(loaded.spec, pools if pools is not None else loaded.pools, loaded.production,
                              loaded.table, torch_versions=loaded.torch, source=loaded.source, given=loaded.given,
                              production_given=loaded.production_given)
    return matrix.require(expansion, loaded.policy.required_cells,
                          where=(loaded.policy.path, loaded.policy.required_cells_line))


def select(opts: Options, loaded: Loaded, *, shard: bool = True) -> matrix.Expansion:
    """The cells of the expanded matrix that run here (`--only`, `--shard`)."""
    return matrix.select(expand(loaded), opts.only, opts.shard if shard else None)


def runnable(opts: Options, loaded: Loaded) -> matrix.Expansion:
    """`select`, refusing a selection with no cell that can run on this machine."""
    chosen = select(opts, loaded)
    if not chosen.cells:
        away = "; ".join(f"{n.cell.id}: {n.reason}" for n in chosen.not_here[:3])
        raise ConfigError(f"the matrix {opts.matrix} has zero cells that can run on this machine"
                          + (f" (--only {' '.join(opts.only)})" if opts.only else ""),
                          hint=(f"not run here: {away}" if away else "check --only and the matrix axes")
                          + f"; pruned: {len(chosen.pruned)}")
    return chosen


def suite_spec(opts: Options, *, platform_checks: bool, host: Mapping[str, str] | None = None) -> SuiteSpec:
    """The suite and how it runs; its environment beyond the contract is what the user passes: the
    `--suite-env` pairs, and the `--pass-env` names' values from `host` (see `masking`)."""
    explicit = opts.suite_env
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


def definition(opts: Options, loaded: Loaded) -> dict[str, str]:
    """What this run is (see `bundle.definition`): equal on every runner of one fleet run."""
    return bundle.definition(matrix=opts.matrix, config_dir=opts.config_dir, candidate=loaded.torch,
                             policy=loaded.policy, suite=opts.suite or BUNDLED_SUITE, profile=opts.profile,
                             pytest_args=(*opts.pytest_args, *(f"--test={t}" for t in opts.tests)),
                             platform_checks=opts.platform_checks,
                             suite_requirements=loaded.deps.fingerprint())
