"""Whether a candidate's new failure holds: the reruns of a test that failed in the candidate's main
run and not in production's, in both stacks (`repeats.new_failures` plans them), read here for the
gate: a failure that repeats in the candidate only is a regression; one a rerun does not repeat is
flaky; one production repeats on a rerun is not caused by the upgrade."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from stackgate.model import Cell, CellResult, Outcome, PhaseKind
from stackgate.rundir import results


def is_failure(outcome: str) -> bool:
    return outcome in ("failed", "error")


def reruns(cell: Cell, recorded: Mapping[str, CellResult]) -> list[CellResult]:
    """The cell's reruns of its new failures (or its candidate's), in round order."""
    return list(results.rounds(recorded, cell, PhaseKind.RERUN).values())


def _outcomes(name: str, runs: Sequence[CellResult]) -> list[str]:
    """The test's outcome in each run that ran the suite and recorded it (a skip is not an outcome)."""
    found = [next((Outcome(t.outcome).value for t in r.tests if t.name == name), "") for r in runs if r.status.ran_suite]
    return [o for o in found if o and o != "skipped"]


def confirmation(name: str, cand_reruns: Sequence[CellResult], prod_reruns: Sequence[CellResult]) -> tuple[str, str]:
    """What the reruns say of a test that failed in the candidate's main run and not in production's:
    ("flaky" | "production-fails" | "confirmed" | "unconfirmed", the evidence in words)."""
    cand, prod = _outcomes(name, cand_reruns), _outcomes(name, prod_reruns)
    passed = sum(o == "passed" for o in cand)
    prod_failed = sum(is_failure(o) for o in prod)
    if passed:
        return "flaky", (f"flaky: failed in the candidate's main run, passed in {passed} of {len(cand)} rerun(s)"
                         f"{f', failed in {len(cand) - passed}' if len(cand) > passed else ''}")
    if prod_failed:
        return "production-fails", (f"fails in production too, not caused by the upgrade: passed in production's main "
                                    f"run, failed in {prod_failed} of {len(prod)} of its rerun(s)")
    if cand:
        return "confirmed", (f"confirmed: failed in all {1 + len(cand)} candidate runs; production passed in "
                             f"{len(prod) + 1} run(s)")
    return "unconfirmed", "not confirmed: its reruns recorded no result for it"
