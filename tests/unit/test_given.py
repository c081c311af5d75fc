"""Stacks a team already has: the probe's reading (torch, CUDA build, Python), a declared version
that disagrees, the matrix with a given stack (its torch, CUDA and Python replace the axes), what the
host backend installs beside an interpreter (only what it lacks) and where a stack is routed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from stackgate import compat, fleet, given, matrix
from stackgate.backends.host import lacking, satisfied
from stackgate.backends.routed import Routed
from stackgate.errors import ConfigError
from stackgate.model import Stack
from stackgate.versions import CudaVariant, parse_driver, parse_torch

ROOT = Path(__file__).resolve().parents[2]


def _output(**data: object) -> str:
    base = {"python": "3.11", "executable": "/x/bin/python", "venv": True, "cudnn": None, "nccl": None,
            "packages": ["torch==2.13.0+cpu", "numpy==2.1.0"]}
    return "noise\nstackgate-given " + json.dumps({**base, **data}) + "\n"


@pytest.mark.parametrize(("torch", "cuda", "variant"), [
    ("2.13.0+cpu", None, "cpu"), ("2.14.1", "13.0", "cu130"), ("2.14.1+cu126", "12.6", "cu126"),
    ("2.15.0.dev20261128+cu132", "13.2", "cu132")])
def test_the_probe_gives_the_stacks_identity(torch: str, cuda: str | None, variant: str) -> None:
    probed = given.parse(given.HOST, "/x/bin/python", _output(torch=torch, cuda=cuda))
    assert probed.torch == parse_torch(torch) and probed.cuda == CudaVariant.parse(variant)
    assert probed.python == "3.11" and probed.given == "host:/x/bin/python" and probed.venv


def test_an_interpreter_without_torch_or_that_does_not_answer_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="cannot import torch: ModuleNotFoundError"):
        given.parse(given.HOST, "/usr/bin/python3", _output(error="ModuleNotFoundError: No module named 'torch'"))
    with pytest.raises(ConfigError, match="did not answer the probe"):
        given.parse(given.IMAGE, "reg/x@sha256:1", "Traceback (most recent call last):\n")


@pytest.mark.parametrize(("line", "words"), [
    ("stackgate-given [1, 2]\n", "what is not a probe's line"),
    ("stackgate-given {\"torch\": 2.14, \"python\": \"3.11\"}\n", "torch: Input should be a valid string"),
    ("stackgate-given {\"torch\": \"2.14.1\", \"cuda\": \"thirteen\"}\n", "reports torch '2.14.1' (CUDA 'thirteen')"),
    ("stackgate-given {\"torch\": \"not-a-version\"}\n", "reports torch 'not-a-version'"),
    ("stackgate-given " + "[" * 5000 + "\n", "what is not a probe's line"),
])
def test_a_probe_line_that_is_not_one_is_a_config_error(line: str, words: str) -> None:
    """#40: the probe's JSON was read as a dict (a list, a number for torch or a nested line crashed)."""
    with pytest.raises(ConfigError, match=re.escape(words)):
        given.parse(given.HOST, "/x/bin/python", line)


def test_a_declared_torch_that_disagrees_with_the_probe_names_both() -> None:
    probed = given.parse(given.HOST, "x/bin/python", _output(torch="2.12.0+cpu", cuda=None))
    given.check_declared(probed, "2.12.0", "--candidate-python")  # agrees
    given.check_declared(probed, None, "--candidate-python")
    with pytest.raises(ConfigError, match=r"x/bin/python holds torch 2\.12\.0\+cpu .* declares torch 2\.13\.0"):
        given.check_declared(probed, "2.13.0", "--candidate-python")
    with pytest.raises(ConfigError, match=r"declares torch 2\.12\.0\+cu126"):
        given.check_declared(probed, "2.12.0+cu126", "--candidate-python")


