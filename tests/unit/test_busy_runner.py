"""#45: a verdict on a busy runner. Run pairs taken beyond max_pressure are dropped only for the
metrics on a clock that interference moves (`[performance] pressure_clocks`, wall and device by
default: docs/performance.md, session 53), and when the runs cannot settle a gated metric yet, or
have too few quiet pairs, more interleaved rounds run within `noise_budget_s` before INCONCLUSIVE."""

from __future__ import annotations

import itertools
import json
import types
from pathlib import Path
from typing import Any

import pytest

from stackgate.backends.memory import Gauge, MemoryBackend
from stackgate.commands import run as run_module
from stackgate.commands.run import run as run_command
from stackgate.policy import load_policy

from .conftest import memory_options, on_memory
from .test_repeats import CALM, _phases, _timed

CPU = {"clock": "cpu"}


def _policy(tmp_path: Path, performance: str = "", tags: str = "") -> str:
    path = tmp_path / "policy.toml"
    path.write_text(f"[performance]\n{performance}\n[[performance.metric]]\nname = \"work.step_time\"\n"
                    f"tolerance = 0.5\n{tags}\n")
    return str(path)


def _run(tmp_path: Path, backend: MemoryBackend, policy: str, busy: list[float] | None = None
         ) -> tuple[int, dict[str, Any], list[str]]:
    said: list[str] = []
    code = run_command(memory_options(tmp_path, policy=policy), {}, said.append,
                       machinery=on_memory(backend, Gauge(busy or [])))
    return code, json.loads((tmp_path / "r" / "mem" / "report.json").read_text()), said


def _repeats(backend: MemoryBackend) -> list[str]:
    return sorted({p for _, p in _phases(backend) if p.startswith("repeat")}, key=lambda p: int(p[6:]))


@pytest.fixture
def rounds_of_50_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run command's clock moves 50 s at each reading: each noise round takes 50 s of the budget."""
    ticks = itertools.count(0, 50)
    monkeypatch.setattr(run_module, "time", types.SimpleNamespace(monotonic=lambda: float(next(ticks))))


def test_the_cpu_clock_uses_the_pairs_taken_on_a_busy_runner_and_says_so(tmp_path: Path) -> None:
    """The candidate's main run taken at 80% CPU pressure: a metric on the CPU clock is compared over that
    pair (nothing replaced), and the report says it was used, and why."""
    backend = MemoryBackend(script=_timed(CALM, candidate_factor=1.0, tags=CPU))
    code, report, said = _run(tmp_path, backend, _policy(tmp_path, tags='tags = { clock = "cpu" }'), [0.0, 0.8])
    assert code == 0 and report["decision"] == "GO"
    assert _repeats(backend) == [] and not any(line.startswith(("interference:", "noise:")) for line in said)
    (note,) = [r for r in report["reasons"] if r["kind"].startswith("pressure-")]
    assert note["kind"] == "pressure-kept" and note["severity"] == "info"
    assert note["message"].startswith("1 of 1 run pair(s) taken while the runner was busy beyond max_pressure = 60% "
                                      "are used for work.step_time[clock=cpu]: interference is not shown to move "
                                      "their clock (`[performance] pressure_clocks` = ['wall', 'device']"), note


def test_a_policy_that_names_the_cpu_clock_drops_its_busy_pairs(tmp_path: Path) -> None:
    backend = MemoryBackend(script=_timed(CALM, candidate_factor=1.0, tags=CPU))
    policy = _policy(tmp_path, 'pressure_clocks = ["wall", "cpu"]', 'tags = { clock = "cpu" }')
    code, report, said = _run(tmp_path, backend, policy, [0.0, 0.8])
    assert code == 0 and _repeats(backend) == ["repeat1"]
    assert any(line.startswith("interference: 1 more interleaved run") and "work.step_time[clock=cpu]" in line
               for line in said)
    assert [r["kind"] for r in report["reasons"] if r["kind"].startswith("pressure-")] == ["pressure-discarded"]


def test_the_wall_clock_still_drops_them(tmp_path: Path) -> None:
    backend = MemoryBackend(script=_timed(CALM, candidate_factor=1.0))
    code, report, _ = _run(tmp_path, backend, _policy(tmp_path), [0.0, 0.8])
    assert code == 0 and _repeats(backend) == ["repeat1"]
    (note,) = [r for r in report["reasons"] if r["kind"].startswith("pressure-")]
    assert note["kind"] == "pressure-discarded" and "not used for work.step_time:" in note["message"]


def test_a_clock_that_is_not_one_is_a_config_error_at_its_line(tmp_path: Path) -> None:
    from stackgate.errors import ConfigError
    with pytest.raises(ConfigError) as err:
        load_policy(Path(_policy(tmp_path, 'pressure_clocks = ["wall", "gpu"]')))
    assert err.value.exit_code == 2 and err.value.line == 2 and "pressure_clocks" in str(err.value)


