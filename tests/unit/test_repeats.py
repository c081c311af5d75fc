"""Issue 11: interleaved repeats, per-run summaries, the paired statistic and the calibration
arithmetic, on recorded samples."""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from stackgate import calibrate, history, stats
from stackgate.backends.base import Execution
from stackgate.backends.memory import MemoryBackend, Script, answer
from stackgate.commands import calibrate as commands_calibrate
from stackgate.commands.calibrate import calibrate as calibrate_command
from stackgate.model import Cell, CellResult, GpuClass, Phase, Role, RunnerPool, Stack, Status, Topology
from stackgate.repeats import WHOLE_SUITE, merge_tests, repeat_order
from stackgate.suite import NodeCommand, NodeExit
from stackgate.versions import CudaVariant, parse_torch

from .conftest import RunMemory, memory_options, on_memory


def test_repeats_interleave_production_and_its_candidates() -> None:
    pool = RunnerPool("local", None, GpuClass.NONE, is_local=True)
    prod = Cell(Stack(parse_torch("2.13.0"), CudaVariant("cpu"), "3.11"), pool, Topology(1, 2), Role.PRODUCTION)
    c1 = Cell(Stack(parse_torch("2.14.1"), CudaVariant("cu130"), "3.11"), pool, Topology(1, 2), Role.CANDIDATE,
              baseline=prod.id)
    c2 = Cell(Stack(parse_torch("2.14.1"), CudaVariant("cu126"), "3.11"), pool, Topology(1, 2), Role.CANDIDATE,
              baseline=prod.id)
    order = repeat_order([prod, c1, c2], {c.id: c for c in (prod, c1, c2)}, range(1, 4))
    assert [(r, c.id) for r, c in order] == [(1, c1.id), (1, c2.id), (1, prod.id), (2, prod.id), (2, c1.id), (2, c2.id),
                                             (3, c1.id), (3, c2.id), (3, prod.id)]
    assert repeat_order([prod, c1], {c.id: c for c in (prod, c1)}, range(1, 1)) == []


def test_per_run_summaries_are_medians_of_each_run() -> None:
    assert stats.run_summaries([[1.0, 9.0, 2.0], [5.0], []]) == [2.0, 5.0]
    assert stats.run_summaries([[1.0, 9.0, 2.0], [5.0]], "best", "lower") == [1.0, 5.0]
    assert stats.run_summaries([[1.0, 9.0, 2.0], [5.0]], "best", "higher") == [9.0, 5.0]


def test_the_best_sample_sees_through_interference_that_only_adds_time() -> None:
    """Recorded shape (2026-12-01, this runner, A/A): a disturbed run's median moves tens of percent
    while its fastest step does not; a real 5% slowdown moves both."""
    calm = [1.90, 1.92, 1.95, 1.97, 2.00, 2.01, 2.02]
    disturbed = [1.91, 2.40, 2.60, 2.70, 2.75, 2.80, 2.90]
    base = [calm, disturbed, calm, disturbed]
    same = [disturbed, calm, disturbed, calm]  # A/A: interference hits the other side each time
    kw = {"better": "lower", "tolerance": 0.01}
    assert stats.paired(base, same, **kw).outcome is stats.Outcome.INCONCLUSIVE  # medians: +-35% per pair
    assert stats.paired(base, same, summary="best", **kw).outcome is stats.Outcome.OK
    slower = [[x * 1.05 for x in run] for run in same]
    best = stats.paired(base, slower, summary="best", **kw)
    assert best.outcome is stats.Outcome.REGRESSION and best.change == pytest.approx(0.05, abs=0.01)


def _runs(centre: float, drift: list[float], noise: float, seed: int) -> list[list[float]]:
    rng = random.Random(seed)
    return [[centre * d * (1 + rng.gauss(0, noise)) for _ in range(20)] for d in drift]


def test_paired_statistic_cancels_drift_that_hits_both() -> None:
    drift = [1.0, 1.3, 0.8, 1.15, 0.9, 1.25]  # the runner's speed changes between runs by up to 30%
    base = _runs(100, drift, 0.01, 1)
    slower = _runs(105, drift, 0.01, 2)  # a real 5% slowdown, run right after each production run
    cmp = stats.paired(base, slower, better="lower", tolerance=0.02)
    assert cmp.method == "paired" and cmp.outcome is stats.Outcome.REGRESSION and 0.04 < cmp.change < 0.06
    same = stats.paired(base, _runs(100, drift, 0.01, 3), better="lower", tolerance=0.02)
    assert same.outcome is stats.Outcome.OK


def test_paired_statistic_needs_two_pairs_and_orients_higher_is_better() -> None:
    assert stats.paired([[1.0]], [[2.0]], better="lower", tolerance=0.05).outcome is stats.Outcome.INCONCLUSIVE
    bw = stats.paired([[100.0], [101.0], [99.0]], [[80.0], [81.0], [79.5]], better="higher", tolerance=0.05)
    assert bw.outcome is stats.Outcome.REGRESSION and bw.change == pytest.approx(0.25, abs=0.01)


def test_t_quantiles_match_the_tables() -> None:
    for df, conf, table in [(1, 0.95, 12.706), (2, 0.95, 4.303), (4, 0.95, 2.776), (9, 0.95, 2.262),
                            (29, 0.95, 2.045), (9, 0.90, 1.833)]:
        assert stats.t_quantile(conf, df) == pytest.approx(table, rel=0.01)


