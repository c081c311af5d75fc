from __future__ import annotations

import datetime as dt
import random
from dataclasses import replace
from pathlib import Path

from stackgate import gate, selftest, stats
from stackgate.model import Decision, Metric, NotHere, Severity, Status, TestOutcome
from stackgate.policy import Policy, Waiver, load_policy

ROOT = Path(__file__).resolve().parents[2]
POLICY = load_policy(ROOT / "matrix" / "policy.toml")
TODAY = dt.date(2026, 11, 29)


def _noisy(centre: float, noise: float, seed: int, n: int = 30) -> list[float]:
    rng = random.Random(seed)
    return [centre * (1 + rng.gauss(0, noise)) for _ in range(n)]


def test_ten_percent_slowdown_with_low_noise_is_a_regression() -> None:
    c = stats.compare(_noisy(100, 0.01, 1), _noisy(110, 0.01, 2), better="lower", tolerance=0.05)
    assert c.outcome is stats.Outcome.REGRESSION and c.low > 0.05


def test_one_percent_change_is_ok() -> None:
    c = stats.compare(_noisy(100, 0.01, 1), _noisy(101, 0.01, 2), better="lower", tolerance=0.05)
    assert c.outcome is stats.Outcome.OK and c.high <= 0.05


def test_ten_percent_with_high_noise_is_inconclusive() -> None:
    c = stats.compare(_noisy(100, 0.30, 1, 8), _noisy(110, 0.30, 2, 8), better="lower", tolerance=0.05)
    assert c.outcome is stats.Outcome.INCONCLUSIVE and c.low < 0.05 < c.high


def test_higher_is_better_metrics_and_few_samples() -> None:
    c = stats.compare(_noisy(100, 0.01, 1), _noisy(80, 0.01, 2), better="higher", tolerance=0.10)
    assert c.outcome is stats.Outcome.REGRESSION  # bandwidth dropped 20%
    assert stats.compare([1.0], [2.0], better="lower", tolerance=0.1).outcome is stats.Outcome.INCONCLUSIVE


def test_parity_reports_bitwise_and_drift() -> None:
    assert stats.parity([1.0, 0.5], [1.0, 0.5], rtol=0, atol=0).bitwise
    p = stats.parity([1.0, 0.5, 0.25], [1.0, 0.5, 0.3], rtol=1e-3, atol=0)
    assert not p.within and p.worst_index == 2
    assert stats.parity([1.0, 0.5, 0.25], [1.0, 0.5, 0.3], rtol=1e-3, atol=0, steps=2).within


def _pair() -> tuple:
    """The selftest's clean pair: the recorded run of the bundled suite, on a GPU pool."""
    rec = selftest.recorded("cuda")
    return rec.production, rec.candidate, rec.results[rec.production.id], rec.candidate_result


def test_gate_go_on_clean_recorded_run() -> None:
    prod, cand, pres, cres = _pair()
    out = gate.decide((prod, cand), (), {prod.id: pres, cand.id: cres}, POLICY, TODAY)
    assert out.verdict.decision is Decision.GO
    assert any(r.kind == "numerics" and "bitwise" in r.message for r in out.verdict.reasons)


def test_every_selftest_fault_is_caught() -> None:
    for case in selftest.CASES:
        ok, outcome = selftest.run_case(case, POLICY, TODAY)
        assert ok, (case.name, outcome.verdict)


def test_failing_baseline_makes_it_inconclusive_not_go() -> None:
    prod, cand, pres, cres = _pair()
    pres = replace(pres, status=Status.TIMEOUT, reason="the suite exceeded the cell timeout")
    out = gate.decide((prod, cand), (), {prod.id: pres, cand.id: cres}, POLICY, TODAY)
    assert out.verdict.decision is Decision.INCONCLUSIVE
    assert any("production baseline" in r.message for r in out.verdict.reasons)


def test_required_test_skipped_or_missing_is_inconclusive() -> None:
    prod, cand, pres, cres = _pair()
    tests = tuple(replace(t, outcome="skipped", message="no artifacts") if "crossversion" in t.name else t
                  for t in cres.tests)
    out = gate.decide((prod, cand), (), {prod.id: pres, cand.id: replace(cres, tests=tests)}, POLICY, TODAY)
    assert out.verdict.decision is Decision.INCONCLUSIVE
    assert any(r.kind == "required-test-skipped" for r in out.verdict.reasons)
    out = gate.decide((prod, cand), (), {prod.id: pres}, POLICY, TODAY)
    assert any(r.kind == "missing-result" for r in out.verdict.reasons)


def test_not_run_here_is_reported_and_inconclusive_only_when_required() -> None:
    prod, cand, pres, cres = _pair()
    away = NotHere(replace(cand, required=False), "runner pool p5 is not this machine")
    out = gate.decide((prod, cand), (away,), {prod.id: pres, cand.id: cres}, POLICY, TODAY)
    assert out.verdict.decision is Decision.GO
    assert any(r.kind == "not-run-here" and r.severity is Severity.INFO for r in out.verdict.reasons)
    away = NotHere(cand, "runner pool p5 is not this machine")
    out = gate.decide((prod, cand), (away,), {prod.id: pres, cand.id: cres}, POLICY, TODAY)
    assert out.verdict.decision is Decision.INCONCLUSIVE


