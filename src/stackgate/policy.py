"""Gate policy: required cells and tests, performance tolerances, numerics, waivers.

A policy belongs to the suite it was written for: the bundled suite's is `<config-dir>/policy.toml`;
a user's suite uses `stackgate-policy.toml` beside it, or by default "every collected test must pass
in every required cell" (plus the platform checks' own required tests when those run).
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import get_args

from stackgate import tomlfile
from stackgate.boundary.policy import (
    FlakyRule,
    HarnessRule,
    Pairing,
    PolicyFile,
    PreexistingRule,
    SizeRule,
    UnratedRule,
)
from stackgate.errors import ConfigError
from stackgate.model import Reason

SUITE_POLICY = "stackgate-policy.toml"
MAX_PRESSURE = 0.6  # docs/performance.md "A verdict that holds on a busy runner": quiet 4%, two busy loops 43-51%
PAIRINGS: tuple[Pairing, ...] = get_args(Pairing)
PRESSURE_CLOCKS = ("wall", "device")
NOISE_BUDGET_S = 300.0


@dataclass(frozen=True)
class MetricRule:
    """`bootstrap`: the confidence interval of the ratio of medians must clear the tolerance (needs
    samples); `threshold`: a single value (peak memory) may be at most `tolerance` worse. With
    interleaved repeats each run is summarised by `summary`: its median step (default), or its best
    (fastest step, highest bandwidth): interference on a shared runner only ever adds time, so the
    best step of a CPU-bound workload moves far less from run to run, but it is blind to a change
    that only makes some steps slower."""

    name: str
    tolerance: float
    devices: tuple[str, ...]
    tags: tuple[tuple[str, str], ...]
    method: str = "bootstrap"
    summary: str = "median"
    line: int | None = None  # where it is written, for the reason that says it matched nothing

    def applies(self, metric_name: str, tags: dict[str, str], device: str) -> bool:
        if not fnmatch.fnmatchcase(metric_name, self.name):
            return False
        if self.devices and device not in self.devices:
            return False
        return all(k in tags and fnmatch.fnmatchcase(tags[k], pattern) for k, pattern in self.tags)


@dataclass(frozen=True)
class NumericsRule:
    name: str
    rtol: float
    atol: float
    steps: int
    line: int | None = None


@dataclass(frozen=True)
class Waiver:
    cells: str
    tests: str
    reason: str
    link: str
    expires: dt.date
    line: int | None

    # an allow-list entry of [vulnerabilities]: `advisory` (an id or alias) and package/stack globs; past
    # its `review_by` (`expires`) it stops counting and is itself a blocking reason
    advisory: str = ""
    package: str = "*"
    stacks: str = "*"

    def covers(self, reason: Reason) -> bool:
        if not self.advisory:
            return fnmatch.fnmatchcase(reason.cell, self.cells) and fnmatch.fnmatchcase(reason.test or "", self.tests)
        about = dict(reason.subject)
        names = {about.get("advisory", ""), *about.get("aliases", "").split()}
        return (reason.kind.startswith("vulnerability") and self.advisory in names
                and fnmatch.fnmatchcase(about.get("package", ""), self.package)
                and fnmatch.fnmatchcase(about.get("stack", ""), self.stacks))


@dataclass(frozen=True)
class SupplyRules:
    """[vulnerabilities] and [size]: what of a stack's supply chain blocks a rollout."""

    database: Path | None = None  # an OSV database on disk (`--vuln-db` overrides)
    threshold: str = "HIGH"  # a finding at or above it, with a fixed version, new in the candidate: NO-GO
    inherited: FlakyRule = "go"  # such a finding in production too: listed ("go"), "inconclusive" or "no-go"
    unrated: UnratedRule = "list"  # a finding no record rates: listed, or counted as at the threshold
    max_growth: float = 0.10  # the candidate's image (or environment) may grow this share over production's...
    max_growth_bytes: int = 500_000_000  # ... and at most this many bytes
    size_over: SizeRule = "no-go"


@dataclass(frozen=True)
class DriftRule:
    """When production's canary on a pool has moved (`[watch]`): its median is more than `tolerance`
    away from the median of its last `runs` canaries there (of the same suite and profile), and more
    than `spread_k` times their spread (the median absolute deviation, scaled to a standard deviation),
    with at least `min_runs` of them recorded."""

    tolerance: float = 0.15
    runs: int = 10
    min_runs: int = 5
    spread_k: float = 3.0


