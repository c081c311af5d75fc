"""#42: Slurm cells in the stack's image. enroot/pyxis and Apptainer cannot be installed here, so
what they would run is golden-tested through the CLI (`stackgate run --launcher slurm --container
RUNTIME --dry-run --stacks stacks.json`): the image by digest in each runtime's own syntax, the
mounts, the GPU flags, the plan's variables passed explicitly and never the harness's secrets.
`UPDATE_GOLDEN=1` rewrites the files (review the diff). The podman path runs for real in the Slurm
tier (tests/slurm/test_slurm_podman.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stackgate import fleet, inputs, options
from stackgate.errors import ConfigError
from stackgate.shipped import BUNDLED_SUITE

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
REGISTRY = "registry.example.com:5000/ml/stack"


def _stacks(cwd: Path) -> Path:
    """stacks.json for the default matrix's stacks, as `stackgate build --push` would write it."""
    opts = options.read({}, {}, cwd / "none.toml", cwd=cwd)
    loaded = inputs.load(opts, {}, fleet.LocalHost())
    chosen = inputs.select(opts, loaded)
    stacks = {}
    for i, cell in enumerate(sorted({c.stack.ident: c for c in chosen.cells}.values(), key=lambda c: c.stack.ident)):
        st = cell.stack
        stacks[st.ident] = {"stack": st.ident, "image": f"{REGISTRY}@sha256:{str(i) * 64}", "key": st.content_hash[:16],
                            "size": 1, "sbom_digest": "sha256:" + "e" * 64, "torch": str(st.torch),
                            "cuda": st.cuda.tag, "python": st.python}
    path = cwd / "stacks.json"
    path.write_text(json.dumps({"schema": 1, "registry": REGISTRY.split("/", maxsplit=1)[0], "stacks": stacks}))
    return path


def _dry_run(cwd: Path, runtime: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "stackgate", "run", "--launcher", "slurm", "--container", runtime,
                           "--dry-run", "--stacks", "stacks.json", "--run-id", "golden",
                           "--suite-env", "NCCL_DEBUG=WARN"], cwd=cwd, capture_output=True, text=True, timeout=300,
                          check=False, env={**os.environ, "SLURM_CONF": "/nonexistent", "HF_TOKEN": "hunter2-secret",
                                            "STACKGATE_CACHE_DIR": str(cwd / "cache")})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout.replace(str(cwd.resolve()), "<project>").replace(str(cwd), "<project>")
    text = text.replace(str(BUNDLED_SUITE.resolve()), "<bundled suite>")
    text = re.sub(r"STACKGATE_RUN_KEY=[0-9a-f]{16}", "STACKGATE_RUN_KEY=<key>", text)
    return re.sub(r"--user \d+:\d+", "--user <uid>:<gid>", text)


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer", "podman"])
def test_the_job_scripts_of_each_runtime_reference_the_image_by_digest(tmp_path: Path, runtime: str) -> None:
    _stacks(tmp_path)
    text = _dry_run(tmp_path, runtime)
    golden = GOLDEN / f"slurm-{runtime}.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text(), f"{golden} differs from what the CLI prints (UPDATE_GOLDEN=1 rewrites it)"
    digest = f"{REGISTRY}@sha256:" + "0" * 64
    wanted = {"pyxis": "--container-image=registry.example.com:5000#ml/stack@sha256:" + "0" * 64,
              "apptainer": f"docker://{digest}", "podman": f"docker://{digest}"}[runtime]
    assert wanted in text
    assert "hunter2-secret" not in text and "HF_TOKEN" not in text.split("esac; done")[-1]  # never the harness's secrets
    assert "export NCCL_DEBUG=WARN" in text  # the plan's variables, explicitly
    assert ":/sg/out:rw" in text and ":/sg/suite:ro" in text
    if runtime == "podman":
        assert "--env NCCL_DEBUG" in text and "=WARN" not in text.split("podman run")[1].split("\n")[0]  # by name
        assert "--network host" in text and "podman rm -f" in text
    if runtime == "apptainer":
        assert "--cleanenv" in text and 'export APPTAINERENV_NCCL_DEBUG="$NCCL_DEBUG"' in text


def test_a_container_on_a_pool_that_is_not_a_slurm_pool_is_an_error_at_its_line(tmp_path: Path) -> None:
    toml = tmp_path / "fleet.toml"
    toml.write_text('[pool.local]\ndetect = true\n\n[pool.cluster]\ngpu_class = "none"\nnodes = 2\ncontainer = "podman"\n')
    with pytest.raises(ConfigError, match='container only apply with launcher = "slurm"') as caught:
        fleet.load_pools(toml, fleet.LocalHost())
    assert caught.value.line == 7
    toml.write_text('[pool.cluster]\ngpu_class = "none"\nlauncher = "slurm"\ncontainer = "docker"\n')
    with pytest.raises(ConfigError, match="podman"):
        fleet.load_pools(toml, fleet.LocalHost())
    toml.write_text('[pool.cluster]\ngpu_class = "none"\nlauncher = "slurm"\ncontainer = "apptainer"\n')
    spec = fleet.load_pools(toml, fleet.LocalHost())["cluster"].slurm
    assert spec is not None and spec.container == "apptainer"


def test_images_on_slurm_need_a_runtime_and_a_runtime_needs_images(tmp_path: Path) -> None:
    for args, message in ((["--backend", "venv", "--container", "podman"], "--backend venv prepares venvs"),
                          (["--backend", "docker"], "need a container runtime")):
        proc = subprocess.run([sys.executable, "-m", "stackgate", "run", "--launcher", "slurm", *args,
                               "--reports", str(tmp_path / "r")], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300, check=False, env={**os.environ, "SLURM_CONF": "/nonexistent"})
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
