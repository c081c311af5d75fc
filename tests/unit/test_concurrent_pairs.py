"""Issue 22: pairing = "concurrent" (duet benchmarking). Measured 2026-12-05 on this kind of runner: the
fastest step of the same workload in two processes, one per core, moved together (correlation 0.99 over
3 s windows) while adjacent windows of one process differed by ~6%: a runner whose speed drifts on every
core at once. Runs taken at the same time, each on its own share of the CPUs, cancel that drift; runs
taken one after the other do not."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from stackgate import repeats, stats
from stackgate.backends.base import Execution
from stackgate.backends.docker.engine import ContainerSpec, container_kwargs
from stackgate.backends.memory import MemoryBackend, answer
from stackgate.errors import ConfigError
from stackgate.model import Cell, GpuClass, Phase, Role, RunnerPool, Stack, Topology, repeat
from stackgate.policy import Policy, load_policy
from stackgate.runner import Attempt, cpu_shares
from stackgate.suite import NodeCommand, NodeExit
from stackgate.versions import CudaVariant, parse_torch

from .conftest import RunMemory
from .test_repeats import CALM, GATED, _calibrated

TWO_CPUS = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to split")


def _policy(tmp_path: Path, pairing: str = "concurrent", repeats_: int = 4, confirm: int = 5) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(f'[performance]\nrepeats = {repeats_}\nconfirm_repeats = {confirm}\npairing = "{pairing}"\n'
                    '[[performance.metric]]\nname = "work.step_time"\ntolerance = 0.03\n')
    return path


def test_the_policy_names_the_pairing_and_a_typo_is_an_error_at_its_line(tmp_path: Path) -> None:
    assert load_policy(_policy(tmp_path)).pairing == "concurrent"
    assert Policy(None).pairing == "sequential"  # the default: no change for a policy that does not say
    bad = tmp_path / "bad.toml"
    bad.write_text('[performance]\nrepeats = 3\npairing = "together"\n')
    with pytest.raises(ConfigError) as err:
        load_policy(bad)
    assert "pairing" in str(err.value) and ":3" in str(err.value) and '"concurrent"' in (err.value.hint or "")


def test_concurrent_pairs_are_repeats_pairs_besides_the_main_run() -> None:
    assert Policy(None, repeats=5).repeat_rounds() == range(1, 5)  # 5 runs of each stack, the main run one
    assert Policy(None, repeats=5, pairing="concurrent").repeat_rounds() == range(1, 6)  # 5 pairs taken together
    assert Policy(None, repeats=1, pairing="concurrent").repeat_rounds() == range(1, 1)  # no repeats: the main pair


def test_cpu_shares_split_the_runners_cpus_and_turn_each_round() -> None:
    assert cpu_shares(2, 0, [0, 1, 2, 3]) == [(0, 1), (2, 3)]
    assert cpu_shares(2, 1, [0, 1, 2, 3]) == [(2, 3), (0, 1)]  # the next round: the stacks swap shares
    assert cpu_shares(3, 0, [4, 5, 6, 7]) == [(4, 5), (6,), (7,)]
    assert cpu_shares(3, 1, [4, 5, 6, 7]) == [(6,), (7,), (4, 5)]
    assert cpu_shares(2, 0, [0]) == []  # one CPU cannot be split: the runs go one after the other


def test_a_rounds_runs_of_one_production_cell_and_its_candidates_run_together() -> None:
    pool = RunnerPool("local", None, GpuClass.NONE, is_local=True)
    prod = Cell(Stack(parse_torch("2.13.0"), CudaVariant("cpu"), "3.11"), pool, Topology(1, 2), Role.PRODUCTION)
    cand = Cell(Stack(parse_torch("2.14.1"), CudaVariant("cpu"), "3.11"), pool, Topology(1, 2), Role.CANDIDATE,
                baseline=prod.id)
    by_id = {c.id: c for c in (prod, cand)}
    attempts = repeats.repeat_attempts([prod, cand], by_id, {prod.id: (GATED,), cand.id: (GATED,)}, range(1, 4))
    groups = repeats.by_round(attempts, by_id)
    assert [[(a.cell.role.value, a.phase) for a in g] for g in groups] == [
        [("candidate", repeat(1)), ("production", repeat(1))], [("production", repeat(2)), ("candidate", repeat(2))],
        [("candidate", repeat(3)), ("production", repeat(3))]]
    assert all(isinstance(a, Attempt) for g in groups for a in g)


class _Timed:
    """The plain suite's tests pass; the gated one records step times. The main runs are one after the
    other on a runner whose speed moved between them: the candidate's main run came out 40% slower. The
    repeats' pairs share the runner's speed; the candidate's are `factor` x production's. Each command
    records when it ran and on which CPUs."""

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.seen: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def __call__(self, command: NodeCommand, exe: Execution) -> NodeExit:
        phase, role = Phase.parse(command.env["STACKGATE_PHASE"]), command.env["STACKGATE_ROLE"]
        start = time.monotonic()
        time.sleep(0.15)
        with self.lock:
            self.seen.append({"phase": phase, "role": role, "start": start, "end": time.monotonic(),
                              "cpus": tuple(sorted(os.sched_getaffinity(0))), "exe_cpus": exe.cpus})
        speed = 1 + 0.05 * phase.round  # the runner's speed drifts from round to round
        if phase.kind.value == "main":
            samples = [x * (1.4 if role == "candidate" else 1.0) for x in CALM]
        else:
            samples = [x * speed * (self.factor if role == "candidate" else 1.0) for x in CALM]
        tests = [t for t in (GATED, "test_model.py::test_matmul_matches_numpy")
                 if phase.round == 0 or any(a.endswith(t) for a in command.argv)]
        return answer(command, dict.fromkeys(tests, "passed"), metrics=[
            {"name": "work.step_time", "unit": "ms", "samples": samples, "better": "lower", "nodeid": GATED}])


def _gated(report: dict[str, Any]) -> dict[str, Any]:
    (found,) = [c for c in report["comparisons"] if c["metric"] == "work.step_time"]
    return found


@TWO_CPUS
def test_concurrent_pairs_run_at_the_same_time_on_shares_that_swap_and_are_compared_alone(
        no_subprocesses: MemoryBackend, run_memory: RunMemory, tmp_path: Path) -> None:
    script = _Timed(factor=1.0)
    no_subprocesses.script = script
    code, report, said = run_memory(policy=str(_policy(tmp_path)), rollback=False)
    repeated = [s for s in script.seen if s["phase"].kind.value == "repeat"]
    assert sorted({s["phase"].round for s in repeated}) == [1, 2, 3, 4]  # repeats = 4 pairs besides the main run
    for r in (1, 2, 3, 4):
        p, c = (next(s for s in repeated if s["phase"].round == r and s["role"] == role)
                for role in ("production", "candidate"))
        assert p["start"] < c["end"] and c["start"] < p["end"], f"round {r}: not at the same time"
        assert p["cpus"] == p["exe_cpus"] and c["cpus"] == c["exe_cpus"]  # pinned, and the backend is told
        assert not set(p["cpus"]) & set(c["cpus"])
    shares = [next(s["cpus"] for s in repeated if s["phase"].round == r and s["role"] == "production")
              for r in (1, 2)]
    assert shares[0] != shares[1]  # production's share turns round by round
    main = [s for s in script.seen if s["phase"].kind.value == "main"]
    assert all(s["exe_cpus"] == () for s in main)  # the main runs are not split
    assert any(line.startswith("together: ") for line in said)
    # the main pair (+40%, one run after the other) is left out: 4 pairs taken together, all +0%
    gated = _gated(report)
    assert code == 0 and report["decision"] == "GO", said[-20:]
    assert gated["pairs"] == 4 and gated["pairing"] == "concurrent" and abs(gated["change"]) < 0.001


@TWO_CPUS
def test_a_regression_in_concurrent_pairs_is_no_go_and_says_how_its_pairs_were_taken(
        no_subprocesses: MemoryBackend, run_memory: RunMemory, tmp_path: Path) -> None:
    no_subprocesses.script = _Timed(factor=1.10)
    code, report, _ = run_memory(policy=str(_policy(tmp_path)), rollback=False)
    gated = _gated(report)
    assert code == 1 and report["decision"] == "NO-GO"
    assert gated["outcome"] == "regression" and gated["change"] == pytest.approx(0.10, abs=0.002)
    assert gated["pairs"] == 5  # confirmed to confirm_repeats pairs before the NO-GO
    reason = next(r["message"] for r in report["reasons"] if r["kind"] == "regression")
    assert "over 5 pairs of runs taken at the same time" in reason


def test_sequential_pairs_keep_the_main_pair(no_subprocesses: MemoryBackend, run_memory: RunMemory,
                                             tmp_path: Path) -> None:
    """The same runs, one after the other: the main pair (+40%) is one of the pairs compared; it stands
    apart, so the gate runs to the sign test's 9 pairs, which leave it out."""
    script = _Timed(factor=1.0)
    no_subprocesses.script = script
    code, report, _ = run_memory(policy=str(_policy(tmp_path, "sequential", confirm=4)), rollback=False)
    assert all(s["exe_cpus"] == () for s in script.seen)
    rounds = {s["phase"].round for s in script.seen if s["phase"].kind.value == "repeat"}
    gated = _gated(report)
    assert gated["pairs"] == 1 + len(rounds) == 9 and gated["pairing"] == "sequential" and gated["apart"] == 1
    assert code == 0 and gated["statistic"] == "sign"


