from __future__ import annotations

import json
from pathlib import Path

import busbw
import nccl_log
import pytest

from stackgate import fleet, junit, suite
from stackgate.model import MAIN, ROLLBACK, CellResult, Phase, Role, Status
from stackgate.rundir import results

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.mark.parametrize(("collective", "n", "factor"), [
    ("all_reduce", 2, 1.0), ("all_reduce", 8, 1.75), ("all_reduce", 16, 1.875),
    ("all_gather", 8, 7 / 8), ("reduce_scatter", 4, 3 / 4), ("all_to_all", 16, 15 / 16),
    ("broadcast", 8, 1.0), ("reduce", 8, 1.0),
])
def test_busbw_factors_pinned_to_nccl_tests(collective: str, n: int, factor: float) -> None:
    assert busbw.bus_factor(collective, n) == pytest.approx(factor)


def test_busbw_worked_example_from_aws_ofi_nccl_584() -> None:
    # 16 ranks: algbw 11.135 GB/s -> busbw 20.878 GB/s
    seconds = (1 << 30) / 1e9 / 11.135
    assert busbw.busbw_gbps("all_reduce", 1 << 30, seconds, 16) == pytest.approx(20.878, rel=1e-4)
    assert busbw.bus_factor("all_reduce", 8, nvls=True) == pytest.approx(7 / 9)
    assert busbw.sizes(8, 128, 4) == [8, 32, 128]


@pytest.mark.parametrize(("log", "network", "expected", "ok"), [
    ("nccl-efa.log", "efa", "efa", True),
    ("nccl-socket-fallback.log", "socket", "efa", False),
    ("nccl-ib.log", "ib", "ib", True),
    ("nccl-ib.log", "ib", "efa", False),
])
def test_nccl_log_parser(log: str, network: str, expected: str, ok: bool) -> None:
    found = nccl_log.parse((DATA / log).read_text())
    assert found.network == network
    assert found.matches(expected)[0] is ok


def test_nccl_log_details() -> None:
    efa = nccl_log.parse((DATA / "nccl-efa.log").read_text())
    assert efa.version == "2.30.7" and efa.ofi_provider == "efa" and efa.plugin
    assert {"P2P", "NET"} <= efa.transports
    sock = nccl_log.parse((DATA / "nccl-socket-fallback.log").read_text())
    assert sock.plugin_missing
    assert "net plugin not found" in sock.matches("efa")[1]
    assert nccl_log.parse("").matches("efa")[0] is False
    assert nccl_log.parse("").matches("none")[0] is True


def test_junit_merge_and_records(tmp_path: Path) -> None:
    (tmp_path / "junit-node0.xml").write_text(
        '<testsuites><testsuite><testcase classname="test_a" file="test_a.py" name="test_x" time="1.5"/>'
        '<testcase classname="test_a" file="test_a.py" name="test_y" time="0.1"><skipped message="why"/></testcase>'
        '</testsuite></testsuites>')
    (tmp_path / "junit-node1.xml").write_text(
        '<testsuites><testsuite><testcase classname="test_a" file="test_a.py" name="test_x" time="1.4">'
        '<failure message="boom">trace</failure></testcase></testsuite></testsuites>')
    tests = junit.parse_junit(sorted(tmp_path.glob("junit-node*.xml")))
    by = {t.name: t for t in tests}
    assert by["test_a.py::test_x"].outcome == "failed" and "boom" in by["test_a.py::test_x"].message
    assert by["test_a.py::test_y"].outcome == "skipped"
    (tmp_path / "results-node0.jsonl").write_text(
        json.dumps({"kind": "metric", "name": "m", "unit": "ms", "samples": [1, 2], "tags": {"size": 8}}) + "\n"
        + json.dumps({"name": "plain", "value": 3}) + "\n{not json\n"
        + json.dumps({"kind": "environment", "torch": "2.14.1"}) + "\n"
        + json.dumps({"kind": "warning", "category": "FutureWarning", "message": "x"}) + "\n")
    rec = suite.parse_records([tmp_path / "results-node0.jsonl"])
    assert [m.key for m in rec.metrics] == ["m[size=8]", "plain"]
    assert rec.environment == {"torch": "2.14.1"} and rec.warnings == ["FutureWarning: x"]
    assert len(rec.problems) == 1


def _proc(rc: int, timed_out: bool = False, tail: str = "", oom_killed: bool = False) -> suite.NodeExit:
    return suite.NodeExit(0, "pytest", rc, timed_out, oom_killed, 1.0, tail)


