"""Issue 18 through the whole pipeline on the in-memory backend: a known failure is not a regression,
a merge of one fleet run says which option to repeat."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stackgate import runner
from stackgate.backends.base import Execution
from stackgate.backends.memory import MemoryBackend, answer
from stackgate.commands.merge import merge as merge_command
from stackgate.commands.run import run as run_command
from stackgate.errors import ConfigError
from stackgate.suite import NodeCommand, NodeExit

from .conftest import RunMemory, memory_options, on_memory


def _failing(in_production: bool, in_candidate: bool, *, plain: str = "failed"):  # type: ignore[no-untyped-def]
    """`plain`: how test_needs_xdist ends when production runs it as plain pytest (the fidelity rerun,
    which carries no STACKGATE_* variable)."""
    def script(command: NodeCommand, exe: Execution) -> NodeExit:
        if "STACKGATE_PHASE" not in command.env:
            assert exe.plain and command.node == 0
            return answer(command, {"test_model.py::test_needs_xdist": plain})
        if command.env["STACKGATE_PHASE"] == "rollback":  # pytest -m crossversion: nothing collected
            return answer(command, {}, returncode=5)
        prod = command.env["STACKGATE_ROLE"] == "production"
        known = "failed" if (in_production if prod else in_candidate) else "passed"
        return answer(command, {"test_model.py::test_ok": "passed", "test_model.py::test_needs_xdist": known})
    return script


def test_a_test_failing_in_both_stacks_is_go_and_listed(no_subprocesses: MemoryBackend, run_memory: RunMemory) -> None:
    no_subprocesses.script = _failing(in_production=True, in_candidate=True)
    code, report, said = run_memory()
    assert (code, report["decision"]) == (0, "GO"), report["reasons"]
    [known] = report["preexisting_failures"]
    assert known["test"] == "test_model.py::test_needs_xdist" and known["candidate"].startswith("failed")
    assert known["production"].startswith("failed")
    assert any("pre-existing failures (1" in line for line in said)
    md = (Path(report["run"]["options"]["reports"]["value"]) / "mem" / "report.md").read_text()
    assert "## Pre-existing failures" in md and "test\\_needs\\_xdist" in md


def test_a_failure_in_both_stacks_that_passes_as_plain_pytest_is_a_harness_failure(
        no_subprocesses: MemoryBackend, run_memory: RunMemory) -> None:
    """#41: production's failing test runs once more as plain pytest (no STACKGATE_* variable, no
    node init, one node, only that test); passing there, it is the harness's failure, not pre-existing."""
    no_subprocesses.script = _failing(in_production=True, in_candidate=True, plain="passed")
    code, report, said = run_memory()
    assert (code, report["decision"]) == (1, "INCONCLUSIVE"), report["reasons"]
    assert report["preexisting_failures"] == []
    [harness] = [r for r in report["reasons"] if r["kind"] == "harness-failure"]
    assert harness["test"] == "test_model.py::test_needs_xdist" and "plain pytest in production: passed" in harness["message"]
    plain = [c for c in no_subprocesses.executed if "STACKGATE_PHASE" not in c.env]
    [command] = plain  # once, for production only, on one node
    assert not any(k.startswith("STACKGATE_") for k in command.env)
    assert command.argv[3].endswith("test_model.py::test_needs_xdist") and "test_ok" not in " ".join(command.argv)
    assert any(line.startswith("fidelity: 1 test(s) that failed in production") for line in said)
    assert any("harness failures, not pre-existing: test_model.py::test_needs_xdist" in line for line in said)


def test_a_test_failing_only_in_the_candidate_is_no_go(no_subprocesses: MemoryBackend, run_memory: RunMemory) -> None:
    no_subprocesses.script = _failing(in_production=False, in_candidate=True)
    code, report, said = run_memory()
    assert (code, report["decision"]) == (1, "NO-GO")
    assert report["preexisting_failures"] == []
    assert any(line.strip().startswith("- [failed-test]") and "test_needs_xdist" in line for line in said)