@TWO_CPUS
def test_calibrate_takes_its_aa_pairs_together_after_a_first_run_alone(
        no_subprocesses: MemoryBackend, tmp_path: Path) -> None:
    script = _Timed(factor=1.0)
    pools, said = _calibrated(no_subprocesses, script, 6, _policy(tmp_path), tmp_path)
    (found,) = pools["local"]
    rounds = sorted(s["phase"].round for s in script.seen)
    assert rounds == list(range(7))  # aa0 alone (the whole suite), then 3 pairs
    first = next(s for s in script.seen if s["phase"].round == 0)
    assert first["exe_cpus"] == ()
    for r in (1, 3, 5):
        a, b = (next(s for s in script.seen if s["phase"].round == n) for n in (r, r + 1))
        assert a["start"] < b["end"] and b["start"] < a["end"] and not set(a["exe_cpus"]) & set(b["exe_cpus"])
    assert found["pairs"] == 3 and found["pairing"] == "concurrent"
    # side by side, a comparison takes one run's time per pair
    assert found["settled_s"] == round(found["recommended_repeats"] * found["run_s"], 1)
    assert any("pairs run at the same time" in line for line in said)


def test_a_containers_cpuset_is_its_share() -> None:
    spec = ContainerSpec(name="n", image="i", command=("true",), env={}, mounts=(), hostname="node0", cpus=(2, 3))
    assert container_kwargs(spec, None)["cpuset_cpus"] == "2,3"
    assert "cpuset_cpus" not in container_kwargs(ContainerSpec(name="n", image="i", command=("true",), env={},
                                                               mounts=(), hostname="node0"), None)


