"""The policy's rules against what the run recorded: a performance or numerics rule that matches no
metric of a cell it applies to gates nothing, so it is a reason of its own (INCONCLUSIVE where a
required cell ran), naming the rule, where it is written and the closest names recorded. And the
kinds of reason no waiver covers: missing or unreadable evidence."""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Mapping, Sequence

from stackgate.model import Cell, CellResult, Metric, Reason, Severity, Status
from stackgate.policy import MetricRule, NumericsRule, Policy

# what no waiver covers: evidence that is missing or cannot be read is never waived into a GO
UNWAIVABLE = frozenset({"bad-record", "missing-result", "missing-metric", "no-candidate", "no-baseline",
                        "bad-artifact", "unreadable-evidence", "unmatched-rule", "metric-mismatch"})


def unmatched(candidates: Sequence[Cell], results: Mapping[str, CellResult], policy: Policy) -> list[Reason]:
    """Each rule of `policy` (performance, numerics) that matches no metric recorded by the candidate
    cells of its devices that ran their suite (and their production partners)."""
    out = []
    where = policy.path.name if policy.path is not None else "policy"
    every: list[MetricRule | NumericsRule] = [*policy.performance, *policy.numerics]
    for rule in every:
        devices = rule.devices if isinstance(rule, MetricRule) else ()
        cells = [c for c in candidates if (not devices or c.device in devices)
                 and (r := results.get(c.id)) is not None and r.status in (Status.PASSED, Status.FAILED)]
        if not cells:
            continue
        recorded = [(c, m) for c in cells for res in (results[c.id], results.get(c.baseline)) if res is not None
                    for m in res.metrics]
        if any(_matches(rule, m, c.device) for c, m in recorded):
            continue
        names = sorted({m.key for _, m in recorded} | {m.name for _, m in recorded})
        close = difflib.get_close_matches(_shown(rule), names, n=3, cutoff=0.6)
        kind = "performance" if rule in policy.performance else "numerics"
        line = f"{where}:{rule.line}" if rule.line else where
        hint = f"; did you mean {', '.join(close)}?" if close else ("; recorded: " + ", ".join(names[:8]) if names else
                                                                     "; no metric was recorded")
        severity = Severity.INCONCLUSIVE if any(c.required for c in cells) else Severity.INFO
        out.append(Reason(severity, f"{kind} rule {_shown(rule)} ({line}) matches no metric recorded on "
                          f"{', '.join(sorted({c.device for c in cells}))}: it gates nothing{hint}", cell=cells[0].id,
                          kind="unmatched-rule"))
    return out


def _matches(rule: MetricRule | NumericsRule, metric: Metric, device: str) -> bool:
    if isinstance(rule, MetricRule):
        return rule.applies(metric.name, dict(metric.tags), device)
    return fnmatch.fnmatchcase(metric.name, rule.name)


def _shown(rule: MetricRule | NumericsRule) -> str:
    tags = rule.tags if isinstance(rule, MetricRule) else ()
    return rule.name + ("[" + ",".join(f"{k}={v}" for k, v in tags) + "]" if tags else "")
