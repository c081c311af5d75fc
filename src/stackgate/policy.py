"""matrix/policy.toml: required cells and tests, performance tolerances, numerics, waivers."""

from __future__ import annotations

import datetime as dt
import fnmatch
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stackgate import tomlfile


@dataclass(frozen=True)
class MetricRule:
    name: str
    tolerance: float
    devices: tuple[str, ...]
    tags: tuple[tuple[str, str], ...]

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


@dataclass(frozen=True)
class Waiver:
    cells: str
    tests: str
    reason: str
    link: str
    expires: dt.date
    line: int | None

    def matches(self, cell: str, test: str) -> bool:
        return fnmatch.fnmatchcase(cell, self.cells) and fnmatch.fnmatchcase(test or "", self.tests)


@dataclass(frozen=True)
class Policy:
    path: Path | None
    inconclusive_exit_code: int = 1
    required_cells: tuple[str, ...] = ()
    required_tests: tuple[str, ...] = ()
    candidate_tests: tuple[str, ...] = ()
    confidence: float = 0.95
    resamples: int = 2000
    min_samples: int = 3
    performance: tuple[MetricRule, ...] = ()
    numerics: tuple[NumericsRule, ...] = ()
    waivers: tuple[Waiver, ...] = ()

    def metric_rule(self, name: str, tags: dict[str, str], device: str) -> MetricRule | None:
        return next((r for r in self.performance if r.applies(name, tags, device)), None)

    def numerics_rule(self, name: str) -> NumericsRule | None:
        return next((r for r in self.numerics if fnmatch.fnmatchcase(name, r.name)), None)


def load_policy(path: Path) -> Policy:
    doc = tomlfile.load(path)
    d = doc.data
    tomlfile.check_keys(doc, d, ["gate", "required", "performance", "numerics", "waiver"])
    gate = tomlfile.get(doc, d, "gate", dict, default={})
    tomlfile.check_keys(doc, gate, ["inconclusive_exit_code"], "gate")
    req = tomlfile.get(doc, d, "required", dict, default={})
    tomlfile.check_keys(doc, req, ["cells", "tests", "candidate_tests"], "required")
    perf = tomlfile.get(doc, d, "performance", dict, default={})
    tomlfile.check_keys(doc, perf, ["confidence", "resamples", "min_samples", "metric"], "performance")
    rules = []
    for row in tomlfile.get(doc, perf, "metric", list, "performance", default=[]):
        tomlfile.check_keys(doc, row, ["name", "tolerance", "devices", "tags"], "performance", "metric")
        tags = tomlfile.get(doc, row, "tags", dict, "performance", "metric", default={})
        rules.append(MetricRule(
            name=tomlfile.get(doc, row, "name", str, "performance", "metric"),
            tolerance=float(tomlfile.get(doc, row, "tolerance", (float, int), "performance", "metric")),
            devices=tomlfile.str_list(doc, row, "devices", "performance", "metric", default=[]),
            tags=tuple(sorted((str(k), str(v)) for k, v in tags.items())),
        ))
    num = tomlfile.get(doc, d, "numerics", dict, default={})
    tomlfile.check_keys(doc, num, ["metric"], "numerics")
    numerics = []
    for row in tomlfile.get(doc, num, "metric", list, "numerics", default=[]):
        tomlfile.check_keys(doc, row, ["name", "rtol", "atol", "steps"], "numerics", "metric")
        numerics.append(NumericsRule(
            name=tomlfile.get(doc, row, "name", str, "numerics", "metric"),
            rtol=float(tomlfile.get(doc, row, "rtol", (float, int), "numerics", "metric", default=0.0)),
            atol=float(tomlfile.get(doc, row, "atol", (float, int), "numerics", "metric", default=0.0)),
            steps=int(tomlfile.get(doc, row, "steps", int, "numerics", "metric", default=0)),
        ))
    waivers = []
    for index, row in enumerate(tomlfile.get(doc, d, "waiver", list, default=[])):
        tomlfile.check_keys(doc, row, ["cells", "tests", "reason", "link", "expires"], "waiver")
        expires: Any = tomlfile.get(doc, row, "expires", (dt.date, str), "waiver")
        if isinstance(expires, str):
            try:
                expires = dt.date.fromisoformat(expires)
            except ValueError:
                raise doc.error(f"waiver 'expires' must be a date (YYYY-MM-DD), got {expires!r}", "waiver",
                                "expires") from None
        reason = tomlfile.get(doc, row, "reason", str, "waiver")
        waivers.append(Waiver(
            cells=tomlfile.get(doc, row, "cells", str, "waiver", default="*"),
            tests=tomlfile.get(doc, row, "tests", str, "waiver", default="*"),
            reason=reason,
            link=tomlfile.get(doc, row, "link", str, "waiver", default=""),
            expires=expires,
            line=_nth(doc, "[[waiver]]", index),
        ))
    return Policy(
        path=path,
        inconclusive_exit_code=tomlfile.get(doc, gate, "inconclusive_exit_code", int, "gate", default=1),
        required_cells=tomlfile.str_list(doc, req, "cells", "required", default=[]),
        required_tests=tomlfile.str_list(doc, req, "tests", "required", default=[]),
        candidate_tests=tomlfile.str_list(doc, req, "candidate_tests", "required", default=[]),
        confidence=float(tomlfile.get(doc, perf, "confidence", (float, int), "performance", default=0.95)),
        resamples=tomlfile.get(doc, perf, "resamples", int, "performance", default=2000),
        min_samples=tomlfile.get(doc, perf, "min_samples", int, "performance", default=3),
        performance=tuple(rules),
        numerics=tuple(numerics),
        waivers=tuple(waivers),
    )


def _nth(doc: tomlfile.Doc, header: str, index: int) -> int | None:
    seen = -1
    for number, raw in enumerate(doc.lines, start=1):
        if raw.strip().startswith(header):
            seen += 1
            if seen == index:
                return number
    return None
