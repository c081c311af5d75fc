"""Issue 8's acceptance for `--suite`, as a user types it: the real CLI, no flags but `--suite`, from a
working directory of the user's (relative suite path, default reports/ and caches, the default
backend: Docker, since an engine answers). A plain pytest suite that knows nothing of stackgate."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BREAKS_ON_UPGRADE = '''

def test_pinned_to_the_production_release() -> None:
    assert torch.__version__.startswith("2.13"), f"this code only works on torch 2.13, got {torch.__version__}"
'''


def _stackgate(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stackgate", "run", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=2400, check=False)


def test_plain_suite_gives_go_then_no_go_naming_the_failing_test(engine: object, tmp_path: Path) -> None:
    shutil.copytree(ROOT / "tests" / "data" / "plain_suite", tmp_path / "mysuite")
    green = _stackgate(tmp_path, "--suite", "mysuite", "--run-id", "green")
    assert green.returncode == 0, green.stdout[-4000:] + green.stderr[-2000:]
    assert "GO (gating verdict GO, exit 0)" in green.stdout
    assert "policy: default for a user suite" in green.stdout
    report = json.loads((tmp_path / "reports" / "green" / "report.json").read_text())
    assert report["decision"] == "GO"
    for cell in report["cells"]:
        outcomes = {t["name"].rsplit("/", 1)[-1]: t["outcome"] for t in cell["tests"]}
        assert cell["environment"]["backend"] == "docker"
        assert outcomes["test_model.py::test_linear_layer_trains"] == "passed"
        assert outcomes["test_model.py::test_matmul_matches_numpy"] == "passed"
        assert outcomes["test_identity.py::test_torch_version"] == "passed"  # the platform checks ran beside it
    rollback = report["rollback"][0]
    assert rollback["status"] == "skipped" and "no cross-version tests" in rollback["reason"]

    with (tmp_path / "mysuite" / "test_model.py").open("a") as fh:
        fh.write(BREAKS_ON_UPGRADE)
    red = _stackgate(tmp_path, "--suite", "mysuite", "--run-id", "red")
    assert red.returncode == 1, red.stdout[-4000:] + red.stderr[-2000:]
    assert "NO-GO (gating verdict NO-GO, exit 1)" in red.stdout
    why = red.stdout[red.stdout.index("why ("):]
    assert "test_model.py::test_pinned_to_the_production_release" in why and "[failed-test]" in why
    report = json.loads((tmp_path / "reports" / "red" / "report.json").read_text())
    blocking = [r for r in report["reasons"] if r["severity"] == "blocking"]
    assert [r["test"].rsplit("/", 1)[-1] for r in blocking] == ["test_model.py::test_pinned_to_the_production_release"]


def test_a_monorepo_suite_with_its_own_package_in_both_images(engine: object, tmp_path: Path) -> None:
    """Issue 14 with the Docker backend (the default): the suite's requirements and the team's package
    go into the images from the host wheelhouse, in a layer after the stack; a rerun reuses both images."""
    from tests.torch.test_suite_requirements import MONOREPO, check_green_in_both_stacks
    shutil.copytree(MONOREPO, tmp_path / "monorepo")
    args = ("--suite", "monorepo/trainer_suite", "--suite-install", "monorepo/libs/recsys_kit")
    first = _stackgate(tmp_path, *args, "--run-id", "first")
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    cells = check_green_in_both_stacks(tmp_path / "reports" / "first" / "report.json")
    assert {c["environment"]["backend"] for c in cells} == {"docker"}
    again = _stackgate(tmp_path, *args, "--run-id", "again")
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-2000:]
    assert "building image" not in again.stdout and "building a wheel" not in again.stdout
    cells = check_green_in_both_stacks(tmp_path / "reports" / "again" / "report.json")
    assert all(c["environment"]["env_reused"] for c in cells)