def test_noisy_pairs_get_more_rounds_until_they_settle(tmp_path: Path) -> None:
    """Pairs that spread widely (2x, then +0% and +40% in turn): five runs cannot tell against a 50%
    tolerance; within the noise budget more interleaved rounds run, each said with why, until they can."""
    backend = MemoryBackend(script=_timed([x * 2 for x in CALM], candidate_factor=[1.0, 1.4]))
    code, report, said = _run(tmp_path, backend, _policy(tmp_path))
    assert code == 0 and report["decision"] == "GO"
    noise = [line for line in said if line.startswith("noise:")]
    assert noise[0].startswith("noise: 1 more interleaved run of test_model.py::test_linear_layer_trains (round 5; "
                               "0 s of the 300 s noise budget spent), because local-cpu-")
    assert "work.step_time: " in noise[0] and "cannot tell over 5 run(s); about " in noise[0]
    rounds = len(noise) - 1
    assert noise[-1] == f"noise: {rounds} more round(s) in 0 s settled what they were for"
    assert 1 <= rounds <= 20 and _repeats(backend)[-1] == f"repeat{4 + rounds}"


def test_the_noise_budget_bounds_the_rounds(tmp_path: Path, rounds_of_50_s: None) -> None:
    """Rounds of 50 s each against a 120 s budget: two more, then INCONCLUSIVE, and the console says why."""
    backend = MemoryBackend(script=_timed([x * 2 for x in CALM], candidate_factor=[1.0, 1.4]))
    code, report, said = _run(tmp_path, backend, _policy(tmp_path, "noise_budget_s = 120"))
    assert code == 1 and report["decision"] == "INCONCLUSIVE"
    assert _repeats(backend)[-1] == "repeat6"  # confirmation's 1-4, then two rounds of the budget
    assert ("noise: 2 more round(s) in 100 s, then the budget: the next round (about 50 s) would pass the 120 s noise "
            "budget ([performance] noise_budget_s); the gate decides on all the runs of "
            "test_model.py::test_linear_layer_trains") in said


def test_a_change_at_the_tolerance_gets_no_rounds_it_cannot_use(tmp_path: Path) -> None:
    """The candidate +45% and +55% in turn against a 50% tolerance: no number of runs settles that, so
    no round is spent on it; the console says so."""
    backend = MemoryBackend(script=_timed([x * 1.5 for x in CALM], candidate_factor=[1.45, 1.55]))
    code, report, said = _run(tmp_path, backend, _policy(tmp_path))
    assert report["decision"] == "INCONCLUSIVE" and code == 1
    assert not any(line.startswith("noise: 1 more") for line in said)
    (line,) = [x for x in said if x.startswith("noise:")]
    assert line.startswith("noise: no more rounds for what more runs would not settle: local-cpu-")
    assert "100 runs would not settle it" in line


def test_pairs_dropped_for_interference_are_replaced_within_the_budget(tmp_path: Path) -> None:
    """Wall clock, the runner busy for the first eight runs (pressure_reruns = 1 replaces one pair): the
    noise rounds replace the rest until enough quiet pairs are there, then GO."""
    backend = MemoryBackend(script=_timed(CALM, candidate_factor=1.0))
    code, report, said = _run(tmp_path, backend, _policy(tmp_path, "pressure_reruns = 1"), [0.9] * 8)
    assert code == 0 and report["decision"] == "GO"
    noise = [line for line in said if line.startswith("noise: 1 more")]
    assert noise and "run pair(s) taken while the runner was busy beyond max_pressure = 60% (work.step_time)" in noise[0]


def test_a_regression_seen_in_the_rounds_runs_on_to_the_end_of_the_budget(tmp_path: Path, rounds_of_50_s: None) -> None:
    """Five noisy runs cannot tell (the candidate 1.8x, then 1.5x and 2.2x in turn against a 50% tolerance:
    CI [+43%, +130%]); the rounds begin for the metric, and from round 5 the candidate is 1.8x. The first
    round calls it a regression, and the rounds do not stop at that look (an early stop on a regression
    would make a false NO-GO likelier): they run to the end of the budget (rounds of 50 s against 200 s:
    four), and the gate decides once, at their end."""
    backend = MemoryBackend(script=_timed([x * 1.8 for x in CALM], candidate_factor=[1.5, 2.2, 1.5, 2.2] + [1.8] * 16))
    code, report, said = _run(tmp_path, backend, _policy(tmp_path, "noise_budget_s = 200"))
    noise = [line for line in said if line.startswith("noise:")]
    assert code == 1 and report["decision"] == "NO-GO", report["decision"]
    assert _repeats(backend)[-1] == "repeat8"  # confirmation's 1-4, then four rounds of the budget
    assert any("a regression over" in line and "the rounds go on to the end of the budget" in line
               for line in noise[:-1])
    assert noise[-1].startswith("noise: 4 more round(s) in 200 s, then the budget: ")


def test_an_undecided_sign_test_gives_no_run_count_from_a_spread(tmp_path: Path, rounds_of_50_s: None) -> None:
    """The candidate +40% and +130% in turn against a 50% tolerance: at nine pairs four stand apart, the
    sign test's interval runs between ranked pairs and cannot tell. Its robust spread (0: most pairs
    agree) once read "about 2 interleaved runs would settle it" after nine had not; it names no count."""
    backend = MemoryBackend(script=_timed([x * 1.8 for x in CALM], candidate_factor=[1.4, 2.3, 1.4, 2.3] + [1.8] * 16))
    code, report, _ = _run(tmp_path, backend, _policy(tmp_path, "noise_budget_s = 200"))
    assert code == 1 and report["decision"] == "INCONCLUSIVE"
    (reason,) = [r for r in report["reasons"] if r["kind"] == "perf-inconclusive"]
    assert "sign test on the median pair" in reason["message"] and "would settle" not in reason["message"]
    assert "4 of the 9 run pairs stand apart from the rest, so the interval is the sign test's" in reason["message"]