def test_calibration_arithmetic() -> None:
    runs = [[100.0], [102.0], [100.0], [98.0], [100.0], [101.0], [100.0], [99.0]]  # A/A pairs: +2%, -2%, +1%, -1%
    found = calibrate.noise("recsys.step_time", runs)
    assert found is not None and found.pairs == 4
    logs = [math.log(1.02), math.log(0.98), math.log(1.01), math.log(0.99)]
    assert found.sigma == pytest.approx(math.sqrt(sum(x * x for x in logs) / 4), rel=1e-9)  # about 0: A/A
    rec = calibrate.recommend(found, target=0.05, allow=0.01)
    assert rec.tolerance == pytest.approx(0.03)  # halfway: 5% must end above it, 1% (and 0%) below it
    # planned at the noise's 80% upper bound (4 pairs: chi-square 0.2-quantile 1.649) for 95% power
    assert rec.planned == pytest.approx(found.sigma * math.sqrt(4 / 1.649), rel=0.01)
    power = calibrate.PLAN_POWER
    assert calibrate.detectable(rec.planned, rec.repeats, rec.tolerance, power=power) <= 0.05  # enough repeats ...
    assert calibrate.detectable(rec.planned, rec.repeats - 1, rec.tolerance, power=power) > 0.05  # ... and no more
    # the allowed change passes as OK with the same power: its interval's upper end stays below the tolerance
    margin = calibrate.detectable(rec.planned, rec.repeats, rec.tolerance, power=power) - rec.tolerance
    assert 0.01 + margin <= rec.tolerance
    assert "to detect 5.0% and pass 1.0% as OK: tolerance 3.0%" in rec.describe(0.05)
    wider = calibrate.recommend(found, target=0.05, allow=0.025)
    assert wider.tolerance == pytest.approx(0.0375) and wider.repeats > rec.repeats
    assert "not enough" not in rec.describe(0.05)
    loud = calibrate.recommend(calibrate.Noise("x", 0.3, 10), target=0.05, allow=0.01)
    assert loud.repeats == 100 and loud.detects > 0.05 and "not enough: 100 repeats detect" in loud.describe(0.05)
    with pytest.raises(ValueError, match="below the target"):
        calibrate.recommend(found, target=0.05, allow=0.05)
    assert calibrate.noise("x", [[1.0], [1.1]]) is None  # one pair says nothing about spread


# Confirmation: a gated metric the first run cannot settle is measured again, interleaved, before the
# gate decides; a performance NO-GO never rests on the steps of one run.

GATED = "test_model.py::test_linear_layer_trains"
CALM = [10.0, 10.1, 9.9, 10.0, 10.2, 9.8, 10.0, 10.1, 9.9, 10.0]


def test_tests_to_repeat_merge_to_the_whole_suite_when_one_side_cannot_say() -> None:
    assert merge_tests(("b::t",), ("a::t", "b::t")) == ("a::t", "b::t")
    assert merge_tests(("a::t",), (WHOLE_SUITE,)) == (WHOLE_SUITE,)


def _timed(candidate_main: list[float], candidate_factor: float | list[float], nodeid: str = GATED,
           tags: dict[str, str] | None = None) -> Script:
    """The plain suite's two tests pass; the gated one records step times (with `tags`): production's are
    calm, the candidate's main run records `candidate_main`, each of its repeats production's times x
    factor (a list: repeat r's is factor[(r - 1) % len])."""
    factors = candidate_factor if isinstance(candidate_factor, list) else [candidate_factor]

    def script(command: NodeCommand, exe: Execution) -> NodeExit:
        phase, role = command.env["STACKGATE_PHASE"], command.env["STACKGATE_ROLE"]
        run = int(phase.removeprefix("repeat")) if phase.startswith("repeat") else 0
        if phase == "rollback":
            return answer(command, {"test_model.py::test_matmul_matches_numpy": "passed"})
        base = [x * (1 + 0.01 * run) for x in CALM]  # the runner drifts between runs; pairs share the drift
        factor = factors[(run - 1) % len(factors)]
        samples = base if role == "production" else candidate_main if run == 0 else [x * factor for x in base]
        tests = [t for t in (GATED, "test_model.py::test_matmul_matches_numpy")
                 if run == 0 or any(a.endswith(t) for a in command.argv) or not any("::" in a for a in command.argv)]
        return answer(command, dict.fromkeys(tests, "passed"), metrics=[
            {"name": "work.step_time", "unit": "ms", "samples": samples, "better": "lower", "nodeid": nodeid,
             "tags": tags or {}}])
    return script


@pytest.fixture
def gated_policy(tmp_path: Path) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text('[[performance.metric]]\nname = "work.step_time"\ntolerance = 0.5\n')
    return path


def _phases(backend: MemoryBackend) -> list[tuple[str, str]]:
    return [(c.env["STACKGATE_ROLE"][0], c.env["STACKGATE_PHASE"]) for c in backend.executed]


def _gated(report: dict[str, Any]) -> dict[str, Any]:
    (found,) = [c for c in report["comparisons"] if c["metric"] == "work.step_time"]
    return found


def test_an_inconclusive_first_run_is_confirmed_by_interleaved_runs_of_the_gated_test_only(
        no_subprocesses: MemoryBackend, run_memory: RunMemory, gated_policy: Path) -> None:
    noisy = [5.0, 8.0, 30.0, 12.0, 25.0, 9.0, 18.0, 11.0, 22.0, 7.0]
    assert stats.compare(CALM, noisy, better="lower", tolerance=0.5).outcome is stats.Outcome.INCONCLUSIVE
    no_subprocesses.script = _timed(noisy, candidate_factor=1.1)
    code, report, said = run_memory(policy=str(gated_policy))
    assert _phases(no_subprocesses) == [("p", "main"), ("c", "main"), *[(r, f"repeat{n}") for n in range(1, 5)
                                                                        for r in ("cp" if n % 2 else "pc")],
                                        ("p", "rollback")]
    repeats = [c for c in no_subprocesses.executed if c.env["STACKGATE_PHASE"].startswith("repeat")]
    assert all(any(a.endswith(GATED) for a in c.argv) for c in repeats)
    assert not any(a.endswith("test_matmul_matches_numpy") for c in repeats for a in c.argv)
    assert any(line.startswith("confirm: 4 more interleaved run(s)") for line in said)
    assert code == 0 and report["decision"] == "GO"
    gated = _gated(report)
    assert gated["method"] == "paired" and gated["outcome"] == "ok"


