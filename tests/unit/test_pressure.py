"""#22 item 2: the runner's interference (PSI, steal, cgroup throttling) read from the kernel's
counters, recorded per run, and runs taken under it replaced before the gate uses them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stackgate import comparison, pressure
from stackgate.backends.memory import Gauge, MemoryBackend
from stackgate.boundary.environment import Environment
from stackgate.commands.calibrate import calibrate as calibrate_command
from stackgate.commands.run import run as run_command
from stackgate.errors import InfraError
from stackgate.model import CellResult, Role, Status, repeat

from .conftest import memory_options, on_memory
from .test_repeats import CALM, _phases, _timed

PSI = """some avg10=5.56 avg60=2.65 avg300=1.79 total=2280267689
full avg10=0.00 avg60=0.00 avg300=0.00 total=12
"""
STAT = "cpu  2356606 1923 597788 4009896 46257 0 12937 14867 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"


def test_the_kernel_counters_are_read_as_they_are_written() -> None:
    assert pressure._psi(PSI) == (2280267689, 12)
    assert pressure._psi("") == (None, None)  # no PSI on this kernel: absent, not zero
    assert pressure._steal(STAT) == (14867, 2356606 + 1923 + 597788 + 4009896 + 46257 + 12937 + 14867)
    assert pressure._throttled("nr_periods 10\nnr_throttled 2\nthrottled_usec 1500\n") == 1500.0
    assert pressure._throttled("nr_periods 0\nnr_throttled 0\nthrottled_time 3000000\n") == 3000.0  # v1: ns


def test_the_cgroup_of_this_process_is_found_in_v2_and_v1(tmp_path: Path) -> None:
    (tmp_path / "ci.slice" / "job").mkdir(parents=True)
    (tmp_path / "ci.slice" / "job" / "cpu.stat").write_text("throttled_usec 0\n")
    assert pressure._cgroup_cpu_stat("0::/ci.slice/job\n", tmp_path) == tmp_path / "ci.slice" / "job" / "cpu.stat"
    (tmp_path / "cpu" / "pod").mkdir(parents=True)
    (tmp_path / "cpu" / "pod" / "cpu.stat").write_text("throttled_time 0\n")
    assert pressure._cgroup_cpu_stat("4:memory:/x\n1:cpu,cpuacct:/pod\n", tmp_path) == tmp_path / "cpu" / "pod" / "cpu.stat"
    assert pressure._cgroup_cpu_stat("0::/nowhere\n", tmp_path) is None


def test_shares_over_a_run_and_the_interference_is_the_largest() -> None:
    start = pressure.Counters(10.0, 1_000_000, 0, 100, 10_000, 0.0)
    end = pressure.Counters(12.0, 1_760_000, 0, 150, 10_400, 500_000.0)  # 2 s: 0.76 s waiting, 50 of 400 jiffies
    seen = pressure.between(start, end)
    assert (round(seen.some or 0, 3), seen.full, round(seen.steal or 0, 3), seen.throttled) == (0.38, 0.0, 0.125, 0.25)
    assert seen.interference == seen.some
    assert seen.describe() == "CPU pressure (PSI some) 38%, steal 12%, throttled 25%"
    recorded = Environment.of({"pressure": seen.to_json()})  # as a result line records it, and reads it back
    assert pressure.of_result(recorded) == pressure.Pressure(2.0, 0.38, 0.0, 0.125, 0.25)
    with pytest.raises(ValueError, match=r"pressure\.some"):
        Environment.of({"pressure": {**seen.to_json(), "some": "38%"}})
    blind = pressure.between(pressure.Counters(0.0, None, None, None, None, None),
                             pressure.Counters(1.0, None, None, None, None, None))
    assert blind.interference is None and blind.describe() == "not measurable here"


def test_every_run_records_the_runners_interference(tmp_path: Path) -> None:
    backend = MemoryBackend()
    run_command(memory_options(tmp_path), {}, lambda _: None, machinery=on_memory(backend, Gauge([0.25, 0.0])))
    rows = [json.loads(line) for line in (tmp_path / "r" / "mem" / "results.jsonl").read_text().splitlines()]
    assert [r["environment"]["pressure"]["some"] for r in rows][:2] == [0.25, 0.0]


def _gated_run(tmp_path: Path, busy: list[float], policy: str) -> tuple[int, dict[str, Any], list[str], MemoryBackend]:
    backend = MemoryBackend(script=_timed(CALM, candidate_factor=1.0))
    said: list[str] = []
    code = run_command(memory_options(tmp_path, policy=policy), {}, said.append,
                       machinery=on_memory(backend, Gauge(busy)))
    return code, json.loads((tmp_path / "r" / "mem" / "report.json").read_text()), said, backend


def _policy(tmp_path: Path, extra: str = "") -> str:
    path = tmp_path / "policy.toml"
    path.write_text(f'[performance]\n{extra}\n[[performance.metric]]\nname = "work.step_time"\ntolerance = 0.5\n')
    return str(path)


def test_a_run_taken_under_pressure_is_replaced_and_not_used(tmp_path: Path) -> None:
    code, report, said, backend = _gated_run(tmp_path, [0.0, 0.8], _policy(tmp_path))
    assert _phases(backend) == [("p", "main"), ("c", "main"), ("c", "repeat1"), ("p", "repeat1"), ("p", "rollback")]
    assert any(line.startswith("interference: 1 more interleaved run of test_model.py::test_linear_layer_trains (1 "
                               "of at most 3)") for line in said)
    assert code == 0 and report["decision"] == "GO"
    (note,) = [r for r in report["reasons"] if r["kind"] == "pressure-discarded"]
    assert note["message"].startswith("1 of 2 run pair(s) not used for work.step_time: taken while the runner "
                                      "was busy beyond max_pressure = 60% (main run: production CPU pressure (PSI "
                                      "some) 0%, steal 0%, throttled 0%, candidate CPU pressure (PSI some) 80%")


def test_a_runner_busy_in_every_run_gives_no_performance_verdict(tmp_path: Path) -> None:
    code, report, said, backend = _gated_run(tmp_path, [0.9] * 20, _policy(tmp_path, "pressure_reruns = 2\n"
                                                                                       "noise_budget_s = 0"))
    assert [p for _, p in _phases(backend)].count("repeat2") == 2 and "repeat3" not in [p for _, p in _phases(backend)]
    assert [line.split(" (")[1].split(")")[0] for line in said if line.startswith("interference:")] == [
        "1 of at most 2", "2 of at most 2"]
    assert code == 1 and report["decision"] == "INCONCLUSIVE"
    (reason,) = [r for r in report["reasons"] if r["severity"] == "inconclusive"]
    assert reason["kind"] == "perf-pressure" and "all 3 run pair(s) were taken while the runner was busy" in reason[
        "message"]


def test_the_threshold_is_the_policys(tmp_path: Path) -> None:
    """max_pressure = 1 keeps every run: nothing is replaced (the runner's pressure is still recorded)."""
    code, report, _, backend = _gated_run(tmp_path, [0.0, 0.8], _policy(tmp_path, "max_pressure = 1.0"))
    assert code == 0 and ("c", "repeat1") not in _phases(backend)
    assert not [r for r in report["reasons"] if r["kind"] == "pressure-discarded"]


def test_a_pair_is_dropped_whole_when_either_side_was_busy() -> None:
    def result(phase_round: int, busy: float | None) -> CellResult:
        env = {} if busy is None else {"pressure": pressure.Pressure(1.0, busy).to_json()}
        return CellResult("c", Role.CANDIDATE, Status.PASSED, phase=repeat(phase_round), environment=env)

    quiet, busy, unknown = (result(1, 0.1), result(1, 0.1)), (result(2, 0.1), result(2, 0.7)), (result(3, None),
                                                                                                 result(3, None))
    kept, dropped = comparison.disturbed([quiet, busy, unknown], 0.5)
    assert kept == [quiet, unknown] and dropped == [busy]


def test_an_inconclusive_for_noise_says_how_busy_the_runner_was(tmp_path: Path) -> None:
    """Candidate runs that spread widely (2x, +0%, +40%: the gate cannot tell), under CPU pressure below
    max_pressure: the reason quotes the interference of the runs it used."""
    backend = MemoryBackend(script=_timed([x * 2 for x in CALM], candidate_factor=[1.0, 1.4]))
    said: list[str] = []
    busy = [0.05, 0.38, 0.30, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.45]  # P C | C P | P C | C P | P C
    run_command(memory_options(tmp_path, policy=_policy(tmp_path, "noise_budget_s = 0")), {}, said.append,
                machinery=on_memory(backend, Gauge(busy)))
    report = json.loads((tmp_path / "r" / "mem" / "report.json").read_text())
    (reason,) = [r for r in report["reasons"] if r["kind"] == "perf-inconclusive"]
    assert reason["message"].endswith("(the runner's CPU interference during the runs used: candidate up to 45% "
                                      "(above 10% in 3 of 5 runs), production up to 5%)"), reason["message"]


def _calibrate(tmp_path: Path, busy: list[float], extra: str = "") -> tuple[int, list[str], MemoryBackend]:
    backend = MemoryBackend(script=_timed(CALM, candidate_factor=1.0))
    said: list[str] = []
    code = calibrate_command(memory_options(tmp_path, run_id="cal", policy=_policy(tmp_path, extra)), {},
                             runs=4, target=0.05, allow=0.01, say=said.append,
                             machinery=on_memory(backend, Gauge(busy)))
    return code, said, backend


def test_calibrate_does_not_use_an_aa_pair_taken_under_pressure_and_runs_another(tmp_path: Path) -> None:
    """The gate leaves out pairs taken beyond max_pressure; calibration must measure the noise of the
    runs the gate keeps, not of a busy minute."""
    code, said, backend = _calibrate(tmp_path, [0.0, 0.0, 0.0, 0.8])  # run 4 (the second pair's) was busy
    assert code == 0
    assert [c.env["STACKGATE_PHASE"] for c in backend.executed] == ["aa0", "aa1", "aa2", "aa3", "aa4", "aa5"]
    assert "  1 A/A pair(s) taken while the runner was busy beyond max_pressure = 60% were not used" in said
    (found,) = json.loads((tmp_path / "r" / "cal" / "calibration.json").read_text())["pools"]["local"]
    assert found["pairs"] == 2 and found["pairs_disturbed"] == 1  # pairs (aa0, aa1) and (aa4, aa5)


def test_calibrate_on_a_runner_busy_throughout_says_so_instead_of_calibrating(tmp_path: Path) -> None:
    with pytest.raises(InfraError, match=r"busy beyond max_pressure = 60% during 3 of 3 A/A pairs") as err:
        _calibrate(tmp_path, [0.9] * 20, "pressure_reruns = 1")
    assert err.value.exit_code == 3 and "quieter runner" in (err.value.hint or "")
