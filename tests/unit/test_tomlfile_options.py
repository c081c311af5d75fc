from __future__ import annotations

from pathlib import Path

import pytest

from stackgate import fleet, matrix, options, policy, tomlfile
from stackgate.errors import ConfigError


def _write(tmp_path: Path, text: str, name: str = "m.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_malformed_toml_names_file_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "[matrix]\nname = 'x'\npools = [\n")
    with pytest.raises(ConfigError) as info:
        tomlfile.load(path)
    assert f"{path}:" in str(info.value) and "malformed TOML" in str(info.value)
    assert info.value.line is not None


def test_unknown_key_says_did_you_mean_with_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "[matrix]\nname = 'x'\npols = ['local']\ntorch = ['2.14.1']\ncuda=['cu130']\npython=['3.11']\n")
    with pytest.raises(ConfigError) as info:
        matrix.load_matrix(path)
    assert info.value.line == 3
    assert "unknown key 'pols'" in str(info.value)
    assert info.value.hint == "did you mean 'pools'?"


def test_unparseable_torch_in_matrix_points_at_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "[matrix]\npools = ['local']\ntorch = ['two']\ncuda=['cu130']\npython=['3.11']\n")
    with pytest.raises(ConfigError) as info:
        matrix.load_matrix(path)
    assert info.value.line == 3 and "unparseable" in str(info.value)


def test_wrong_type_is_reported(tmp_path: Path) -> None:
    path = _write(tmp_path, "[gate]\ninconclusive_exit_code = 'one'\n")
    with pytest.raises(ConfigError) as info:
        policy.load_policy(path)
    assert "must be int" in str(info.value) and info.value.line == 2


def test_waiver_dates_and_lines(tmp_path: Path) -> None:
    path = _write(tmp_path, "[[waiver]]\ncells='local-*'\ntests='*'\nreason='r'\nexpires=2027-01-31\n"
                            "[[waiver]]\nreason='bad'\nexpires='soon'\n")
    with pytest.raises(ConfigError) as info:
        policy.load_policy(path)
    assert "YYYY-MM-DD" in str(info.value)


def test_options_cascade_records_sources(tmp_path: Path) -> None:
    project = _write(tmp_path, "[run]\nprofile = 'quick'\ntimeout = 100\nreports = 'r1'\n", "stackgate.toml")
    env = {"STACKGATE_TIMEOUT": "200", "STACKGATE_REPORTS": "r2", "UNRELATED": "x"}
    work = tmp_path / "work"
    opts = options.read({"reports": "r3", "only": []}, env, project, cwd=work)
    assert opts.profile == "quick" and opts.sources["profile"] == str(project)
    assert opts.timeout == 200.0 and opts.sources["timeout"] == "environment"
    assert opts.reports == work / "r3" and opts.sources["reports"] == "command line"
    assert opts.history == work / "r3" / "history.sqlite"
    assert opts.describe()["timeout"] == {"value": 200.0, "from": "environment"}


def test_every_option_is_declared_once_for_argparse_the_cascade_and_the_report() -> None:
    import argparse
    parser = argparse.ArgumentParser()
    options.add_arguments(parser, "run")
    args = vars(parser.parse_args(["--pytest-arg=-k", "--pytest-arg=x", "--no-rollback", "--pool", "cpu-a",
                                   "--profile", "quick"]))
    assert set(args) == {f.name for f in options.declared("run")}  # one argument per declared option
    opts = options.read(args, {}, None)
    assert opts.pytest_args == ("-k", "x") and opts.rollback is False and opts.pool == ("cpu-a",)
    assert opts.describe()["pool"] == {"value": ["cpu-a"], "from": "command line"}
    assert set(opts.describe()) == {f.name for f in (*options.declared("run"), *options.declared("merge"))}
    with pytest.raises(SystemExit):
        parser.parse_args(["--profile", "huge"])  # choices come from the declaration's parser


def test_every_path_option_comes_out_absolute(tmp_path: Path) -> None:
    """Relative paths are taken against the working directory (command line, environment) or the
    directory of stackgate.toml, so no bind mount or subprocess ever sees a relative path."""
    (tmp_path / "proj").mkdir()
    project = _write(tmp_path / "proj", "[run]\ncache-dir = 'cache'\nsuite = 'tests/trainers'\n", "stackgate.toml")
    work = tmp_path / "elsewhere"
    opts = options.read({"reports": "out/../reports", "history": "h.sqlite"}, {"STACKGATE_CONFIG_DIR": "cfg"},
                           project, cwd=work)
    assert opts.reports == work / "reports"
    assert opts.history == work / "h.sqlite"
    assert opts.config_dir == work / "cfg"
    assert opts.cache_dir == tmp_path / "proj" / "cache"
    assert opts.suite == tmp_path / "proj" / "tests" / "trainers"
    for f in options.declared():
        value = getattr(opts, f.name)
        if isinstance(value, Path):
            assert value.is_absolute(), f.name
    defaults = options.read({}, {}, None, cwd=work)
    assert defaults.reports == work / "reports" and defaults.matrix.name == "upgrade.toml"
    assert defaults.matrix.is_file() and (defaults.config_dir / "policy.toml").is_file()  # shipped in the package
    assert options.read({"matrix": "nightly"}, {}, None, cwd=work).matrix.name == "nightly.toml"