def test_a_given_stack_replaces_the_torch_cuda_and_python_axes() -> None:
    table = compat.load_compat(ROOT / "matrix" / "compat.toml")
    spec = matrix.load_matrix(ROOT / "matrix" / "upgrade.toml")
    prod = matrix.load_production(ROOT / "matrix" / "production.toml")
    gpu = fleet.LocalHost(driver=parse_driver("580.65.06"), gpu="NVIDIA H200", gpu_count=1)
    pools = fleet.load_pools(ROOT / "matrix" / "fleet.toml", gpu)
    candidate = given.parse(given.HOST, "/opt/conda/bin/python", _output(torch="2.14.1", cuda="13.0"))
    baseline = given.parse(given.HOST, "/usr/bin/python3", _output(torch="2.13.0+cu130", cuda="13.0"))
    exp = matrix.expand(spec, pools, prod, table, torch_versions=[candidate.torch], given=candidate,
                        production_given=baseline)
    local = [c for c in exp.cells if c.pool.name == "local"]
    cands = [c for c in local if c.role.value == "candidate"]
    assert [c.stack.cuda.tag for c in cands] == ["cu130"]  # the matrix's cu126 is not what it holds
    assert all(c.stack.given == "host:/opt/conda/bin/python" for c in cands)
    [prod_cell] = [c for c in local if c.role.value == "production"]
    assert prod_cell.stack.given == "host:/usr/bin/python3" and str(prod_cell.stack.torch) == "2.13.0+cu130"
    built = Stack(parse_torch("2.14.1"), CudaVariant.parse("cu130"), "3.11")
    assert "given" not in built.to_json()  # a built stack's content hash is as it was
    assert cands[0].stack.content_hash != built.content_hash


def test_only_what_the_interpreter_lacks_goes_into_the_suite_prefix() -> None:
    held = ("torch==2.13.0+cpu", "NumPy==2.1.0", "typing_extensions==4.16.0")
    assert satisfied(["numpy", "typing-extensions>=4"], held)
    assert not satisfied(["numpy", "pytest"], held) and not satisfied(["numpy>=2.2"], held)
    assert not satisfied(["recsys-kit @ file:///w/recsys_kit-0.3.0-py3-none-any.whl"], held)
    pins = ("numpy==2.1.0", "pytest==8.4.1", "pluggy==1.6.0", "torch==2.13.0+cpu", "typing-extensions==4.16.0")
    assert lacking(pins, held) == ("pytest==8.4.1", "pluggy==1.6.0")  # never torch, never a second numpy


class _Named:
    def __init__(self, name: str) -> None:
        self.name = name
        self.prepared: list[Stack] = []
        self.runs_plain = True

    def prepare(self, stack: Stack, log_path: Path) -> str:
        self.prepared.append(stack)
        return self.name

    def close(self) -> None:
        return None


def test_a_given_interpreter_goes_to_the_host_backend_and_every_other_stack_is_built() -> None:
    built, host = _Named("docker"), _Named("host")
    routed = Routed(built, host)  # type: ignore[arg-type]
    plain = Stack(parse_torch("2.13.0"), CudaVariant.parse("cpu"), "3.11")
    mine = Stack(parse_torch("2.13.0"), CudaVariant.parse("cpu"), "3.11", given="host:/x/bin/python")
    assert routed.prepare(plain, Path("l")) == "docker" and routed.prepare(mine, Path("l")) == "host"
    assert routed.name == "docker+host"


def test_a_matrix_can_name_the_candidate_stack_the_team_has(tmp_path: Path) -> None:
    from stackgate import inputs, options
    fake = tmp_path / "x" / "bin" / "python"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\necho 'stackgate-given " + json.dumps(
        {"python": "3.11", "executable": str(fake), "torch": "2.14.1", "cuda": "13.0", "packages": ["torch==2.14.1"]})
        + "'\n")
    fake.chmod(0o755)
    upgrade = (ROOT / "matrix" / "upgrade.toml").read_text()
    (tmp_path / "m.toml").write_text(upgrade + '\n[[stack]]\nrole = "candidate"\nbackend = "host"\npython = "x/bin/python"\n')
    opts = options.read({"matrix": str(tmp_path / "m.toml")}, {}, None, cwd=tmp_path)
    loaded = inputs.load(opts, {}, fleet.LocalHost())
    assert loaded.given is not None and loaded.given.ref == str(fake) and str(loaded.torch[0]) == "2.14.1"
    cells = inputs.expand(loaded).cells
    assert {c.stack.given for c in cells if c.role.value == "candidate"} == {f"host:{fake}"}
    for bad, message in (('image = "reg/x:1"\nbackend = "host"\n', "needs either image"),
                         ('backend = "host"\n', "needs either image"),
                         ('image = "reg/x:1"\nrole = "staging"\n', "role = 'staging' is not one of \"candidate\", \"production\""),
                         ('image = "reg/x:1"\nimage_python = "p"\n', "image_python"),
                         ('image = "reg/x:1"\n[[stack]]\nimage = "reg/y:1"\n', "one stack per role")):
        (tmp_path / "bad.toml").write_text(upgrade + "\n[[stack]]\n" + bad)
        with pytest.raises(ConfigError, match=message) as err:
            matrix.load_matrix(tmp_path / "bad.toml")
        assert "bad.toml" in str(err.value.render())
