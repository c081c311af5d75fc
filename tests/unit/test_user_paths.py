"""Issue 8: the paths users take. World sizes that fit the host, a GPU candidate that can reach GO,
the policy that belongs to a user's suite, rollback without cross-version tests, the console's why."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import replace
from pathlib import Path

import pytest

from stackgate import fleet, gate, shipped, suite
from stackgate.conclude import why_lines
from stackgate.console import Console
from stackgate.model import (
    MAIN,
    ROLLBACK,
    Cell,
    CellResult,
    Decision,
    GpuClass,
    Metric,
    Reason,
    Role,
    RunnerPool,
    Severity,
    Stack,
    Status,
    TestOutcome,
    Topology,
    Transport,
    Verdict,
)
from stackgate.policy import SUITE_POLICY, load_for_suite, load_policy
from stackgate.versions import CudaVariant, parse_driver, parse_torch
from tests.unit.test_matrix import _expand

POLICY = load_policy(shipped.MATRIX_DIR / "policy.toml")
TODAY = dt.date(2026, 11, 30)


@pytest.mark.parametrize(("gpus", "sizes"), [(1, (1,)), (2, (2,)), (8, (2, 8))])
def test_fake_gpu_hosts_expand_to_world_sizes_that_fit_them(gpus: int, sizes: tuple[int, ...]) -> None:
    host = fleet.LocalHost(driver=parse_driver("580.65.06"), gpu="NVIDIA H200", gpu_count=gpus)
    local = [c for c in _expand("upgrade.toml", host).cells if c.pool.is_local]
    assert local, "the local GPU pool must have cells"
    for cell in local:
        assert cell.topology.nproc_per_node == gpus
        assert cell.collective_world_sizes == sizes
        assert max(cell.collective_world_sizes) <= gpus
        env = suite.suite_env(cell, results=Path("/r"), artifacts=Path("/a"), shared=Path("/s"), profile="quick",
                              marks=suite.run_marks("r", Path("/reports/r")))
        assert env["STACKGATE_WORLD_SIZES"] == ",".join(map(str, sizes))
        assert env["STACKGATE_STACK_GIVEN"] == ""  # a stack stackgate builds (the identity check's rule: its venv)
        assert env["STACKGATE_RUN_ID"] == "r" and len(env["STACKGATE_RUN_KEY"]) == 16
        assert env["STACKGATE_EXPECT_TRANSPORT"] == "any"  # fleet.toml's declaration for the local pool
        # the compile caches the stacks share (#43), under the artifacts as the node sees them
        assert env["TORCHINDUCTOR_CACHE_DIR"] == "/a/production/compile-cache/inductor"
        assert env["TRITON_CACHE_DIR"] == "/a/production/compile-cache/triton"
        own = suite.suite_env(cell, results=Path("/r"), artifacts=Path("/a"), shared=Path("/s"), profile="quick",
                              marks={}, extra=(("TORCHINDUCTOR_CACHE_DIR", "/scratch/inductor"),))
        assert own["TORCHINDUCTOR_CACHE_DIR"] == "/scratch/inductor"  # a suite's own --suite-env wins


def test_cpu_host_and_multi_node_cells_use_the_cells_own_processes() -> None:
    cells = _expand("upgrade.toml", fleet.LocalHost()).cells
    assert {c.collective_world_sizes for c in cells} == {(2,)}
    pool = RunnerPool("local", None, GpuClass.NONE, nodes=2, is_local=True)
    two_nodes = Cell(cells[0].stack, pool, Topology(2, 3), Role.CANDIDATE)
    assert two_nodes.collective_world_sizes == (3,)


def test_local_pool_transport_comes_from_its_declaration(tmp_path: Path) -> None:
    toml = tmp_path / "fleet.toml"
    toml.write_text("[pool.local]\ndetect = true\ntransport = 'ib'\n")
    gpu = fleet.LocalHost(driver=parse_driver("580.65.06"), gpu="NVIDIA H100", gpu_count=8)
    assert fleet.load_pools(toml, gpu)["local"].transport is Transport.IB
    assert fleet.load_pools(toml, fleet.LocalHost())["local"].transport is Transport.NONE  # CPU: gloo
    toml.write_text("[pool.local]\ndetect = true\n")
    assert fleet.load_pools(toml, gpu)["local"].transport is Transport.ANY


def _gpu_pair() -> tuple[Cell, Cell]:
    pool = RunnerPool("local", parse_driver("580.65.06"), GpuClass.DATACENTER, gpu="H200", gpus_per_node=1,
                      transport=Transport.ANY, is_local=True)
    prod = Cell(Stack(parse_torch("2.13.0"), CudaVariant("cu126"), "3.11"), pool, Topology(1, 1), Role.PRODUCTION,
                required=True)
    cand = Cell(Stack(parse_torch("2.14.1"), CudaVariant("cu130"), "3.11"), pool, Topology(1, 1), Role.CANDIDATE,
                required=True, baseline=prod.id)
    return prod, cand


def _gpu_result(cell: Cell, peak_mib: float) -> CellResult:
    steps = tuple(100.0 + (i % 3) * 0.1 for i in range(18))
    losses = tuple(2.0 * 0.9 ** i for i in range(20))
    metrics = (Metric("recsys.step_time", "ms", steps), Metric("vit.step_time", "ms", steps),
               Metric("recsys.loss", "", losses, better="equal"), Metric("vit.loss", "", losses, better="equal"),
               Metric("vit.peak_memory", "MiB", (peak_mib,)))
    tests = (TestOutcome("test_identity.py::test_torch_version", "passed"),)
    return CellResult(cell.id, cell.role, Status.PASSED, tests=tests, metrics=metrics)


@pytest.mark.parametrize(("candidate_peak", "decision"), [(1000.0, Decision.GO), (1200.0, Decision.NO_GO)])
def test_gpu_single_valued_metric_is_gated_by_threshold(candidate_peak: float, decision: Decision) -> None:
    prod, cand = _gpu_pair()
    # (the rules of the metrics this hand-made suite records: the others would match nothing)
    policy = replace(POLICY, required_tests=(), candidate_tests=(),
                     performance=tuple(r for r in POLICY.performance if r.name == "vit.peak_memory"),
                     numerics=tuple(n for n in POLICY.numerics if n.name == "*.loss"))
    results = {prod.id: _gpu_result(prod, 1000.0), cand.id: _gpu_result(cand, candidate_peak)}
    out = gate.decide((prod, cand), (), results, policy, TODAY)
    assert out.verdict.decision is decision, out.verdict.reasons
    peak = next(c for c in out.evidence.comparisons if c.metric == "vit.peak_memory")
    assert peak.gated and peak.comparison.method == "threshold"
    if decision is Decision.NO_GO:
        blocking = out.verdict.blocking
        assert [r.kind for r in blocking] == ["regression"] and "vit.peak_memory" in blocking[0].message
        assert "single value" in blocking[0].message


def _user_cells() -> tuple[Cell, Cell]:
    pool = RunnerPool("local", None, GpuClass.NONE, gpu="cpu", is_local=True)
    prod = Cell(Stack(parse_torch("2.13.0"), CudaVariant("cpu"), "3.11"), pool, Topology(1, 2), Role.PRODUCTION,
                required=True)
    cand = Cell(Stack(parse_torch("2.14.1"), CudaVariant("cu130"), "3.11"), pool, Topology(1, 2), Role.CANDIDATE,
                required=True, baseline=prod.id)
    return prod, cand


def _user_result(cell: Cell, outcomes: dict[str, str]) -> CellResult:
    tests = tuple(TestOutcome(f"test_mine.py::{n}", o, message="AssertionError: boom" if o == "failed" else "")
                  for n, o in outcomes.items())
    status = Status.FAILED if "failed" in outcomes.values() else Status.PASSED
    return CellResult(cell.id, cell.role, status, tests=tests)


def _user_policy(tmp_path: Path, platform_checks: bool = False) -> object:
    return load_for_suite(suite=tmp_path, bundled_suite=shipped.BUNDLED_SUITE, config_dir=shipped.MATRIX_DIR,
                          explicit=None, platform_checks=platform_checks, platform_files=suite.PLATFORM_CHECKS)


def test_a_user_suite_gets_every_collected_test_must_pass(tmp_path: Path) -> None:
    policy = _user_policy(tmp_path)
    assert policy.all_tests_required and not policy.candidate_tests and not policy.required_metrics  # type: ignore[attr-defined]
    assert policy.required_tests == ()  # type: ignore[attr-defined]
    with_checks = _user_policy(tmp_path, platform_checks=True)
    assert with_checks.required_tests and all(t.split("::")[0] in suite.PLATFORM_CHECKS  # type: ignore[attr-defined]
                                              for t in with_checks.required_tests)  # type: ignore[attr-defined]
    prod, cand = _user_cells()
    both = {"test_a": "passed", "test_b": "passed"}
    go = gate.decide((prod, cand), (), {prod.id: _user_result(prod, both), cand.id: _user_result(cand, both)},
                     policy, TODAY)  # type: ignore[arg-type]
    assert go.verdict.decision is Decision.GO, go.verdict.reasons
    red = _user_result(cand, {"test_a": "passed", "test_b": "failed"})
    nogo = gate.decide((prod, cand), (), {prod.id: _user_result(prod, both), cand.id: red}, policy, TODAY)  # type: ignore[arg-type]
    assert nogo.verdict.decision is Decision.NO_GO
    assert [r.test for r in nogo.verdict.blocking] == ["test_mine.py::test_b"]
    gone = _user_result(cand, {"test_a": "passed", "test_b": "skipped"})
    out = gate.decide((prod, cand), (), {prod.id: _user_result(prod, both), cand.id: gone}, policy, TODAY)  # type: ignore[arg-type]
    assert out.verdict.decision is Decision.INCONCLUSIVE
    assert [r.kind for r in out.verdict.reasons if r.severity is Severity.INCONCLUSIVE] == ["required-test-skipped"]


def test_a_policy_beside_the_suite_overrides_the_default(tmp_path: Path) -> None:
    (tmp_path / SUITE_POLICY).write_text("[required]\ntests = ['test_mine.py::test_a']\n")
    policy = _user_policy(tmp_path)
    assert policy.required_tests == ("test_mine.py::test_a",) and not policy.all_tests_required  # type: ignore[attr-defined]
    assert policy.origin == str(tmp_path / SUITE_POLICY)  # type: ignore[attr-defined]
    bundled_policy = load_for_suite(suite=shipped.BUNDLED_SUITE, bundled_suite=shipped.BUNDLED_SUITE,
                                    config_dir=shipped.MATRIX_DIR, explicit=None, platform_checks=True,
                                    platform_files=suite.PLATFORM_CHECKS)
    assert "test_recsys.py::*" in bundled_policy.required_tests


def test_rollback_with_no_cross_version_tests_is_not_an_error() -> None:
    procs = [suite.NodeExit(0, "pytest", 5, tail="no tests ran")]
    assert suite.classify(procs, (), ROLLBACK) == (Status.SKIPPED, suite.NO_ROLLBACK_TESTS)
    assert suite.classify(procs, (), MAIN)[0] is Status.ERROR  # in the main phase it still is
    prod, cand = _user_cells()
    both = {"test_a": "passed"}
    rollback = CellResult(prod.result_id(ROLLBACK, cand), Role.PRODUCTION, Status.SKIPPED,
                          reason=suite.NO_ROLLBACK_TESTS, phase=ROLLBACK, against=cand.id)
    results = {prod.id: _user_result(prod, both), cand.id: _user_result(cand, both), rollback.cell_id: rollback}
    user_default = replace(POLICY, required_tests=(), candidate_tests=(), required_metrics=(), rules_must_match=False)
    out = gate.decide((prod, cand), (), results, user_default, TODAY)
    assert out.verdict.decision is Decision.GO
    assert any(r.kind == "rollback" and r.severity is Severity.INFO for r in out.verdict.reasons)


def test_console_states_why_first_ten_and_how_many_more() -> None:
    reasons = tuple(Reason(Severity.INCONCLUSIVE, f"required test t{i} did not run", cell="c", test=f"t{i}",
                           kind="required-test-missing") for i in range(14))
    lines = why_lines(Verdict(Decision.INCONCLUSIVE, (*reasons, Reason(Severity.INFO, "fyi"))))
    assert lines[0] == "why (14 inconclusive reason(s)):"
    assert len([line for line in lines if line.startswith("  - ")]) == 10
    assert lines[-1] == "  ... and 4 more in report.md"
    assert why_lines(Verdict(Decision.GO, ())) == []
    waived = Reason(Severity.WAIVED, "GHSA-x in pip 23.2.1 -- allowed until 2027-01-31: reason", cell="c", kind="vulnerability")
    assert why_lines(Verdict(Decision.GO, (waived,))) == [
        "waived (1 reason(s) the policy lets pass, until their date):",
        "  - [vulnerability] c: GHSA-x in pip 23.2.1 -- allowed until 2027-01-31: reason"]  # a GO says what it let pass
    assert why_lines(Verdict(Decision.INCONCLUSIVE, (*reasons[:1], waived)))[2].startswith("waived (1 ")


def test_heartbeat_speaks_during_a_quiet_step() -> None:
    lines: list[str] = []
    console = Console(lines.append, interval_s=1.0)
    with console.step("build image x"):
        time.sleep(2.6)
    beats = [line for line in lines if "build image x" in line]
    assert beats and all(line.startswith("  ... build image x: ") for line in beats)
