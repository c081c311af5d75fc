"""Stacks as registry artifacts, against the fake engine: a pool runner given stacks.json pulls by
digest and never builds; a stack stacks.json does not name is an infrastructure error; a push gives
the artifact by digest; the registry's configuration; merge refuses one stack run as two images."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stackgate import artifacts, bundle, options
from stackgate.backends.docker import DockerBackend
from stackgate.boundary.manifest import Manifest
from stackgate.errors import ConfigError, InfraError
from stackgate.model import CellResult, Role, Status
from stackgate.rundir import results
from tests.unit.test_docker_plan import STACK, FakeEngine, fake_backend


@pytest.fixture
def backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[DockerBackend, FakeEngine]:
    return fake_backend(tmp_path, monkeypatch)


DIGEST = "127.0.0.1:5050/team/stack@sha256:" + "a" * 64


def _artifact(ident: str, image: str = DIGEST) -> artifacts.StackArtifact:
    return artifacts.StackArtifact(stack=ident, image=image, key="k", size=1, sbom_digest="sha256:s",
                                   torch="2.14.1", cuda="cu130", python="3.11")


def test_a_pool_runner_pulls_by_digest_and_never_builds(backend: tuple[DockerBackend, FakeEngine],
                                                        tmp_path: Path) -> None:
    be, engine = backend
    engine.registry[DIGEST] = {"_id": "sha256:pulled", "org.stackgate.torch": "2.14.1"}
    be.pinned = {STACK.ident: _artifact(STACK.ident)}
    first = be.prepare(STACK, tmp_path / "p.log")
    second = be.prepare(STACK, tmp_path / "p.log")
    assert engine.pulled == [DIGEST] and engine.builds == []  # pulled once, then found here; never built
    assert first.ref == second.ref == DIGEST and first.sbom["image_id"] == "sha256:pulled"
    assert be.describe(first)["stack_label"] == STACK.ident


def test_a_stack_that_stacks_json_does_not_name_is_an_infra_error_not_a_build(
        backend: tuple[DockerBackend, FakeEngine], tmp_path: Path) -> None:
    be, engine = backend
    be.pinned = {"cpu-torch2.13.0-py3.11-00000000": _artifact("cpu-torch2.13.0-py3.11-00000000")}
    with pytest.raises(InfraError, match=f"stacks.json has no image for stack {STACK.ident}.*never builds") as err:
        be.prepare(STACK, tmp_path / "p.log")
    assert "stackgate build --push" in str(err.value.hint)
    assert engine.builds == [] and engine.pulled == []


def test_a_digest_the_registry_does_not_have_is_an_infra_error(backend: tuple[DockerBackend, FakeEngine],
                                                               tmp_path: Path) -> None:
    be, engine = backend
    be.pinned = {STACK.ident: _artifact(STACK.ident)}
    with pytest.raises(InfraError, match="manifest unknown"):
        be.prepare(STACK, tmp_path / "p.log")
    assert engine.builds == []


def test_publish_pushes_the_built_stack_image_and_names_it_by_digest(backend: tuple[DockerBackend, FakeEngine],
                                                                     tmp_path: Path) -> None:
    be, engine = backend
    with pytest.raises(ConfigError, match="no registry"):
        be.publish(be.prepare(STACK, tmp_path / "b.log"))
    be.registry = artifacts.Registry("127.0.0.1:5050", "team/stack")
    handle = be.prepare(STACK, tmp_path / "b.log")
    found = be.publish(handle)
    assert engine.pushed == [handle.ref] and found.image.startswith("127.0.0.1:5050/team/stack@sha256:")
    assert found.stack == STACK.ident and found.key == handle.key and found.sbom_digest.startswith("sha256:")
    out = tmp_path / "stacks.json"
    artifacts.write(out, {found.stack: found}, be.registry.name)
    assert artifacts.read(out) == {found.stack: found}


@pytest.mark.parametrize(("text", "message"), [
    ("{", "Invalid JSON: EOF while parsing"),
    ('{"schema": 1, "stacks": []}', "not a stacks.json"),
    (json.dumps({"schema": 1, "stacks": {"s": {**vars(_artifact("s")), "image": "reg/stack:latest"}}}),
     "stacks.s.image: String should match pattern"),
    (json.dumps({"schema": 1, "stacks": {"s": {"stack": "s"}}}), "stacks.s.image: Field required"),
    (json.dumps({"schema": 1, "stacks": {"s": {**vars(_artifact("t"))}}}), "stack 't', filed under another label"),
    (json.dumps({"schema": 1, "stacks": {"s": {**vars(_artifact("s")), "size": "12"}}}), "stacks.s.size: Input should"),
])
def test_a_broken_stacks_json_is_a_config_error_saying_what(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "stacks.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        artifacts.read(path)
    with pytest.raises(ConfigError, match="no such file") as missing:
        artifacts.read(tmp_path / "missing.json")
    assert "stackgate build --push" in str(missing.value.hint)


def test_the_registry_comes_from_the_command_line_stackgate_toml_or_the_fleet(tmp_path: Path) -> None:
    (tmp_path / "stackgate.toml").write_text('[registry]\nurl = "reg.example:5000"\nrepository = "ml/stack"\n')
    opts = options.read({}, {}, tmp_path / "stackgate.toml", cwd=tmp_path)
    assert (opts.registry, opts.repository) == ("reg.example:5000", "ml/stack")
    assert opts.sources["registry"].endswith("stackgate.toml [registry]")
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "fleet.toml").write_text('[registry]\nurl = "fleet.example"\n\n[pool.a]\nnodes = 1\n')
    assert artifacts.configured(None, None, cfg) == artifacts.Registry("fleet.example", "stackgate/stack")
    assert artifacts.configured("cli.example:1", None, cfg) == artifacts.Registry("cli.example:1", "stackgate/stack")
    assert artifacts.configured(None, None, tmp_path) is None  # no fleet.toml there: local images only
    with pytest.raises(ConfigError, match="is not host"):
        artifacts.configured("http://bad host", None, cfg)
    with pytest.raises(ConfigError, match="not a valid image name"):
        artifacts.configured("ok.example", "Upper/Case", cfg)
    (cfg / "fleet.toml").write_text('[registry]\nurll = "x"\n')
    with pytest.raises(ConfigError, match="url"):  # a misspelled key, with a did-you-mean
        artifacts.configured(None, None, cfg)


def _bundle(path: Path, image: str | None, recorded: str | None = None) -> bundle.Bundle:
    env = {"stack_label": "cpu-x", **({"image_digest": image} if image else {})}
    found = {"c1": CellResult("c1", Role.CANDIDATE, Status.PASSED, environment=env)}
    manifest = Manifest(definition={}, stacks={"cpu-x": [recorded]} if recorded else {})
    return bundle.Bundle(path, manifest, results.ResultLines(found))


def test_merge_refuses_bundles_that_ran_one_stack_as_different_images(tmp_path: Path) -> None:
    other = DIGEST.replace("a" * 64, "b" * 64)
    bundle.check_same_images([_bundle(tmp_path / "a", DIGEST), _bundle(tmp_path / "b", DIGEST)])  # one image: fine
    with pytest.raises(ConfigError, match=f"stack cpu-x ran as different images: {DIGEST} in bundle .*a, {other}"):
        bundle.check_same_images([_bundle(tmp_path / "a", DIGEST), _bundle(tmp_path / "b", other)])
    with pytest.raises(ConfigError, match="local build"):  # a digest in one bundle, a local build in the other
        bundle.check_same_images([_bundle(tmp_path / "a", DIGEST), _bundle(tmp_path / "b", None)])
    with pytest.raises(ConfigError, match="2 different images"):  # run.json edited to name another digest
        bundle.check_same_images([_bundle(tmp_path / "a", DIGEST, recorded=other)])


def test_a_given_image_is_run_as_it_is_with_the_suites_prefix_mounted_read_only(
        backend: tuple[DockerBackend, FakeEngine], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stackgate.backends import host
    from stackgate.model import Cell, GpuClass, Role, RunnerPool, Stack, Topology
    from stackgate.runner import run_cell
    from stackgate.suite import RunContext, SuiteSpec
    from stackgate.versions import CudaVariant, parse_torch
    be, engine = backend
    ref = "team/trainer:2.13"
    engine.images[ref] = {"_id": "sha256:" + "e" * 64}
    engine.given_probe = "stackgate-given " + json.dumps({
        "python": "3.11", "executable": "/opt/venv/bin/python3", "torch": "2.13.0+cpu", "cuda": None,
        "packages": ["torch==2.13.0+cpu", "filelock==4.3.1"]})
    prefix = tmp_path / "prefix"
    seen: list[object] = []

    def fake_prefix(cache_dir, deps, probed, target, index, env, log_path, say):  # type: ignore[no-untyped-def]
        seen.append((probed.ref, list(target)))
        return prefix

    monkeypatch.setattr(host, "suite_prefix", fake_prefix)
    stack = Stack(parse_torch("2.13.0+cpu"), CudaVariant.parse("cpu"), "3.11", given=f"image:{ref}")
    handle = be.prepare(stack, tmp_path / "g.log")
    assert engine.builds == [] and handle.ref == ref and handle.sbom["interpreter"] == "/opt/venv/bin/python3"
    assert seen == [(ref, ["--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28"])]
    cell = Cell(stack, RunnerPool("local", None, GpuClass.NONE, is_local=True), Topology(1, 2), Role.CANDIDATE)
    run_cell(be, cell, handle, RunContext("r1", tmp_path / "run", SuiteSpec()))
    [spec] = engine.groups[-1][0]
    assert spec.image == ref and spec.command[0] == "/opt/venv/bin/python3"  # the image's own interpreter
    assert (str(prefix), "/sg/prefix", "ro") in spec.mounts and spec.env["PYTHONPATH"] == "/sg/prefix"
    engine.given_probe = engine.given_probe.replace("2.13.0+cpu", "2.12.0+cpu")
    with pytest.raises(InfraError, match="changed while the run went on"):
        be.prepare(stack, tmp_path / "g.log")
