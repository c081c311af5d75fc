"""The Docker backend against a fake engine (our seam), and the pure image-planning functions."""

from __future__ import annotations

import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from stackgate import compat, given, suite
from stackgate.backends.docker import DockerBackend, images
from stackgate.backends.docker.engine import ContainerExit, ContainerSpec, ImageFacts, container_kwargs
from stackgate.errors import InfraError
from stackgate.model import PLAIN, Cell, GpuClass, Role, RunnerPool, Stack, Status, Topology, WheelSource
from stackgate.runner import run_cell
from stackgate.sources import PipConfig
from stackgate.suite import RunContext
from stackgate.versions import CudaVariant, parse_torch

ROOT = Path(__file__).resolve().parents[2]
STACK = Stack(parse_torch("2.14.1"), CudaVariant("cu130"), "3.11", source=WheelSource(inherit_pip_config=False))


@dataclass
class FakeEngine:
    images: dict[str, dict[str, str]] = field(default_factory=lambda: {"stackgate/base:bookworm": {"_id": "sha256:base"}})
    builds: list[str] = field(default_factory=list)
    groups: list[tuple[list[ContainerSpec], str | None]] = field(default_factory=list)
    exit_codes: tuple[int, ...] = (0, 0)
    probe: str = "stackgate-probe 2.14.1+cu130"  # what a cached image's check prints
    removed: list[str] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)
    pushed: list[str] = field(default_factory=list)
    pulled: list[str] = field(default_factory=list)
    registry: dict[str, dict[str, str]] = field(default_factory=dict)  # what a pull can fetch, by digest ref
    given_probe: str = ""  # what a given image's interpreter answers
    checked: list[str] = field(default_factory=list)  # images whose torch import was checked

    def problem(self) -> str | None:
        return None

    def image_labels(self, tag: str) -> dict[str, str] | None:
        return self.images.get(tag)

    def build(self, context: Path, tag: str, on_line: object, args: dict[str, str]) -> None:
        dockerfile = (context / "Dockerfile").read_text()
        assert "--no-index" in dockerfile and [p.name for p in context.iterdir()] == ["Dockerfile"]  # no suite, no wheel
        listing = urllib.request.urlopen(args[images.WHEELS_ARG], timeout=10).read().decode()  # the wheels are served
        assert ".whl" in listing and "wheels.json" not in listing
        self.builds.append(tag)
        self.images[tag] = {"_id": f"sha256:{len(self.builds)}", "org.stackgate.torch": "2.14.1"}

    def facts(self, ref: str) -> ImageFacts | None:
        found = self.images.get(ref)
        if found is None:
            return None
        return ImageFacts(found["_id"], 1000, tuple(d for d in self.digests if d.split("@")[0] in ref
                                                    or ref.startswith(d.split("@")[0])))

    def push(self, tag: str, name: str, on_line: object) -> str:
        ref = f"{name}@sha256:{'d' * 64}"
        self.digests.append(ref)
        self.pushed.append(tag)
        return ref

    def pull(self, ref: str, on_line: object) -> None:
        if ref not in self.registry:
            raise InfraError(f"docker pull {ref} failed: manifest unknown")
        self.pulled.append(ref)
        self.images[ref] = self.registry[ref]

    def import_rootfs(self, rootfs: Path, tag: str) -> None:
        raise AssertionError("not expected")

    def read_file(self, tag: str, path: str) -> str:
        return "torch==2.14.1\nnumpy==2.0\n"

    def remove_images(self, tags: Sequence[str]) -> None:
        for tag in tags:
            self.removed.append(tag)
            del self.images[tag]

    def run_group(self, specs: Sequence[ContainerSpec], *, network: str | None, timeout_s: float,
                  on_line: object) -> list[ContainerExit]:
        if specs and given.PROBE in specs[0].command:  # the probe of a given image
            return [ContainerExit(specs[0].name, 0, False, False, self.given_probe)]
        if specs and not specs[0].mounts:  # the check of a cached image: `python -c 'import torch'`
            self.checked.append(specs[0].image)
            return [ContainerExit(specs[0].name, 0 if self.probe.startswith("stackgate-probe") else 1, False, False,
                                  self.probe)]
        self.groups.append((list(specs), network))
        out = []
        for i, spec in enumerate(specs):
            [junit] = [a.split("=", 1)[1] for a in spec.command if a.startswith("--junitxml=")]
            host, inside, _ = spec.mounts[0]  # where the command writes, seen from the host
            Path(host, Path(junit).relative_to(inside)).write_text(
                '<testsuite><testcase classname="t" file="test_t.py" name="test_ok" time="1"/></testsuite>')
            out.append(ContainerExit(spec.name, self.exit_codes[i % len(self.exit_codes)], False, False, "log"))
        return out


