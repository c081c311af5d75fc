"""Gate policy: required cells and tests, performance tolerances, numerics, waivers.

A policy belongs to the suite it was written for: the bundled suite's is `<config-dir>/policy.toml`;
a user's suite uses `stackgate-policy.toml` beside it, or by default "every collected test must pass
in every required cell" (plus the platform checks' own required tests when those run).
"""

from __future__ import annotations

import datetime as dt
import fnmatch
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from stackgate import tomlfile
from stackgate.errors import ConfigError
from stackgate.model import Reason

SUITE_POLICY = "stackgate-policy.toml"
METHODS = ("bootstrap", "threshold")
DEVICES = ("cpu", "cuda")  # model.Cell.device
SUMMARIES = ("median", "best")
PreexistingRule = Literal["go", "inconclusive"]
PREEXISTING: tuple[PreexistingRule, ...] = ("go", "inconclusive")
MAX_PRESSURE = 0.6  # docs/performance.md "A verdict that holds on a busy runner": quiet 4%, two busy loops 43-51%
FlakyRule = Literal["inconclusive", "go", "no-go"]
Pairing = Literal["sequential", "concurrent"]
PAIRINGS: tuple[Pairing, ...] = ("sequential", "concurrent")
FLAKY: tuple[FlakyRule, ...] = ("inconclusive", "go", "no-go")


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
    unrated: Literal["list", "block"] = "list"  # a finding no record rates: listed, or counted as at the threshold
    max_growth: float = 0.10  # the candidate's image (or environment) may grow this share over production's...
    max_growth_bytes: int = 500_000_000  # ... and at most this many bytes
    size_over: Literal["no-go", "inconclusive"] = "no-go"


@dataclass(frozen=True)
class Policy:
    path: Path | None
    inconclusive_exit_code: int = 1
    # a test that fails in the candidate and in production is not caused by the upgrade: listed, and it
    # leaves the verdict GO ("go", a user suite's default) or makes it INCONCLUSIVE ("inconclusive")
    preexisting_failures: PreexistingRule = "go"
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
    # how the two runs of a pair of the interleaved repeats are taken: one after the other, in alternating
    # order ("sequential"), or at the same time, each stack on its own share of the runner's CPUs, the shares
    # swapped pair by pair ("concurrent", duet benchmarking: a runner whose speed drifts on every core at
    # once slows both runs of a pair alike; then the gated comparison is over those pairs alone)
    pairing: Pairing = "sequential"
    performance: tuple[MetricRule, ...] = ()
    numerics: tuple[NumericsRule, ...] = ()
    waivers: tuple[Waiver, ...] = ()
    supply: SupplyRules = SupplyRules()
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

    def metric_rule(self, name: str, tags: dict[str, str], device: str) -> MetricRule | None:
        return next((r for r in self.performance if r.applies(name, tags, device)), None)

    def numerics_rule(self, name: str) -> NumericsRule | None:
        return next((r for r in self.numerics if fnmatch.fnmatchcase(name, r.name)), None)