def test_preexisting_failures_inconclusive_by_policy(no_subprocesses: MemoryBackend, run_memory: RunMemory,
                                                      tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[gate]\npreexisting_failures = "inconclusive"\n[required]\nall_tests = true\n')
    no_subprocesses.script = _failing(in_production=True, in_candidate=True)
    code, report, said = run_memory(policy=str(policy))
    assert (code, report["decision"]) == (1, "INCONCLUSIVE")
    assert any("[preexisting-failure]" in line for line in said)


def test_merge_of_bundles_run_with_suite_names_the_option_to_repeat(no_subprocesses: MemoryBackend,
                                                                     tmp_path: Path) -> None:
    """#18 item 13: the bundles agree with each other; the merge was not given --suite."""
    assert run_command(memory_options(tmp_path), {}, lambda _: None, machinery=on_memory(no_subprocesses)) in (0, 1)
    bundle = tmp_path / "r" / "mem"
    assert json.loads((bundle / "run.json").read_text())["options"]["suite"].endswith("plain_suite")
    merge = memory_options(tmp_path, run_id="merged", suite=None)
    with pytest.raises(ConfigError) as info:
        merge_command(merge, {}, [bundle], lambda _: None)
    assert "belongs to another run definition" in str(info.value)
    assert info.value.hint is not None and "the bundles agree with each other" in info.value.hint
    assert "--suite " in info.value.hint and "plain_suite" in info.value.hint


def test_a_run_directory_belongs_to_one_live_run(no_subprocesses: MemoryBackend, tmp_path: Path) -> None:
    """#19 item 6: two runs with the same --run-id shared one directory and swapped results."""
    import subprocess
    import sys
    import time

    from stackgate import rundir
    run_dir = tmp_path / "r" / "mem"
    run_dir.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(rundir.RunDir(run_dir).owner)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\nos.write(fd, b'pid %d on the other run' % os.getpid())\n"
        "print('held', flush=True)\ntime.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError) as info:
            run_command(memory_options(tmp_path), {}, lambda _: None, machinery=on_memory(no_subprocesses))
        assert f"run directory {run_dir} belongs to a live run: pid {holder.pid} on the other run" in str(info.value)
        assert not (run_dir / "results.jsonl").exists() and not (run_dir / "run.json").exists()  # nothing written
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    time.sleep(0.1)
    assert run_command(memory_options(tmp_path), {}, lambda _: None, machinery=on_memory(no_subprocesses)) in (0, 1)  # a dead owner's claim is gone
    assert "pid" in rundir.RunDir(run_dir).owner.read_text()


def test_links_out_of_the_run_directory_are_never_followed_when_artifacts_are_copied(tmp_path: Path) -> None:
    """#19 item 9: a production test left a link to /etc/passwd; the bundle held a copy of it."""
    run = tmp_path / "run"
    written = run / "artifacts" / "local-1x2" / "production-main" / "production"
    (written / "ckpt").mkdir(parents=True)
    (written / "ckpt" / "model.pt").write_bytes(b"weights")
    (written / "passwd").symlink_to("/etc/passwd")
    (written / "etc").symlink_to("/etc", target_is_directory=True)
    (written / "same").symlink_to("ckpt/model.pt")  # inside the run directory: kept, as a link
    target = run / "artifacts" / "local-1x2" / "cand" / "production"
    refused = runner.copy_artifacts(written, target, run)
    assert sorted(refused) == ["etc -> /etc", "passwd -> /etc/passwd"]
    assert not (target / "passwd").exists() and not (target / "passwd").is_symlink() and not (target / "etc").exists()
    assert (target / "ckpt" / "model.pt").read_bytes() == b"weights" and (target / "same").is_symlink()


def test_a_refused_link_makes_the_candidate_inconclusive(no_subprocesses: MemoryBackend, run_memory: RunMemory,
                                                         tmp_path: Path) -> None:
    def script(command: NodeCommand, exe: Execution) -> NodeExit:
        if command.env["STACKGATE_ROLE"] == "production" and command.env["STACKGATE_PHASE"] == "main":
            written = Path(command.env["STACKGATE_ARTIFACTS"]) / "production"
            written.mkdir(parents=True, exist_ok=True)
            if not (written / "passwd").is_symlink():
                (written / "passwd").symlink_to("/etc/passwd")
        return answer(command, {"test_model.py::test_ok": "passed"})
    no_subprocesses.script = script
    code, report, _ = run_memory()
    assert (code, report["decision"]) == (1, "INCONCLUSIVE")
    [reason] = [r for r in report["reasons"] if r["kind"] == "bad-artifact"]
    assert "passwd -> /etc/passwd" in reason["message"]
    copied = list((tmp_path / "r" / "mem" / "artifacts").rglob("passwd"))
    assert all(p.is_symlink() and "production-main" in str(p) for p in copied)  # only the one the test made


def test_a_process_the_suite_left_running_is_a_note_in_the_report_not_a_verdict(no_subprocesses: MemoryBackend,
                                                                                 run_memory: RunMemory) -> None:
    """#19 item 10, decided on the result a backend reports: the ended leftover is named, GO holds."""
    import dataclasses

    def script(command: NodeCommand, exe: Execution) -> NodeExit:
        done = answer(command, {"test_model.py::test_ok": "passed"},
                      returncode=5 if command.env["STACKGATE_PHASE"] == "rollback" else 0)
        if command.env["STACKGATE_ROLE"] == "candidate" and command.env["STACKGATE_PHASE"] != "rollback":
            done = dataclasses.replace(done, leftovers=("pid 41: sleep 1001",))
        return done
    no_subprocesses.script = script
    code, report, _ = run_memory()
    assert (code, report["decision"]) == (0, "GO"), report["reasons"]
    [note] = [r for r in report["reasons"] if r["kind"] == "leftover-process"]
    assert note["severity"] == "info" and "sleep 1001" in note["message"] and "torch2.14.1" in note["cell"]
    out = Path(report["run"]["options"]["reports"]["value"]) / "mem"
    for name in ("report.md", "report.html"):  # a note every report shows, not only the JSON
        assert "outlived the suite and were ended: pid 41: sleep 1001" in (out / name).read_text(), name


def test_an_earlier_attempts_writer_never_reaches_the_next_attempts_evidence(tmp_path: Path) -> None:
    """#19 item 5: each attempt writes its JUnit and records in a directory of its own; a process of a
    killed attempt that still writes (to the path its environment names) is not merged into the rerun."""
    from stackgate.backends.base import EnvHandle
    from stackgate.runner import run_cell
    from stackgate.suite import RunContext, SuiteSpec
    from tests.unit.test_user_paths import _user_cells
    cell, _ = _user_cells()
    earlier: list[Path] = []

    def script(command: NodeCommand, exe: Execution) -> NodeExit:
        for path in earlier:  # the orphan of the first attempt, still writing during the second
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as fh:
                fh.write(json.dumps({"kind": "metric", "name": "orphan.step_time", "samples": [1.0]}) + "\n")
        earlier.append(Path(command.env["STACKGATE_RESULTS"]))
        return answer(command, {"test_a.py::test_ok": "passed"},
                      metrics=[{"name": "own.step_time", "samples": [2.0]}])

    backend = MemoryBackend(script=script)
    handle = EnvHandle(cell.stack, "memory", "k", reused=True, prepare_s=0.0)
    ctx = RunContext("attempts", tmp_path / "run", SuiteSpec(path=tmp_path, platform_checks=False))
    first = run_cell(backend, cell, handle, ctx)
    second = run_cell(backend, cell, handle, ctx)
    assert [m.name for m in first.metrics] == ["own.step_time"]
    assert [m.name for m in second.metrics] == ["own.step_time"], [m.name for m in second.metrics]
    assert earlier[0].parent != earlier[1].parent and earlier[1].parent.parent == earlier[0].parent.parent


def test_a_merge_claims_its_run_directory_too(no_subprocesses: MemoryBackend, tmp_path: Path) -> None:
    """#40 item 2: merge wrote into a directory a live run (or merge) of the same id held."""
    from stackgate import rundir
    assert run_command(memory_options(tmp_path), {}, lambda _: None, machinery=on_memory(no_subprocesses)) in (0, 1)
    target = rundir.RunDir.of(tmp_path / "r", "merged")
    held = target.claim()
    try:
        with pytest.raises(ConfigError, match="belongs to a live run: pid"):
            merge_command(memory_options(tmp_path, run_id="merged"), {}, [tmp_path / "r" / "mem"], lambda _: None)
        assert not target.results.exists() and not target.manifest.exists()
    finally:
        held.release()
    assert merge_command(memory_options(tmp_path, run_id="merged"), {}, [tmp_path / "r" / "mem"], lambda _: None) in (0, 1)
    assert target.results.exists() and target.report_json.exists()


def test_a_go_whose_history_cannot_be_written_never_says_exit_0(no_subprocesses: MemoryBackend, tmp_path: Path) -> None:
    """A history database on a full disk (or not a database) ends the run with exit 3 after its reports;
    the console's verdict line above that error said "exit 0"."""
    from stackgate.errors import InfraError
    broken = tmp_path / "history.sqlite"
    broken.write_text("this is not an SQLite database\n" * 100)
    said: list[str] = []
    with pytest.raises(InfraError, match="history database"):
        run_command(memory_options(tmp_path, history=str(broken)), {}, said.append, machinery=on_memory(no_subprocesses))
    assert json.loads((tmp_path / "r" / "mem" / "report.json").read_text())["decision"] == "GO"
    verdict = [line for line in said if "(gating verdict" in line]
    assert verdict == ["\nGO (gating verdict GO, exit 3, not 0: the history database failed, below)"], said