def test_a_regression_seen_in_one_run_is_no_go_only_when_the_repeats_confirm_it(
        no_subprocesses: MemoryBackend, run_memory: RunMemory, gated_policy: Path) -> None:
    slow = [x * 2 for x in CALM]
    no_subprocesses.script = _timed(slow, candidate_factor=2.0)
    code, report, _ = run_memory(policy=str(gated_policy))
    assert code == 1 and report["decision"] == "NO-GO"
    assert _gated(report)["method"] == "paired" and _gated(report)["outcome"] == "regression"
    assert ("c", "repeat4") in _phases(no_subprocesses)


def test_one_slow_run_that_the_repeats_do_not_reproduce_is_left_out_by_the_sign_test(
        no_subprocesses: MemoryBackend, run_memory: RunMemory, gated_policy: Path) -> None:
    """One candidate run in five 2x slower, the other four +5%: that pair stands apart, and the t interval
    over five pairs holds it (INCONCLUSIVE, before #22's sign-test rounds). Four more interleaved runs
    give the sign test its 9 pairs, which leave the slowed run out: +5% against a 50% tolerance, GO."""
    no_subprocesses.script = _timed([x * 2 for x in CALM], candidate_factor=1.05)
    code, report, said = run_memory(policy=str(gated_policy))
    assert code == 0 and report["decision"] == "GO"
    gated = _gated(report)
    assert gated["statistic"] == "sign" and gated["pairs"] == 9 and gated["apart"] == 1
    assert gated["change"] == pytest.approx(0.05, abs=1e-6)
    assert any(line.startswith("confirm: 4 more interleaved run(s) of test_model.py::test_linear_layer_trains, "
                               "because a run pair stands apart") for line in said)
    assert [p for _, p in _phases(no_subprocesses)].count("repeat8") == 2 and "repeat9" not in str(_phases(
        no_subprocesses))


def test_a_regression_with_a_pair_apart_is_decided_on_the_sign_tests_pairs(
        no_subprocesses: MemoryBackend, run_memory: RunMemory, gated_policy: Path) -> None:
    """2x slower in four pairs of five and 4x in one: the t interval over five pairs says regression, but
    the pair apart is on the worse side, so the NO-GO waits for the sign test's 9 pairs (which still say
    regression: 2x against a 50% tolerance)."""
    no_subprocesses.script = _timed([x * 2 for x in CALM], candidate_factor=[2.0, 2.0, 2.0, 4.0])
    code, report, said = run_memory(policy=str(gated_policy))
    assert code == 1 and report["decision"] == "NO-GO"
    gated = _gated(report)
    assert gated["outcome"] == "regression" and gated["statistic"] == "sign" and gated["pairs"] == 9
    assert any(line.startswith("confirm: 4 more interleaved run(s)") for line in said)


def test_a_regression_whose_pair_apart_is_on_the_better_side_is_decided_without_more_runs(
        no_subprocesses: MemoryBackend, run_memory: RunMemory, gated_policy: Path) -> None:
    """3x slower in four pairs of five and 2.5x in one: the pair apart pulls towards no change, so
    without it the regression would only be clearer: NO-GO over the five pairs, nothing more run."""
    no_subprocesses.script = _timed([x * 3 for x in CALM], candidate_factor=[3.0, 3.0, 3.0, 2.5])
    code, report, said = run_memory(policy=str(gated_policy))
    gated = _gated(report)
    assert code == 1 and gated["outcome"] == "regression" and gated["pairs"] == 5 and gated["apart"] == 1
    assert "repeat5" not in str(_phases(no_subprocesses)) and not any("stands apart" in line for line in said)


def test_with_confirmation_off_a_pair_apart_runs_nothing_more(
        no_subprocesses: MemoryBackend, run_memory: RunMemory, tmp_path: Path) -> None:
    policy = tmp_path / "fixed.toml"
    policy.write_text('[performance]\nrepeats = 5\nconfirm_repeats = 1\n'
                      '[[performance.metric]]\nname = "work.step_time"\ntolerance = 0.5\n')
    no_subprocesses.script = _timed([x * 3 for x in CALM], candidate_factor=[3.0, 3.0, 3.0, 2.0])
    code, report, _ = run_memory(policy=str(policy))
    gated = _gated(report)
    assert code == 1 and gated["statistic"] == "t" and gated["pairs"] == 5 and gated["apart"] == 1
    assert "repeat5" not in str(_phases(no_subprocesses))


def test_an_inconclusive_for_noise_says_what_the_pairs_noise_needs(
        no_subprocesses: MemoryBackend, run_memory: RunMemory, gated_policy: Path, tmp_path: Path) -> None:
    """Five pairs that spread widely and none apart (2x, then +0% and +40% in turn): the gate cannot tell,
    and no pair is for the sign test to leave out, so nothing more runs (without a noise budget)."""
    no_subprocesses.script = _timed([x * 2 for x in CALM], candidate_factor=[1.0, 1.4])
    gated_policy.write_text("[performance]\nnoise_budget_s = 0\n" + gated_policy.read_text())
    code, report, _ = run_memory(policy=str(gated_policy))
    assert report["decision"] == "INCONCLUSIVE" and code == 1
    assert "repeat5" not in str(_phases(no_subprocesses))
    (reason,) = [r for r in report["reasons"] if r["kind"] == "perf-inconclusive"]
    assert "over 5 interleaved runs" in reason["message"]
    # what the pairs' own noise says the gate needs: their spread, and about how many runs would settle it
    logs = [math.log(2.0), 0.0, math.log(1.4), 0.0, math.log(1.4)]
    mean = sum(logs) / 5
    spread = math.sqrt(sum((x - mean) ** 2 for x in logs) / 4)
    gated = _gated(report)
    assert gated["noise"] == pytest.approx(spread, rel=1e-4)
    runs = calibrate.runs_to_settle(stats.Comparison(1, 1, math.expm1(mean), 0, 0, 0.5, stats.Outcome.INCONCLUSIVE, 0, 0,
                                                 method="paired", pairs=5, noise=spread))
    assert runs is not None and 5 < runs < 100
    assert (f"the pairs' log ratios spread {spread:.1%} in this run; at that noise about {runs} interleaved runs would "
            f"settle a change of {stats.percent(math.expm1(mean))} against the 50.0% tolerance") in reason["message"]
    assert f"confirm_repeats = {runs}" in reason["message"]
    # the report's power: no calibration of this pool, so only what this run's noise lets it detect
    (power,) = report["power"].values()
    assert "sigma" not in power and power["pairs"] == 5 and power["seen"] == pytest.approx(spread, rel=1e-4)
    assert power["detects_seen"] == pytest.approx(calibrate.detectable(spread, 5, 0.5), rel=1e-3)
    md = (tmp_path / "r" / "mem" / "report.md").read_text()
    power_row = f"work.step\\_time | 50.0% | - | - | - | {spread:.1%} | 5 | >= "  # calibrated: none; this run's
    assert any(power_row in line for line in md.splitlines()), md


