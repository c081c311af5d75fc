"""report.json. Schema (schema_version 1):

    schema_version: int            -- bumped on incompatible change
    verdict: "GO" | "NO-GO"        -- what a pipeline gates on (INCONCLUSIVE maps per policy)
    decision: "GO" | "NO-GO" | "INCONCLUSIVE"
    exit_code: int
    run: {id, matrix, channel, started, finished, options}
    reasons: [{severity, kind, cell, test, message, subject?}]   -- subject: {advisory, aliases, package, stack}
                   for the supply chain's reasons
    cells: [{id, role, required, pool, device, topology, stack, status, reason, duration_s,
             tests: [{name, outcome, duration_s, message}], metrics: [{name, unit, samples, tags, better}],
             warnings, environment}]
    not_run_here: [{id, reason}]
    pruned: [{id, reasons}]
    comparisons: [{cell, baseline, metric, unit, base_median, cand_median, better: lower | higher,
                   ratio, value_change, value_ci: [low, high], reading: better | worse | same,
                   change, ci_low, ci_high, tolerance, outcome, gated, method: bootstrap | threshold | paired}]
                   -- ratio = cand/base and value_change = ratio - 1 are in the metric's own terms (a 7.3x
                   bandwidth is +6.34); change/ci_low/ci_high are the gate's (worse is positive: -0.864 there)
    numerics: [{cell, baseline, metric, bitwise, within, worst_step, worst_abs, worst_rel, rtol, atol}]
    stack_diff: [{production_cell, candidate_cell, facts: [{what, production, candidate}],
                  packages: [{name, production, candidate, kind}]}]
    new_warnings: {cell: [warning]}
    preexisting_failures: [{cell, baseline, test, candidate, production}]   -- failed in both stacks:
                   not caused by the upgrade (reasons of kind "preexisting-failure")
    trends: {metric: [{run_id, started, role, value}]}   -- the last runs of the same matrix and suite,
                   metrics this run's own suite recorded
    host_probe: {pool: {status, evidence, facts}}   -- the runner checked against its pool's declaration
    vulnerability_database: path | null   -- null: the stacks were not scanned
    supply_chain: [{cell, production, candidate, added, inherited, fixed_by_upgrade}]   -- per candidate
                   stack beside production; production/candidate: {stack, scanned, why_not, findings:
                   [{advisory, aliases, package, ecosystem, installed, severity, fixed, summary}], packages,
                   unread, image_size, env_size, largest_packages, loader_copies}
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from stackgate.report.data import SCHEMA_VERSION, RunReport, stack_image_rows
from stackgate.report.files import atomic_write


def _num(x: float) -> float | None:
    return None if math.isinf(x) or math.isnan(x) else round(x, 6)


def to_json(report: RunReport, exit_code: int) -> dict[str, Any]:
    cells = []
    for cell, result in report.result_rows():
        row: dict[str, Any] = cell.to_json()
        if result is None:
            row.update(status="no-result", reason="", tests=[], metrics=[], warnings=[], environment={})
        else:
            data = result.to_json()
            row.update({k: data[k] for k in ("status", "reason", "duration_s", "tests", "metrics", "warnings",
                                              "environment")})
        cells.append(row)
    ev = report.evidence
    return {
        "schema_version": SCHEMA_VERSION,
        "verdict": report.gating_verdict,
        "decision": report.gate.verdict.decision.value,
        "exit_code": exit_code,
        "run": {"id": report.run_id, "matrix": report.matrix, "channel": report.channel,
                "started": report.started, "finished": report.finished, "options": dict(report.options)},
        "reasons": [r.to_json() for r in report.gate.verdict.reasons],
        "cells": cells,
        "stack_images": [{"stack": r.stack, "image": r.image, "image_id": r.image_id, "cells": list(r.cells)}
                         for r in stack_image_rows(report.results)],
        "rollback": [r.to_json() for r in report.rollbacks],
        "not_run_here": [{"id": n.cell.id, "reason": n.reason, "cell": n.cell.to_json()} for n in report.not_here],
        "pruned": [{"id": p.cell.id, "reasons": list(p.reasons)} for p in report.pruned],
        "comparisons": [
            {"cell": c.cell, "baseline": c.baseline, "metric": c.metric, "unit": c.unit,
             "base_median": c.comparison.base_median, "cand_median": c.comparison.cand_median,
             "better": c.comparison.better, "ratio": _num(c.comparison.ratio),
             "value_change": _num(c.comparison.value_change()),
             "value_ci": [_num(x) for x in c.comparison.value_interval], "reading": c.comparison.word,
             "change": _num(c.comparison.change), "ci_low": _num(c.comparison.low), "ci_high": _num(c.comparison.high),
             "tolerance": c.comparison.tolerance, "outcome": c.comparison.outcome.value, "gated": c.gated,
             "method": c.comparison.method, **({"statistic": c.comparison.statistic, "pairs": c.comparison.pairs,
                                                "apart": c.comparison.apart, "noise": _num(c.comparison.noise),
                                                "pairing": "concurrent" if c.comparison.together else "sequential"}
                                               if c.comparison.method == "paired" else {})}
            for c in ev.comparisons
        ],
        "numerics": [
            {"cell": p.cell, "baseline": p.baseline, "metric": p.metric, "bitwise": p.parity.bitwise,
             "within": p.parity.within, "worst_step": p.parity.worst_index, "worst_abs": p.parity.worst_abs,
             "worst_rel": _num(p.parity.worst_rel), "rtol": p.rtol, "atol": p.atol}
            for p in ev.parity
        ],
        "stack_diff": [
            {"production_cell": d.production_cell, "candidate_cell": d.candidate_cell,
             "facts": [{"what": w, "production": a, "candidate": b} for w, a, b in d.facts],
             "packages": [{"name": p.name, "production": p.production, "candidate": p.candidate, "kind": p.kind}
                          for p in d.packages]}
            for d in report.diffs
        ],
        "new_warnings": {k: list(v) for k, v in ev.new_warnings.items()},
        "preexisting_failures": [{"cell": k.cell, "baseline": k.baseline, "test": k.test, "candidate": k.candidate,
                                  "production": k.production} for k in ev.preexisting],
        "trends": {k: [vars(p) for p in v] for k, v in report.trends.items()},
        "host_probe": dict(report.host_probe),
        "power": dict(report.power),
        "nightly": dict(report.nightly),
        "vulnerability_database": report.vuln_db or None,
        "supply_chain": [pair.to_json() for pair in ev.supply],
    }


def write(report: RunReport, path: Path, exit_code: int) -> None:
    # json.dumps escapes control characters (\u0000, \u001b): quoted output stays intact and safe
    atomic_write(path, json.dumps(to_json(report, exit_code), indent=2, sort_keys=False, default=str))