def test_classify_statuses() -> None:
    from stackgate.model import TestOutcome
    ok = (TestOutcome("t", "passed"),)
    assert suite.classify([_proc(0)], ok)[0] is Status.PASSED
    assert suite.classify([_proc(1)], (TestOutcome("t", "failed"),))[0] is Status.FAILED
    assert suite.classify([_proc(-15, timed_out=True)], ok)[0] is Status.TIMEOUT
    assert suite.classify([_proc(-9, oom_killed=True)], ok)[0] is Status.OOM  # the backend says so, as data
    assert suite.classify([_proc(-9, tail="Killed")], ok)[0] is Status.CRASHED  # a log line is not evidence
    assert suite.classify([_proc(-11)], ok)[0] is Status.CRASHED
    assert suite.classify([_proc(5)], ())[0] is Status.ERROR
    assert suite.classify([_proc(0)], ())[0] is Status.ERROR
    assert suite.classify([_proc(0), _proc(1)], (TestOutcome("t", "failed"),))[0] is Status.FAILED


def test_results_append_read_and_torn_line(tmp_path: Path) -> None:
    r = CellResult("c1", Role.CANDIDATE, Status.PASSED)
    results.append(tmp_path, r)
    results.append(tmp_path, CellResult("c2", Role.PRODUCTION, Status.FAILED, reason="x"))
    with (tmp_path / results.RESULTS).open("a") as fh:
        fh.write('{"cell_id": "c3", "role": "cand')  # killed mid-write
    got = results.read(tmp_path)
    assert set(got) == {"c1", "c2"} and got["c2"].reason == "x"
    assert results.resume_dir(tmp_path.parent, tmp_path.name) == tmp_path


def test_a_users_suite_gets_a_separate_platform_checks_invocation(tmp_path: Path) -> None:
    own = suite.invocations(suite.SuiteSpec(), MAIN)
    assert [i.label for i in own] == ["suite"] and own[0].args[:3] == (str(suite.BUNDLED_SUITE), "--rootdir",
                                                                        str(suite.BUNDLED_SUITE))
    user = suite.invocations(suite.SuiteSpec(path=tmp_path, pytest_args=("-k", "mine")), MAIN)
    assert [i.label for i in user] == ["platform", "suite"]
    assert [Path(a).name for a in user[0].args[:3]] == list(suite.PLATFORM_CHECKS)
    assert "-k" not in user[0].args and user[1].args[-2:] == ("-k", "mine")  # the user's filter is theirs
    assert user[0].cwd == suite.BUNDLED_SUITE and user[1].cwd == tmp_path
    off = suite.invocations(suite.SuiteSpec(path=tmp_path, platform_checks=False), MAIN)
    assert [i.label for i in off] == ["suite"]
    rollback = suite.invocations(suite.SuiteSpec(path=tmp_path), ROLLBACK)
    assert [i.label for i in rollback] == ["suite"] and rollback[0].args[-2:] == ("-m", "crossversion")
    argv = suite.pytest_argv("py", own[0], tmp_path / "j.xml")
    assert argv[:3] == ["py", "-m", "pytest"] and argv[-1] == f"--junitxml={tmp_path / 'j.xml'}"


def test_nightly_resolves_newest_dev_build_from_a_wheelhouse(tmp_path: Path) -> None:
    from stackgate.errors import ConfigError
    from stackgate.model import WheelSource
    from stackgate.sources import PipConfig, Target, installer_args, newest_nightly, parse_pip_config
    for name in ("torch-2.15.0.dev20261120+cu130-cp311-cp311-manylinux_2_28_x86_64.whl",
                 "torch-2.15.0.dev20261128+cu130-cp311-cp311-manylinux_2_28_x86_64.whl",
                 "torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl", "not-a-wheel.txt",
                 # newer, but for another Python and platform, or another CUDA variant: never picked
                 "torch-2.15.0.dev20261130+cu130-cp313-cp313-manylinux_2_28_aarch64.whl",
                 "torch-2.15.0.dev20261129+cu126-cp311-cp311-manylinux_2_28_x86_64.whl"):
        (tmp_path / name).write_bytes(b"")
    source = WheelSource(find_links=(str(tmp_path),), inherit_pip_config=False, pre=True)
    target = Target(pythons=("3.11",), variants=("cu130",), arch="x86_64")
    # the date, without a variant label: each cell asks for its own variant of that date
    assert str(newest_nightly(source, PipConfig(), target=target)) == "2.15.0.dev20261128"
    with pytest.raises(ConfigError, match=r"for Python 3\.12 on x86_64"):
        newest_nightly(source, PipConfig(), target=Target(pythons=("3.12",), variants=("cu130",)))
    assert str(newest_nightly(source, PipConfig(), "2.15.0.dev20261101")) == "2.15.0.dev20261101"
    with pytest.raises(ConfigError, match=r"no \.dev torch build"):
        newest_nightly(WheelSource(inherit_pip_config=False), PipConfig())
    host = parse_pip_config("global.find-links='/opt/wheels'\nglobal.extra-index-url='file:///a file:///b'\n"
                            ":env:.cert='/etc/ca.crt'\n")
    assert host.find_links == ("/opt/wheels",) and host.extra_index_urls == ("file:///a", "file:///b")
    assert host.cert == "/etc/ca.crt"
    args = installer_args(source, host)
    assert "--prerelease" in args and "/opt/wheels" not in args
    assert "/opt/wheels" in installer_args(WheelSource(), host)