def test_a_run_noisier_than_its_pools_calibration_says_to_calibrate_again(
        no_subprocesses: MemoryBackend, run_memory: RunMemory, gated_policy: Path, tmp_path: Path) -> None:
    """The runner's noise moves by the hour (docs/performance.md): when a run's pairs spread more than the
    noise calibrate recorded for the pool can explain (F test), the report and the console say so, with
    the calibration's date, and that the repeats planned from it may miss their target."""
    no_subprocesses.script = _timed([x * 2 for x in CALM], candidate_factor=[1.0, 1.4])  # pairs spread ~28%
    gated_policy.write_text("[performance]\nnoise_budget_s = 0\n" + gated_policy.read_text())  # (5 runs)
    history.record_calibration(tmp_path / "r" / "history.sqlite", pool="local", run_id="cal-1",
                               recorded="2026-12-01T09:00:00Z", noise=[("work.step_time", 0.01, 10)])
    code, report, said = run_memory(policy=str(gated_policy))
    assert code == 1 and report["decision"] == "INCONCLUSIVE"  # the note changes no verdict
    (power,) = report["power"].values()
    assert power["sigma"] == 0.01 and power["calibrated"] == "2026-12-01T09:00:00Z" and power["calibrated_pairs"] == 10
    assert "more than the 1.0% stackgate calibrate measured on pool local at 2026-12-01T09:00:00Z" in power["note"]
    assert any(line.startswith("gate power: ") and "calibrate again" in line for line in said), said
    md = (tmp_path / "r" / "mem" / "report.md").read_text()
    assert "work.step\\_time | 50.0% | 1.0% (2026-12-01) | 5 | >= " in md
    assert "noisier than when calibrated" in md and "noisier than when calibrated" in \
        (tmp_path / "r" / "mem" / "report.html").read_text()
    # a calibration that saw such noise explains it: no note
    history.record_calibration(tmp_path / "r" / "history.sqlite", pool="local", run_id="cal-2",
                               recorded="2026-12-02T09:00:00Z", noise=[("work.step_time", 0.3, 10)])
    shutil.rmtree(tmp_path / "r" / "mem")
    code, report, said = run_memory(policy=str(gated_policy))
    (power,) = report["power"].values()
    assert code == 1 and power["sigma"] == 0.3 and "note" not in power and not any("gate power" in line for line in said)


def test_noisier_than_calibrated_is_an_f_test_of_the_two_spreads() -> None:
    for d1, d2, table in ((4, 10, 3.48), (6, 10, 3.22), (2, 5, 5.79), (4, 20, 2.87), (8, 40, 2.18), (13, 10, 2.89)):
        assert stats.f_quantile(0.95, d1, d2) == pytest.approx(table, rel=0.01)  # F tables, 0.95
    # 5 pairs against 1.0% from 10 A/A pairs: F(0.95; 4, 10) = 3.48, so up to 1.86% is explained
    assert not calibrate.noisier(0.018, 5, 0.01, 10) and calibrate.noisier(0.019, 5, 0.01, 10)
    assert calibrate.noisier(0.015, 30, 0.01, 40) and not calibrate.noisier(0.015, 5, 0.01, 40)  # more pairs tell less
    assert not calibrate.noisier(0.5, 2, 0.01, 10)  # one spread from two pairs tells nothing
    assert not calibrate.noisier(0.05, 5, 0.0, 10)  # a calibration of no noise (one clock tick) is no yardstick


def test_calibrated_noise_counts_an_order_effect_as_the_gates_counterbalanced_pairs_see_it() -> None:
    """Both calibrations of the sensitivity workload on two machines here (2026-12-02) had the second
    run of every A/A pair faster, by 0.6-2.6% (9 pairs of 9). Their spread about their mean was 0.13%
    on the second machine; the gate's pairs alternate order (P C | C P), so the same effect is +-d there."""
    rng = random.Random(7)
    jitter = [1 + rng.gauss(0, 0.0005) for _ in range(20)]
    aa = [[(1.0 if i % 2 == 0 else 0.99) * jitter[i]] for i in range(10)]  # second of each pair 1% faster
    found = calibrate.noise("workload.step_time", aa, summary="best")
    assert found is not None and found.sigma == pytest.approx(0.01, rel=0.15)  # not ~0.05%
    base, cand = [], []
    for i in range(10):  # the gate's pairs on the same runner: whichever runs second is 1% faster
        first, second = 1.0 * jitter[10 + i], 0.99 * jitter[i]
        (base, cand)[i % 2].append([first])
        (cand, base)[i % 2].append([second])
    gate = stats.paired(base, cand, better="lower", tolerance=0.03, summary="best")
    assert gate.noise == pytest.approx(found.sigma, rel=0.2)  # calibrate predicted the spread the gate saw


