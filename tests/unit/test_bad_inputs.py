"""Generated bad inputs at every boundary (tests/hostile.py): no exception but stackgate's own, no
hang, and never GO on evidence that is missing, broken or contradicted. A fixed, derandomized profile
bounds the time; `nox -s bad-inputs` runs >= 10,000 of them and prints the table."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings

from tests import hostile

CI = settings(max_examples=25, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("entry", list(hostile.ENTRY_POINTS))
def test_no_crash_no_hang_no_false_go(entry: str) -> None:
    strategy, check = hostile.ENTRY_POINTS[entry]

    @CI
    @given(strategy())
    def each(value: Any) -> None:
        assert hostile.outcome(lambda: check(value)) == "ok", value

    each()


def _fast_world() -> tuple[Any, ...]:
    fast = replace(hostile.PROD_RESULT, cell_id=hostile.CAND.id, role=hostile.CAND.role)
    return ((hostile.PROD, hostile.CAND), (), {hostile.PROD.id: hostile.PROD_RESULT, hostile.CAND.id: fast},
            hostile.POLICY, hostile.TODAY)


def test_the_checks_can_fail() -> None:
    """The oracle sees a false GO, a crash and a hang when there is one (a check that cannot fail is a defect)."""
    loss = hostile._dump(hostile.LOSS_RECORD) + b"\n"
    fast, slow = hostile._dump(hostile.FAST) + b"\n" + loss, hostile._dump(hostile.SLOW) + b"\n" + loss
    assert hostile.check_records(fast) == "ok" and hostile.check_records(slow) == "ok"  # GO and NO-GO, rightly
    go = hostile.gate.decide(*_fast_world())
    assert go.verdict.decision.value == "GO"
    with mock.patch.object(hostile.gate, "decide", return_value=go):  # a gate that says GO to anything
        assert hostile.check_records(fast) == "ok"  # the fast copy is the only gated measurement: GO is right
        assert hostile.check_records(slow) == "false-go"  # contradicted by the slow record
        assert hostile.check_records(loss) == "false-go"  # the gated metric is missing
        assert hostile.check_records(hostile._dump({**hostile.SLOW, "tags": {}}).replace(b"30.", b"10.") + b"\n"
                                     + hostile._dump({**hostile.SLOW, "samples": [99.0] * 12}) + b"\n") == "false-go"
    assert hostile.outcome(lambda: str(1 / 0)).startswith("crash: ZeroDivisionError")

    def forever() -> str:
        while True:
            pass

    manifest, lines = hostile._merge_world(1.0)  # a merged bundle whose candidate is as fast: GO
    assert hostile.check_merge((hostile._dump(manifest), b"\n".join(lines) + b"\n")) == "false-go"
    manifest, lines = hostile._merge_world()
    assert hostile.check_merge((hostile._dump(manifest), b"\n".join(lines) + b"\n")) == "ok"

    # watch: the promoted lock is clean; a lock naming another wheel path is a finding; a rollback check that
    # says clean to anything is caught
    got = hostile.check_watch((hostile.PYLOCK.encode(), [None] * 11))
    assert got == "ok", got
    moved = hostile.PYLOCK.replace('path = "wheels/', 'path = "elsewhere/').encode()
    assert hostile.check_watch((moved, [None] * 11)) == "ok"
    from stackgate import watch as checks
    with mock.patch.object(checks, "_lock_problems", return_value=[]):
        assert hostile.check_watch((moved, [None] * 11)) == "false-go"

    before, hostile.HANG_S = hostile.HANG_S, 1
    try:
        assert hostile.outcome(forever) == "hang"
    finally:
        hostile.HANG_S = before


def test_the_shipped_json_schemas_are_the_models() -> None:
    from stackgate.boundary import schemas
    assert schemas.stale() == []
    record = schemas.schemas()["suite-record"]
    assert "metric" in json.dumps(record) and "LOWER" not in json.dumps(record)


def test_a_phase_round_beyond_its_bound_is_not_a_result_and_no_loop() -> None:
    """`"phase": "repeat1000000000"` looped about 10^9 times in the gate's round walk; non-ASCII digits
    passed the pattern."""
    from stackgate.model import MAX_ROUND, Phase, PhaseKind
    assert Phase.parse(f"repeat{MAX_ROUND}") == Phase(PhaseKind.REPEAT, MAX_ROUND)
    for text in (f"repeat{MAX_ROUND + 1}", "repeat1000000000", "repeat٣", "aa" + "9" * 40):
        with pytest.raises(ValueError, match=r"phase"):
            Phase.parse(text)
    line = hostile._dump({"cell_id": "c@repeat1000000000", "role": "candidate", "status": "passed",
                          "phase": "repeat1000000000"})
    assert hostile.outcome(lambda: hostile.check_results(line + b"\n")) == "ok"