@dataclass(frozen=True)
class Policy:
    path: Path | None
    inconclusive_exit_code: int = 1
    # a test that fails in the candidate and in production is not caused by the upgrade: listed, and it
    # leaves the verdict GO ("go", a user suite's default) or makes it INCONCLUSIVE ("inconclusive")
    preexisting_failures: PreexistingRule = "go"
    # a failure in both stacks that passes when production runs it as plain pytest, outside the harness
    # (the fidelity rerun of a user's suite), was made by the harness: INCONCLUSIVE (default), or "go"
    # (listed, not held against the run); never pre-existing
    harness_failures: HarnessRule = "inconclusive"
    # a test that passed in production and failed in the candidate runs again this many times in both
    # stacks, interleaved, before it counts: failing every time in the candidate only is a regression
    confirm_failures: int = 2
    # a failure that a rerun does not repeat is flaky: INCONCLUSIVE (default), or it counts as "go"
    # (listed, not held against the candidate) or "no-go" (a flaky test is a regression too)
    flaky_failures: FlakyRule = "inconclusive"
    required_cells: tuple[str, ...] = ()
    required_cells_line: int | None = None  # where `[required] cells` is written, for errors
    required_tests: tuple[str, ...] = ()
    candidate_tests: tuple[str, ...] = ()
    all_tests_required: bool = False  # every test the production cell ran must pass in the candidate too
    required_metrics: tuple[str, ...] = ()  # globs: metrics every required cell must record
    origin: str = ""  # where this policy came from, for the report
    confidence: float = 0.95
    resamples: int = 2000
    min_samples: int = 3
    repeats: int = 1  # runs of the performance-gated tests per cell, interleaved production/candidate
    # when `repeats` runs cannot settle a gated metric (inconclusive, or a regression not yet seen over
    # this many runs), its tests run again, interleaved, until this many runs in all; then the gate decides
    confirm_repeats: int = 5
    # a run pair of the performance-gated tests taken while the runner's interference (the largest of
    # CPU pressure, steal and throttling over the run, `pressure.py`) exceeded this share is not used;
    # up to `pressure_reruns` more interleaved rounds replace such pairs
    max_pressure: float = MAX_PRESSURE
    pressure_reruns: int = 3
    # the clocks whose runs interference moves (docs/performance.md, session 53): a pair taken beyond
    # max_pressure is dropped for the metrics on these clocks only; a metric on another clock (the CPU
    # clock: the rank processes' own CPU time, which waiting for a CPU does not add to) uses every pair
    pressure_clocks: tuple[str, ...] = PRESSURE_CLOCKS
    # the most wall time spent on more interleaved rounds after confirmation, for the gated metrics the
    # runs cannot settle yet (noise) or have too few quiet pairs for (interference), before INCONCLUSIVE
    noise_budget_s: float = NOISE_BUDGET_S
    # how the two runs of a pair of the interleaved repeats are taken: one after the other, in alternating
    # order ("sequential"), or at the same time, each stack on its own share of the runner's CPUs, the shares
    # swapped pair by pair ("concurrent", duet benchmarking: a runner whose speed drifts on every core at
    # once slows both runs of a pair alike; then the gated comparison is over those pairs alone)
    pairing: Pairing = "sequential"
    performance: tuple[MetricRule, ...] = ()
    numerics: tuple[NumericsRule, ...] = ()
    waivers: tuple[Waiver, ...] = ()
    supply: SupplyRules = SupplyRules()
    drift: DriftRule = DriftRule()  # `stackgate watch`'s canary
    # every performance and numerics rule must match a metric the run recorded (a typo gates nothing);
    # off for the default policy of a user's suite, whose rules come from the bundled suite's
    rules_must_match: bool = True

    @property
    def concurrent(self) -> bool:
        """The repeats' pairs run at the same time: then the gated comparison is over them alone (the
        main runs, one after the other, are not such a pair), and `repeats` of them are made."""
        return self.pairing == "concurrent"

    def repeat_rounds(self) -> range:
        """The rounds of interleaved repeats after the main run: `repeats` runs of each stack in all
        (the main run one of them), or, with concurrent pairs, `repeats` pairs besides the main run."""
        return range(1, self.repeats + 1 if self.concurrent and self.repeats > 1 else self.repeats)

    def pressure_limit(self, tags: Mapping[str, str]) -> float:
        """The interference beyond which a run pair is not used for a metric with these tags:
        `max_pressure` on a clock in `pressure_clocks` (the `clock` tag; none: wall), none (inf) on the others."""
        return self.max_pressure if tags.get("clock", "wall") in self.pressure_clocks else math.inf

    def metric_rule(self, name: str, tags: dict[str, str], device: str) -> MetricRule | None:
        return next((r for r in self.performance if r.applies(name, tags, device)), None)

    def numerics_rule(self, name: str) -> NumericsRule | None:
        return next((r for r in self.numerics if fnmatch.fnmatchcase(name, r.name)), None)