def test_waiver_turns_red_into_waived_until_it_expires() -> None:
    prod, cand, pres, cres = _pair()
    name = "test_transport.py::test_nccl_transport_matches_pool"
    failing = replace(cres, status=Status.FAILED,
                      tests=tuple(TestOutcome(t.name, "failed", 1, "expected efa") if t.name == name else t
                                  for t in cres.tests))
    waiver = Waiver(cells="*", tests="test_transport.py::*", reason="aws-ofi-nccl#584",
                    link="https://github.com/aws/aws-ofi-nccl/issues/584", expires=dt.date(2026, 12, 31), line=1)
    policy: Policy = replace(POLICY, waivers=(waiver,))
    out = gate.decide((prod, cand), (), {prod.id: pres, cand.id: failing}, policy, TODAY)
    assert out.verdict.decision is Decision.GO
    assert any(r.severity is Severity.WAIVED and "waived until 2026-12-31" in r.message for r in out.verdict.reasons)
    out = gate.decide((prod, cand), (), {prod.id: pres, cand.id: failing}, policy, dt.date(2027, 1, 1))
    assert out.verdict.decision is Decision.NO_GO
    assert any(r.kind == "waiver-expired" for r in out.verdict.reasons)


def test_new_warnings_are_listed_as_work_items() -> None:
    prod, cand, pres, cres = _pair()
    pres = replace(pres, warnings=("FutureWarning: old",))
    cres = replace(cres, warnings=("FutureWarning: old", "FutureWarning: `torch.jit.load` is deprecated"))
    out = gate.decide((prod, cand), (), {prod.id: pres, cand.id: cres}, POLICY, TODAY)
    assert out.evidence.new_warnings == {cand.id: ("FutureWarning: `torch.jit.load` is deprecated",)}
    assert out.verdict.decision is Decision.GO


def test_busbw_regression_per_message_size_is_gated_on_gpu() -> None:
    prod, cand, pres, cres = _pair()
    def bw(centre: float, seed: int) -> Metric:
        return Metric("busbw", "GB/s", tuple(_noisy(centre, 0.01, seed, 10)), "collective_bandwidth", "higher",
                      (("collective", "all_reduce"), ("size", "16777216")))
    pres = replace(pres, metrics=(*pres.metrics, bw(100, 3)))
    cres = replace(cres, metrics=(*cres.metrics, bw(70, 4)))
    out = gate.decide((prod, cand), (), {prod.id: pres, cand.id: cres}, POLICY, TODAY)
    assert out.verdict.decision is Decision.NO_GO
    assert any(r.kind == "regression" and "busbw[collective=all_reduce,size=16777216]" in r.message
               for r in out.verdict.blocking)


def test_infrastructure_error_is_inconclusive_not_no_go() -> None:
    prod, cand, pres, cres = _pair()
    cres = replace(cres, status=Status.INFRA_ERROR, reason="lost the Docker engine", tests=())
    out = gate.decide((prod, cand), (), {prod.id: pres, cand.id: cres}, POLICY, TODAY)
    assert out.verdict.decision is Decision.INCONCLUSIVE
    assert any(r.kind == "cell-infra-error" for r in out.verdict.reasons)


def test_selftest_fails_when_a_gated_metric_cannot_be_decided_on_a_device() -> None:
    """The bug selftest exists to catch: peak memory is one value per run; gated by bootstrap (which
    needs >= min_samples) no GPU candidate could ever be GO."""
    rules = tuple(replace(r, method="bootstrap") if r.name == "vit.peak_memory" else r for r in POLICY.performance)
    clean_gpu = next(c for c in selftest.CASES if c.name == "clean run (GPU pool)")
    ok, outcome = selftest.run_case(clean_gpu, replace(POLICY, performance=rules), TODAY)
    assert not ok and outcome.verdict.decision is Decision.INCONCLUSIVE
    assert any("vit.peak_memory" in r.message and "only 1 samples" in r.message for r in outcome.verdict.reasons)


def test_the_vectorised_bootstrap_draws_exactly_what_the_loop_over_choices_draws() -> None:
    """The gate's intervals did not move when the bootstrap went to numpy: the same resamples, medians and
    changes, bit for bit, over sample sets holding zeros, negatives, huge values, inf and NaN."""
    import math
    import random

    rnd = random.Random(7)
    pools = ([0.0, -1.0, 1.0, 2.0, 1e308, 1e-308, math.inf], [math.nan, 1.0, 2.0], [0.0, 1.0, 2.0, 3.0])
    for trial in range(240):
        pool = pools[trial % 4] if trial % 4 < 3 else None
        def draw(n: int, pool: list[float] | None = pool) -> list[float]:
            return [rnd.choice(pool) if pool else rnd.uniform(0.001, 10) for _ in range(n)]
        base, cand = draw(rnd.randint(1, 40)), draw(rnd.randint(1, 40))
        for better in ("lower", "higher"):
            seed = rnd.randint(0, 2**40)
            fast = stats.bootstrap_changes(base, cand, better=better, resamples=100, seed=seed)
            loop = stats.bootstrap_changes_loop(base, cand, better=better, resamples=100, seed=seed)
            assert repr(fast) == repr(loop), (base, cand, better, seed)