def test_options_bad_values(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="STACKGATE_TIMEOUT"):
        options.read({}, {"STACKGATE_TIMEOUT": "-1"})
    with pytest.raises(ConfigError, match="--profile"):
        options.read({"profile": "huge"}, {})
    assert options.read({"shard": "1/4"}, {}).shard == (1, 4) and str(options.read({"shard": "1/4"}, {}).shard) == "1/4"
    with pytest.raises(ConfigError, match=r"--shard='4/4': need 0 <= INDEX < COUNT"):
        options.read({"shard": "4/4"}, {})  # refused when options are read, before anything is loaded
    with pytest.raises(ConfigError, match="STACKGATE_SHARD='x': must be INDEX/COUNT"):
        options.read({}, {"STACKGATE_SHARD": "x"})
    bad = _write(tmp_path, "[run]\nprofil = 'quick'\n", "stackgate.toml")
    with pytest.raises(ConfigError, match=r"unknown key 'profil'"):
        options.read({}, {}, bad)


def test_suite_env_pairs() -> None:
    given = options.read({"suite_env": ["NCCL_NET=AWS Libfabric", "FI_EFA_SET_CUDA_SYNC_MEMOPS=0"]}, {})
    assert given.suite_env == (("NCCL_NET", "AWS Libfabric"), ("FI_EFA_SET_CUDA_SYNC_MEMOPS", "0"))
    with pytest.raises(ConfigError, match=r"--suite-env=.*'NOVALUE' must be KEY=VALUE"):
        options.read({"suite_env": ["NOVALUE"]}, {})  # refused when options are read, before any resolution
    opts = options.read({}, {"STACKGATE_SUITE_ENV": "A=1 2\nB=3"})
    assert opts.suite_env == (("A", "1 2"), ("B", "3"))


# ---- issue 18 item 2: every number is finite and inside its documented range, or exit 2 with where

@pytest.mark.parametrize(("text", "line", "words"), [
    ("[[numerics.metric]]\nname = '*.loss'\nrtol = nan\n", 3, "'rtol' = nan is not a finite number"),
    ("[performance]\nconfidence = nan\n", 2, "'confidence' = nan is not a finite number"),
    ("[[performance.metric]]\nname = 'x'\ntolerance = inf\n", 3, "'tolerance' = inf is not a finite number"),
    ("[[numerics.metric]]\nname = 'x'\natol = -inf\n", 3, "not a finite number"),
    ("[performance]\nconfidence = 1.5\n", 2, "out of range"),
])
def test_non_finite_and_out_of_range_policy_numbers_name_file_and_line(tmp_path: Path, text: str, line: int,
                                                                       words: str) -> None:
    path = _write(tmp_path, text, "policy.toml")
    with pytest.raises(ConfigError) as info:
        policy.load_policy(path)
    assert words in str(info.value) and info.value.line == line and str(path) in str(info.value)


@pytest.mark.parametrize(("row", "words"), [
    ("gpus_per_node = -8", "'gpus_per_node' = -8 is out of range: must be between 0 and 128"),
    ("gpus_per_node = 100000000000000000000", "gpus_per_node"),
    ("nodes = 0", "'nodes' = 0 is out of range: must be between 1 and 4096"),
])
def test_fleet_counts_have_ranges(tmp_path: Path, row: str, words: str) -> None:
    path = _write(tmp_path, f"[pool.p5]\ndriver = '580.65.06'\ngpu_class = 'datacenter'\n{row}\n", "fleet.toml")
    with pytest.raises(ConfigError) as info:
        fleet.load_pools(path, fleet.LocalHost())
    assert words in str(info.value) and info.value.line == 4


MATRIX = "[matrix]\npools = ['local']\ntorch = ['2.14.1']\ncuda = ['cu130']\npython = ['3.11']\n"


@pytest.mark.parametrize(("text", "line", "words"), [
    (MATRIX + "topology = ['1x99999999999999999999']\n", 6, "at most 4096 nodes and 1024 processes per node"),
    (MATRIX.replace("['2.14.1']", "[]"), 3, "'torch' is an empty list"),
    (MATRIX.replace("['local']", "[]"), 2, "'pools' is an empty list"),
])
def test_matrix_axes_are_never_empty_or_absurd(tmp_path: Path, text: str, line: int, words: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        matrix.load_matrix(path)
    assert words in str(info.value) and info.value.line == line


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "1e9"])
def test_timeout_must_be_finite_and_in_range_from_cli_and_env(value: str) -> None:
    with pytest.raises(ConfigError, match="--timeout"):
        options.read({"timeout": value}, {})
    with pytest.raises(ConfigError, match="STACKGATE_TIMEOUT"):
        options.read({}, {"STACKGATE_TIMEOUT": value})


