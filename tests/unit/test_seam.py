"""Issue 12, part 1: the seam. The suite plans what each node runs; a backend only provides an
environment and executes commands; the Docker code lives in backends/docker; and the in-memory
backend drives the whole pipeline (plan, run, collect, decide, report) without a subprocess."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from stackgate import shipped, suite
from stackgate.backends import memory
from stackgate.backends.base import Execution
from stackgate.backends.memory import MemoryBackend, answer
from stackgate.model import MAIN, ROLLBACK, Cell, GpuClass, Role, RunnerPool, Stack, Status, Topology
from stackgate.runner import run_cell
from stackgate.suite import NodeCommand, NodeExit, RunContext
from stackgate.versions import CudaVariant, parse_torch

from .conftest import RunMemory

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "stackgate"
STACK = Stack(parse_torch("2.13.0"), CudaVariant("cpu"), "3.11")


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_only_backends_docker_touches_the_docker_sdk_or_the_engine() -> None:
    docker_dir = SRC / "backends" / "docker"
    offenders = {}
    for path in SRC.rglob("*.py"):
        if path.is_relative_to(docker_dir) or path.is_relative_to(SRC / "resources"):
            continue
        bad = {m for m in _imports(path) if m == "docker" or m.startswith(
            ("docker.", "stackgate.backends.docker.engine", "stackgate.backends.docker.images"))}
        if bad:
            offenders[str(path.relative_to(SRC))] = sorted(bad)
    assert offenders == {}
    assert not (SRC / "docker_engine.py").exists() and not (SRC / "images.py").exists()


def test_one_node_plan_for_every_backend() -> None:
    """`suite.node_commands` is the only place that builds a node's argv and environment; `run_cell`
    executes it on every backend and `--dry-run` prints it: no backend plans pytest runs of its own."""
    callers = {str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
               if not p.is_relative_to(SRC / "resources") and "node_commands(" in p.read_text()}
    assert callers == {"suite.py", "runner.py", "commands/dry_run.py"}
    for name in ("backends/venv.py", "backends/docker/backend.py", "backends/memory.py", "backends/slurm.py"):
        text = (SRC / name).read_text()
        assert "suite_env(" not in text and "pytest_argv(" not in text and "invocations(" not in text, name
        assert "def execute(" in text and "def layout(" in text and "def run(" not in text, name


def _ctx(tmp_path: Path, spec: suite.SuiteSpec, **kw: object) -> RunContext:
    return RunContext("r1", tmp_path / "run", spec, **kw)  # type: ignore[arg-type]


def test_the_plan_of_a_two_node_cell_with_a_user_suite(tmp_path: Path) -> None:
    pool = RunnerPool("local", None, GpuClass.NONE, nodes=2, is_local=True)
    cell = Cell(STACK, pool, Topology(2, 3), Role.CANDIDATE)
    user = tmp_path / "mysuite"
    layout = suite.Layout(python="/venv/bin/python", out=Path("/out"), artifacts=Path("/a"), shared=Path("/s"),
                          suite=user, endpoint="node0:29400")
    groups = suite.node_commands(cell, _ctx(tmp_path, suite.SuiteSpec(path=user)), layout)
    assert [[c.label for c in g] for g in groups] == [["platform", "platform"], ["suite", "suite"]]
    node1 = groups[1][1]
    assert node1.node == 1 and node1.cwd == user and node1.argv[:3] == ("/venv/bin/python", "-m", "pytest")
    assert node1.argv[-1] == "--junitxml=/out/junit-node1-suite.xml"
    assert node1.env["STACKGATE_NODE_RANK"] == "1" and node1.env["STACKGATE_RDZV_ENDPOINT"] == "node0:29400"
    assert node1.env["STACKGATE_RESULTS"] == "/out/results-node1.jsonl"
    assert node1.env["STACKGATE_NPROC_PER_NODE"] == "3"
    single = Cell(STACK, pool, Topology(1, 2), Role.CANDIDATE)
    (group,) = suite.node_commands(single, _ctx(tmp_path, suite.SuiteSpec(), phase=ROLLBACK), layout)
    assert len(group) == 1 and group[0].env["STACKGATE_RDZV_ENDPOINT"] == ""  # one node: no rendezvous
    assert "crossversion" in group[0].argv


def test_an_oom_kill_travels_as_data(tmp_path: Path) -> None:
    def script(command: NodeCommand, exe: Execution) -> NodeExit:
        if command.node == 1:
            return answer(command, {}, oom_killed=True)
        return answer(command, {"test_x.py::test_a": "passed"})

    pool = RunnerPool("local", None, GpuClass.NONE, nodes=2, is_local=True)
    cell = Cell(STACK, pool, Topology(2, 2), Role.CANDIDATE)
    backend = MemoryBackend(script)
    result = run_cell(backend, cell, backend.prepare(STACK, tmp_path / "b.log"), _ctx(tmp_path, suite.SuiteSpec()))
    assert result.status is Status.OOM and "memory-node1" in result.reason and "out of memory" in result.reason
    assert [c.node for c in backend.executed] == [0, 1]


def test_the_whole_pipeline_runs_on_the_memory_backend(no_subprocesses: MemoryBackend, run_memory: RunMemory) -> None:
    code, report, _ = run_memory()
    assert code == 0 and report["decision"] == "GO"
    assert {c["environment"]["backend"] for c in report["cells"]} == {"memory"}
    assert {s.label for s in no_subprocesses.prepared} == {"cpu-torch2.13.0-py3.11", "cu130-torch2.14.1-py3.11"}
    phases = [(c.env["STACKGATE_ROLE"], c.env["STACKGATE_PHASE"]) for c in no_subprocesses.executed]
    assert phases == [("production", "main"), ("candidate", "main"), ("production", "rollback")]
    assert all(c["tests"][0]["outcome"] == "passed" for c in report["cells"])


def test_an_oom_in_the_candidate_is_no_go_on_the_memory_backend(no_subprocesses: MemoryBackend,
                                                                  run_memory: RunMemory) -> None:
    def script(command: NodeCommand, exe: Execution) -> NodeExit:
        if exe.cell.role is Role.CANDIDATE and command.label == "suite":
            return answer(command, {}, oom_killed=True)
        return memory.all_pass(command, exe)

    no_subprocesses.script = script
    code, report, _ = run_memory()
    assert code == 1 and report["decision"] == "NO-GO"
    (cand,) = [c for c in report["cells"] if c["role"] == "candidate"]
    assert cand["status"] == "oom"
    assert shipped.BUNDLED_SUITE.exists()


def test_a_suite_is_configured_by_its_own_directory_on_every_backend(tmp_path: Path) -> None:
    """A parent directory's pytest configuration (here: filterwarnings = error) reaches a suite on
    the host but not in a container, where the suite is mounted alone: so it reaches it nowhere."""
    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\nfilterwarnings = ["error"]\n')
    user = tmp_path / "tests" / "integration"
    user.mkdir(parents=True)
    (user / "test_x.py").write_text("def test_x(): pass\n")
    host = suite.invocations(suite.SuiteSpec(path=user), MAIN)[-1]
    container = suite.invocations(suite.SuiteSpec(path=user), MAIN, path=Path("/sg/suite"))[-1]
    assert host.args[host.args.index("-c"):][:4] == ("-c", "/dev/null", "--confcutdir", str(user))
    assert container.args[container.args.index("-c"):][:4] == ("-c", "/dev/null", "--confcutdir", "/sg/suite")
    (user / "pytest.ini").write_text("[pytest]\nmarkers = slow\n")  # its own configuration: used as it is
    assert "-c" not in suite.invocations(suite.SuiteSpec(path=user), MAIN)[-1].args
    (user / "pytest.ini").unlink()
    (user / "setup.cfg").write_text("[metadata]\nname = x\n")  # not a pytest section: does not count
    assert "-c" in suite.invocations(suite.SuiteSpec(path=user), MAIN)[-1].args
    bundled_run = suite.invocations(suite.SuiteSpec(), MAIN)[-1]
    assert "-c" not in bundled_run.args  # the bundled suite has its pytest.ini


# ---- #20: one way through a run

def _modules() -> dict[str, Path]:
    found = {}
    for path in SRC.rglob("*.py"):
        if path.is_relative_to(SRC / "resources"):
            continue
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _import_graph() -> dict[str, set[str]]:
    """Module -> the stackgate modules it imports anywhere (top level, TYPE_CHECKING or inside a function)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        wanted = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                wanted |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
            elif isinstance(node, ast.Import):
                wanted |= {a.name for a in node.names}
        package = name.rsplit(".", 1)[0]
        graph[name] = {w for w in wanted if w in modules and w not in (name, package)}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle (as a path that returns to its start), or []."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_package() -> None:
    graph = _import_graph()
    assert "stackgate.runner" in graph and "stackgate.suite" in graph["stackgate.runner"]  # the walk sees imports
    assert _cycle(graph) == []