def test_runs_to_settle_an_inconclusive_at_the_noise_its_pairs_showed() -> None:
    def seen(change: float, noise: float, tolerance: float = 0.03) -> stats.Comparison:
        return stats.Comparison(1, 1, change, 0, 0, tolerance, stats.Outcome.INCONCLUSIVE, 0, 0, method="paired",
                                pairs=9, noise=noise)

    # +1.2% seen with pairs spread 3% against a 3% tolerance: the runs with which such a change is told from
    # the tolerance ~90% of the time, as calibrate plans its repeats
    runs = calibrate.runs_to_settle(seen(0.012, 0.03))
    margin = math.log(1.03) - math.log(1.012)
    assert runs is not None
    assert calibrate.detectable(0.03, runs, 0.0) <= margin < calibrate.detectable(0.03, runs - 1, 0.0)
    assert (calibrate.runs_to_settle(seen(-0.02, 0.03)) or 0) < runs  # further from the tolerance: fewer runs
    assert calibrate.runs_to_settle(seen(0.012, 0.055)) is None  # the pairs spread 5.5%: more than 100 runs
    assert calibrate.runs_to_settle(seen(0.0299, 0.03)) is None  # at the tolerance itself no number of runs will do
    assert calibrate.runs_to_settle(seen(0.0, 0.0)) is None  # no spread measured: nothing to plan from
    assert calibrate.runs_to_settle(stats.Comparison(1, 1, 0.0, 0, 0, 0.03, stats.Outcome.INCONCLUSIVE, 0, 0)) is None
    # the sign test's interval (pairs stand apart): its ends are ranked pairs, so no spread gives a count (its
    # robust spread is 0 when most pairs agree, which would read "2 runs"): 0, no figure, and not hopeless
    sign = stats.Comparison(1, 1, 0.8, 0.4, 1.3, 0.5, stats.Outcome.INCONCLUSIVE, 0, 0, method="paired",
                            statistic="sign", pairs=9, noise=0.0001, apart=4)
    assert calibrate.runs_to_settle(sign) == 0
    # calibrate's own repeats come from the same rule
    found = calibrate.Noise("x", 0.02, 5)
    assert calibrate.recommend(found, 0.05, 0.01).repeats == calibrate.runs_for(found.bound(), 0.02, power=0.95)


def test_the_paired_statistic_reports_the_pairs_noise_robustly_when_it_uses_the_sign_test() -> None:
    calm = [0.004, -0.003, 0.001, 0.002, -0.001, 0.0, 0.003, -0.002, 0.001, 0.002]
    base = [[10.0]] * 10
    clean = stats.paired(base, [[10.0 * math.exp(x)] for x in calm], better="lower", tolerance=0.025)
    mean = sum(calm) / 10
    assert clean.noise == pytest.approx(math.sqrt(sum((x - mean) ** 2 for x in calm) / 9), rel=1e-6)
    hit = stats.paired(base, [[10.0 * math.exp(x)] for x in [*calm[:9], math.log(1.9)]], better="lower",
                       tolerance=0.025)
    assert hit.statistic == "sign" and hit.noise < 0.01  # the spread of the pairs it keeps, not the +90% one's


def test_without_confirmation_one_run_decides(no_subprocesses: MemoryBackend, run_memory: RunMemory,
                                               gated_policy: Path) -> None:
    no_subprocesses.script = _timed([x * 2 for x in CALM], candidate_factor=1.0)
    code, report, said = run_memory(policy=str(gated_policy), confirm_repeats="1")
    assert code == 1 and report["decision"] == "NO-GO" and _gated(report)["method"] == "bootstrap"
    assert _phases(no_subprocesses) == [("p", "main"), ("c", "main"), ("p", "rollback")]
    assert not any(line.startswith("confirm:") for line in said)


def test_a_settled_first_run_runs_nothing_more(no_subprocesses: MemoryBackend, run_memory: RunMemory,
                                                gated_policy: Path) -> None:
    no_subprocesses.script = _timed([x * 1.05 for x in CALM], candidate_factor=1.05)
    code, report, _ = run_memory(policy=str(gated_policy))
    assert code == 0 and _gated(report)["outcome"] == "ok" and _gated(report)["method"] == "bootstrap"
    assert _phases(no_subprocesses) == [("p", "main"), ("c", "main"), ("p", "rollback")]


def _calibrated(backend: MemoryBackend, script: Script, runs: int, policy: Path,
                tmp_path: Path) -> tuple[dict[str, Any], list[str]]:
    """`stackgate calibrate --runs RUNS` on the memory backend answering with `script`: calibration.json's
    pools, and what it said."""
    backend.script = script
    said: list[str] = []
    opts = memory_options(tmp_path, run_id="cal", policy=str(policy))
    assert calibrate_command(opts, {}, runs=runs, target=0.05, allow=0.01, say=said.append,
                             machinery=on_memory(backend)) == 0
    return json.loads((tmp_path / "r" / "cal" / "calibration.json").read_text())["pools"], said


def test_calibration_lists_the_gated_metrics_only(no_subprocesses: MemoryBackend, gated_policy: Path,
                                                   tmp_path: Path) -> None:
    def script(command: NodeCommand, exe: Execution) -> NodeExit:
        run = Phase.parse(command.env["STACKGATE_PHASE"]).round
        return answer(command, {GATED: "passed"}, metrics=[
            {"name": "work.step_time", "unit": "ms", "samples": [10.0 + run % 2], "better": "lower", "nodeid": GATED},
            {"name": "work.loss", "unit": "", "samples": [0.5, 0.4], "better": "equal", "nodeid": GATED}])

    pools, said = _calibrated(no_subprocesses, script, 4, gated_policy, tmp_path)
    assert [m["metric"] for m in pools["local"]] == ["work.step_time"]
    # every second run 10% slower: an order effect, which the gate's counterbalanced pairs see as +-10% spread
    assert pools["local"][0]["pairs"] == 2
    assert pools["local"][0]["sigma"] == pytest.approx(math.log(1.1), rel=1e-5)
    assert not any("work.loss" in line for line in said)


