"""Everything a report shows, assembled once from the run's results."""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stackgate.evidence import Evidence, GateOutcome, MetricComparison
from stackgate.history import TrendPoint
from stackgate.model import ROLLBACK, Cell, CellResult, NotHere, Pruned, Reason, Severity, Status
from stackgate.rundir.results import stack_pairs

SCHEMA_VERSION = 1
KEY_PACKAGES = ("torch", "triton", "numpy", "nvidia-nccl", "nvidia-cudnn", "nvidia-cublas", "nvidia-cuda-runtime")


@dataclass(frozen=True)
class PackageChange:
    name: str
    production: str | None
    candidate: str | None

    @property
    def kind(self) -> str:
        if self.production is None:
            return "added"
        if self.candidate is None:
            return "removed"
        return "changed"


@dataclass(frozen=True)
class StackDiff:
    production_cell: str
    candidate_cell: str
    facts: tuple[tuple[str, str, str], ...]  # (what, production, candidate)
    packages: tuple[PackageChange, ...]


@dataclass(frozen=True)
class RunReport:
    run_id: str
    matrix: str
    channel: str
    started: str
    finished: str
    gate: GateOutcome
    gating_exit_code: int
    cells: tuple[Cell, ...]
    results: Mapping[str, CellResult]
    not_here: tuple[NotHere, ...]
    pruned: tuple[Pruned, ...]
    diffs: tuple[StackDiff, ...]
    options: Mapping[str, Any] = field(default_factory=dict)
    trends: Mapping[str, Sequence[TrendPoint]] = field(default_factory=dict)  # same run definition only
    host_probe: Mapping[str, Any] = field(default_factory=dict)  # pool -> the host probe's result on this runner
    power: Mapping[str, Any] = field(default_factory=dict)  # "cell metric" -> what the gate detects (calibrate)
    nightly: Mapping[str, str] = field(default_factory=dict)  # last_green, first_red_after (from the history)
    vuln_db: str = ""  # the OSV database the stacks were scanned against ("": not scanned)

    @property
    def evidence(self) -> Evidence:
        return self.gate.evidence

    @property
    def gating_verdict(self) -> str:
        """The binary verdict a pipeline gates on: INCONCLUSIVE counts as NO-GO unless policy says otherwise."""
        decision = self.gate.verdict.decision.value
        if decision == "INCONCLUSIVE":
            return "GO" if self.gating_exit_code == 0 else "NO-GO"
        return decision

    @property
    def rollbacks(self) -> list[CellResult]:
        """Production reading each candidate's artifacts, one result per candidate."""
        return [self.results[k] for k in sorted(self.results) if self.results[k].phase == ROLLBACK]

    def result_rows(self) -> list[tuple[Cell, CellResult | None]]:
        rows: list[tuple[Cell, CellResult | None]] = [(c, self.results.get(c.id)) for c in self.cells]
        return rows


def _packages(result: CellResult) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in result.environment.packages:
        if " @ " in line:  # a local project's wheel: its version is in the file name
            name, url = (part.strip() for part in line.split(" @ ", 1))
            version = url.rsplit("/", 1)[-1]
            if version.endswith(".whl") and version.count("-") >= 4:
                version = version.split("-")[1]
            out[re.sub(r"[-_.]+", "-", name).lower()] = version
        elif "==" in line:
            name, version = line.split("==", 1)
            out[re.sub(r"[-_.]+", "-", name).lower()] = version
    return out