def load_policy(path: Path) -> Policy:
    doc = tomlfile.load(path)
    d = doc.data
    tomlfile.check_keys(doc, d, ["gate", "required", "performance", "numerics", "waiver", "vulnerabilities", "size"])
    gate = tomlfile.get(doc, d, "gate", dict, default={})
    tomlfile.check_keys(doc, gate, ["inconclusive_exit_code", "preexisting_failures", "confirm_failures",
                                     "flaky_failures"], "gate")
    preexisting = tomlfile.get(doc, gate, "preexisting_failures", str, "gate", default="go")
    if preexisting not in PREEXISTING:
        raise doc.error(f"preexisting_failures = {preexisting!r}", "gate", "preexisting_failures",
                        hint='use "go" (a test failing in production too is listed, not held against the '
                             'candidate) or "inconclusive"')
    flaky = tomlfile.get(doc, gate, "flaky_failures", str, "gate", default="inconclusive")
    if flaky not in FLAKY:
        raise doc.error(f"flaky_failures = {flaky!r}", "gate", "flaky_failures",
                        hint='use "inconclusive" (a failure a rerun does not repeat leaves the verdict '
                             'INCONCLUSIVE), "go" (listed, not held against the candidate) or "no-go"')
    req = tomlfile.get(doc, d, "required", dict, default={})
    tomlfile.check_keys(doc, req, ["cells", "tests", "candidate_tests", "all_tests", "metrics"], "required")
    perf = tomlfile.get(doc, d, "performance", dict, default={})
    tomlfile.check_keys(doc, perf, ["confidence", "resamples", "min_samples", "repeats", "confirm_repeats",
                                     "max_pressure", "pressure_reruns", "pairing", "metric"], "performance")
    rules = []
    for index, row in enumerate(tomlfile.get(doc, perf, "metric", list, "performance", default=[])):
        tomlfile.check_keys(doc, row, ["name", "tolerance", "devices", "tags", "method", "summary"],
                            "performance", "metric")
        tags = tomlfile.get(doc, row, "tags", dict, "performance", "metric", default={})
        method = tomlfile.get(doc, row, "method", str, "performance", "metric", default="bootstrap")
        if method not in METHODS:
            raise doc.error(f"unknown method {method!r}", "performance", "metric", "method",
                            hint="use 'bootstrap' (many samples) or 'threshold' (one value)")
        summary = tomlfile.get(doc, row, "summary", str, "performance", "metric", default="median")
        if summary not in SUMMARIES:
            raise doc.error(f"unknown summary {summary!r}", "performance", "metric", "summary",
                            hint="use 'median' (each run's median sample) or 'best' (its best sample)")
        for device in tomlfile.str_list(doc, row, "devices", "performance", "metric", default=[]):
            if device not in DEVICES:
                raise doc.error(f"devices = {device!r} is not a device", "performance", "metric", "devices",
                                hint="use " + " or ".join(f'"{d}"' for d in DEVICES) + " (a rule for a device no cell "
                                     "has gates nothing)")
        rules.append(MetricRule(
            name=tomlfile.get(doc, row, "name", str, "performance", "metric"),
            tolerance=_in_range(doc, row, "tolerance", 0.0, None, "performance", "metric"),
            devices=tomlfile.str_list(doc, row, "devices", "performance", "metric", default=[]),
            tags=tuple(sorted((str(k), str(v)) for k, v in tags.items())),
            method=method,
            summary=summary,
            line=_nth(doc, "[[performance.metric]]", index),
        ))
    num = tomlfile.get(doc, d, "numerics", dict, default={})
    tomlfile.check_keys(doc, num, ["metric"], "numerics")
    numerics = []
    for index, row in enumerate(tomlfile.get(doc, num, "metric", list, "numerics", default=[])):
        tomlfile.check_keys(doc, row, ["name", "rtol", "atol", "steps"], "numerics", "metric")
        numerics.append(NumericsRule(
            name=tomlfile.get(doc, row, "name", str, "numerics", "metric"),
            rtol=_in_range(doc, row, "rtol", 0.0, None, "numerics", "metric", default=0.0),
            atol=_in_range(doc, row, "atol", 0.0, None, "numerics", "metric", default=0.0),
            steps=int(_in_range(doc, row, "steps", 0, None, "numerics", "metric", default=0, kind=int)),
            line=_nth(doc, "[[numerics.metric]]", index),
        ))
    waivers = []
    for index, row in enumerate(tomlfile.get(doc, d, "waiver", list, default=[])):
        tomlfile.check_keys(doc, row, ["cells", "tests", "reason", "link", "expires"], "waiver")
        expires = _date(doc, row, "expires", "waiver")
        reason = tomlfile.get(doc, row, "reason", str, "waiver")
        cells = tomlfile.get(doc, row, "cells", str, "waiver", default="*")
        tests = tomlfile.get(doc, row, "tests", str, "waiver", default="*")
        if cells.strip() in ("", "*") and tests.strip() in ("", "*"):
            raise ConfigError(f"[[waiver]] ({reason[:60]!r}) names no cells and no tests: it would waive everything, "
                              "including a candidate that never ran", path=path, line=_nth(doc, "[[waiver]]", index),
                              hint="name what it waives: cells = \"<cell id glob>\" and/or tests = \"<file::test glob>\"")
        waivers.append(Waiver(
            cells=cells,
            tests=tests,
            reason=reason,
            link=tomlfile.get(doc, row, "link", str, "waiver", default=""),
            expires=expires,
            line=_nth(doc, "[[waiver]]", index),
        ))
    supply, allowed = _supply(doc, path)
    confidence = _in_range(doc, perf, "confidence", 0.5, 0.9999, "performance", default=0.95)
    pairing = _choice(doc, perf, "pairing", PAIRINGS, "sequential", "performance")
    exit_code = int(_in_range(doc, gate, "inconclusive_exit_code", 0, 1, "gate", default=1, kind=int))
    return Policy(
        path=path,
        inconclusive_exit_code=exit_code,
        preexisting_failures="inconclusive" if preexisting == "inconclusive" else "go",
        confirm_failures=int(_in_range(doc, gate, "confirm_failures", 0, 10, "gate", default=2, kind=int)),
        flaky_failures=next(f for f in FLAKY if f == flaky),
        required_cells=tomlfile.str_list(doc, req, "cells", "required", default=[]),
        required_cells_line=doc.line_of("required", "cells") if "cells" in req else None,
        required_tests=tomlfile.str_list(doc, req, "tests", "required", default=[]),
        candidate_tests=tomlfile.str_list(doc, req, "candidate_tests", "required", default=[]),
        all_tests_required=tomlfile.get(doc, req, "all_tests", bool, "required", default=False),
        required_metrics=tomlfile.str_list(doc, req, "metrics", "required", default=[]),
        origin=str(path),
        confidence=confidence,
        resamples=int(_in_range(doc, perf, "resamples", 200, 20_000, "performance", default=2000, kind=int)),
        min_samples=int(_in_range(doc, perf, "min_samples", 1, None, "performance", default=3, kind=int)),
        repeats=int(_in_range(doc, perf, "repeats", 1, 100, "performance", default=1, kind=int)),
        confirm_repeats=int(_in_range(doc, perf, "confirm_repeats", 1, 100, "performance", default=5, kind=int)),
        max_pressure=_in_range(doc, perf, "max_pressure", 0.0, 1.0, "performance", default=MAX_PRESSURE),
        pressure_reruns=int(_in_range(doc, perf, "pressure_reruns", 0, 20, "performance", default=3, kind=int)),
        pairing=next(p for p in PAIRINGS if p == pairing),
        performance=tuple(rules),
        numerics=tuple(numerics),
        waivers=tuple(waivers) + allowed,
        supply=supply,
    )


