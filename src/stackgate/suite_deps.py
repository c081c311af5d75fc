"""What a suite needs besides the stack: its requirements and local projects, found where Python
projects already declare them, and the local projects built into wheels on the host.

Lookup (the README's "Your suite's requirements" says the same):
1. `--suite-requirements FILE` (repeatable): exactly these files; nothing is looked up.
2. Otherwise, in the suite directory itself (not above it):
   a. `requirements.txt`, then every other `requirements*.txt`, in name order;
   b. `constraints.txt`, then every other `constraints*.txt`, in name order: constraints only;
   c. `pyproject.toml`: the PEP 735 dependency group named by `[tool.stackgate] dependency-group`,
      else the group `stackgate` when there is one (`include-group` is followed).
3. `--suite-install PATH[EXTRAS]` (repeatable): a local project (the monorepo root, a trainer
   package) built into a wheel on the host and installed, non-editable, into every stack.

In a requirements file: PEP 508 lines, `-r FILE`, `-c FILE`, and local paths (`./lib`, `-e ./lib`;
installed non-editable, like `--suite-install`). Index options are refused: where wheels come from
belongs to the matrix and `--index-url` / `--find-links`, so both backends and the report agree.

The stack under test always wins: `resolve.py` pins the stack's torch (and the CUDA wheels that come
with it) as a constraint while these resolve, and names a requirement that would replace it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from stackgate import proc, tomlfile
from stackgate.boundary.project import IncludeGroup, PyProject
from stackgate.errors import ConfigError, InfraError
from stackgate.installer import cache_lock, cached_dir, is_network_failure
from stackgate.plan import SUITE_REQUIREMENTS as BASE
from stackgate.sources import pip_command

_EXTRAS = re.compile(r"^(?P<path>.*?)(?:\[(?P<extras>[A-Za-z0-9_.,\s-]*)\])?$")
_SKIP_DIRS = {"__pycache__", "build", "dist", "node_modules"}


@dataclass(frozen=True)
class Line:
    """One requirement or constraint, and where it was written (`file:line`, or the flag)."""
    text: str
    origin: str


@dataclass(frozen=True)
class LocalProject:
    path: Path
    extras: tuple[str, ...]
    origin: str


@dataclass(frozen=True)
class BuiltWheel:
    """A local project as a wheel in the cache, keyed by a digest of its source files."""
    project: LocalProject
    wheel: Path
    name: str
    version: str
    digest: str

    @property
    def requirement(self) -> str:
        extras = f"[{','.join(self.project.extras)}]" if self.project.extras else ""
        return f"{self.name}{extras} @ {self.wheel.as_uri()}"


@dataclass(frozen=True)
class SuiteDeps:
    requirements: tuple[Line, ...] = ()
    constraints: tuple[Line, ...] = ()
    projects: tuple[LocalProject, ...] = ()
    built: tuple[BuiltWheel, ...] = ()
    sources: tuple[str, ...] = ()  # what was read, in order: shown on the console and in the report

    @property
    def empty(self) -> bool:
        return not (self.requirements or self.constraints or self.projects)

    def install_lines(self) -> tuple[str, ...]:
        """What the suite adds to an environment (after torch): the base, then `own_lines()`."""
        return (*BASE, *self.own_lines())

    def own_lines(self) -> tuple[str, ...]:
        """The suite's own requirements and its built local projects (without the base every suite
        gets). Raises when a project has not been built yet."""
        if len(self.built) != len(self.projects):
            raise RuntimeError("SuiteDeps: the local projects are used before build_projects()")
        return (*(r.text for r in self.requirements), *(b.requirement for b in self.built))

    def constraint_lines(self) -> tuple[str, ...]:
        return tuple(c.text for c in self.constraints)

    def fingerprint(self) -> tuple[str, ...]:
        """What the suite asks for, without host paths: equal on every runner of one fleet run."""
        projects = tuple(f"{p.path.name}[{','.join(p.extras)}]" if p.extras else p.path.name for p in self.projects)
        return (*(r.text for r in self.requirements), *(f"-c {c.text}" for c in self.constraints),
                *(f"project:{p}" for p in projects))

    def origin_of(self, requirement: str) -> str:
        for line in self.requirements:
            if line.text == requirement:
                return line.origin
        for built in self.built:
            if built.requirement == requirement:
                return built.project.origin
        return "stackgate (every suite)"

    def describe(self) -> dict[str, Any]:
        """For report.json: what the suite asked for and where it said so."""
        return {"sources": list(self.sources),
                "requirements": [{"requirement": r.text, "from": r.origin} for r in self.requirements],
                "constraints": [{"constraint": c.text, "from": c.origin} for c in self.constraints],
                "projects": [{"path": str(b.project.path), "wheel": b.wheel.name, "source_digest": b.digest,
                              "from": b.project.origin} for b in self.built]}


# ----------------------------------------------------------------------------------------- lookup
def discover(suite: Path, requirement_files: Sequence[Path] = (), install: Sequence[Path] = ()) -> SuiteDeps:
    """The suite's declared needs, by the lookup order above. Bad input is a ConfigError naming
    the file and line."""
    reqs: list[Line] = []
    cons: list[Line] = []
    projects: list[LocalProject] = []
    sources: list[str] = []
    if requirement_files:
        for path in requirement_files:
            if not path.is_file():
                raise ConfigError(f"--suite-requirements {path}: no such file")
            _read_requirements(path, reqs, cons, projects, constraint=False, seen=set())
            sources.append(str(path))
    elif suite.is_dir():
        for pattern, constraint in (("requirements", False), ("constraints", True)):
            for path in _named(suite, pattern):
                _read_requirements(path, reqs, cons, projects, constraint=constraint, seen=set())
                sources.append(str(path))
        pyproject = suite / "pyproject.toml"
        if pyproject.is_file():
            group = _dependency_group(pyproject, reqs)
            if group:
                sources.append(f"{pyproject} [dependency-groups] {group}")
    for path in install:
        projects.append(_project(str(path), Path.cwd(), "--suite-install"))
        sources.append(f"--suite-install {path}")
    return SuiteDeps(tuple(reqs), tuple(cons), tuple(projects), sources=tuple(sources))


def _named(directory: Path, stem: str) -> list[Path]:
    exact = directory / f"{stem}.txt"
    others = sorted(p for p in directory.glob(f"{stem}*.txt") if p.is_file() and p != exact)
    return ([exact] if exact.is_file() else []) + others


def _logical_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) with comments stripped and backslash continuations joined."""
    pending, start = "", 0
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        text = re.sub(r"(^|\s)#.*$", "", raw).rstrip()
        if not pending:
            start = number
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        text, pending = (pending + text).strip(), ""
        if text:
            yield start, text