def stack_diffs(cells: Sequence[Cell], results: Mapping[str, CellResult]) -> tuple[StackDiff, ...]:
    """What changed between each production cell and its candidates, from captured environments."""
    out = []
    for base, cand, bres, cres in stack_pairs(cells, results):
        shown = bres.environment.to_json(), cres.environment.to_json()  # what each recorded, the suite's own keys too
        facts = [(key, str(shown[0].get(key)), str(shown[1].get(key)))
                 for key in ("torch", "cuda", "nccl", "cudnn", "triton", "python", "numpy", "nvidia_driver",
                             "cuda_driver_api", "cuda_compat_in_use")]
        libraries = _mapped(bres), _mapped(cres)
        facts += [(f"mapped {lib}", libraries[0].get(lib, "-"), libraries[1].get(lib, "-"))
                  for lib in sorted(set(libraries[0]) | set(libraries[1]))]
        bp, cp = _packages(bres), _packages(cres)
        changes = [PackageChange(n, bp.get(n), cp.get(n)) for n in sorted(set(bp) | set(cp)) if bp.get(n) != cp.get(n)]
        changes.sort(key=lambda ch: (not ch.name.startswith(KEY_PACKAGES), ch.name))
        out.append(StackDiff(base.id, cand.id, tuple(facts), tuple(changes)))
    return tuple(out)


def _mapped(result: CellResult) -> dict[str, str]:
    """library -> the files of it the cell's processes had mapped, each with its origin ("env": the
    stack's environment, shown from its site-packages on; "system"; "outside")."""
    return {lib: "; ".join(f"{f.path.split('/site-packages/', 1)[-1]} ({f.origin})" for f in files)
            for lib, files in result.environment.mapped_libraries.items()}


def performance_rows(comparisons: Sequence[MetricComparison]) -> tuple[list[MetricComparison], list[MetricComparison]]:
    """The gated comparisons (regressions first, then inconclusive, then the rest) and the ungated
    ones (largest change first): what a reader must act on comes first."""
    order = {"regression": 0, "inconclusive": 1, "ok": 2, "improvement": 3}
    gated = sorted((c for c in comparisons if c.gated),
                   key=lambda c: (order.get(c.comparison.outcome.value, 4), c.cell, c.metric))
    ungated = sorted((c for c in comparisons if not c.gated),
                     key=lambda c: (-abs(c.comparison.value_change()) if math.isfinite(c.comparison.value_change())
                                    else -math.inf, c.cell, c.metric))
    return gated, ungated


def blocking_findings(report: RunReport) -> set[tuple[str, str, str]]:
    """(advisory, package, stack) of each vulnerability that blocks the verdict."""
    out = set()
    for r in report.gate.verdict.reasons:
        if r.kind == "vulnerability" and r.severity is Severity.BLOCKING:
            about = dict(r.subject)
            out.add((about.get("advisory", ""), about.get("package", ""), about.get("stack", "")))
    return out


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# INFO reasons each report shows in a section of its own, not under "Notes"
OWN_SECTION = ("new-warning", "not-run-here", "preexisting-failure")


def notes(report: RunReport) -> list[Reason]:
    """What a reader should know that decides nothing (a process the suite left running, a test the
    upgrade fixed): the same list in every report."""
    return [r for r in report.gate.verdict.reasons if r.severity is Severity.INFO and r.kind not in OWN_SECTION]


def counts(report: RunReport) -> dict[str, int]:
    out: dict[str, int] = {}
    for _, result in report.result_rows():
        status = result.status.value if result else "no-result"
        out[status] = out.get(status, 0) + 1
    out[Status.NOT_RUN_HERE.value] = len(report.not_here)
    out["pruned"] = len(report.pruned)
    return out


@dataclass(frozen=True)
class StackImageRow:
    stack: str  # the stack's label
    image: str  # repo@sha256:... when it came from (or went to) the registry, else the local tag
    image_id: str
    cells: tuple[str, ...]


def stack_image_rows(found: Mapping[str, CellResult]) -> list[StackImageRow]:
    """The image each stack's cells ran (one row per stack and image), for the reports."""
    rows: dict[tuple[str, str, str], list[str]] = {}
    for cell_id, result in sorted(found.items()):
        env = result.environment
        if env.stack_label:
            key = (env.stack_label, env.image_digest or env.image, env.image_id)
            rows.setdefault(key, []).append(cell_id)
    return [StackImageRow(*key, tuple(cells)) for key, cells in sorted(rows.items())]
