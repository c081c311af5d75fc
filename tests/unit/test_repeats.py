"""Issue 11: interleaved repeats, per-run summaries, the paired statistic and the calibration
arithmetic, on recorded samples."""

from __future__ import annotations

import math
import random

import pytest

from stackgate import calibrate, stats
from stackgate.model import Cell, GpuClass, Role, RunnerPool, Stack, Topology
from stackgate.pipeline import repeat_order
from stackgate.versions import CudaVariant, parse_torch


def test_repeats_interleave_production_and_its_candidates() -> None:
    pool = RunnerPool("local", None, GpuClass.NONE, is_local=True)
    prod = Cell(Stack(parse_torch("2.13.0"), CudaVariant("cpu"), "3.11"), pool, Topology(1, 2), Role.PRODUCTION)
    c1 = Cell(Stack(parse_torch("2.14.1"), CudaVariant("cu130"), "3.11"), pool, Topology(1, 2), Role.CANDIDATE,
              baseline=prod.id)
    c2 = Cell(Stack(parse_torch("2.14.1"), CudaVariant("cu126"), "3.11"), pool, Topology(1, 2), Role.CANDIDATE,
              baseline=prod.id)
    order = repeat_order([prod, c1, c2], {c.id: c for c in (prod, c1, c2)}, repeats=3)
    assert [(r, c.role.value[0]) for r, c in order] == [(1, "p"), (1, "c"), (1, "c"), (2, "p"), (2, "c"), (2, "c")]
    assert repeat_order([prod, c1], {c.id: c for c in (prod, c1)}, repeats=1) == []


def test_per_run_summaries_are_medians_of_each_run() -> None:
    assert stats.run_summaries([[1.0, 9.0, 2.0], [5.0], []]) == [2.0, 5.0]


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
    assert found.sigma == pytest.approx(math.sqrt(sum(x * x for x in logs) / 3 - sum(logs) ** 2 / 12), rel=1e-9)
    rec = calibrate.recommend(found, target=0.05)
    assert rec.tolerance == 0.025
    assert calibrate.detectable(found.sigma, rec.repeats, rec.tolerance) <= 0.05  # enough repeats ...
    assert calibrate.detectable(found.sigma, rec.repeats - 1, rec.tolerance) > 0.05  # ... and no more
    assert calibrate.noise("x", [[1.0], [1.1]]) is None  # one pair says nothing about spread
