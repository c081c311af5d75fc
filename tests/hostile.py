"""Hostile inputs for every boundary (hypothesis strategies), and one check per entry point that
pushes one input through the real reader, the gate or the CLI command and says what happened:
"ok", "crash" (an exception that is not stackgate's own, or a traceback out of the CLI), "hang"
(longer than HANG_S) or "false-go" (GO on evidence that is missing, broken or contradicted).

The property tests (tests/unit/test_bad_inputs.py) assert "ok" on a bounded, deterministic sample;
`nox -s bad-inputs` (benchmarks/bad_inputs.py) pushes >= 10,000 of them and prints the table."""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import io
import json
import signal
import sqlite3
import statistics
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest import mock

from hypothesis import strategies as st

from stackgate import artifacts, cli, compat, fleet, gate, history, inputs, options, osv, selftest, shipped, suite
from stackgate.errors import StackgateError
from stackgate.junit import parse_junit
from stackgate.model import ROLLBACK, CellResult, Decision, Metric, Role, Status
from stackgate.model import TestOutcome as Outcome
from stackgate.policy import load_policy
from stackgate.report import plots
from stackgate.rundir import RunDir, results
from tests.unit.test_user_paths import _user_cells

HANG_S = 10
TODAY = dt.date(2026, 12, 6)
_BUNDLED = load_policy(shipped.MATRIX_DIR / "policy.toml")
# the bundled policy's rules for the metrics of this small world (a CPU cell: its step time on the CPU
# clock, its loss): the valid candidate is GO, the truly slow one NO-GO (test_the_checks_can_fail)
POLICY = replace(_BUNDLED, required_tests=(), candidate_tests=(), required_metrics=("recsys.step_time",),
                 performance=tuple(r for r in _BUNDLED.performance if r.name == "*.step_time"),
                 numerics=tuple(n for n in _BUNDLED.numerics if n.name == "*.loss"))


class Hang(Exception):
    pass


@contextlib.contextmanager
def _deadline() -> Iterator[None]:
    seconds = HANG_S

    def fire(signum: int, frame: object) -> None:
        raise Hang

    previous = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def outcome(check: Callable[[], str]) -> str:
    """What one input did: the check's own verdict, or "crash" / "hang"."""
    try:
        with _deadline():
            return check()
    except Hang:
        return "hang"
    except StackgateError:
        return "ok"
    except Exception as exc:
        return f"crash: {type(exc).__name__}: {str(exc)[:120]}"


# ------------------------------------------------------------------------------------------ values
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**400), max_value=10**400),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                    st.sampled_from(["LOWER", "equal", "higher ", "1111", "1,5", "repeat1000000000", "٣", "NaN"]))
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                          max_size=4), max_leaves=12)


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def _dump(value: Any) -> bytes:
    try:
        return json.dumps(value, allow_nan=True).encode()
    except (ValueError, TypeError, OverflowError):
        return b"null"