def test_only_the_runner_calls_a_backends_execute() -> None:
    """A backend may wrap another (Slurm starts the inner backend's nodes; Routed sends each stack to its
    backend); nothing else executes nodes."""
    callers = {str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
               if not p.is_relative_to(SRC / "resources") and not p.is_relative_to(SRC / "backends")
               and re.search(r"\bbackend\.execute\(|\.execute\(handle", p.read_text())}
    assert callers == {"runner.py"}
    wrappers = {str(p.relative_to(SRC)) for p in (SRC / "backends").rglob("*.py") if ".execute(" in p.read_text()}
    assert wrappers == {"backends/slurm.py", "backends/routed.py"}


def test_no_phase_text_is_written_or_read_outside_the_model() -> None:
    """Phases are values of one type (model.Phase): no "@rollback", "repeat{r}" or "aa{r}" built, and no
    phase compared with a string, anywhere else."""
    pattern = re.compile(r"""f["'](?:repeat|aa)\{|["']@rollback|phase\s*[!=]=\s*["']|["'](?:main|rollback)["']\s*==\s*"""
                         r"""\w*phase|removeprefix\(["'](?:repeat|aa)""")
    offenders = {str(p.relative_to(SRC)): pattern.findall(p.read_text()) for p in SRC.rglob("*.py")
                 if not p.is_relative_to(SRC / "resources") and p.name != "model.py"}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_no_module_over_450_lines() -> None:
    sizes = {str(p.relative_to(SRC)): len(p.read_text().splitlines()) for p in SRC.rglob("*.py")
             if not p.is_relative_to(SRC / "resources")}
    assert {k: n for k, n in sizes.items() if n > 450} == {}


def test_in_image_paths_and_constants_are_spelled_once() -> None:
    """The SBOM path, the suite's place in the image, the mount points, the rendezvous port and the Debian
    mirror each have one home; Python writes no Dockerfile instruction (the fragments are resources)."""
    homes = {r'"/opt/': "backends/docker/layout.py", r'"/sg/': "backends/docker/layout.py",
             r"\b29400\b": "suite.py", r"deb\.debian\.org": "sources.py"}
    for needle, home in homes.items():
        found = {str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if not p.is_relative_to(SRC / "resources")
                 and re.search(needle, p.read_text())}
        assert found == {home}, needle
    dockerfile_lines = re.compile(r"""["'](?:FROM|RUN|COPY|ENV|LABEL|WORKDIR) """)
    assert {str(p.relative_to(SRC)) for p in (SRC / "backends").rglob("*.py") if dockerfile_lines.search(p.read_text())} \
        == set()