def _date(doc: tomlfile.Doc, row: dict[str, Any], key: str, *where: str) -> dt.date:
    value: Any = tomlfile.get(doc, row, key, (dt.date, str), *where)
    if isinstance(value, str):
        try:
            value = dt.date.fromisoformat(value)
        except ValueError:
            raise doc.error(f"'{key}' must be a date (YYYY-MM-DD), got {value!r}", *where, key) from None
    return value  # type: ignore[no-any-return]


def _choice(doc: tomlfile.Doc, table: dict[str, Any], key: str, choices: tuple[str, ...], default: str,
            *where: str) -> str:
    value = tomlfile.get(doc, table, key, str, *where, default=default)
    if value not in choices:
        raise doc.error(f"{key} = {value!r}", *where, key, hint="use one of: " + ", ".join(f'"{c}"' for c in choices))
    return str(value)


def _supply(doc: tomlfile.Doc, path: Path) -> tuple[SupplyRules, tuple[Waiver, ...]]:
    """[vulnerabilities] (database, threshold, inherited, unrated, [[vulnerabilities.allow]]) and [size]."""
    vuln = tomlfile.get(doc, doc.data, "vulnerabilities", dict, default={})
    tomlfile.check_keys(doc, vuln, ["database", "threshold", "inherited", "unrated", "allow"], "vulnerabilities")
    database = tomlfile.get(doc, vuln, "database", str, "vulnerabilities", default="")
    threshold = _choice(doc, vuln, "threshold", ("LOW", "MODERATE", "HIGH", "CRITICAL"), "HIGH", "vulnerabilities")
    allowed = []
    for index, row in enumerate(tomlfile.get(doc, vuln, "allow", list, "vulnerabilities", default=[])):
        where = ("vulnerabilities", "allow")
        tomlfile.check_keys(doc, row, ["id", "package", "stacks", "reason", "review_by", "link"], *where)
        allowed.append(Waiver(cells="*", tests="*", reason=tomlfile.get(doc, row, "reason", str, *where),
                              link=tomlfile.get(doc, row, "link", str, *where, default=""),
                              expires=_date(doc, row, "review_by", *where), line=_nth(doc, "[[vulnerabilities.allow]]", index),
                              advisory=tomlfile.get(doc, row, "id", str, *where),
                              package=tomlfile.get(doc, row, "package", str, *where, default="*"),
                              stacks=tomlfile.get(doc, row, "stacks", str, *where, default="*")))
    size = tomlfile.get(doc, doc.data, "size", dict, default={})
    tomlfile.check_keys(doc, size, ["max_growth", "max_growth_mb", "over"], "size")
    rules = SupplyRules(
        database=(path.parent / database).resolve() if database else None,
        threshold=threshold,
        inherited=next(f for f in FLAKY if f == _choice(doc, vuln, "inherited", FLAKY, "go", "vulnerabilities")),
        unrated="block" if _choice(doc, vuln, "unrated", ("list", "block"), "list", "vulnerabilities") == "block"
        else "list",
        max_growth=_in_range(doc, size, "max_growth", 0.0, None, "size", default=0.10),
        max_growth_bytes=int(_in_range(doc, size, "max_growth_mb", 0.0, None, "size", default=500.0) * 1_000_000),
        size_over="inconclusive" if _choice(doc, size, "over", ("no-go", "inconclusive"), "no-go", "size")
        == "inconclusive" else "no-go")
    return rules, tuple(allowed)


def _in_range(doc: tomlfile.Doc, table: dict[str, Any], key: str, low: float, high: float | None, *where: str,
              default: Any = ..., kind: type = float) -> float:
    """A number within [low, high], or a ConfigError with file:line that says the range."""
    kinds: tuple[type, ...] = (int,) if kind is int else (float, int)
    value = tomlfile.get(doc, table, key, kinds, *where, default=default)
    if value < low or (high is not None and value > high):
        bound = f"between {low:g} and {high:g}" if high is not None else f">= {low:g}"
        raise doc.error(f"'{key}' = {value!r} is out of range: must be {bound}", *where, key)
    return float(value)


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


def _nth(doc: tomlfile.Doc, header: str, index: int) -> int | None:
    seen = -1
    for number, raw in enumerate(doc.lines, start=1):
        if raw.strip().startswith(header):
            seen += 1
            if seen == index:
                return number
    return None
