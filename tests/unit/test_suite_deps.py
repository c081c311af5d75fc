"""A suite's requirements: where they are found (the documented lookup order), what is refused
with file:line, and what goes into environments, images and the run definition."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from stackgate import suite_deps
from stackgate.backends.docker import images, layout
from stackgate.errors import ConfigError
from stackgate.options import read as read_options
from stackgate.plan import SUITE_REQUIREMENTS

ROOT = Path(__file__).resolve().parents[2]
RECSYS_KIT = ROOT / "tests" / "data" / "monorepo" / "libs" / "recsys_kit"


def _project(path: Path, name: str = "teamlib") -> Path:
    (path / "src" / name).mkdir(parents=True)
    (path / "pyproject.toml").write_text(f'[project]\nname = "{name}"\nversion = "1.0"\n')
    (path / "src" / name / "__init__.py").write_text("X = 1\n")
    return path


def test_requirements_files_then_constraints_then_the_pyproject_group(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "requirements-extra.txt").write_text("tabulate\n")
    (suite / "requirements.txt").write_text("einops>=0.8  # rearrange\n\n# a comment\ntoolz \\\n  <2\n")
    (suite / "constraints.txt").write_text("six==1.16.0\n")
    (suite / "pyproject.toml").write_text('[dependency-groups]\nbase = ["attrs"]\n'
                                          'stackgate = ["packaging", {include-group = "base"}]\n')
    deps = suite_deps.discover(suite)
    assert [r.text for r in deps.requirements] == ["einops>=0.8", "toolz<2", "tabulate", "packaging", "attrs"]
    assert deps.requirements[1].origin == f"{suite / 'requirements.txt'}:4"  # a continued line keeps its start
    assert [c.text for c in deps.constraints] == ["six==1.16.0"]
    assert deps.sources == (str(suite / "requirements.txt"), str(suite / "requirements-extra.txt"),
                            str(suite / "constraints.txt"), f"{suite / 'pyproject.toml'} [dependency-groups] stackgate")
    assert deps.install_lines() == (*SUITE_REQUIREMENTS, "einops>=0.8", "toolz<2", "tabulate", "packaging", "attrs")


def test_a_named_dependency_group_and_a_missing_one(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.stackgate]\ndependency-group = "integration"\n'
                                             '[dependency-groups]\nintegration = ["einops"]\nstackgate = ["x"]\n')
    assert [r.text for r in suite_deps.discover(tmp_path).requirements] == ["einops"]
    (tmp_path / "pyproject.toml").write_text('[tool.stackgate]\ndependency-group = "nope"\n'
                                             '[dependency-groups]\ntest = ["einops"]\n')
    with pytest.raises(ConfigError, match=r"dependency-group = 'nope'.*has test"):
        suite_deps.discover(tmp_path)


def test_flags_replace_the_lookup_and_nested_files_follow(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "requirements.txt").write_text("ignored-because-a-flag-was-given\n")
    lib = _project(tmp_path / "libs" / "teamlib")
    (tmp_path / "ci").mkdir()
    (tmp_path / "ci" / "pins.txt").write_text("numpy<3\n")
    (tmp_path / "ci" / "suite.txt").write_text("-c pins.txt\n-r more.txt\n-e ../libs/teamlib\n")
    (tmp_path / "ci" / "more.txt").write_text("einops\n")
    deps = suite_deps.discover(suite, [tmp_path / "ci" / "suite.txt"])
    assert [r.text for r in deps.requirements] == ["einops"]
    assert [c.text for c in deps.constraints] == ["numpy<3"]
    assert [p.path for p in deps.projects] == [lib]  # editable in the file, installed non-editable
    assert deps.projects[0].origin == f"{(tmp_path / 'ci' / 'suite.txt').resolve()}:3"


@pytest.mark.parametrize(("line", "message"), [
    ("--index-url https://example.invalid/simple", "index and installer options are not taken"),
    ("torch >= = 2", "is not a valid requirement"),
    ("mylib @ https://example.invalid/mylib-1.0-py3-none-any.whl", "from a URL cannot be resolved"),
    ("./not-a-project", "is not a Python project"),
    ("-r missing.txt", "no such file"),
])
def test_bad_lines_name_the_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    (tmp_path / "requirements.txt").write_text(f"einops\n{line}\n")
    with pytest.raises(ConfigError, match=message) as caught:
        suite_deps.discover(tmp_path)
    assert f"{tmp_path / 'requirements.txt'}:2" in str(caught.value)


def test_suite_install_with_extras_and_the_options_make_it_absolute(tmp_path: Path) -> None:
    _project(tmp_path / "mono", "mono")
    opts = read_options({"suite_install": ["mono[test,dev]"], "suite_requirements": ["reqs.txt"]}, {}, cwd=tmp_path)
    assert opts.suite_install == (tmp_path / "mono[test,dev]",)
    assert opts.suite_requirements == (tmp_path / "reqs.txt",)
    deps = suite_deps.discover(tmp_path / "nosuite", (), opts.suite_install)
    assert deps.projects[0].path == tmp_path / "mono" and deps.projects[0].extras == ("dev", "test")
    assert deps.fingerprint() == ("project:mono[dev,test]",)  # no host path: equal on every runner
    with pytest.raises(RuntimeError, match="before build_projects"):
        deps.install_lines()


def test_source_files_ignore_the_reports_and_build_litter(tmp_path: Path) -> None:
    lib = _project(tmp_path / "lib")
    (lib / "build").mkdir()
    (lib / "build" / "junk.py").write_text("")
    (lib / "src" / "teamlib" / "__pycache__").mkdir()
    (lib / "src" / "teamlib" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    (lib / "reports").mkdir()
    (lib / "reports" / "report.json").write_text("{}")
    files = suite_deps.source_files(lib, exclude=[lib / "reports"])
    assert files == [Path("pyproject.toml"), Path("src/teamlib/__init__.py")]
    before = suite_deps.source_digest(lib, files)
    (lib / "reports" / "report.json").write_text('{"another": "run"}')  # a run writes reports: no rebuild
    assert suite_deps.source_digest(lib, suite_deps.source_files(lib, exclude=[lib / "reports"])) == before
    (lib / "src" / "teamlib" / "__init__.py").write_text("X = 2\n")
    assert suite_deps.source_digest(lib, suite_deps.source_files(lib, exclude=[lib / "reports"])) != before


def test_source_files_follow_git_inside_a_work_tree(tmp_path: Path) -> None:
    lib = _project(tmp_path / "lib")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("*.log\n")
    (lib / "debug.log").write_text("ignored by git")
    assert suite_deps.source_files(lib) == [Path("pyproject.toml"), Path("src/teamlib/__init__.py")]


def test_a_requirement_is_named_with_where_it_was_written(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("einops\ntorch==2.12.0\n")
    deps = suite_deps.discover(tmp_path)
    assert deps.origin_of("torch==2.12.0") == f"{tmp_path / 'requirements.txt'}:2"
    assert deps.origin_of("numpy") == "stackgate (every suite)"


def test_local_wheels_enter_the_image_by_name_and_version_only() -> None:
    assert images.in_image("recsys-kit[test] @ file:///root/.cache/stackgate/projects/x/recsys_kit-0.3.0-py3-none-any.whl") \
        == "recsys-kit[test]==0.3.0"
    assert images.in_image("einops>=0.8") == "einops>=0.8"


def test_the_suite_requirements_are_a_thin_layer_on_the_stack_image() -> None:
    plain = images.render(images.TEMPLATE.read_text(), base="b", requirements=["torch==2.13.0+cpu"], label_map={})
    steps = "\n".join(line for line in plain.splitlines() if not line.startswith("#"))
    assert "suite" not in steps and "{{" not in steps  # the stack image: nothing of the suite
    layer = images.render_layer(images.LAYER_TEMPLATE.read_text(), parent="stackgate/stack:cpu-x-1234",
                                requirements=["einops>=0.8", "recsys-kit==0.3.0"], label_map={"org.stackgate.parent": "sha256:p"})
    steps = "\n".join(line for line in layer.splitlines() if not line.startswith("#"))
    assert steps.startswith("FROM stackgate/stack:cpu-x-1234\n") and "{{" not in steps
    assert "COPY" not in steps and "--find-links \"${STACKGATE_WHEELS}\" 'einops>=0.8' 'recsys-kit==0.3.0'" in steps
    assert "pip check" in steps and f"pip freeze --all > {layout.PIP_FREEZE}" in steps  # its SBOM has the suite's
    assert 'org.stackgate.parent="sha256:p"' in steps and "file://" not in steps


def test_the_fixture_project_builds_into_a_cached_wheel(tmp_path: Path) -> None:
    deps = suite_deps.discover(tmp_path / "nosuite", (), (RECSYS_KIT,))
    said: list[str] = []
    built = suite_deps.build_projects(deps, tmp_path / "cache", {}, say=said.append)
    wheel = built.built[0]
    assert (wheel.name, wheel.version) == ("recsys-kit", "0.3.0") and wheel.wheel.is_file()
    assert wheel.requirement == f"recsys-kit @ {wheel.wheel.as_uri()}"
    assert not (RECSYS_KIT / "build").exists() and not list(RECSYS_KIT.rglob("*.egg-info"))  # the tree stays clean
    again = suite_deps.build_projects(deps, tmp_path / "cache", {}, say=said.append)
    assert again.built[0].wheel == wheel.wheel and len([s for s in said if "building" in s]) == 1