def test_timeout_nan_in_stackgate_toml(tmp_path: Path) -> None:
    project = _write(tmp_path, "[run]\ntimeout = nan\n", "stackgate.toml")
    with pytest.raises(ConfigError, match="timeout"):
        options.read({}, {}, project)


def test_calibrate_history_show_and_base_image_options_are_in_the_cascade(tmp_path: Path) -> None:
    """#20: their flags were declared in cli.py beside the cascade; now stackgate.toml and STACKGATE_*
    reach them too, and a bad value is refused when options are read."""
    project = _write(tmp_path, "[run]\nruns = 8\ntarget = 0.1\nhistory = 'h/history.sqlite'\n", "stackgate.toml")
    opts = options.read({}, {"STACKGATE_DEBIAN_MIRROR": "http://mirror.local/debian"}, project, cwd=tmp_path)
    assert (opts.runs, opts.target, opts.allow) == (8, 0.1, None)
    assert opts.history == tmp_path / "h" / "history.sqlite" and opts.debian_mirror == "http://mirror.local/debian"
    with pytest.raises(ConfigError, match=r"STACKGATE_RUNS='5': need an even number from 4 to 200"):
        options.read({}, {"STACKGATE_RUNS": "5"})
    with pytest.raises(ConfigError, match=r"--allow 0\.2: the change that must pass must be below --target 0\.05"):
        options.read({"allow": "0.2"}, {})
    assert "runs" not in options.read({}, {}).describe()  # calibrate's own options are not a run's
    from stackgate.cli import build_parser
    parsed = build_parser().parse_args(["matrix", "show", "--only", "*cpu*", "--candidate", "2.14.1"])
    assert (parsed.only, parsed.candidate) == (["*cpu*"], "2.14.1")
    assert build_parser().parse_args(["base-image", "--mirror", "http://m"]).debian_mirror == "http://m"


POLICY_ROWS = ("[[performance.metric]]\nname = 'a'\ntolerance = 0.1\n\n"
               "[[performance.metric]]\nname = 'b'\ntolerance = 0.1\n{row}\n\n"
               "[[waiver]]\ncells = 'x'\nreason = 'r'\nexpires = 2027-01-01\n")


@pytest.mark.parametrize(("row", "line", "words", "hint"), [
    ("tolerence = 0.2", 8, "unknown key 'tolerence' in [performance.metric]", "did you mean 'tolerance'?"),
    ("tags = { clock = ['cpu'] }", 8, "'clock' must be str, got list ['cpu']", None),
    ("devices = ['cpu', 'gpu']", 8, "devices = 'gpu' is not one of \"cpu\", \"cuda\"", 'use one of: "cpu", "cuda"'),
    ("method = 1", 8, "method = 1 is not one of", None),
    ("summary = true", 8, "summary = True is not one of", None),
])
def test_the_policy_is_one_typed_model_and_its_errors_land_on_the_line(tmp_path: Path, row: str, line: int,
                                                                       words: str, hint: str | None) -> None:
    """#40: the policy file is validated whole by its model (boundary/policy.py); an error inside the
    second [[performance.metric]] block is reported at that block's line, not the first's."""
    path = _write(tmp_path, POLICY_ROWS.format(row=row), "policy.toml")
    with pytest.raises(ConfigError) as info:
        policy.load_policy(path)
    assert words in str(info.value) and info.value.line == line, str(info.value)
    if hint is not None:
        assert info.value.hint == hint


def test_a_policy_number_beyond_any_range_and_a_nested_date_name_their_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "[gate]\nconfirm_failures = 100000000000000000000000\n", "policy.toml")
    with pytest.raises(ConfigError, match=r"'confirm_failures' = 100000000000000000000000 is out of range: "
                                          r"must be between 0 and 10") as info:
        policy.load_policy(path)
    assert info.value.line == 2
    path = _write(tmp_path, POLICY_ROWS.format(row="") + "[[waiver]]\ncells = 'y'\nreason = 'r'\nexpires = 'soon'\n",
                  "policy.toml")
    with pytest.raises(ConfigError, match=r"'expires': 'soon' is not a date \(YYYY-MM-DD\)") as info:
        policy.load_policy(path)
    assert info.value.line == 17
    loaded = policy.load_policy(_write(tmp_path, POLICY_ROWS.format(row="devices = 'cuda'"), "policy.toml"))
    assert [r.devices for r in loaded.performance] == [(), ("cuda",)] and [r.line for r in loaded.performance] == [1, 5]
