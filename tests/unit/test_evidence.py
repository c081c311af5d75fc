"""Issue 9's findings at the module level: bad lines never stop a run, torn tails are repaired before
the next append, validation says file:line, reports are atomic and free of control characters."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from stackgate import matrix, options, policy, stats, suite, tomlfile
from stackgate.boundary import records as records_boundary
from stackgate.errors import ConfigError
from stackgate.model import CellResult, Role, Status
from stackgate.report.files import atomic_write, strip_control
from stackgate.rundir import RunDir, results


def test_bad_result_lines_are_problems_not_crashes(tmp_path: Path) -> None:
    results.append(tmp_path, CellResult("c1", Role.CANDIDATE, Status.PASSED))
    with (tmp_path / results.RESULTS).open("a") as fh:
        fh.write("null\n\"a bare string\"\n")
        fh.write(json.dumps({"cell_id": "c2", "role": "candidate", "status": "passed",
                             "metrics": [{"name": "m", "samples": [1], "tags": ["not", "a", "table"]}]}) + "\n")
    read = results.read_all(tmp_path)
    assert read.results["c1"].status is Status.PASSED
    assert read.results["c2"].status is Status.ERROR and read.results["c2"].role is Role.CANDIDATE
    assert "results.jsonl:4" in read.results["c2"].reason  # quotes where the bad line is
    assert [p.split(":")[1] for p in read.problems] == ["2", "3", "4"]


def test_torn_tail_is_cut_before_the_next_append(tmp_path: Path) -> None:
    results.append(tmp_path, CellResult("c1", Role.CANDIDATE, Status.PASSED))
    with (tmp_path / results.RESULTS).open("a") as fh:
        fh.write('{"cell_id": "c2", "sta')
    assert results.repair_tail(tmp_path) == '{"cell_id": "c2", "sta'
    assert results.repair_tail(tmp_path) is None  # idempotent
    results.append(tmp_path, CellResult("c2", Role.CANDIDATE, Status.PASSED))
    read = results.read_all(tmp_path)
    assert set(read.results) == {"c1", "c2"} and read.problems == ()
    assert RunDir(tmp_path).torn.read_text() == '{"cell_id": "c2", "sta\n'


@pytest.mark.parametrize("line", ['"just a string"', "null", '{"name": "m", "samples": [1], "tags": ["x"]}',
                                  '{"name": "m", "samples": ["fast"]}'])
def test_a_bad_metrics_record_makes_the_cell_error_quoting_the_line(tmp_path: Path, line: str) -> None:
    (tmp_path / "results-node0.jsonl").write_text(json.dumps({"name": "ok", "samples": [1.0]}) + "\n" + line + "\n")
    (tmp_path / "junit-node0-suite.xml").write_text(
        '<testsuites><testsuite><testcase classname="test_a" file="test_a.py" name="test_x"/></testsuite></testsuites>')
    from tests.unit.test_user_paths import _user_cells
    _, cand = _user_cells()
    result = suite.build_result(cand, [suite.NodeExit(0, "pytest", 0)], tmp_path, 1.0)
    assert result.status is Status.ERROR
    assert "results-node0.jsonl:2" in result.reason and line[:20] in result.reason


def test_parity_fails_on_nan_and_short_trajectories() -> None:
    base = [2.0 * 0.9 ** i for i in range(20)]
    nan = stats.parity(base, [*base[:5], math.nan, *base[6:]], rtol=1e-3, atol=0, steps=10)
    assert not nan.within and not nan.bitwise and "not finite" in nan.problem
    short = stats.parity(base, base[:2], rtol=1e-3, atol=0, steps=10)
    assert not short.within and not short.bitwise and short.problem == "candidate trajectory has 2 of 10 steps"
    assert stats.parity(base, base, rtol=0, atol=0, steps=10).bitwise
    assert stats.parity(base[:5], [*base[:5], 1.0], rtol=0, atol=0).within  # longer than production is fine


@pytest.mark.parametrize(("text", "message"), [
    ("[performance]\nresamples = 0\n", "'resamples' = 0 is out of range"),
    ("[performance]\nconfidence = 7\n", "'confidence' = 7 is out of range"),
    ("[[performance.metric]]\nname = 'x'\ntolerance = -1\n", "'tolerance' = -1 is out of range"),
    ("[[performance.metric]]\nname = 'x'\ntolerance = 0.1\nmethod = 'guess'\n", "method = 'guess' is not one of \"bootstrap\", \"threshold\""),
    ("[[performance.metric]]\nname = 'x'\ntolerance = 0.1\nsummary = 'mean'\n", "summary = 'mean' is not one of \"median\", \"best\""),
    ("[gate]\ninconclusive_exit_code = 7\n", "out of range"),
])
def test_policy_values_are_range_checked_with_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        policy.load_policy(path)
    assert message in str(info.value) and f"{path}:" in str(info.value)


def test_misspelled_table_and_empty_topology_are_errors(tmp_path: Path) -> None:
    project = tmp_path / "stackgate.toml"
    project.write_text("[rnu]\nprofile = 'quick'\n")
    with pytest.raises(ConfigError, match=r"stackgate.toml:1: unknown key 'rnu'") as info:
        options.read({}, {}, project)
    assert info.value.hint == "did you mean 'run'?"
    doc = tomlfile.loads("[matrix]\ntopology = ['0x0']\n", tmp_path / "m.toml")
    with pytest.raises(ConfigError, match="at least one node"):
        matrix._topology_word(doc, "0x0", "matrix")


def test_reports_are_written_atomically_and_without_control_characters(tmp_path: Path) -> None:
    target = tmp_path / "report.md"
    atomic_write(target, "old")
    atomic_write(target, "new")
    assert target.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["report.md"]
    assert strip_control("ok\x00 \x1b[31mred\x1b[0m\tend\n") == "ok red\tend\n"


# ---- issue 18 items 7 and 8: extreme and unbounded evidence


def _cell_with_records(tmp_path: Path, data: bytes) -> CellResult:
    (tmp_path / "results-node0.jsonl").write_bytes(data)
    (tmp_path / "junit-node0-suite.xml").write_text(
        '<testsuites><testsuite><testcase classname="test_a" file="test_a.py" name="test_x"/></testsuite></testsuites>')
    from tests.unit.test_user_paths import _user_cells
    _, cand = _user_cells()
    return suite.build_result(cand, [suite.NodeExit(0, "pytest", 0)], tmp_path, 1.0)


def test_a_record_that_is_not_utf8_is_unreadable_evidence(tmp_path: Path) -> None:
    """It used to become U+FFFD and be accepted."""
    result = _cell_with_records(tmp_path, b'{"name": "step\xff\xfe", "samples": [1.0, 2.0]}\n')
    assert result.status is Status.ERROR
    assert "results-node0.jsonl:1: unreadable record (not valid UTF-8" in result.reason
    assert "\\xff\\xfe" in result.reason  # the bad bytes are shown, not replaced
    assert not result.metrics


def test_a_record_line_beyond_the_limit_is_unreadable_evidence(tmp_path: Path) -> None:
    big = json.dumps({"name": "step", "samples": [1.0], "pad": "x" * suite.MAX_RECORD_BYTES}).encode()
    result = _cell_with_records(tmp_path, big + b"\n" + b'{"name": "ok", "samples": [1.0]}\n')
    assert result.status is Status.ERROR
    assert f"more than the limit of {suite.MAX_RECORD_BYTES}" in result.reason
    assert [m.name for m in result.metrics] == ["ok"]


def test_a_metric_with_more_samples_than_the_limit_is_unreadable_evidence(tmp_path: Path) -> None:
    line = json.dumps({"name": "step", "samples": [1.0] * (suite.MAX_SAMPLES + 1)}).encode()
    result = _cell_with_records(tmp_path, line + b"\n")
    assert result.status is Status.ERROR
    assert f"at most {suite.MAX_SAMPLES} items" in result.reason


def test_a_results_file_beyond_the_limit_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(records_boundary, "MAX_RECORDS_BYTES", 1000)
    result = _cell_with_records(tmp_path, b'{"name": "ok", "samples": [1.0]}\n' * 100)
    assert result.status is Status.ERROR and "more than the limit of 1000" in result.reason
    assert not result.metrics


def test_results_lines_that_are_not_utf8_or_too_long_are_problems(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    results.append(tmp_path, CellResult("c1", Role.CANDIDATE, Status.PASSED))
    good = json.dumps(CellResult("c2", Role.CANDIDATE, Status.PASSED).to_json())
    with (tmp_path / results.RESULTS).open("ab") as fh:
        fh.write(good.replace('"c2"', '"c\xe9"').encode("latin-1") + b"\n")
        fh.write(good.replace('"c2"', '"c3"').encode() + b"\n")
    monkeypatch.setattr(results, "MAX_RESULT_LINE", len(good) - 1)
    read = results.read_all(tmp_path)
    assert set(read.results) == set()  # c1's line is longer than the limit too
    monkeypatch.setattr(results, "MAX_RESULT_LINE", 64 << 20)
    read = results.read_all(tmp_path)
    assert set(read.results) == {"c1", "c3"}
    [problem] = read.problems
    assert problem.startswith("results.jsonl:2: not a result (UnicodeDecodeError") and "\\xe9" in problem


def test_statistics_of_extreme_finite_values_never_raise() -> None:
    """1e-308 in production against 1e308 in the candidate raised in statistics.stdev (no report)."""
    tiny, huge = [[1e-308] * 5] * 3, [[1e308] * 5] * 3
    worse = stats.paired(tiny, huge, better="lower", tolerance=0.05)
    assert worse.outcome is stats.Outcome.REGRESSION and worse.low == math.inf
    better = stats.paired(tiny, huge, better="higher", tolerance=0.05)
    assert better.outcome is stats.Outcome.IMPROVEMENT
    assert stats.compare([1e-308] * 5, [1e308] * 5, better="lower", tolerance=0.05).outcome is stats.Outcome.REGRESSION
    assert stats.median([1e308, 1e308]) == 1e308  # statistics.median gives inf
    assert stats.threshold([1e308], [1e-308], better="higher", tolerance=0.1).outcome is stats.Outcome.REGRESSION


def test_the_bootstrap_cost_is_bounded_whatever_the_sample_count() -> None:
    rng = __import__("random").Random(3)
    base = [1.0 + rng.random() / 100 for _ in range(200_000)]
    cand = [x * 1.5 for x in base]
    got = stats.compare(base, cand, better="lower", tolerance=0.05)
    assert got.outcome is stats.Outcome.REGRESSION and got.thinned_from == 200_000
    assert "interval from 2000 evenly spaced order statistics of 200000 samples" in got.describe("ms")
    assert stats.median(base) == got.base_median  # the medians are of every sample
    thinned = stats.thin(base)
    assert len(thinned) == stats.MAX_BOOTSTRAP_SAMPLES and thinned[0] == min(base) and thinned[-1] == max(base)


def test_a_log_keeps_its_head_and_tail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """200 MiB of test output gave a 210 MB node log per cell."""
    from stackgate import proc
    monkeypatch.setattr(proc, "LOG_HEAD_BYTES", 10_000)
    monkeypatch.setattr(proc, "LOG_TAIL_BYTES", 5_000)
    log = tmp_path / "node0.log"
    script = "import sys\nfor i in range(100000): print(f'line {i}')\nprint('x' * 200000)\nprint('the end')\n"
    result = proc.run([__import__("sys").executable, "-c", script], log_path=log, timeout_s=60)
    assert result.ok
    text = log.read_text()
    assert len(text) < 10_000 + 5_000 + 1000
    assert "line 0\n" in text and "the end\n" in text and "bytes of output left out here" in text
    assert "line 99999" not in text


def test_a_node_log_on_a_full_disk_never_raises_and_the_tail_says_the_disk_is_full() -> None:
    """#19 item 4: at 16 KiB free the node's log raised in the node's thread (a traceback, the node's exit
    lost). /dev/full answers every write with ENOSPC: the process still runs to its end, and its result
    says why its log is missing, in words the disk-full rule reads."""
    import sys

    from stackgate import proc
    from stackgate.installer import is_disk_full
    result = proc.run([sys.executable, "-c", "print('x' * 100000)"], log_path=Path("/dev/full"))
    assert result.returncode == 0
    assert "cannot write the log /dev/full: [Errno 28] No space left on device" in result.tail
    assert is_disk_full(result.tail)