def mutated(record: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """A valid JSON record with one field replaced, removed or added, or the line broken."""
    keys = sorted(record)

    @st.composite
    def replace_field(draw: st.DrawFn) -> bytes:
        out = dict(record)
        key = draw(st.sampled_from([*keys, "extra", "kind"]))
        if draw(st.booleans()) and key in out:
            del out[key]
        else:
            out[key] = draw(JSON)
        return _dump(out)

    raw = _dump(record)
    return st.one_of(
        replace_field(),
        st.just(raw[: len(raw) // 2]),
        st.just(raw.replace(b'"', b"'", 1)),
        st.binary(max_size=40),
        st.just(_deep(5000).encode()),
        st.just(raw[:-1] + b', "pad": "' + b"\xff\xfe" + b'"}'),
        JSON.map(_dump),
    )


# ------------------------------------------------------------------------------------ the gate's world
PROD, CAND = _user_cells()  # a CPU pair, both required
STEPS = [10.0 + (i % 5) * 0.01 for i in range(12)]
LOSS = [2.0 * 0.9**i for i in range(12)]
# the candidate is truly 3x slower: whatever it writes about it, the gate may never say GO
SLOW = {"kind": "metric", "name": "recsys.step_time", "unit": "ms", "samples": [3 * x for x in STEPS],
        "better": "lower", "tags": {"clock": "cpu"}, "test": "test_recsys.py::test_recsys"}
FAST = {**SLOW, "samples": STEPS}
LOSS_RECORD = {"kind": "metric", "name": "recsys.loss", "unit": "", "samples": LOSS, "better": "equal"}
JUNIT = (b'<testsuites><testsuite><testcase classname="test_recsys" file="test_recsys.py" name="test_recsys"/>'
         b"</testsuite></testsuites>")


def _metric(record: dict[str, Any]) -> Metric:
    return Metric(record["name"], record["unit"], tuple(record["samples"]), record.get("test", ""), record["better"],
                  tuple(sorted(record.get("tags", {}).items())))


PROD_RESULT = CellResult(PROD.id, Role.PRODUCTION, Status.PASSED,
                         tests=(Outcome("test_recsys.py::test_recsys", "passed"),),
                         metrics=(_metric(FAST), _metric(LOSS_RECORD)))


def candidate_records() -> st.SearchStrategy[bytes]:
    """The candidate's results file: its true (slow) step time, hostile, beside valid lines and a
    fast copy that would hide it."""
    line = st.one_of(mutated(SLOW), st.just(_dump(SLOW)))
    extra = st.lists(st.one_of(mutated(LOSS_RECORD), st.just(_dump(LOSS_RECORD)), st.just(_dump(FAST)),
                               mutated(FAST), mutated({"kind": "environment", "torch": "2.14.1"}),
                               mutated({"kind": "warning", "category": "W", "message": "m"})), max_size=3)
    return st.tuples(line, extra, st.booleans()).map(
        lambda t: b"\n".join([t[0], *t[1], _dump(LOSS_RECORD)] if t[2] else [*t[1], t[0], _dump(LOSS_RECORD)]) + b"\n")


GATED = _metric(SLOW).key  # recsys.step_time[clock=cpu]: what the policy gates on a CPU cell


def check_records(data: bytes, nodes: int = 1, junit: bytes = JUNIT) -> str:
    """Suite records and JUnit through build_result, then the gate. GO is false when the candidate's
    true (3x slower) record is there as written, when the gated metric was not read, or when what was
    read is slow: evidence contradicted, missing, or misread. (A mutation that moves the slow record
    to another key, a wall-time step_time without the cpu clock say, leaves a fast copy as the only
    gated measurement: GO on it is what the suite said, not a false GO.)"""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "results-node0.jsonl").write_bytes(data)
        for node in range(nodes):
            (root / f"junit-node{node}-suite.xml").write_bytes(junit if node == 0 else JUNIT)
        built = suite.build_result(CAND, [suite.NodeExit(n, "pytest", 0) for n in range(nodes)], root, 1.0)
    out = gate.decide((PROD, CAND), (), {PROD.id: PROD_RESULT, CAND.id: built}, POLICY, TODAY)
    if out.verdict.decision is not Decision.GO:
        return "ok"
    read = next((m for m in built.metrics if m.key == GATED), None)
    slow = read is None or not read.samples or statistics.median(read.samples) > 1.5 * statistics.median(STEPS)
    return "false-go" if _dump(SLOW) in data.split(b"\n") or slow else "ok"


def junit_files() -> st.SearchStrategy[bytes]:
    attrs = st.sampled_from(['time="1,5"', 'time="nan"', 'time="-1"', 'time="1e999"', 'name=""', "", 'file="x"'])
    case = attrs.map(lambda a: f'<testcase classname="t" name="test_x" {a}/>'.encode())
    return st.one_of(
        case.map(lambda c: b"<testsuites><testsuite>" + c + b"</testsuite></testsuites>"),
        st.just(b'<?xml version="1.0" encoding="klingon"?><testsuites/>'),
        st.just(b'<?xml version="1.0" encoding="utf-16"?><testsuites/>'),
        st.just(b""), st.just(b"<testsuites><testsuite>"), st.binary(max_size=60),
        st.just(b"<a>" * 3000 + b"</a>" * 3000),
        st.just(b'<!DOCTYPE x [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">'
                b'<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">]><testsuites><testsuite><testcase name="&c;"/>'
                b"</testsuite></testsuites>"),
    )


def check_junit_of_a_second_node(junit: bytes) -> str:
    """A 2-node cell whose node 1 JUnit is hostile: read without a crash, and never GO on it for a slow
    candidate (node 0's evidence alone is not the cell's)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "results-node0.jsonl").write_bytes(_dump(SLOW) + b"\n")
        (root / "junit-node0-suite.xml").write_bytes(JUNIT)
        (root / "junit-node1-suite.xml").write_bytes(junit)
        parse_junit([root / "junit-node1-suite.xml"])
        built = suite.build_result(CAND, [suite.NodeExit(0, "pytest", 0), suite.NodeExit(1, "pytest", 0)], root, 1.0)
    out = gate.decide((PROD, CAND), (), {PROD.id: PROD_RESULT, CAND.id: built}, POLICY, TODAY)
    return "false-go" if out.verdict.decision is Decision.GO else "ok"


def results_lines() -> st.SearchStrategy[bytes]:
    valid = {**CellResult(CAND.id, Role.CANDIDATE, Status.PASSED, metrics=(_metric(SLOW),)).to_json()}
    rounds = [_dump({**valid, "cell_id": f"{CAND.id}@{phase}", "phase": phase})
              for phase in ("repeat1000000000", "repeat٣", "aa99999999999", "rerun1001", "repeat1000")]
    return st.lists(st.one_of(mutated(valid), st.just(_dump(valid)), st.sampled_from(rounds)), min_size=1,
                    max_size=4).map(
        lambda lines: b"\n".join(lines) + b"\n")


def check_results(data: bytes) -> str:
    """results.jsonl read back (resume, merge, the report): every line a result or a problem; and the
    gate over it never GO (the candidate is 3x slower in every line that can be read)."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / results.RESULTS).write_bytes(data)
        found = results.read_all(Path(tmp))
    recorded = {**found.results, PROD.id: PROD_RESULT}
    out = gate.decide((PROD, CAND), (), recorded, POLICY, TODAY, found.problems)
    return "false-go" if out.verdict.decision is Decision.GO else "ok"


def osv_records() -> st.SearchStrategy[bytes]:
    valid = {"id": "GHSA-x", "affected": [{"package": {"ecosystem": "PyPI", "name": "torch"},
                                           "ranges": [{"type": "ECOSYSTEM",
                                                       "events": [{"introduced": "0"}, {"fixed": "2.99"}]}]}],
             "severity": [{"type": "CVSS_V3", "score": "CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:H/I:H/A:H"}]}
    return st.one_of(mutated(valid), st.just(_dump(valid)))


def check_osv(data: bytes) -> str:
    """An OSV record loaded and a stack scanned against it: a finding, an unclassified one, nothing,
    or a ConfigError; torch 2.14.1 is inside the record's range, so a readable record is never 0
    findings."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "x.json").write_bytes(data)
        osv.load.cache_clear()
        db = osv.load(Path(tmp))
        db.scan([osv.Package("PyPI", "torch", "2.14.1")])
    return "ok"


def toml_values() -> st.SearchStrategy[str]:
    return st.sampled_from(['"x"', "1", "-1", "1e999", "nan", "inf", "true", "[]", "{}", '"*"', '"LOWER"',
                              '"0x2"', '"1x99999999999999999999999"', '"٣.١١"', "[1, 2]", '{ a = 1 }', '"cdua"',
                              "1979-05-27", '""', '"' + "x" * 600 + '"'])


@st.composite
def edited(draw: st.DrawFn, name: str, edits: int = 3, include: bool = False) -> bytes:
    """A shipped TOML file with up to `edits` values replaced by hostile ones (and, for a matrix, an
    [[include]] row with a hostile topology)."""
    lines = (shipped.MATRIX_DIR / name).read_text().splitlines()
    values = [i for i, line in enumerate(lines) if "=" in line and not line.lstrip().startswith("#")]
    for _ in range(draw(st.integers(1, edits))):
        i = draw(st.sampled_from(values))
        lines[i] = f"{lines[i].split('=', 1)[0]}= {draw(toml_values())}"
    if include and draw(st.booleans()):
        lines += ["[[include]]", 'pool = "local"', f"topology = {draw(toml_values())}"]
    return "\n".join(lines).encode()


def policy_texts() -> st.SearchStrategy[bytes]:
    return st.one_of(edited("policy.toml"), st.just(b"\xff\xfe[gate]\n"), st.just(("a = " + _deep(3000)).encode()),
                     st.just(b"[[waiver]]\nreason = 'x'\nexpires = 2027-01-01\n"), st.binary(max_size=40))


def check_policy(text: bytes) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "policy.toml"
        path.write_bytes(text)
        load_policy(path)
    return "ok"


def config_texts(name: str) -> Callable[[], st.SearchStrategy[bytes]]:
    return lambda: st.one_of(edited(name), st.binary(max_size=40), st.just(b"\xff\xfe[pool.x]\n"))


def check_loads(name: str) -> Callable[[bytes], str]:
    """A shipped config file with hostile values loaded by its reader: a model or exit 2, never a crash."""
    readers: dict[str, Callable[[Path], object]] = {"fleet.toml": lambda p: fleet.load_pools(p, fleet.LocalHost()),
                                                    "compat.toml": compat.load_compat}

    def check(text: bytes) -> str:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_bytes(text)
            readers[name](path)
        return "ok"
    return check


def matrix_texts() -> st.SearchStrategy[bytes]:
    return st.one_of(edited("upgrade.toml", edits=1, include=True), st.binary(max_size=40))


def _cli(argv: list[str]) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            return cli.main(argv)
        except SystemExit as exc:  # argparse
            return int(exc.code or 0)


def check_matrix_show(text: bytes) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp)
        for name in ("compat.toml", "fleet.toml", "policy.toml", "production.toml"):
            (config / name).write_bytes((shipped.MATRIX_DIR / name).read_bytes())
        (config / "upgrade.toml").write_bytes(text)
        code = _cli(["matrix", "show", "--config-dir", str(config), "--matrix", str(config / "upgrade.toml")])
    return "ok" if code in (0, 2) else f"crash: exit {code}"


def check_run_dry_run_policy(text: bytes) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "policy.toml"
        path.write_bytes(text)
        code = _cli(["run", "--dry-run", "--policy", str(path), "--reports", str(Path(tmp) / "r")])
    return "ok" if code in (0, 2) else f"crash: exit {code}"


def report_jsons() -> st.SearchStrategy[bytes]:
    env = {"image_digest": "", "stack_packages": ["torch==2.14.1"]}
    valid = {"schema_version": 1, "decision": "GO", "verdict": "GO", "run": {"id": "r1"}, "reasons": [],
             "cells": [{"id": CAND.id, "role": "candidate", "status": "passed", "device": "cpu",
                        "stack": {"torch": "2.14.1", "cuda": "cu130", "python": "3.11"}, "environment": env}],
             "stack_diff": [], "new_warnings": {}, "comparisons": []}
    return mutated(valid)


def check_promote_dry_run(data: bytes) -> str:
    """promote --dry-run on a malformed report.json: exit 0 (it is still a GO report) or 2, nothing written."""
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "reports" / "r1"
        run.mkdir(parents=True)
        (run / "report.json").write_bytes(data)
        code = _cli(["promote", str(run), "--dry-run", "--reports", str(Path(tmp) / "reports"),
                     "--history", str(Path(tmp) / "h.sqlite")])
        written = sorted(p.name for p in run.iterdir() if p.name != "report.json")
    if code not in (0, 2):
        return f"crash: exit {code}"
    return "ok" if not written else f"crash: wrote {written}"


@functools.cache
def _merge_world(slower: float = 3.0) -> tuple[dict[str, Any], list[bytes]]:
    """A bundle a merge with default options accepts (its manifest, as `stackgate run` writes it),
    and its results: the recorded clean pair (selftest) on the matrix's local CPU cells, the
    candidate's step time `slower` times production's (1.0: the bundle merges to GO)."""
    opts = options.read({"reports": "unused", "run_id": "merged"}, {}, Path("stackgate.toml"))
    loaded = inputs.load(opts, {}, fleet.LocalHost())
    cells = inputs.expand(loaded, {n: replace(p, is_local=False) for n, p in loaded.pools.items()}).not_here
    cand = next(n.cell for n in cells if n.cell.role is Role.CANDIDATE and n.cell.device == "cpu")
    prod = next(n.cell for n in cells if n.cell.id == cand.baseline)
    rec = selftest.recorded("cpu")
    found = [replace(rec.results[rec.production.id], cell_id=prod.id, cell=prod.record()),
             replace(rec.results[rec.candidate.id], cell_id=cand.id, cell=cand.record(),
                     metrics=tuple(replace(m, samples=tuple(x * slower for x in m.samples))
                                   if m.name == "recsys.step_time" else m for m in rec.results[rec.candidate.id].metrics))]
    rollback = rec.production.result_id(ROLLBACK, rec.candidate)
    if rollback in rec.results:
        found.append(replace(rec.results[rollback], cell_id=prod.result_id(ROLLBACK, cand), against=cand.id))
    manifest = {"definition": inputs.definition(opts, loaded), "definition_hash": "x",
                "selection": {"pools": cand.pool.name, "only": "", "shard": ""}, "options": {},
                "stackgate_version": "0", "cells": [prod.id, cand.id], "host_probe": {}, "merged_from": [],
                "stacks": {}}
    return manifest, [_dump(r.to_json()) for r in found]


@st.composite
def bundles(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """(run.json, results.jsonl) of a bundle: one of them hostile."""
    manifest, lines = _merge_world()
    good_manifest, good_results = _dump(manifest), b"\n".join(lines) + b"\n"
    if draw(st.booleans()):
        return draw(mutated(manifest)), good_results
    return good_manifest, draw(st.lists(st.one_of(mutated(json.loads(lines[1])), st.sampled_from(lines)),
                                        min_size=1, max_size=3).map(lambda xs: b"\n".join(xs) + b"\n"))


def check_merge(bundle: tuple[bytes, bytes]) -> str:
    """`stackgate merge` of one bundle whose run.json or results.jsonl is hostile: exit 1 or 2 (the
    candidate is 3x slower wherever it can be read), never GO, never a traceback."""
    manifest, lines = bundle
    with tempfile.TemporaryDirectory() as tmp:
        run = RunDir(Path(tmp) / "reports" / "pool-a")
        run.root.mkdir(parents=True)
        run.manifest.write_bytes(manifest)
        run.results.write_bytes(lines)
        with mock.patch.object(plots, "line", return_value=""):  # the report's plots: 80% of the time, read nothing
            code = _cli(["merge", str(run.root), "--reports", str(Path(tmp) / "reports"), "--run-id", "merged",
                         "--history", str(Path(tmp) / "h.sqlite")])
    if code == 0:
        return "false-go"
    return "ok" if code in (1, 2) else f"crash: exit {code}"


def stacks_files() -> st.SearchStrategy[bytes]:
    entry = {"stack": "cpu-torch2.14.1-py3.11-1a2b3c4d", "image": "reg/stack@sha256:" + "a" * 64, "key": "k",
             "size": 1, "sbom_digest": "sha256:s", "torch": "2.14.1", "cuda": "cpu", "python": "3.11"}
    valid = {"schema": 1, "registry": "reg", "stacks": {entry["stack"]: entry}}
    head = b'{"schema": 1, "registry": "reg", "stacks": {"' + entry["stack"].encode() + b'": '
    return st.one_of(mutated(valid), mutated(entry).map(lambda e: head + e + b"}}"))


def check_stacks(data: bytes) -> str:
    """stacks.json as a pool runner reads it (`run --stacks`): every image it returns is by digest."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "stacks.json"
        path.write_bytes(data)
        found = artifacts.read(path)
    ok = all("@sha256:" in a.image and a.stack == label for label, a in found.items())
    return "ok" if ok else f"crash: accepted {found!r:.120}"


def history_rows() -> st.SearchStrategy[list[Any]]:
    cell = st.one_of(st.none(), st.text(max_size=8), st.integers(min_value=-(2**63), max_value=2**63 - 1),
                     st.floats(allow_nan=True), st.binary(max_size=8), st.just(b"\xff\xfe"))
    return st.lists(cell, min_size=9, max_size=9)


def check_history(row: list[Any]) -> str:
    """`stackgate history` and `--last-green` over a database with one hostile runs row."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "h.sqlite"
        with contextlib.closing(sqlite3.connect(path)) as conn:
            conn.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY, matrix TEXT, channel TEXT, started TEXT, "
                         "finished TEXT, decision TEXT, verdict TEXT, candidate TEXT, summary TEXT)")
            with contextlib.suppress(sqlite3.IntegrityError):
                conn.execute("INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?)", row)
            conn.commit()
        codes = [_cli(["history", "--history", str(path)]), _cli(["history", "--history", str(path), "--last-green"])]
    return "ok" if all(c in (0, 1, 2, 3) for c in codes) else f"crash: exit {codes}"


WHEEL = b"the tested wheel"
PYLOCK = ('lock-version = "1.0"\nrequires-python = "==3.11.*"\ncreated-by = "stackgate"\n\n[[packages]]\n'
          'name = "torch"\nversion = "2.14.1"\n\n[[packages.wheels]]\n'
          'name = "torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl"\n'
          'path = "wheels/torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl"\n'
          f'size = {len(WHEEL)}\nhashes = {{sha256 = "{__import__("hashlib").sha256(WHEEL).hexdigest()}"}}\n')


@st.composite
def watch_worlds(draw: st.DrawFn) -> tuple[bytes, list[Any]]:
    """A promotion's pylock.toml with hostile values (or bytes), and a hostile row of the canaries table."""
    lines = PYLOCK.splitlines()
    values = [i for i, line in enumerate(lines) if "=" in line]
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.sampled_from(values))
        lines[i] = f"{lines[i].split('=', 1)[0]}= {draw(toml_values())}"
    text = draw(st.one_of(st.just("\n".join(lines).encode()), st.binary(max_size=40),
                          st.just(("a = " + _deep(3000)).encode())))
    cell = st.one_of(st.none(), st.text(max_size=8), st.integers(min_value=-(2**63), max_value=2**63 - 1),
                     st.floats(allow_nan=True), st.binary(max_size=8))
    return text, draw(st.lists(cell, min_size=11, max_size=11))


def check_watch(world: tuple[bytes, list[Any]]) -> str:
    """`stackgate watch` on a promotion whose lock is hostile, with a hostile canaries row in the history
    (which a gate run reads too): an exit code, never a crash; a lock that is not the promoted one is
    never "clean" for the rollback unless it still names the very wheel by its path and sha256."""
    lock, row = world
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "reports" / "r1"
        stack = run / "promotion" / "cu130-torch2.14.1-py3.11"
        (stack / "wheels").mkdir(parents=True)
        (stack / "pylock.toml").write_bytes(lock)
        (stack / "wheels" / "torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(WHEEL)
        (run / "report.json").write_bytes(report_jsons_valid())
        db = Path(tmp) / "osv"
        db.mkdir()
        (db / "X-1.json").write_text(json.dumps({"id": "X-1", "modified": "2026-12-01T00:00:00Z", "affected": [
            {"package": {"ecosystem": "PyPI", "name": "pandas"}, "ranges": [{"type": "ECOSYSTEM", "events": [
                {"introduced": "0"}, {"fixed": "3.0.0"}]}]}]}))
        path = Path(tmp) / "h.sqlite"
        history.record_promotion(path, [history.Promotion(
            at="t", who="w", action="promote", run_id="r1", stack="cu130-torch2.14.1-py3.11", image="", tag="",
            previous="", production_toml="", previous_toml="", run_dir=str(run))])
        with contextlib.closing(sqlite3.connect(path)) as conn:
            conn.execute("INSERT INTO canaries VALUES (?,?,?,?,?,?,?,?,?,?,?)", row)
            conn.commit()
        history.last_canaries(path, [str(row[3])])
        code = _cli(["watch", "--reports", str(Path(tmp) / "reports"), "--history", str(path), "--vuln-db", str(db),
                     "--config-dir", str(shipped.MATRIX_DIR), "--no-canary"])
        [out] = list((Path(tmp) / "reports").glob("watch-*/watch.json")) or [None]
        checks = {c["name"]: c["state"] for c in json.loads(out.read_text())["checks"]} if out else {}
    if code not in (0, 1, 2, 3):
        return f"crash: exit {code}"
    kept = [line for line in PYLOCK.splitlines() if line.startswith(("path =", "hashes ="))]
    if checks.get("rollback") == "clean" and not all(line in lock.decode(errors="replace") for line in kept):
        return "false-go"  # a lock that no longer names the tested wheel by path and sha256 passed the rollback
    return "ok"


def report_jsons_valid() -> bytes:
    env = {"image_digest": "", "stack_packages": ["torch==2.14.1"]}
    return json.dumps({"schema_version": 1, "decision": "GO", "run": {"id": "r1"}, "cells": [
        {"id": CAND.id, "role": "candidate", "status": "passed", "device": "cpu",
         "stack": {"torch": "2.14.1", "cuda": "cu130", "python": "3.11"}, "environment": env}]}).encode()


# entry point -> (strategy, check); the order is the table's
ENTRY_POINTS: dict[str, tuple[Callable[[], st.SearchStrategy[Any]], Callable[[Any], str]]] = {
    "suite records -> gate": (candidate_records, check_records),
    "JUnit (node 1 of 2) -> gate": (junit_files, check_junit_of_a_second_node),
    "results.jsonl -> gate": (results_lines, check_results),
    "OSV record -> scan": (osv_records, check_osv),
    "policy.toml -> load": (policy_texts, check_policy),
    "run --dry-run --policy": (policy_texts, check_run_dry_run_policy),
    "matrix show": (matrix_texts, check_matrix_show),
    "history": (history_rows, check_history),
    "promote --dry-run": (report_jsons, check_promote_dry_run),
    "merge (run.json, results.jsonl)": (bundles, check_merge),
    "stacks.json -> run --stacks": (stacks_files, check_stacks),
    "fleet.toml -> load": (config_texts("fleet.toml"), check_loads("fleet.toml")),
    "compat.toml -> load": (config_texts("compat.toml"), check_loads("compat.toml")),
    "watch (pylock.toml, canaries)": (watch_worlds, check_watch),
}
