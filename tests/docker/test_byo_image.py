"""Issue 21, a prebuilt image for real: an image built outside stackgate with a plain Dockerfile
(FROM the local base, `pip install torch`, nothing else) gated as the candidate with
`--candidate-image` against the bundled production stack, with a plain pytest suite: GO, run with
the image's own interpreter and the suite's requirements in a read-only prefix beside it; the image
is the same image afterwards (never rebuilt). Declared as another torch: the clear mismatch error
(exit 2) before any suite runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stackgate.backends.base import EnvHandle
from stackgate.backends.docker.engine import DockerEngine
from stackgate.sources import pip_command

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]
IMAGE = "stackgate-test/byo-trainer:2.13"
DOCKERFILE = """FROM stackgate/base:bookworm
COPY wheels /wheels
RUN python3 -m venv /opt/venv && /opt/venv/bin/pip install --no-index --find-links /wheels torch==2.13.0 \\
 && rm -rf /wheels
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
"""


def test_a_plain_image_is_gated_as_it_is(engine: DockerEngine, cpu_image: EnvHandle, tmp_path: Path) -> None:
    ctx = tmp_path / "ctx"
    (ctx / "wheels").mkdir(parents=True)
    (ctx / "Dockerfile").write_text(DOCKERFILE)
    subprocess.run([*pip_command(), "download", "-q", "-d", str(ctx / "wheels"), "torch==2.13.0"], check=True,
                   timeout=900)  # (the machine's pip configuration finds the wheels; a uv venv has no pip)
    subprocess.run(["docker", "build", "-q", "-t", IMAGE, str(ctx)], check=True, capture_output=True, timeout=1800)
    before = engine.facts(IMAGE)
    assert before is not None
    subprocess.run(["cp", "-r", str(ROOT / "tests" / "data" / "plain_suite"), str(tmp_path / "suite")], check=True)

    proc = subprocess.run([sys.executable, "-m", "stackgate", "run", "--candidate-image", IMAGE, "--suite", "suite",
                           "--no-platform-checks", "--run-id", "byo"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=1800, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "building image" not in proc.stdout.split("prepare", 2)[-1]  # the candidate's image is never built
    report = json.loads((tmp_path / "reports" / "byo" / "report.json").read_text())
    assert report["decision"] == "GO"
    [cand] = [c for c in report["cells"] if c["role"] == "candidate"]
    assert cand["environment"]["backend"] == "docker" and cand["environment"]["image"] == IMAGE
    assert cand["stack"]["torch"] == "2.13.0+cpu" and cand["stack"]["given"] == f"image:{IMAGE}"
    assert "torch==2.13.0+cpu" in cand["environment"]["stack_packages"]
    assert not any(p.lower().startswith("pytest==") for p in cand["environment"]["stack_packages"])  # not in it
    after = engine.facts(IMAGE)
    assert after is not None and after.id == before.id  # the same image: nothing was added to it

    wrong = subprocess.run([sys.executable, "-m", "stackgate", "run", "--candidate-image", IMAGE, "--candidate",
                            "2.14.1", "--run-id", "wrong"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                           check=False)
    assert wrong.returncode == 2 and f"--candidate-image {IMAGE} holds torch 2.13.0+cpu" in wrong.stderr
    assert "declares torch 2.14.1" in wrong.stderr and not (tmp_path / "reports" / "wrong").exists()


SHADOWED = "stackgate-test/byo-trainer:2.13-shadowed"
SHADOWING = f"""FROM {IMAGE}
RUN mkdir /opt/extra && cp /opt/venv/lib/python3.11/site-packages/torch/lib/libgomp.so.1 /opt/extra/
ENV LD_LIBRARY_PATH=/opt/extra
"""


def test_an_image_whose_ld_library_path_shadows_the_wheels_libgomp_is_no_go_naming_both(
        engine: DockerEngine, cpu_image: EnvHandle, tmp_path: Path) -> None:
    """#43's acceptance: the candidate image carries a second libgomp on LD_LIBRARY_PATH (as a base image's
    CUDA or MKL directory would): NO-GO, the identity check naming both files; the same image with
    LD_LIBRARY_PATH unset: GO. (Uses the image test_a_plain_image_is_gated_as_it_is built.)"""
    if engine.facts(IMAGE) is None:
        pytest.skip(f"{IMAGE} is built by test_a_plain_image_is_gated_as_it_is, which did not run")
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(SHADOWING)
    subprocess.run(["docker", "build", "-q", "-t", SHADOWED, str(ctx)], check=True, capture_output=True, timeout=600)
    subprocess.run(["cp", "-r", str(ROOT / "tests" / "data" / "plain_suite"), str(tmp_path / "suite")], check=True)
    common = ["run", "--candidate-image", SHADOWED, "--suite", "suite", "--no-rollback"]

    def run(*args: str) -> tuple[int, dict, str]:
        proc = subprocess.run([sys.executable, "-m", "stackgate", *common, *args], cwd=tmp_path, capture_output=True,
                              text=True, timeout=1800, check=False)
        run_id = args[args.index("--run-id") + 1]
        return proc.returncode, json.loads((tmp_path / "reports" / run_id / "report.json").read_text()), proc.stdout

    code, report, out = run("--run-id", "shadowed")
    assert code == 1 and report["decision"] == "NO-GO", out[-4000:]
    [cand] = [c for c in report["cells"] if c["role"] == "candidate"]
    failed = {t["name"].rsplit("/", 1)[-1]: t["message"] for t in cand["tests"] if t["outcome"] == "failed"}
    message = failed.get("test_identity.py::test_runpath_alone_resolves_and_a_planted_copy_is_caught", "")
    assert "/opt/extra/libgomp.so.1" in message and "/opt/venv/lib/python3.11/site-packages/torch/lib/libgomp.so.1" in message, failed

    code, report, out = run("--suite-env", "LD_LIBRARY_PATH=", "--run-id", "unset")
    assert code == 0 and report["decision"] == "GO", out[-4000:]