def _read_requirements(path: Path, reqs: list[Line], cons: list[Line], projects: list[LocalProject], *,
                       constraint: bool, seen: set[Path]) -> None:
    path = path.resolve()
    if path in seen:
        return
    seen.add(path)
    for number, text in _logical_lines(path):
        where = f"{path}:{number}"
        option, _, rest = text.partition(" ")
        rest = rest.strip()
        if option in ("-r", "--requirement", "-c", "--constraint"):
            nested = (path.parent / rest).resolve()
            if not nested.is_file():
                raise ConfigError(f"{where}: {option} {rest}: no such file")
            _read_requirements(nested, reqs, cons, projects, seen=seen,
                               constraint=constraint or option in ("-c", "--constraint"))
        elif option in ("-e", "--editable"):
            projects.append(_project(rest, path.parent, where))
        elif text.startswith("-"):
            raise ConfigError(f"{where}: {text!r}: index and installer options are not taken from a suite's "
                              "requirements", hint="the wheel source belongs to the matrix ([source]) or "
                                                   "--index-url / --extra-index-url / --find-links")
        elif text.startswith((".", "/", "~", "file:")):
            projects.append(_project(text.removeprefix("file://"), path.parent, where))
        else:
            req = _checked(text, where)
            if req.url and not req.url.endswith(".whl"):  # `name @ file:///dir`: a local project
                extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
                projects.append(_project(req.url.removeprefix("file://") + extras, path.parent, where))
            else:
                (cons if constraint else reqs).append(Line(str(req), where))


def _checked(text: str, where: str) -> Requirement:
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        raise ConfigError(f"{where}: {text!r} is not a valid requirement: {exc}",
                          hint="one PEP 508 requirement per line, e.g. einops>=0.8") from None
    if req.url and not req.url.startswith("file:"):
        raise ConfigError(f"{where}: {text!r}: a requirement from a URL cannot be resolved into the wheelhouse",
                          hint="publish it to the index the matrix uses, or give a local path")
    return req


def _project(text: str, base: Path, origin: str) -> LocalProject:
    match = _EXTRAS.match(text.strip())
    assert match is not None  # the pattern matches every string
    path = Path(os.path.normpath(base / Path(match["path"]).expanduser()))
    extras = tuple(sorted(e.strip() for e in (match["extras"] or "").split(",") if e.strip()))
    if not ((path / "pyproject.toml").is_file() or (path / "setup.py").is_file()):
        raise ConfigError(f"{origin}: {path} is not a Python project (no pyproject.toml or setup.py)",
                          hint="--suite-install takes the directory of a project pip can build")
    return LocalProject(path, extras, origin)


def _dependency_group(pyproject: Path, reqs: list[Line]) -> str:
    """The suite's requirements from its pyproject.toml's dependency group (`boundary.project.PyProject`):
    `[tool.stackgate] dependency-group`, else a group named "stackgate"."""
    found = tomlfile.validate(tomlfile.load(pyproject), PyProject)
    groups = found.dependency_groups
    named = found.tool.stackgate.dependency_group
    if named and named not in groups:
        raise ConfigError(f"{pyproject}: [tool.stackgate] dependency-group = {named!r}, but [dependency-groups] "
                          f"has {', '.join(sorted(groups)) or 'no groups'}")
    group = named or ("stackgate" if "stackgate" in groups else "")
    if group:
        for text in _group_items(groups, group, pyproject, ()):
            where = f"{pyproject} [dependency-groups] {group}"
            reqs.append(Line(str(_checked(text, where)), where))
    return group