def load_policy(path: Path) -> Policy:
    """The policy file, validated whole (`boundary.policy.PolicyFile`: an unknown key, a wrong type,
    a number out of its range or not finite, a choice that is not one is exit 2 at its line), then
    what the model cannot say: a waiver must name what it waives."""
    doc = tomlfile.load(path)
    f = tomlfile.validate(doc, PolicyFile)
    for index, row in enumerate(f.waiver):
        if row.cells.strip() in ("", "*") and row.tests.strip() in ("", "*"):
            raise ConfigError(f"[[waiver]] ({row.reason[:60]!r}) names no cells and no tests: it would waive "
                              "everything, including a candidate that never ran", path=path,
                              line=doc.nth_header("waiver", index),
                              hint="name what it waives: cells = \"<cell id glob>\" and/or tests = \"<file::test glob>\"")
    perf, vuln, size = f.performance, f.vulnerabilities, f.size
    rules = tuple(MetricRule(name=r.name, tolerance=r.tolerance, devices=tuple(r.devices),
                             tags=tuple(sorted(r.tags.items())), method=r.method,
                             summary=r.summary, line=doc.nth_header("performance.metric", i))
                  for i, r in enumerate(perf.metric))
    numerics = tuple(NumericsRule(name=r.name, rtol=r.rtol, atol=r.atol, steps=r.steps,
                                  line=doc.nth_header("numerics.metric", i)) for i, r in enumerate(f.numerics.metric))
    waivers = tuple(Waiver(cells=w.cells, tests=w.tests, reason=w.reason, link=w.link, expires=w.expires,
                           line=doc.nth_header("waiver", i)) for i, w in enumerate(f.waiver))
    allowed = tuple(Waiver(cells="*", tests="*", reason=a.reason, link=a.link, expires=a.review_by,
                           line=doc.nth_header("vulnerabilities.allow", i), advisory=a.id, package=a.package,
                           stacks=a.stacks) for i, a in enumerate(vuln.allow))
    supply = SupplyRules(database=(path.parent / vuln.database).resolve() if vuln.database else None,
                         threshold=vuln.threshold, inherited=vuln.inherited, unrated=vuln.unrated,
                         max_growth=size.max_growth, max_growth_bytes=int(size.max_growth_mb * 1_000_000),
                         size_over=size.over)
    req = f.required
    return Policy(
        path=path,
        inconclusive_exit_code=f.gate.inconclusive_exit_code,
        preexisting_failures=f.gate.preexisting_failures,
        harness_failures=f.gate.harness_failures,
        confirm_failures=f.gate.confirm_failures,
        flaky_failures=f.gate.flaky_failures,
        required_cells=tuple(req.cells),
        required_cells_line=doc.line_of("required", "cells") if "cells" in req.model_fields_set else None,
        required_tests=tuple(req.tests),
        candidate_tests=tuple(req.candidate_tests),
        all_tests_required=req.all_tests,
        required_metrics=tuple(req.metrics),
        origin=str(path),
        confidence=perf.confidence,
        resamples=perf.resamples,
        min_samples=perf.min_samples,
        repeats=perf.repeats,
        confirm_repeats=perf.confirm_repeats,
        max_pressure=perf.max_pressure if perf.max_pressure is not None else MAX_PRESSURE,
        pressure_reruns=perf.pressure_reruns,
        pressure_clocks=tuple(perf.pressure_clocks),
        noise_budget_s=perf.noise_budget_s,
        pairing=perf.pairing,
        performance=rules,
        numerics=numerics,
        waivers=waivers + allowed,
        supply=supply,
        drift=DriftRule(f.watch.drift_tolerance, f.watch.baseline_runs, f.watch.min_baseline_runs, f.watch.spread_k),
    )


def load_for_suite(*, suite: Path, bundled_suite: Path, config_dir: Path, explicit: Path | None,
                   platform_checks: bool, platform_files: tuple[str, ...]) -> Policy:
    """The policy that belongs to the suite being run (see the module docstring)."""
    if explicit is not None:
        return load_policy(explicit)
    bundled_policy = load_policy(config_dir / "policy.toml")
    if suite.resolve() == bundled_suite.resolve():
        return bundled_policy
    own = (suite if suite.is_dir() else suite.parent) / SUITE_POLICY
    if own.is_file():
        return load_policy(own)
    platform = tuple(t for t in bundled_policy.required_tests if t.split("::")[0] in platform_files)
    return replace(bundled_policy, required_tests=platform if platform_checks else (), candidate_tests=(),
                   required_metrics=(),
                   all_tests_required=True,
                   preexisting_failures="go",
                   rules_must_match=False,
                   origin=f"default for a user suite (no {own} found): every test collected in production must "
                          f"pass in each required candidate cell" + ("; plus the platform checks' required tests"
                                                                      if platform_checks else ""))
