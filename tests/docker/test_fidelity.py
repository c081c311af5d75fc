"""#41: a suite runs under stackgate as it runs under plain pytest. The fidelity suite does what trainer
suites do (DataLoader workers and fork/spawn children passing tensors over 64 MB through shared memory,
spawned gloo ranks over env:// and file://, a process group a fixture sets up and tears down, writes to
the home cache and torch.hub's, name resolution); under plain pytest, `--backend venv` and the default
Docker backend every one of its tests ends the same. A planted test that fails only when a stackgate
variable is present, and passes under plain pytest, is a harness failure in both backends, named as such
and never listed as pre-existing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from stackgate import compat, sources
from stackgate.backends.venv import VenvBackend
from stackgate.model import Stack
from stackgate.versions import CudaVariant, parse_torch

ROOT = Path(__file__).resolve().parents[2]
FIDELITY = ROOT / "tests" / "data" / "fidelity_suite"
PLANTED = "test_z_planted.py::test_passes_unless_stackgate_is_watching"
BROKEN = "test_z_planted.py::test_broken_everywhere"
PLANTED_TEST = '''import os


def test_passes_unless_stackgate_is_watching() -> None:
    """Planted: it fails only where the harness's own variables reach the suite."""
    assert not sorted(k for k in os.environ if k.startswith("STACKGATE_"))


def test_broken_everywhere() -> None:
    """A failure that really is pre-existing: plain pytest sees it too."""
    assert 1 + 1 == 3
'''


def _users_shell() -> dict[str, str]:
    """This process's environment less stackgate's own variables (CI sets STACKGATE_TEST_TIMES for the
    test tiers' table): the shell of a user who has never run stackgate."""
    return {k: v for k, v in os.environ.items() if not k.startswith("STACKGATE_")}


def _plain_pytest(python: str, suite: Path, junit: Path) -> dict[str, str]:
    """The suite under plain pytest, as its owner runs it: from its directory, nothing else."""
    subprocess.run([python, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={junit}"], cwd=suite,
                   env=_users_shell(), capture_output=True, text=True, timeout=900, check=False)
    outcomes = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('file') or case.get('classname', '').replace('.', '/') + '.py'}::{case.get('name')}"
        kinds = {child.tag for child in case}
        outcomes[name] = ("failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed")
    return outcomes


def _stackgate(cwd: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:  # type: ignore[type-arg]
    done = subprocess.run([sys.executable, "-m", "stackgate", "run", "--suite", "suite", "--matrix", "same-stack.toml",
                           "--no-platform-checks", "--no-rollback", *args], cwd=cwd, env=_users_shell(),
                          capture_output=True, text=True, timeout=2400, check=False)
    run_id = args[args.index("--run-id") + 1]
    report = json.loads((cwd / "reports" / run_id / "report.json").read_text())
    return done, report


def _outcomes(cell: dict) -> dict[str, str]:  # type: ignore[type-arg]
    return {t["name"].rsplit("/", 1)[-1]: ("failed" if t["outcome"] == "error" else t["outcome"]) for t in cell["tests"]}


def test_the_fidelity_suite_ends_as_under_plain_pytest_in_both_backends_and_a_harness_failure_is_named(
        engine: object, tmp_path: Path) -> None:
    shutil.copytree(FIDELITY, tmp_path / "suite", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "suite" / "test_z_planted.py").write_text(PLANTED_TEST)
    shutil.copy(ROOT / "benchmarks" / "sensitivity-matrix.toml", tmp_path / "same-stack.toml")
    env = dict(os.environ)
    cache = Path(env.get("STACKGATE_CACHE_DIR", Path.home() / ".cache" / "stackgate"))
    venv = VenvBackend(cache, compat.load_compat(ROOT / "matrix" / "compat.toml"), sources.read_pip_config(env), env)
    python = venv.prepare(Stack(parse_torch("2.13.0"), CudaVariant("cpu"), "3.11"), tmp_path / "venv.log").ref
    plain = _plain_pytest(python, tmp_path / "suite", tmp_path / "plain.xml")
    # green under plain pytest, but for the one test that is broken everywhere
    assert plain.pop(BROKEN) == "failed" and plain and set(plain.values()) == {"passed"}, plain
    plain[BROKEN] = "failed"

    table = {"plain pytest": plain}
    for backend in ("venv", "docker"):
        done, report = _stackgate(tmp_path, "--backend", backend, "--run-id", backend)
        said = done.stdout + done.stderr
        assert done.returncode == 1 and report["decision"] == "INCONCLUSIVE", said[-4000:]
        ran = [c for c in report["cells"] if c["status"] != "not-run"]
        assert len(ran) == 2 and {c["environment"]["backend"] for c in ran} == {backend}
        for cell in ran:
            table[f"{backend} {cell['role']}"] = _outcomes(cell)
        # the planted test is the harness's failure, named with both outcomes; the broken one, which plain
        # pytest sees fail too, is the only pre-existing failure
        assert [k["test"].rsplit("/", 1)[-1] for k in report["preexisting_failures"]] == [BROKEN]
        harness = [r for r in report["reasons"] if r["kind"] == "harness-failure"]
        assert [r["test"].rsplit("/", 1)[-1] for r in harness] == [PLANTED], report["reasons"]
        assert harness[0]["severity"] == "inconclusive" and "plain pytest in production: passed" in harness[0]["message"]
        assert [r for r in report["reasons"] if r["severity"] in ("blocking", "inconclusive")] == harness
        assert "fidelity: 2 test(s) that failed in production run once more as plain pytest" in said
        rows = [json.loads(line) for line in (tmp_path / "reports" / backend / "results.jsonl").read_text().splitlines()]
        [rerun] = [r for r in rows if r["phase"] == "plain"]  # once, for production, of its failures only
        assert rerun["role"] == "production"
        assert {t["name"].rsplit("/", 1)[-1]: t["outcome"] for t in rerun["tests"]} == {PLANTED: "passed", BROKEN: "failed"}
        print(f"{backend}: the fidelity rerun took {rerun['duration_s']:.1f} s")
        for name in ("report.md", "report.html", "junit.xml"):  # named in every report
            assert "harness failure (fails under stackgate" in (tmp_path / "reports" / backend / name).read_text(), name
    print("\n".join(f"{name:60s} " + "  ".join(f"{k}={v.get(name, 'absent')}" for k, v in table.items())
                    for name in sorted(plain)))
    expected = {name: outcome for name, outcome in plain.items() if name != PLANTED}
    for where, seen in table.items():
        if where != "plain pytest":
            assert seen.get(PLANTED) == "failed", where
            assert {k: v for k, v in seen.items() if k != PLANTED} == expected, where
    if shutil.which("docker") and subprocess.run(["docker", "ps", "-aq", "--filter", "name=sg-"], capture_output=True,
                                                 text=True, check=False).stdout.strip():
        pytest.fail("a node container outlived its cell")
