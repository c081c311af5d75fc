"""Issue 14's acceptance through the real CLI, from a working directory of the user's: a monorepo's
suite that imports the team's own package (a sibling directory, given with --suite-install) and a
requirement from the index (its requirements.txt) runs green in both stacks; a rerun reuses both
environments; a requirement that would replace the stack's torch is refused (exit 2) by name."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MONOREPO = ROOT / "tests" / "data" / "monorepo"
SUITE_TESTS = {"test_recsys.py::test_two_tower_trains", "test_recsys.py::test_einops_rearranges_a_batch",
               "test_recsys.py::test_package_is_installed_not_imported_from_the_tree"}


def stackgate_run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stackgate", "run", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=2400, check=False)


def check_green_in_both_stacks(report_path: Path) -> list[dict[str, object]]:
    """Every cell ran the suite's three tests, passed, and its environment holds the suite's packages."""
    report = json.loads(report_path.read_text())
    assert report["decision"] == "GO"
    cells = [c for c in report["cells"] if c["status"] != "not-run"]
    assert {(c["stack"]["torch"], c["stack"]["cuda"]) for c in cells} == {("2.13.0", "cpu"), ("2.14.1", "cu130")}
    for cell in cells:
        outcomes = {t["name"].rsplit("/", 1)[-1]: t["outcome"] for t in cell["tests"]}
        assert {name: outcomes.get(name) for name in SUITE_TESTS} == dict.fromkeys(SUITE_TESTS, "passed")
        packages = cell["environment"]["packages"]
        assert any(p.startswith("einops==") for p in packages), packages
        # what the suite's identity check lists (name==version), or the environment's freeze (a direct URL)
        assert any(p == "recsys-kit==0.3.0" or (p.startswith("recsys-kit @ file://") and
                                                p.endswith("/recsys_kit-0.3.0-py3-none-any.whl")) for p in packages), packages
        declared = cell["environment"]["suite_requirements"]
        assert [r["requirement"] for r in declared["requirements"]] == ["einops>=0.8"]
        assert declared["projects"][0]["wheel"] == "recsys_kit-0.3.0-py3-none-any.whl"
    return cells


@pytest.mark.torch
def test_a_monorepo_suite_runs_green_in_both_stacks_and_reruns_reuse_them(tmp_path: Path) -> None:
    shutil.copytree(MONOREPO, tmp_path / "monorepo")
    # the subject is the suite's own requirements: the platform checks a user's suite gets are
    # test_end_to_end.py's test_a_users_own_suite_gets_the_platform_checks (and, with Docker, test_user_suite_cli.py)
    args = ("--backend", "venv", "--suite", "monorepo/trainer_suite", "--suite-install", "monorepo/libs/recsys_kit",
            "--no-platform-checks")
    first = stackgate_run(tmp_path, *args, "--run-id", "first")
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    assert "suite requirements: " in first.stdout and "--suite-install" in first.stdout
    check_green_in_both_stacks(tmp_path / "reports" / "first" / "report.json")

    again = stackgate_run(tmp_path, *args, "--run-id", "again")
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-2000:]
    assert "building a wheel of" not in again.stdout  # the project's wheel came from the cache
    cells = check_green_in_both_stacks(tmp_path / "reports" / "again" / "report.json")
    assert all(c["environment"]["env_reused"] for c in cells), [c["environment"]["env_reused"] for c in cells]


@pytest.mark.torch
@pytest.mark.parametrize(("requirement", "stack"), [
    ("torch==2.12.0", "torch==2.13.0+cpu"),  # would replace the stack: refused in the first stack
    ("torchvision==0.28.0", "torch==2.14.1"),  # a companion built for 2.13: fine there, refused in the candidate
])
def test_a_requirement_that_moves_torch_is_refused_by_name(tmp_path: Path, requirement: str, stack: str) -> None:
    suite = tmp_path / "suite"
    shutil.copytree(ROOT / "tests" / "data" / "plain_suite", suite)
    (suite / "requirements.txt").write_text(f"einops\n{requirement}  # pinned long ago\n")
    proc = stackgate_run(tmp_path, "--backend", "venv", "--suite", "suite")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"'{requirement}' ({suite / 'requirements.txt'}:2)" in proc.stderr
    assert f"cannot be installed with the stack under test, {stack}" in proc.stderr
    assert "einops" not in proc.stderr.split("cannot be installed")[0]  # only the culprit is named
    assert not (tmp_path / "reports").exists()