def test_calibration_says_what_its_recommendation_costs_in_wall_time_on_this_runner(
        no_subprocesses: MemoryBackend, gated_policy: Path, tmp_path: Path) -> None:
    """Measured 2026-12-04: a runner of the same kind, 2.5x noisier, needed repeats = 14 and confirm_repeats
    = 24 where another needed 4 and 9; a team weighs a quieter runner against what a verdict costs."""
    def script(command: NodeCommand, exe: Execution) -> NodeExit:
        run = Phase.parse(command.env["STACKGATE_PHASE"]).round
        time.sleep(0.02)
        return answer(command, {GATED: "passed"}, metrics=[
            {"name": "work.step_time", "unit": "ms", "samples": [10.0 + 0.1 * (run % 3)], "better": "lower",
             "nodeid": GATED}])

    pools, said = _calibrated(no_subprocesses, script, 6, gated_policy, tmp_path)
    (found,) = pools["local"]
    assert found["run_s"] >= 0.02
    assert found["settled_s"] == round(2 * found["recommended_repeats"] * found["run_s"], 1)
    assert found["confirmed_s"] == round(2 * found["recommended_confirm_repeats"] * found["run_s"], 1)
    assert any(line.strip().startswith("cost on this runner, at ") for line in said), said


def test_the_cost_of_a_recommendation_is_its_runs_at_the_gated_tests_run_time() -> None:
    results = [CellResult("p", Role.PRODUCTION, Status.PASSED, duration_s=d) for d in (40.0, 7.0, 8.0, 7.5, 0.0)]
    assert commands_calibrate._run_seconds(results) == 7.5  # the first runs the whole suite; 0 is not a time
    assert commands_calibrate._run_seconds([]) == 0.0
    rec = calibrate.recommend(calibrate.Noise("x", 0.015425, 10), target=0.05, allow=0.01)
    assert (rec.repeats, rec.confirm) == (14, 24)  # the noisier runner of 2026-12-04
    text = commands_calibrate._cost(rec, 7.5)
    assert "a comparison the repeats settle takes 2 x 14 runs (production and a candidate), about 3.5 min" in text
    assert "one confirmed (left unsettled, or before a NO-GO) 2 x 24 runs, about 6.0 min" in text
    quiet = calibrate.recommend(calibrate.Noise("x", 0.006, 10), target=0.05, allow=0.01)
    assert "2 x 4 runs (production and a candidate), about 60 s" in commands_calibrate._cost(quiet, 7.5)
    assert "upper bound" not in text  # 10 pairs measured it: no more to say
    # `calibrate --runs 6` here: 2.2% from 2 pairs kept (1 apart) asked for 74 repeats, 18.6 minutes a comparison
    few = calibrate.Noise("x", 0.022307, 3, apart=1)
    rec, more = (calibrate.recommend(noise, target=0.05, allow=0.01) for noise in (few, replace(few, pairs=11)))
    assert rec.repeats == 74 and more.repeats < 74
    text = commands_calibrate._cost(rec, 7.55, more)
    assert "2 x 74 runs (production and a candidate), about 18.6 min" in text
    assert (f"which 2 A/A pair(s) leave wide: were the same noise measured from 10 pairs (`--runs 20` or more), "
            f"repeats = {more.repeats}, about {2 * more.repeats * 7.55 / 60:.1f} min") in text


def test_calibration_says_when_each_runs_best_sample_is_the_quieter_summary(
        no_subprocesses: MemoryBackend, gated_policy: Path, tmp_path: Path) -> None:
    """Every other A/A run is disturbed (its steps slower, its fastest step not): medians swing, best
    samples do not, and calibrate suggests `summary = "best"` with the repeats it would need."""
    def script(command: NodeCommand, exe: Execution) -> NodeExit:
        run = Phase.parse(command.env["STACKGATE_PHASE"]).round
        steps = [10.0, 10.1, 10.2] + ([14.0, 15.0, 16.0] if run % 4 in (1, 2) else [10.3, 10.4, 10.5])
        return answer(command, {GATED: "passed"}, metrics=[
            {"name": "work.step_time", "unit": "ms", "samples": [s + 0.01 * run for s in steps], "better": "lower",
             "nodeid": GATED}])

    pools, said = _calibrated(no_subprocesses, script, 8, gated_policy, tmp_path)
    (found,) = pools["local"]
    assert found["sigma"] > 0.1  # the rule's summary, the median: +-18% per pair
    hint = next(line for line in said if "each run's best sample moved" in line)
    assert 'summary = "best"' in hint and "repeats = 2 would do" in hint


def test_a_suite_that_does_not_say_which_test_measured_is_confirmed_whole(
        no_subprocesses: MemoryBackend, run_memory: RunMemory, gated_policy: Path) -> None:
    no_subprocesses.script = _timed([x * 2 for x in CALM], candidate_factor=2.0, nodeid="")
    code, report, _ = run_memory(policy=str(gated_policy))
    assert code == 1 and _gated(report)["method"] == "paired" and _gated(report)["outcome"] == "regression"
    repeats = [c for c in no_subprocesses.executed if c.env["STACKGATE_PHASE"].startswith("repeat")]
    assert len(repeats) == 8 and not any("::" in a for c in repeats for a in c.argv)  # no test selected: all of it


MATMUL = "test_model.py::test_matmul_matches_numpy"


def _failing(candidate: list[str], production: list[str] | None = None) -> Script:
    """The plain suite's matmul test: in the candidate, `candidate[r]` in run r (0 = main, r = rerun r),
    in production `production[r]` (passed by default); the other test passes."""
    def script(command: NodeCommand, exe: Execution) -> NodeExit:
        phase, role = Phase.parse(command.env["STACKGATE_PHASE"]), command.env["STACKGATE_ROLE"]
        if phase.kind.value == "rollback":
            return answer(command, {MATMUL: "passed"})
        outcomes = candidate if role == "candidate" else production or ["passed"] * len(candidate)
        selected = [t for t in (GATED, MATMUL) if any(a.endswith(t) for a in command.argv)]
        tests = selected or [GATED, MATMUL]
        return answer(command, {t: outcomes[phase.round] if t == MATMUL else "passed" for t in tests})
    return script


