"""`stackgate selftest`: inject known faults into a recorded run and check that the real gate, with
the real policy, says NO-GO for the right reason while the clean run says GO.

The recorded run is real: the production and candidate results of the bundled suite on a CPU
runner (`resources/selftest/recorded-cpu.jsonl`, refreshed by `scripts/refresh-selftest-data.py`),
with the test and metric names the suite really writes. The clean cases are built from it for a CPU
pool and for a GPU pool (same names, gated by the cuda rules): the candidate gets production's
values, so every gated metric must be decidable on each device, or the clean case is not GO.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from stackgate import gate, shipped
from stackgate.boundary.results import from_json as result_from_json
from stackgate.evidence import GateOutcome
from stackgate.model import (
    MAIN,
    ROLLBACK,
    Cell,
    CellResult,
    GpuClass,
    Metric,
    Outcome,
    Role,
    RunnerPool,
    Stack,
    Status,
    TestOutcome,
    Topology,
    Transport,
)
from stackgate.policy import Policy, load_policy
from stackgate.versions import CudaVariant, parse_driver, parse_torch

RECORDING = ("selftest", "recorded-cpu.jsonl")
NCCL_SOCKET_LOG = """NCCL INFO NCCL version 2.30.7+cuda13.0
NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.
NCCL INFO NET/Socket : Using [0]eth0:10.0.0.2<0>
NCCL INFO Using network Socket
"""


@dataclass(frozen=True)
class Recorded:
    production: Cell
    candidate: Cell
    results: dict[str, CellResult]

    @property
    def candidate_result(self) -> CellResult:
        return self.results[self.candidate.id]

    def with_candidate(self, result: CellResult) -> dict[str, CellResult]:
        return {**self.results, self.candidate.id: result}


def _pool(device: str, nproc: int) -> RunnerPool:
    if device == "cuda":
        return RunnerPool("local", parse_driver("580.65.06"), GpuClass.DATACENTER, gpu="H100", gpus_per_node=nproc,
                          transport=Transport.EFA, is_local=True)
    return RunnerPool("local", None, GpuClass.NONE, gpu="cpu", is_local=True)


def _cell(result: CellResult, pool: RunnerPool) -> Cell:
    stack = result.cell.stack
    nodes, nproc = result.cell.nodes_and_processes
    return Cell(Stack(parse_torch(stack.torch), CudaVariant.parse(stack.cuda), stack.python), pool,
                Topology(nodes, nproc), result.role, required=True)


GPU_SPREAD = 0.01


def _gpu_spread(metric: Metric) -> Metric:
    """CPU noise is not GPU noise: on the GPU pool a sampled metric keeps the recording's name, tags
    and sample count, with its samples spread 1% around the recorded median (seeded). Trajectories
    ("equal") and single values stay as recorded. A recording from a GPU runner makes this moot."""
    if metric.better == "equal" or len(metric.samples) < 2:
        return metric
    centre = statistics.median(metric.samples)
    rng = random.Random(metric.key)
    return replace(metric, samples=tuple(centre * (1 + rng.gauss(0, GPU_SPREAD)) for _ in metric.samples))


def _on_device(metric: Metric) -> Metric:
    """On the GPU pool the recording's CPU-time clock stands in for the device clock (CUDA events) that
    a GPU runner records and the cuda rules gate."""
    tags = dict(metric.tags)
    if tags.get("clock") != "cpu":
        return metric
    return replace(metric, tags=tuple(sorted({**tags, "clock": "device"}.items())))


def recorded(device: str = "cpu") -> Recorded:
    """The clean pair on a `device` pool: the candidate's tests, production's metric values."""
    text = shipped.resource(*RECORDING).read_text()
    rows = [result_from_json(json.loads(line)) for line in text.splitlines() if line.strip()]
    main = [r for r in rows if r.phase == MAIN]
    prod_r = next(r for r in main if r.role is Role.PRODUCTION)
    cand_r = next(r for r in main if r.role is Role.CANDIDATE)
    nproc = cand_r.cell.nodes_and_processes[1]
    pool = _pool(device, nproc)
    prod = _cell(prod_r, pool)
    cand = replace(_cell(cand_r, pool), baseline=prod.id)
    if device == "cuda":
        prod_r = replace(prod_r, metrics=tuple(_gpu_spread(_on_device(m)) for m in prod_r.metrics))
        cand_r = replace(cand_r, metrics=tuple(_on_device(m) for m in cand_r.metrics))
    base = {m.key: m for m in prod_r.metrics}
    cand_metrics = tuple(replace(base[m.key], test=m.test) if m.key in base else m for m in cand_r.metrics)
    results = {prod.id: replace(prod_r, cell_id=prod.id, cell=prod.record()),
               cand.id: replace(cand_r, cell_id=cand.id, metrics=cand_metrics, cell=cand.record())}
    for r in rows:
        if r.phase == ROLLBACK:
            rid = prod.result_id(ROLLBACK, cand)
            results[rid] = replace(r, cell_id=rid, against=cand.id)
    return Recorded(prod, cand, results)


def _with_metric(result: CellResult, name: str, change: Callable[[Metric], Metric]) -> CellResult:
    return replace(result, metrics=tuple(change(m) if m.name == name else m for m in result.metrics))


def _fail_test(result: CellResult, name: str, message: str) -> CellResult:
    return replace(result, status=Status.FAILED, reason=f"1 test(s) failed: {name}",
                   tests=tuple(TestOutcome(t.name, Outcome.FAILED, t.duration_s, message) if t.name == name else t
                               for t in result.tests))


def _scale(name: str, factor: float) -> Callable[[CellResult], CellResult]:
    return lambda r: _with_metric(r, name, lambda m: replace(m, samples=tuple(s * factor for s in m.samples)))


def _transport_fallback(result: CellResult) -> CellResult:
    sys.path.insert(0, str(shipped.BUNDLED_SUITE))
    import nccl_log  # type: ignore[import-not-found]  # the suite's own parser, applied to a captured NCCL log
    ok, why = nccl_log.parse(NCCL_SOCKET_LOG).matches("efa")
    if ok:
        return result
    return _fail_test(result, "test_transport.py::test_nccl_transport_matches_pool", f"AssertionError: {why}")


def _drift(name: str) -> Callable[[CellResult], CellResult]:
    return lambda r: _with_metric(r, name, lambda m: replace(
        m, samples=tuple(s * (1 + 0.02 * i) for i, s in enumerate(m.samples))))


@dataclass(frozen=True)
class Case:
    name: str
    device: str
    inject: Callable[[CellResult], CellResult]
    expect: str  # decision
    kind: str  # the reason kind that must be among the deciding reasons ("" for GO)


CASES = (
    Case("clean run (CPU pool)", "cpu", lambda r: r, "GO", ""),
    Case("clean run (GPU pool)", "cuda", lambda r: r, "GO", ""),
    Case("10% slowdown", "cuda", _scale("recsys.step_time", 1.10), "NO-GO", "regression"),
    Case("2x slowdown on a CPU runner", "cpu", _scale("vit.step_time", 2.0), "NO-GO", "regression"),
    Case("20% more peak memory", "cuda", _scale("vit.peak_memory", 1.20), "NO-GO", "regression"),
    Case("numerics drift", "cuda", _drift("vit.loss"), "NO-GO", "numerics"),
    Case("checkpoint will not load", "cuda", lambda r: _fail_test(
        r, "test_crossversion.py::test_load_dcp_model_and_optimizer",
        "RuntimeError: Error(s) in loading state_dict: unexpected key 'optim.state.0.exp_avg'"), "NO-GO", "failed-test"),
    Case("transport fallback to sockets", "cuda", _transport_fallback, "NO-GO", "failed-test"),
    Case("failing required test", "cuda", lambda r: _fail_test(
        r, "test_identity.py::test_cuda_build_matches_cell", "AssertionError: torch is a CPU build"),
        "NO-GO", "failed-test"),
    Case("candidate stopped recording a metric", "cuda",
         lambda r: replace(r, metrics=tuple(m for m in r.metrics if m.name != "vit.step_time")),
         "INCONCLUSIVE", "missing-metric"),
)


def run_case(case: Case, policy: Policy, today: dt.date) -> tuple[bool, GateOutcome]:
    rec = recorded(case.device)
    results = rec.with_candidate(case.inject(rec.candidate_result))
    outcome = gate.decide((rec.production, rec.candidate), (), results, policy, today)
    ok = outcome.verdict.decision.value == case.expect
    if case.kind:
        ok = ok and any(r.kind == case.kind for r in outcome.verdict.reasons
                        if r.severity.value in ("blocking", "inconclusive"))
    return ok, outcome


def main(*, as_json: bool = False, policy_path: Path | None = None) -> int:
    policy = load_policy(policy_path or shipped.MATRIX_DIR / "policy.toml")
    rows = []
    for case in CASES:
        ok, outcome = run_case(case, policy, dt.date.today())
        deciding = [r for r in outcome.verdict.reasons if r.severity.value in ("blocking", "inconclusive")]
        first = deciding[0].message if deciding else ""
        rows.append({"case": case.name, "expected": case.expect, "got": outcome.verdict.decision.value,
                     "reason_kind": case.kind, "ok": ok, "reason": first[:200]})
    if as_json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            print(f"[{'ok' if row['ok'] else 'FAIL'}] {row['case']:38} expected {row['expected']:12} "
                  f"got {row['got']:12} {row['reason']}")
    failed = [r for r in rows if not r["ok"]]
    print(f"selftest: {len(rows) - len(failed)} passed, {len(failed)} failed")
    return 0 if not failed else 1