def test_a_comparison_of_concurrent_pairs_describes_them() -> None:
    base = [[10.0 * (1 + 0.01 * i)] for i in range(5)]
    cmp = stats.paired(base, [[x[0] * 1.1] for x in base], better="lower", tolerance=0.03)
    assert "over 5 interleaved runs" in cmp.describe("ms")
    from dataclasses import replace
    assert "over 5 pairs of runs taken at the same time" in replace(cmp, together=True).describe("ms")


@TWO_CPUS
def test_the_pairing_option_overrides_the_policy(no_subprocesses: MemoryBackend, run_memory: RunMemory,
                                                 tmp_path: Path) -> None:
    script = _Timed(factor=1.0)
    no_subprocesses.script = script
    _, report, _ = run_memory(policy=str(_policy(tmp_path, "sequential")), pairing="concurrent", rollback=False)
    assert _gated(report)["pairing"] == "concurrent"
    assert any(s["exe_cpus"] for s in script.seen if s["phase"].kind.value == "repeat")


@TWO_CPUS
def test_an_interrupt_stops_both_runs_of_a_concurrent_pair_and_records_neither(
        no_subprocesses: MemoryBackend, tmp_path: Path) -> None:
    """Ctrl-C (or a CI's SIGTERM) reaches the main thread only: the runs of the pair in flight, in their own
    threads, are stopped too (their real processes ended, not waited for), record nothing (a resumed run
    makes them again), and the report of what finished is written."""
    import signal
    import threading

    from stackgate import proc
    from stackgate.commands.run import run as run_command
    from stackgate.errors import Interrupted

    from .conftest import memory_options, on_memory

    started = threading.Event()
    timed = _Timed(factor=1.0)

    def script(command: NodeCommand, exe: Execution) -> NodeExit:
        if command.env["STACKGATE_PHASE"] == "repeat1":
            started.set()
            proc.run(["sleep", "30"], timeout_s=60)  # a real process group, as the venv backend starts
        return timed(command, exe)

    def interrupt() -> None:
        started.wait(10)
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGUSR1)

    no_subprocesses.script = script
    previous = signal.signal(signal.SIGUSR1, lambda signum, _f: (_ for _ in ()).throw(Interrupted(signal.SIGTERM)))
    threading.Thread(target=interrupt, daemon=True).start()
    begin = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_command(memory_options(tmp_path, policy=str(_policy(tmp_path)), rollback=False), {}, lambda _: None,
                        machinery=on_memory(no_subprocesses))
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert time.monotonic() - begin < 20  # not the 30 s sleeps
    recorded = (tmp_path / "r" / "mem" / "results.jsonl").read_text()
    assert '"cell_id": "' in recorded and "@repeat1" not in recorded
    assert (tmp_path / "r" / "mem" / "report.json").exists()
    assert not proc.STOPPING.is_set()