def test_a_new_failure_is_rerun_in_both_stacks_and_a_failure_that_repeats_is_no_go(
        no_subprocesses: MemoryBackend, run_memory: RunMemory) -> None:
    no_subprocesses.script = _failing(["failed", "failed", "failed"])
    code, report, said = run_memory()
    assert _phases(no_subprocesses) == [("p", "main"), ("c", "main"), ("c", "rerun1"), ("p", "rerun1"),
                                        ("p", "rerun2"), ("c", "rerun2"), ("p", "rollback")]
    reruns = [c for c in no_subprocesses.executed if c.env["STACKGATE_PHASE"].startswith("rerun")]
    assert all(any(a.endswith(MATMUL) for a in c.argv) and not any(a.endswith(GATED) for a in c.argv) for c in reruns)
    assert any(line.startswith("confirm failures: 2 more interleaved run(s), in both stacks") for line in said)
    assert code == 1 and report["decision"] == "NO-GO"
    (blocking,) = [r for r in report["reasons"] if r["severity"] == "blocking"]
    assert blocking["test"] == MATMUL and "confirmed: failed in all 3 candidate runs" in blocking["message"]


def test_a_failure_a_rerun_does_not_repeat_is_flaky_and_inconclusive(
        no_subprocesses: MemoryBackend, run_memory: RunMemory) -> None:
    no_subprocesses.script = _failing(["failed", "passed", "passed"])
    code, report, _ = run_memory()
    assert code == 1 and report["decision"] == "INCONCLUSIVE"
    assert [r["kind"] for r in report["reasons"] if r["severity"] == "inconclusive"] == ["flaky"]


def test_a_failure_production_repeats_on_a_rerun_is_not_caused_by_the_upgrade(
        no_subprocesses: MemoryBackend, run_memory: RunMemory) -> None:
    no_subprocesses.script = _failing(["failed", "failed", "failed"], ["passed", "passed", "failed"])
    code, report, _ = run_memory()
    assert code == 1 and report["decision"] == "INCONCLUSIVE"
    (reason,) = [r for r in report["reasons"] if r["severity"] == "inconclusive"]
    assert reason["kind"] == "production-fails" and "not caused by the upgrade" in reason["message"]


def test_a_run_without_failures_reruns_nothing(no_subprocesses: MemoryBackend, run_memory: RunMemory) -> None:
    no_subprocesses.script = _failing(["passed"])
    code, report, said = run_memory()
    assert code == 0 and report["decision"] == "GO" and not any(p.startswith("rerun") for _, p in _phases(no_subprocesses))
    assert not any(line.startswith("confirm failures") for line in said)


def test_the_sign_interval_leaves_out_the_wrecked_pairs_at_each_end() -> None:
    """At 95% the sign test's interval is [d(k), d(n+1-k)] with P(Bin(n, 1/2) <= k-1) <= 2.5%: k = 2 from
    9 pairs (10/512 = 2.0%), k = 6 at 20 pairs (P(X <= 5) = 2.1%); below 9 pairs it would be the range."""
    assert stats.sign_interval([0.0] * 8, 0.95) is None
    logs = [0.01 * i for i in range(9)]
    assert stats.sign_interval(logs, 0.95) == (0.01, 0.07)
    twenty = [0.001 * i for i in range(20)]
    assert stats.sign_interval(twenty, 0.95) == (0.005, 0.014)


def test_wrecked_pairs_switch_the_paired_statistic_to_the_sign_test() -> None:
    calm = [0.004, -0.003, 0.001, 0.002, -0.001, 0.0, 0.003, -0.002, 0.001, 0.002]
    assert not any(stats.apart(calm)) and any(stats.apart([*calm[:8], 0.9, 0.001]))
    base = [[10.0]] * 10
    clean = stats.paired(base, [[10.0 * math.exp(x)] for x in calm], better="lower", tolerance=0.025)
    assert clean.statistic == "t" and clean.outcome is stats.Outcome.OK and clean.pairs == 10
    # one run of the candidate landed beside a busy neighbour: +90% (at 10 pairs the interval leaves out one at
    # each end; at 20 pairs, five)
    hit = [*calm[:9], math.log(1.9)]
    robust = stats.paired(base, [[10.0 * math.exp(x)] for x in hit], better="lower", tolerance=0.025)
    assert robust.statistic == "sign" and robust.outcome is stats.Outcome.OK
    assert "sign test on the median pair" in robust.describe("ms")
    assert "t interval on the mean pair" in clean.describe("ms")
    # the t interval over the same pairs cannot tell: the wrecked pairs widen it past the tolerance
    mean = sum(hit) / 10
    spread = math.sqrt(sum((x - mean) ** 2 for x in hit) / 9)
    assert mean + stats.t_quantile(0.95, 9) * spread / math.sqrt(10) > math.log1p(0.025)


def test_calibrate_counts_a_run_slowed_whole_apart_instead_of_folding_it_into_the_noise() -> None:
    """Best steps of ten A/A runs of the sensitivity workload on this machine (2026-12-02): run 2 was
    slowed whole (3.459 ms against 2.45-2.51) with no CPU pressure seen; sigma over all five pairs was
    14.1% and asked for 100 repeats."""
    best = [2.510, 2.473, 3.459, 2.488, 2.514, 2.450, 2.507, 2.479, 2.492, 2.478]
    found = calibrate.noise("workload.step_time", [[b, b + 1] for b in best], summary="best")
    assert found is not None and found.pairs == 5 and found.apart == 1
    assert found.sigma < 0.02  # the other four pairs moved about 1%
    # the gate's confirmation takes a comparison with such a pair to the sign test's 9 pairs itself: the
    # repeats are what the clean pairs need; with confirmation off they must be 9 from the start
    rec = calibrate.recommend(found, target=0.05, allow=0.01)
    assert rec.repeats == calibrate.runs_for(found.bound(), 0.02, power=0.95)
    assert "confirmation runs the pairs" in rec.describe(0.05) and "from 4 A/A pairs" in rec.describe(0.05)
    quiet = calibrate.Noise("x", 0.005, 5, apart=1)
    assert calibrate.recommend(quiet, 0.05, 0.01).repeats == calibrate.runs_for(quiet.bound(), 0.02, power=0.95) < 9
    off = calibrate.recommend(quiet, target=0.05, allow=0.01, confirms=False)
    assert off.repeats == 9 and "as confirmation is off" in off.describe(0.05)  # the sign test's minimum
    clean = calibrate.noise("x", [[b] for b in (2.50, 2.51, 2.49, 2.50, 2.51, 2.50, 2.50, 2.49)])
    assert clean is not None and clean.apart == 0 and calibrate.recommend(clean, 0.05, 0.01).repeats < 9  # no floor