def _group_items(groups: Mapping[str, Sequence[str | IncludeGroup]], name: str, pyproject: Path,
                 trail: tuple[str, ...]) -> list[str]:
    if name in trail:
        raise ConfigError(f"{pyproject}: dependency group {name!r} includes itself ({' -> '.join((*trail, name))})")
    if name not in groups:
        raise ConfigError(f"{pyproject}: dependency group {name!r} is missing")
    out: list[str] = []
    for item in groups[name]:
        if isinstance(item, IncludeGroup):
            out += _group_items(groups, item.include_group, pyproject, (*trail, name))
        else:
            out.append(item)
    return out


# ------------------------------------------------------------------------------- local projects
def source_files(project: Path, exclude: Sequence[Path] = ()) -> list[Path]:
    """The project's files, relative: git's view (tracked and untracked, not ignored) inside a work
    tree, else a walk that skips hidden and build directories. `exclude` (the reports and cache
    directories, when they lie inside the project) never counts: a run must not change the digest."""
    files: list[Path] | None = None
    if shutil.which("git"):
        listed = subprocess.run(["git", "-C", str(project), "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard", "."], capture_output=True, check=False)
        if listed.returncode == 0:
            files = [Path(p) for p in listed.stdout.decode().split("\0") if p]
    if files is None:
        files = []
        for root, dirs, names in os.walk(project):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS
                             and not d.endswith(".egg-info"))
            files += [Path(root, n).relative_to(project) for n in names]
    skip = [e.resolve() for e in exclude]
    out = []
    for rel in files:
        full = (project / rel)
        if not full.is_file() or "__pycache__" in rel.parts or rel.suffix == ".pyc":
            continue
        if any(full.resolve().is_relative_to(s) for s in skip):
            continue
        out.append(rel)
    return sorted(out)


def source_digest(project: Path, files: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for rel in files:
        h.update(str(rel).encode() + b"\0")
        h.update(hashlib.sha256((project / rel).read_bytes()).digest())
    return h.hexdigest()


def build_projects(deps: SuiteDeps, cache_dir: Path, env: Mapping[str, str], *, exclude: Sequence[Path] = (),
                   say: Callable[[str], None] = print) -> SuiteDeps:
    """Each local project as a wheel, built on the host from a copy of its source files (the
    user's tree gets no build/ or egg-info), cached by the digest of those files."""
    built = []
    for project in deps.projects:
        files = source_files(project.path, exclude)
        digest = source_digest(project.path, files)
        home = cache_dir / "projects" / f"{project.path.name}-{digest[:16]}"
        with cache_lock(home):
            wheel = _cached_wheel(home) or _build_wheel(project, files, home, env, say)
        name, version, _, _ = parse_wheel_filename(wheel.name)
        built.append(BuiltWheel(project, wheel, str(canonicalize_name(name)), str(version), digest))
    return SuiteDeps(deps.requirements, deps.constraints, deps.projects, tuple(built), deps.sources)


def _cached_wheel(home: Path) -> Path | None:
    marker = home / "built.json"
    if marker.is_file():
        wheel = home / str(json.loads(marker.read_text())["wheel"])
        if wheel.is_file():
            return wheel
    return None


def _build_wheel(project: LocalProject, files: Sequence[Path], home: Path, env: Mapping[str, str],
                 say: Callable[[str], None]) -> Path:
    say(f"  building a wheel of {project.path} ({len(files)} files)")
    with tempfile.TemporaryDirectory(prefix="stackgate-project-") as tmp:
        src = Path(tmp) / project.path.name
        for rel in files:
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(project.path / rel, src / rel)
        with cached_dir(home, say) as staging:
            # pip, not uv: pip reads the host's index configuration for the build backend. This
            # interpreter's pip, else the one on PATH (a uv-made venv, such as nox's, has none)
            result = proc.run([*pip_command(), "wheel", "--no-deps", "--disable-pip-version-check",
                               "-w", str(staging), str(src)], env=dict(env), timeout_s=1800,
                              log_path=Path(tmp) / "build.log")
            if not result.ok:
                if is_network_failure(result.tail):
                    raise InfraError(f"building {project.path}: an index could not be reached",
                                     hint=result.tail[-800:])
                raise ConfigError(f"{project.origin}: building a wheel of {project.path} failed "
                                  f"(exit {result.returncode}): {result.tail.strip()[-600:]}",
                                  hint="`pip wheel --no-deps PATH` must work for a project given to --suite-install")
            wheels = sorted(staging.glob("*.whl"))
            if len(wheels) != 1:
                raise ConfigError(f"building {project.path} gave {len(wheels)} wheels, expected one")
            (staging / "built.json").write_text(json.dumps({"wheel": wheels[0].name, "source": str(project.path)}))
    return home / wheels[0].name