@pytest.fixture
def backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[DockerBackend, FakeEngine]:
    return fake_backend(tmp_path, monkeypatch)


def fake_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[DockerBackend, FakeEngine]:
    """The Docker backend over a FakeEngine, with a fake host wheelhouse."""
    house = tmp_path / "cache" / "wheelhouse"

    def fake_wheelhouse(cache_dir, requirements, index_args, python, ca_bundle, env, log_path, constraints=()):
        house.mkdir(parents=True, exist_ok=True)
        (house / "torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"t")
        (house / "nvidia_nccl_cu13-2.30.7-py3-none-manylinux_2_18_x86_64.whl").write_bytes(b"n")
        return images.Wheelhouse(house, (images.Wheel("torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl", "aa"),
                                         images.Wheel("nvidia_nccl_cu13-2.30.7-py3-none-manylinux_2_18_x86_64.whl", "bb")))

    monkeypatch.setattr(images, "wheelhouse", fake_wheelhouse)
    engine = FakeEngine()
    table = compat.load_compat(ROOT / "matrix" / "compat.toml")
    return DockerBackend(engine, tmp_path / "cache", table, PipConfig(), {}, suite_dir=suite.BUNDLED_SUITE,
                         say=lambda _: None), engine


def test_image_built_once_then_reused(backend: tuple[DockerBackend, FakeEngine], tmp_path: Path) -> None:
    be, engine = backend
    first = be.prepare(STACK, tmp_path / "b.log")
    second = be.prepare(STACK, tmp_path / "b.log")
    assert not first.reused and second.reused and first.ref == second.ref
    assert engine.builds == [first.ref] and first.ref.startswith("stackgate/stack:cu130-torch2.14.1-py3.11-")
    assert first.sbom["packages"] == ["torch==2.14.1", "numpy==2.0"]


def test_multi_node_cell_gets_a_network_and_one_container_per_node(backend: tuple[DockerBackend, FakeEngine],
                                                                   tmp_path: Path) -> None:
    be, engine = backend
    handle = be.prepare(STACK, tmp_path / "b.log")
    pool = RunnerPool("local", None, GpuClass.NONE, nodes=2, is_local=True)
    cell = Cell(STACK, pool, Topology(2, 2), Role.CANDIDATE)
    result = run_cell(be, cell, handle, RunContext("r1", tmp_path / "run", suite.SuiteSpec()))
    specs, network = engine.groups[-1]
    assert network is not None and len(specs) == 2
    assert [s.env["STACKGATE_NODE_RANK"] for s in specs] == ["0", "1"]
    assert all(s.env["STACKGATE_RDZV_ENDPOINT"] == "node0:29400" and not s.gpu for s in specs)
    assert result.status is Status.PASSED


def test_the_fidelity_rerun_of_a_two_node_cell_is_one_plain_container(backend: tuple[DockerBackend, FakeEngine],
                                                                       tmp_path: Path) -> None:
    """Phase "plain": node 0 only, the pytest command itself (no node init), no stackgate variable, no
    network of stackgate's, only the selected tests."""
    be, engine = backend
    handle = be.prepare(STACK, tmp_path / "b.log")
    pool = RunnerPool("local", None, GpuClass.NONE, nodes=2, is_local=True)
    cell = Cell(STACK, pool, Topology(2, 2), Role.PRODUCTION)
    spec = suite.SuiteSpec(path=tmp_path, env=(("NCCL_DEBUG", "INFO"),))
    run_cell(be, cell, handle, RunContext("r1", tmp_path / "run", spec, phase=PLAIN, select=("test_t.py::test_ok",)))
    [(specs, network)] = engine.groups
    [only] = specs
    assert network is None and only.plain and only.command[:3] == ("python", "-m", "pytest")
    assert only.command[3] == "/sg/suite/test_t.py::test_ok" and only.env == {"NCCL_DEBUG": "INFO"}


def test_a_killed_container_is_a_crashed_cell(backend: tuple[DockerBackend, FakeEngine], tmp_path: Path) -> None:
    be, engine = backend
    engine.exit_codes = (1, 137)
    handle = be.prepare(STACK, tmp_path / "b.log")
    pool = RunnerPool("local", None, GpuClass.NONE, nodes=2, is_local=True)
    result = run_cell(be, Cell(STACK, pool, Topology(2, 2), Role.CANDIDATE), handle,
                    RunContext("r2", tmp_path / "run", suite.SuiteSpec()))
    assert result.status is Status.CRASHED and "killed" in result.reason


def test_gpu_flags_only_for_gpu_cells_and_what_training_needs_for_all() -> None:
    spec = ContainerSpec("n", "img", ("true",), {}, (("/h", "/c", "rw"),), "node0", gpu=False, user="0:0")
    cpu = container_kwargs(spec, None)
    assert "device_requests" not in cpu and "ulimits" not in cpu and "network" not in cpu
    assert cpu["cap_drop"] == ["ALL"] and cpu["security_opt"] == ["no-new-privileges:true"]
    assert "privileged" not in cpu and "ipc_mode" not in cpu and "read_only" not in cpu
    # DataLoader workers and torch.multiprocessing hand tensors over through /dev/shm: CPU cells too
    assert cpu["shm_size"] == "16g"
    assert cpu["environment"] == {} and set(cpu["tmpfs"]) == {"/tmp"}  # root: the image's own home
    gpu = container_kwargs(ContainerSpec("n", "img", ("true",), {}, (), "node0", gpu=True), "net")
    assert gpu["device_requests"][0]["Count"] == -1 and gpu["shm_size"] == "16g"
    assert {u["Name"] for u in gpu["ulimits"]} == {"memlock", "stack"} and gpu["network"] == "net"


def test_a_user_the_image_does_not_know_gets_a_name_and_a_writable_home() -> None:
    spec = ContainerSpec("n", "img", ("true",), {"HOME": "/mine"}, (), "node0", user="1000:1000")
    kwargs = container_kwargs(spec, None)
    env = kwargs["environment"]
    assert env["USER"] == env["LOGNAME"] and env["USER"]  # getpass.getuser() answers without a passwd entry
    assert kwargs["tmpfs"]["/sg/home"].endswith("mode=1777")
    assert env["HOME"] == "/mine"  # a HOME the suite was given explicitly wins
    default = container_kwargs(ContainerSpec("n", "img", ("true",), {}, (), "node0", user="1000:1000"), None)
    assert default["environment"]["HOME"] == "/sg/home"


def test_the_fidelity_rerun_is_a_plain_docker_run() -> None:
    """#41: production's failing tests once more as `docker run --rm --ipc=host IMAGE ...` would run them:
    none of the restrictions, the init or the network a cell gets."""
    spec = ContainerSpec("n", "img", ("python", "-m", "pytest"), {}, (("/h", "/c", "ro"),), "node0", user="0:0",
                         workdir="/c", plain=True)
    kwargs = container_kwargs(spec, None)
    assert kwargs["ipc_mode"] == "host" and kwargs["command"] == ["python", "-m", "pytest"]
    assert not {"cap_drop", "security_opt", "pids_limit", "tmpfs", "network", "shm_size", "hostname"} & set(kwargs)
    assert kwargs["volumes"] == {"/h": {"bind": "/c", "mode": "ro"}} and kwargs["working_dir"] == "/c"


def test_render_key_labels_and_download_args() -> None:
    house = images.Wheelhouse(Path("/w"), (images.Wheel("torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl", "aa"),
                                           images.Wheel("nvidia_cudnn_cu13-9.24.0.43-py3-none-manylinux_2_27_x86_64.whl", "bb")))
    labels = images.labels(STACK, house, "stackgate/base:bookworm", "sha256:base", "k")
    assert labels["org.stackgate.torch"] == "2.14.1" and labels["org.stackgate.cudnn"] == "9.24.0.43"
    assert labels["org.stackgate.nccl"] == "none"
    text = images.render(images.TEMPLATE.read_text(), base="stackgate/base:bookworm",
                         requirements=["torch==2.14.1", "numpy"], label_map=labels)
    instructions = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    assert instructions.count("FROM ") == 1 and "COPY" not in instructions  # one stage; no wheel in any layer
    assert "ARG STACKGATE_WHEELS" in instructions
    assert "--find-links \"${STACKGATE_WHEELS}\" 'torch==2.14.1' 'numpy'" in instructions
    assert 'org.stackgate.cudnn="9.24.0.43"' in text and "{{" not in instructions
    assert "cert" not in instructions.lower()  # no CA bundle, ever, in the image recipe
    assert "COPY suite" not in instructions and "/opt/stackgate/suite" not in instructions  # the suite: mounted
    k1 = images.image_key("t", "sha256:base", house, ["torch==2.14.1"])
    assert k1 == images.image_key("t", "sha256:base", house, ["torch==2.14.1"])
    assert k1 != images.image_key("t", "sha256:other", house, ["torch==2.14.1"])
    assert k1 != images.image_key("t", "sha256:base", house, ["torch==2.14.2"])
    args = images.download_args(["--find-links", "/opt/wheels", "--index-strategy", "unsafe-best-match",
                                 "--prerelease", "allow"], "3.11", "/etc/ca.pem")
    assert "--index-strategy" not in args and "--pre" in args and args[args.index("--cert") + 1] == "/etc/ca.pem"
    assert "--only-binary=:all:" in args and args[args.index("--python-version") + 1] == "3.11"


def test_a_build_reads_exactly_the_wheelhouses_wheels_over_loopback_and_then_nothing(tmp_path: Path) -> None:
    import urllib.error
    (tmp_path / "torch-2.14.1+cu130-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"wheel bytes " * 1000)
    (tmp_path / "wheels.json").write_text("[]")
    (tmp_path / "other-1.0-py3-none-any.whl").write_bytes(b"not in this house")
    house = images.Wheelhouse(tmp_path, (images.Wheel("torch-2.14.1+cu130-cp311-cp311-manylinux_2_28_x86_64.whl", "aa"),))
    with images.serve_wheels(house) as url:
        assert url.startswith("http://127.0.0.1:")
        listing = urllib.request.urlopen(url, timeout=10).read().decode()
        assert listing.count("<a href=") == 1 and 'href="torch-2.14.1%2Bcu130-cp311' in listing
        got = urllib.request.urlopen(url + "torch-2.14.1%2Bcu130-cp311-cp311-manylinux_2_28_x86_64.whl", timeout=10)
        assert got.read() == b"wheel bytes " * 1000
        for other in ("wheels.json", "other-1.0-py3-none-any.whl", "..%2F" + tmp_path.name + "%2Fwheels.json"):
            with pytest.raises(urllib.error.HTTPError, match="404"):
                urllib.request.urlopen(url + other, timeout=10)
    with pytest.raises(urllib.error.URLError):  # the server ends with the build
        urllib.request.urlopen(url, timeout=10)


def test_download_platforms_cover_every_manylinux_tag_the_base_loads() -> None:
    tags = images.platforms((2, 36))
    assert tags[0] == "manylinux_2_36_x86_64" and "manylinux_2_18_x86_64" in tags and "manylinux_2_17_x86_64" in tags
    assert "manylinux2014_x86_64" in tags and "manylinux_2_37_x86_64" not in tags


def test_engine_lost_mid_run_is_an_infra_error_and_the_run_goes_on(backend: tuple[DockerBackend, FakeEngine],
                                                                  tmp_path: Path) -> None:
    from stackgate.console import Console
    from stackgate.errors import InfraError
    from stackgate.runner import Attempt, Runner
    be, engine = backend
    handle = be.prepare(STACK, tmp_path / "b.log")

    def gone(*args: object, **kwargs: object) -> list[ContainerExit]:
        raise InfraError("lost the Docker engine: connection refused")

    engine.run_group = gone  # type: ignore[method-assign]
    pool = RunnerPool("local", None, GpuClass.NONE, nodes=1, is_local=True)
    cell = Cell(STACK, pool, Topology(1, 2), Role.CANDIDATE)
    ctx = RunContext("r3", tmp_path / "run", suite.SuiteSpec())
    result = Runner(be, ctx, Console(lambda _: None), [cell]).attempt(Attempt(cell), handle)
    assert result.status is Status.INFRA_ERROR and "lost the Docker engine" in result.reason


def test_prune_keeps_the_newest_image_per_stack() -> None:
    found = [images.ImageInfo("stackgate/stack:cpu-torch2.13.0-py3.11-aaaa", "2026-11-29T09:00:00Z"),
             images.ImageInfo("stackgate/stack:cpu-torch2.13.0-py3.11-bbbb", "2026-11-29T10:00:00Z"),
             images.ImageInfo("stackgate/stack:cpu-torch2.13.0-py3.11-cccc", "2026-11-28T10:00:00Z"),
             images.ImageInfo("stackgate/stack:cu130-torch2.14.1-py3.11-dddd", "2026-11-01T00:00:00Z")]
    assert images.stale_images(found) == ["stackgate/stack:cpu-torch2.13.0-py3.11-aaaa",
                                          "stackgate/stack:cpu-torch2.13.0-py3.11-cccc"]
    assert images.stale_images(found, keep=2) == ["stackgate/stack:cpu-torch2.13.0-py3.11-cccc"]


# ---- #18 item 3b: what the host's pip configuration does is not a verdict on the candidate

PIP_CAPPED = """Looking in indexes: https://pypi.org/simple, file:///opt/pypi/simple
Looking in links: /opt/wheels
ERROR: Cannot install torch==2.15.0 because these package versions have conflicting dependencies.

The conflict is caused by:
    The user requested torch==2.15.0
    The user requested (constraint) torch<=2.14.1

To fix this you could try to:
1. loosen the range of package versions you've specified
2. remove package versions to allow pip attempt to solve the dependency conflict

ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/
"""
PIP_CONFLICT = PIP_CAPPED.replace("The user requested (constraint) torch<=2.14.1",
                                  "numpy 3.0 depends on python>=3.13")


def _failing_download(monkeypatch: pytest.MonkeyPatch, output: str) -> None:
    def fail(*args: object, **kwargs: object) -> images.Wheelhouse:
        raise images.WheelhouseFailed("downloading wheels for torch==2.15.0 numpy pytest failed (exit 1)", output)
    monkeypatch.setattr(images, "wheelhouse", fail)


def test_a_host_pip_constraint_is_an_infra_error_naming_the_file_and_the_way_out(
        backend: tuple[DockerBackend, FakeEngine], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stackgate.errors import InfraError
    from stackgate.sources import parse_pip_config
    docker, _ = backend
    docker.host_pip = parse_pip_config("global.constraint='/etc/xdg/pip/constraints.txt'\n"
                                       "global.find-links='/opt/wheels'\n")
    _failing_download(monkeypatch, PIP_CAPPED)
    with pytest.raises(InfraError) as info:
        docker.prepare(STACK, tmp_path / "build.log")
    text = str(info.value)
    assert "The user requested (constraint) torch<=2.14.1" in text
    assert "global.constraint = /etc/xdg/pip/constraints.txt" in text
    assert "PIP_CONSTRAINT=/dev/null" in text and "Not a verdict on the candidate" in text


def test_a_conflict_of_the_stacks_own_requirements_stays_a_build_failure(
        backend: tuple[DockerBackend, FakeEngine], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stackgate.backends.base import PrepareFailed
    docker, _ = backend
    _failing_download(monkeypatch, PIP_CONFLICT)
    with pytest.raises(PrepareFailed, match="the stack's own requirements conflict"):
        docker.prepare(STACK, tmp_path / "build.log")


def test_a_full_disk_while_downloading_is_an_infra_error(backend: tuple[DockerBackend, FakeEngine], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from stackgate.errors import InfraError
    docker, _ = backend
    _failing_download(monkeypatch, "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on "
                                   "device")
    with pytest.raises(InfraError, match="the disk is full"):
        docker.prepare(STACK, tmp_path / "build.log")


def test_a_cached_image_that_fails_its_check_is_rebuilt(backend: tuple[DockerBackend, FakeEngine],
                                                       tmp_path: Path) -> None:
    """#18 item 3 on the Docker backend: a cached image is checked (its python imports torch at the
    stack's version) before it is reused, once per image id (an image is immutable by its id)."""
    docker, engine = backend
    first = docker.prepare(STACK, tmp_path / "build.log")
    assert docker.prepare(STACK, tmp_path / "build.log").reused and engine.checked == [first.ref]
    assert docker.prepare(STACK, tmp_path / "build.log").reused and engine.checked == [first.ref]  # checked once

    def replaced(probe: str) -> None:  # the tag now names another image (`docker build -t` of a broken one)
        engine.images[first.ref] = {**engine.images[first.ref], "_id": f"sha256:broken-{len(engine.checked)}"}
        engine.probe = probe

    replaced("ImportError: libtorch_cpu.so: cannot open shared object file")
    again = docker.prepare(STACK, tmp_path / "build.log")
    assert not again.reused and engine.removed == [first.ref] and len(engine.builds) == 2
    engine.probe = "stackgate-probe 2.14.1+cu130"
    assert docker.prepare(STACK, tmp_path / "build.log").reused  # the rebuilt image: a new id, checked
    replaced("stackgate-probe 2.12.0+cu130")
    assert not docker.prepare(STACK, tmp_path / "build.log").reused  # another torch in the image: rebuilt too


def test_an_interrupt_inside_containers_run_leaves_no_container_behind() -> None:
    """Ctrl-C (or SIGTERM, raised as an exception) while the SDK's `containers.run` is waiting on the
    engine: the engine has made the container, the call never returned it; it is removed by name."""
    import docker

    from stackgate.backends.docker.engine import DockerEngine

    class Made:
        def __init__(self, engine: dict[str, Made], name: str) -> None:
            self.engine, self.name = engine, name

        def remove(self, force: bool = False) -> None:
            del self.engine[self.name]

    class Containers:
        def __init__(self) -> None:
            self.alive: dict[str, Made] = {}

        def run(self, image: str, **kwargs: object) -> Made:
            name = str(kwargs["name"])
            self.alive[name] = Made(self.alive, name)
            if name.endswith("node1"):
                raise KeyboardInterrupt  # the engine started it; the answer never came back
            return self.alive[name]

        def get(self, name: str) -> Made:
            if name not in self.alive:
                raise docker.errors.NotFound(name)
            return self.alive[name]

    class Client:
        containers = Containers()

    engine = DockerEngine()
    engine._client = Client()
    specs = [ContainerSpec(f"sg-x-suite-node{i}", "img", ("true",), {}, (), f"node{i}") for i in range(3)]
    with pytest.raises(KeyboardInterrupt):
        engine.run_group(specs, network=None, timeout_s=5, on_line=None)
    assert Client.containers.alive == {}  # node0 (returned) and node1 (never returned) are both gone