def test_the_hosts_pip_configuration_is_asked_once_until_it_changes(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """pip itself is asked (`pip config list`, ~0.6 s) once per environment and state of its files."""
    from stackgate import proc, sources
    asked: list[list[str]] = []
    real = proc.capture
    monkeypatch.setattr(proc, "capture", lambda argv, **kw: (asked.append(list(argv)), real(argv, **kw))[1])
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nfind-links = /opt/one\n")
    env = {"PIP_CONFIG_FILE": str(conf), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    assert sources.read_pip_config(env).find_links == ("/opt/one",)
    assert sources.read_pip_config(dict(env)).find_links == ("/opt/one",) and len(asked) == 1
    conf.write_text("[global]\nfind-links = /opt/two /opt/three\n")  # another size: seen without waiting on mtime
    assert sources.read_pip_config(env).find_links == ("/opt/two", "/opt/three") and len(asked) == 2
    assert sources.read_pip_config({**env, "PIP_FIND_LINKS": "/opt/env"}).find_links[0] == "/opt/env"
    assert len(asked) == 3


def test_production_keeps_its_own_source_on_the_nightly_channel() -> None:
    from stackgate import compat, matrix
    from stackgate.shipped import MATRIX_DIR
    from stackgate.versions import parse_torch
    spec = matrix.load_matrix(MATRIX_DIR / "nightly.toml")
    exp = matrix.expand(spec, fleet.load_pools(MATRIX_DIR / "fleet.toml", fleet.LocalHost()),
                        matrix.load_production(MATRIX_DIR / "production.toml"),
                        compat.load_compat(MATRIX_DIR / "compat.toml"),
                        torch_versions=[parse_torch("2.15.0.dev20261128+cu130")])
    prod = next(c for c in exp.cells if c.role.value == "production")
    cand = next(c for c in exp.cells if c.role.value == "candidate")
    assert cand.stack.source.pre and cand.stack.source.index_url == spec.source.index_url
    assert not prod.stack.source.pre and prod.stack.source.index_url is None  # the host's stable configuration


def test_a_long_test_message_keeps_its_first_line(tmp_path: Path) -> None:
    """The reasons quote a failure's first line: a long message lost it (only its last 4000 characters
    were kept) and the reason quoted a line from the middle of a dumped dict."""
    body = "AssertionError: not run under pytest-xdist\nassert None\n + where None = " + "x" * 20000
    (tmp_path / "junit.xml").write_text(
        '<testsuite><testcase classname="t" file="test_t.py" name="test_x"><failure message="m">'
        + body + "</failure></testcase></testsuite>")
    [outcome] = junit.parse_junit([tmp_path / "junit.xml"])
    assert outcome.message.startswith("m\nAssertionError: not run under pytest-xdist")
    assert outcome.message.endswith("x" * 100) and len(outcome.message) < 4100


def test_a_test_in_a_class_keeps_its_class_in_its_node_id(tmp_path: Path) -> None:
    """xunit1's classname is the dotted module, then the class: the name is pytest's node id, so a
    rerun selects exactly that test."""
    path = tmp_path / "junit.xml"
    path.write_text(
        '<testsuites><testsuite><testcase classname="sub.test_a.TestBox" file="sub/test_a.py" name="test_x"/>'
        '<testcase classname="test_a" file="test_a.py" name="test_y"/>'
        '<testcase classname="t" file="test_t.py" name="test_z"/></testsuite></testsuites>')
    assert [t.name for t in junit.parse_junit([path])] == [
        "sub/test_a.py::TestBox::test_x", "test_a.py::test_y", "test_t.py::test_z"]


def test_a_rerun_of_a_platform_check_runs_it_from_the_bundled_suite(tmp_path: Path) -> None:
    spec = suite.SuiteSpec(tmp_path, platform_checks=True)
    found = suite.invocations(spec, Phase.parse("rerun1"), select=("test_identity.py::test_torch_version",
                                                                   "test_mine.py::test_a"))
    assert [(i.label, i.args[0]) for i in found] == [
        ("platform", f"{suite.BUNDLED_SUITE}/test_identity.py::test_torch_version"),
        ("suite", f"{tmp_path}/test_mine.py::test_a")]