def test_calibrate_plans_its_repeats_at_an_upper_bound_of_the_noise_it_measured() -> None:
    """The sensitivity workload on this machine (2026-12-04, docs/performance.md): calibrate measured
    1.0% from 10 A/A pairs and, planning for ~90% power at that figure, recommended 5 repeats; those
    caught a planted 5% in fewer than 18 of 20 trials, the issue's 90% rate. A sigma from 10 pairs is
    itself uncertain (its 80% upper bound is 1.27x), and 90% power makes 18 of 20 a coin flip."""
    found = calibrate.Noise("workload.step_time", 0.010, 10)
    assert found.bound() == pytest.approx(0.010 * math.sqrt(10 / 6.179), rel=0.005)  # the table's chi2(0.2, 10)
    assert calibrate.runs_for(found.sigma, 0.02) == 5  # the point-estimate plan it replaces
    rec = calibrate.recommend(found, 0.05, 0.01)
    assert rec.repeats == 7 and rec.detects <= 0.05
    assert "repeats planned for 95% power at 1.3%, the noise's 80% upper bound from 10 A/A pairs" in rec.describe(0.05)
    # more A/A pairs: a tighter bound, fewer repeats for the same measured noise
    assert calibrate.recommend(calibrate.Noise("w", 0.010, 40), 0.05, 0.01).repeats < rec.repeats
    assert calibrate.Noise("w", 0.010, 10, apart=2).bound() > found.bound()  # pairs apart are not counted
    for df, table in ((2, 0.446), (5, 2.343), (10, 6.179), (20, 14.578)):  # chi-square 0.2-quantiles
        assert stats.chi2_quantile(0.2, df) == pytest.approx(table, rel=0.011)


def test_calibrate_plans_confirmation_for_the_noise_a_run_may_show_on_the_runner_it_measured() -> None:
    """The sensitivity workload here (2026-12-04, docs/performance.md): calibrate measured 0.6% from 8
    A/A pairs kept (2 apart) and recommended 4 repeats; a trial's pairs then spread 0.4-1.9%, and the
    three 5% trials of 15 left INCONCLUSIVE after the default 5 runs each had one run slowed by 3-4%.
    Confirmation runs only for a comparison left unsettled, or a NO-GO to confirm: it is planned for the
    most noise a run of `repeats` pairs shows 95% of the time on the runner as calibrated (an F
    prediction bound, the yardstick the report's "noisier than calibrated" note uses), and for no fewer
    pairs than the sign test's 9."""
    found = calibrate.Noise("workload.step_time", 0.006, 10, apart=2)
    rec = calibrate.recommend(found, 0.05, 0.01)
    assert rec.repeats == 4
    assert rec.confirm_planned == pytest.approx(0.006 * math.sqrt(4.07), rel=0.01)  # F(0.95; 3, 8) = 4.07
    assert calibrate.runs_for(rec.confirm_planned, 0.02, power=calibrate.PLAN_POWER) == 7
    assert rec.confirm == stats.sign_test_pairs(0.95) == 9  # no fewer than the sign test's pairs
    assert ("confirm_repeats = 9 (for a comparison 4 runs leave unsettled, and before a NO-GO: at least the sign "
            "test's pairs, and planned for 95% power at 1.2%, the most noise a run of 4 pairs shows 95% of the "
            "time") in rec.describe(0.05)
    # a noisier runner: the noise a run may show sets it
    loud = calibrate.recommend(calibrate.Noise("w", 0.010, 10), 0.05, 0.01)
    assert loud.confirm == calibrate.runs_for(loud.confirm_planned, 0.02, power=calibrate.PLAN_POWER) > 9
    # what a run of that many pairs may show is what the note holds it to: just inside, no note
    assert not calibrate.noisier(rec.confirm_planned * 0.99, 4, found.sigma, 8)
    assert calibrate.noisier(rec.confirm_planned * 1.01, 4, found.sigma, 8)
    # confirmation off: nothing to plan, nothing said
    off = calibrate.recommend(found, 0.05, 0.01, confirms=False)
    assert off.confirm == off.repeats and "confirm_repeats" not in off.describe(0.05)
    # never fewer than the repeats
    quiet = calibrate.recommend(calibrate.Noise("w", 0.001, 10), 0.05, 0.01)
    assert quiet.confirm >= quiet.repeats >= 2


def test_calibrate_says_how_long_each_run_measured() -> None:
    """The time a run's samples cover decides, on a runner with slow phases of seconds, how often a run
    is slowed whole (docs/performance.md): calibrate prints it beside the noise."""
    runs = [[2.0] * 400, [2.02] * 380, [2.01] * 390, [2.0] * 410]  # ms: 0.8 s, 0.77 s, 0.78 s, 0.82 s
    found = calibrate.noise("w", runs, summary="best", unit="ms")
    assert found is not None and found.span_s == pytest.approx(0.7919, abs=1e-3)
    assert "(runs whose samples cover 0.79 s)" in calibrate.recommend(found, 0.05, 0.01).describe(0.05)
    assert calibrate.noise("w", runs, unit="GB/s").span_s is None  # type: ignore[union-attr]
