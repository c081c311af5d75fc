"""Every option declared once, typed: the `Options` fields. From that one declaration come the
command-line arguments (`add_arguments`), the cascade defaults < stackgate.toml [run] <
STACKGATE_* environment < command line (`read`, which records where each value came from, so
the report can show it), and the type checker's view of every option.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NamedTuple, TypeVar, cast, get_args

from stackgate import artifacts, shipped, tomlfile
from stackgate.boundary.policy import Pairing
from stackgate.boundary.project import StackgateToml
from stackgate.errors import ConfigError
from stackgate.policy import PAIRINGS
from stackgate.sources import DEBIAN_MIRROR

T = TypeVar("T")
BackendName = Literal["auto", "venv", "docker"]
LauncherName = Literal["pool", "local", "slurm"]
ContainerName = Literal["podman", "pyxis", "apptainer"]
ProfileName = Literal["default", "quick"]


class Shard(NamedTuple):
    """`--shard I/N`: this runner takes shard `index` of `count` (pairs of cells stay together)."""

    position: int  # 0 .. total - 1
    total: int

    def __str__(self) -> str:
        return f"{self.position}/{self.total}"


def _path(v: object) -> Path:
    return Path(str(v)).expanduser()


def _list(v: object) -> tuple[str, ...]:
    if isinstance(v, (list, tuple)):
        return tuple(str(x) for x in v)
    return tuple(x for x in str(v).replace(",", " ").split() if x)


def _paths(v: object) -> tuple[Path, ...]:
    return tuple(_path(x) for x in _list(v))


def _env_pairs(v: object) -> tuple[tuple[str, str], ...]:
    """KEY=VALUE items (a string from the environment or TOML holds them one per line), as pairs."""
    items = [str(x) for x in v] if isinstance(v, (list, tuple)) else [x.strip() for x in str(v).splitlines()]
    pairs = []
    for item in (i for i in items if i):
        key, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"{item!r} must be KEY=VALUE")
        pairs.append((key, value))
    return tuple(pairs)


def _shard(v: object) -> Shard:
    try:
        index, count = (int(x) for x in str(v).split("/"))
    except ValueError:
        raise ValueError("must be INDEX/COUNT, for example 0/4") from None
    if count < 1 or not 0 <= index < count:
        raise ValueError("need 0 <= INDEX < COUNT")
    return Shard(index, count)


def _one_of(v: object, allowed: tuple[str, ...]) -> str:
    if str(v) not in allowed:
        raise ValueError(f"must be one of {', '.join(allowed)}")
    return str(v)


def _backend(v: object) -> BackendName:
    return cast(BackendName, _one_of(v, get_args(BackendName)))


def _launcher(v: object) -> LauncherName:
    return cast(LauncherName, _one_of(v, get_args(LauncherName)))


def _profile(v: object) -> ProfileName:
    return cast(ProfileName, _one_of(v, get_args(ProfileName)))


def _pairing(v: object) -> Pairing:
    return cast(Pairing, _one_of(v, PAIRINGS))


def _container(v: object) -> ContainerName:
    return cast(ContainerName, _one_of(v, get_args(ContainerName)))


CHOICES: dict[Callable[[object], object], tuple[str, ...]] = {
    _backend: get_args(BackendName), _launcher: get_args(LauncherName), _profile: get_args(ProfileName),
    _pairing: PAIRINGS, _container: get_args(ContainerName)}


MAX_TIMEOUT_S = 7 * 24 * 3600.0


def _seconds(v: object) -> float:
    """A timeout in seconds: finite, above 0 and at most a week (NaN and inf compare false with every
    bound, so they are refused by name)."""
    x = float(str(v))
    if not math.isfinite(x):
        raise ValueError("must be a finite number of seconds")
    if not 0 < x <= MAX_TIMEOUT_S:
        raise ValueError(f"must be > 0 and at most {MAX_TIMEOUT_S:.0f} (a week)")
    return x


def _days(v: object) -> int:
    n = int(str(v))
    if not 0 <= n <= 36500:
        raise ValueError("must be 0 to 36500 days")
    return n


def _count(v: object) -> int:
    n = int(str(v))
    if not 1 <= n <= 100:
        raise ValueError("must be between 1 and 100")
    return n


def _bool(v: object) -> bool:
    if isinstance(v, bool):
        return v
    if str(v).lower() in ("1", "true", "yes", "on"):
        return True
    if str(v).lower() in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("must be true or false")


def _default_cache(env: Mapping[str, str]) -> str:
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "stackgate")


RUN = ("run",)
RUN_MERGE = ("run", "merge")
CALIBRATE = ("calibrate",)  # calibrate takes the options of run, and these
SHOW = ("matrix show",)
BUILD_RUN = ("run", "build")
REGISTRY_USERS = ("run", "build", "promote")


def _aa_runs(v: object) -> int:
    n = int(str(v))
    if not 4 <= n <= 200 or n % 2:
        raise ValueError("need an even number from 4 to 200 (A/A pairs)")
    return n


def _fraction(v: object) -> float:
    x = float(str(v))
    if not 0 < x < 1:
        raise ValueError("a fraction such as 0.05")
    return x


def _share(v: object) -> float:
    x = float(str(v))
    if not 0 <= x < 1:
        raise ValueError("a fraction from 0 (such as 0.01), below --target")
    return x


def opt(default: T, parse: Callable[[object], T], help: str, *, commands: tuple[str, ...] = RUN,
        repeat: bool = False, negate: str = "", metavar: str | None = None, flag: str = "") -> T:
    """One option: its default, how a raw value (TOML, environment, command line) is parsed, its help,
    the commands that take it, and its command-line form (`repeat`: may be given several times;
    `negate`: a `--no-...` switch that sets the boolean to false; `flag`: a spelling other than
    `--<name>`)."""
    return field(default=default, metadata={"parse": parse, "help": help, "commands": commands, "repeat": repeat,
                                            "negate": negate, "metavar": metavar, "flag": flag})


def computed(parse: Callable[[object], T], help: str, *, commands: tuple[str, ...] = RUN) -> T:
    """An option whose default `read` computes (from the environment or another option): never None
    once read."""
    return cast(T, field(default=None, metadata={"parse": parse, "help": help, "commands": commands, "repeat": False,
                                                 "negate": "", "metavar": None, "flag": ""}))


@dataclass(frozen=True)
class Options:
    """The resolved options of a command. Path options are absolute; `sources` says, per option,
    where its value came from (default, stackgate.toml, environment, command line)."""

    matrix: Path = computed(_path, "matrix file, or the name of a bundled matrix (default: the bundled upgrade.toml)",
                            commands=(*RUN_MERGE, *SHOW, "build"))
    config_dir: Path = computed(_path, "directory with compat/fleet/production/policy TOML (default: the bundled "
                                       "data)", commands=(*RUN_MERGE, *SHOW, "build", "promote"))
    policy: Path | None = opt(None, _path, "gate policy file (default: the suite's stackgate-policy.toml, else "
                                           "<config-dir>/policy.toml for the bundled suite)", commands=RUN_MERGE)
    vuln_db: Path | None = opt(None, _path, "OSV database on disk (a directory of OSV JSON records or the OSV "
                                            "export's all.zip files) to scan each stack's SBOM against (default: the "
                                            "policy's [vulnerabilities] database; none: not scanned)",
                               commands=RUN_MERGE)
    backend: BackendName = opt("auto", _backend, "how stacks are built and cells run")
    launcher: LauncherName = opt("pool", _launcher, "how cells start: as each pool says in fleet.toml "
                                                                    "(pool), on this machine (local), or as Slurm "
                                                                    "jobs (slurm)")
    container: ContainerName | None = opt(None, _container, "the container runtime on the nodes of every Slurm pool "
                                                             "of the run (fleet.toml: container): each task runs "
                                                             "the stack's image, by digest")
    candidate: str | None = opt(None, str, "candidate torch version (replaces the matrix's torch axis)",
                                commands=(*RUN_MERGE, *SHOW, "build"))
    pool: tuple[str, ...] = opt((), _list, "this runner belongs to pool NAME: run exactly that pool's cells "
                                           "(repeatable; default: the pools with detect = true)", repeat=True,
                                metavar="NAME")
    only: tuple[str, ...] = opt((), _list, "run only cells matching (repeatable)", repeat=True, metavar="GLOB",
                                commands=(*RUN, *SHOW, "build"))
    shard: Shard | None = opt(None, _shard, "run shard I of N (pairs of cells stay together)", metavar="I/N")
    profile: ProfileName = opt("default", _profile, "suite profile", commands=RUN_MERGE)
    timeout: float = opt(1800.0, _seconds, "per-cell timeout in seconds (at most a week)")
    repeats: int | None = opt(None, _count, "runs of the performance-gated tests per cell, interleaved production/"
                                            "candidate (default: the policy's [performance] repeats)",
                              commands=RUN_MERGE, metavar="N")
    confirm_repeats: int | None = opt(None, _count, "when the runs so far cannot settle a gated metric (inconclusive, "
                                                    "or a regression seen over fewer runs), run its tests again, "
                                                    "interleaved, until N runs in all, then decide; 1 = never "
                                                    "(default: the policy's [performance] confirm_repeats)",
                                      commands=RUN_MERGE, metavar="N")
    pairing: Pairing | None = opt(None, _pairing, "how each pair of the repeats is taken: sequential (one run after "
                                                   "the other) or concurrent (both at once, each stack on its own "
                                                   "share of the CPUs) (default: the policy's [performance] pairing)",
                                  commands=RUN_MERGE)
    reports: Path = opt(Path("reports"), _path, "reports directory", commands=(*RUN_MERGE, "build", "promote"))
    run_id: str | None = opt(None, str, "run id (default: time, matrix and a random suffix)", commands=RUN_MERGE)
    resume: str | None = opt(None, str, "continue a run; finished cells are skipped", metavar="RUN_ID")
    cache_dir: Path = computed(_path, "where environments are cached (default ~/.cache/stackgate)",
                               commands=(*RUN, "build", "promote"))
    suite: Path | None = opt(None, _path, "pytest suite to run in each stack (default: the bundled integration_tests)",
                             commands=RUN_MERGE)
    suite_requirements: tuple[Path, ...] = opt((), _paths, "the suite's requirements file (repeatable; default: "
                                                           "requirements*.txt, constraints*.txt and pyproject.toml's "
                                                           "dependency group next to the suite)", repeat=True,
                                                commands=RUN_MERGE, metavar="FILE")
    suite_install: tuple[Path, ...] = opt((), _paths, "a local project (e.g. the monorepo root) to build and install "
                                                      "into every stack, non-editable (repeatable; PATH[EXTRAS])",
                                          repeat=True, commands=RUN_MERGE, metavar="PATH")
    tests: tuple[str, ...] = opt((), _list, "run only this test of the suite, a node id relative to it "
                                            "(repeatable; the platform checks are left out)", repeat=True,
                                 commands=RUN_MERGE, flag="--test", metavar="NODEID")
    pytest_args: tuple[str, ...] = opt((), _list, "extra pytest argument (repeatable)", repeat=True,
                                       commands=RUN_MERGE, flag="--pytest-arg", metavar="ARG")
    index_url: str | None = opt(None, str, "index for the candidate's wheels", commands=(*RUN_MERGE, "build"))
    extra_index_url: tuple[str, ...] = opt((), _list, "extra index (repeatable)", repeat=True, commands=(*RUN_MERGE, "build"))
    find_links: tuple[str, ...] = opt((), _list, "wheelhouse directory or page (repeatable)", repeat=True,
                                      commands=(*RUN_MERGE, "build"))
    nightly_version: str | None = opt(None, str, "pin the nightly build, e.g. 2.15.0.dev20261128",
                                      commands=(*RUN_MERGE, "build"))
    nightly_max_age: int = opt(3, _days, "the oldest nightly to test, in days (PyTorch's own validation: 3)",
                               metavar="DAYS", commands=(*RUN, "build"))
    nightly_index: str | None = opt(None, str, "a nightly index with one directory per variant, like PyTorch's "
                                               "(URL/<variant>/torch/...)", commands=(*RUN_MERGE, "build"), metavar="URL")
    history: Path = computed(_path, "history database (default <reports>/history.sqlite)",
                             commands=(*RUN_MERGE, "history", "promote"))
    rollback: bool = opt(True, _bool, "skip the rollback phase (production reading the candidate's artifacts)",
                         negate="--no-rollback")
    platform_checks: bool = opt(True, _bool, "with --suite: do not add the bundled identity/collective/transport "
                                             "checks", negate="--no-platform-checks", commands=RUN_MERGE)
    suite_env: tuple[tuple[str, str], ...] = opt((), _env_pairs, "extra environment for the suite, e.g. NCCL_NET='AWS Libfabric' "
                                                    "(repeatable)", repeat=True, metavar="KEY=VALUE")
    pass_env: tuple[str, ...] = opt((), _list, "pass this host variable to the suite (repeatable; the suite's "
                                               "environment is otherwise an allow-list; a secret-looking value is "
                                               "masked as *** in every report and log)", repeat=True, metavar="NAME")
    bootstrap_base: bool = opt(True, _bool, "never debootstrap a local base image when the configured base is "
                                            "missing", negate="--no-bootstrap-base", commands=(*RUN, "build"))
    debian_mirror: str = opt(DEBIAN_MIRROR, str, "Debian mirror for the base-image bootstrap",
                             commands=(*RUN, "base-image", "build"))
    ca_bundle: str | None = opt(None, str, "extra CA bundle for resolving wheels on the host (never enters an "
                                           "image)", commands=(*RUN, "build"))
    candidate_python: Path | None = opt(None, _path, "the candidate is this interpreter, as it is (a machine "
                                                     "image's Python, a conda env, a venv): probed, never modified; "
                                                     "its torch, CUDA build and Python are the candidate stack's",
                                        commands=(*RUN_MERGE, *SHOW), metavar="PYTHON")
    production_python: Path | None = opt(None, _path, "production is this interpreter, as it is (probed, never "
                                                      "modified; default: production.toml, built by stackgate)",
                                         commands=(*RUN_MERGE, *SHOW), metavar="PYTHON")
    candidate_image: str | None = opt(None, str, "the candidate is this image, as it is (an NGC or DLC image, yours): "
                                                 "pulled, probed, run with its own interpreter, never rebuilt",
                                      commands=(*RUN_MERGE, *SHOW), metavar="REF")
    production_image: str | None = opt(None, str, "production is this image, as it is (pulled, probed, never "
                                                  "rebuilt)", commands=(*RUN_MERGE, *SHOW), metavar="REF")
    image_python: str = opt("python3", str, "the interpreter of a --candidate-image / --production-image (default: "
                                            "the first python3 on the image's PATH)", commands=(*RUN_MERGE, *SHOW),
                            metavar="PATH")
    registry: str | None = opt(None, str, "registry of stack images, host[:port][/path] (default: [registry] url in "
                                          "stackgate.toml, else in <config-dir>/fleet.toml; none: local images only)",
                               commands=REGISTRY_USERS, metavar="URL")
    repository: str | None = opt(None, str, "image name under the registry (default: [registry] repository, else "
                                            "stackgate/stack)", commands=REGISTRY_USERS, metavar="NAME")
    stacks: Path | None = opt(None, _path, "run: pull each stack by digest from this stacks.json (written by "
                                           "`stackgate build --push`) and never build one; build: where to write it "
                                           "(default stacks.json)", commands=BUILD_RUN, metavar="FILE")
    runs: int = opt(6, _aa_runs, "A/A runs (pairs are consecutive runs; default 6)", commands=CALIBRATE)
    target: float = opt(0.05, _fraction, "the change to detect (default 0.05 = 5%%)", commands=CALIBRATE)
    allow: float | None = opt(None, _share, "the change that must still pass as OK: the recommended tolerance is "
                                            "halfway to the target (default a fifth of the target: 0.01 for 0.05)",
                              commands=CALIBRATE)
    sources: Mapping[str, str] = field(default_factory=dict, metadata={"internal": True})

    def describe(self) -> dict[str, dict[str, object]]:
        """Every option of a run (or merge): its value and where it came from, for report.json."""
        return {f.name: {"value": _shown(getattr(self, f.name)), "from": self.sources.get(f.name, "default")}
                for f in declared() if {"run", "merge"} & set(f.metadata["commands"])}


def flag_of(name: str) -> str:
    """The command-line spelling of an option (`--no-...` for a switch that turns one off)."""
    f = next(f for f in declared() if f.name == name)
    return str(f.metadata["negate"] or f.metadata["flag"] or "--" + f.name.replace("_", "-"))


def _shown(value: object) -> object:
    """An option's value for the report (JSON); `KEY=VALUE` pairs whose KEY looks secret show `KEY=***`."""
    if isinstance(value, tuple) and value and all(isinstance(v, tuple) and len(v) == 2 for v in value):
        from stackgate.masking import MASK, looks_secret
        return [f"{k}={MASK}" if looks_secret(str(k)) else f"{k}={v}" for k, v in value]
    if isinstance(value, (Path, Shard)):
        return str(value)
    if isinstance(value, tuple):
        return [str(v) if isinstance(v, Path) else v for v in value]
    return value


def declared(command: str | None = None) -> list[dataclasses.Field[object]]:
    """The declared options (of one command)."""
    return [f for f in dataclasses.fields(Options) if not f.metadata.get("internal")
            and (command is None or command in f.metadata["commands"])]


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """The command line of `command`, from the declaration. Values stay None (unset) unless given,
    so the cascade can tell a given value from a default."""
    for f in declared(command):
        meta = f.metadata
        flag = meta["flag"] or "--" + f.name.replace("_", "-")
        if meta["negate"]:
            parser.add_argument(meta["negate"], dest=f.name, action="store_false", default=None, help=meta["help"])
            continue
        parser.add_argument(flag, dest=f.name, help=meta["help"], default=None, choices=CHOICES.get(meta["parse"]),
                            metavar=meta["metavar"], action="append" if meta["repeat"] else "store")


def absolute(path: Path, base: Path) -> Path:
    """`path` made absolute against `base`, without resolving symbolic links."""
    return Path(os.path.normpath(base / path.expanduser()))


def read(cli: Mapping[str, object], env: Mapping[str, str], project_file: Path | None = None,
         cwd: Path | None = None) -> Options:
    """Every path option comes out absolute: relative values on the command line or in the
    environment are taken against `cwd`, those in stackgate.toml against that file's directory.
    Nothing downstream (a bind mount, a subprocess cwd) ever sees a relative path."""
    cwd = cwd or Path.cwd()
    fields = {f.name: f for f in declared()}
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    for name, f in fields.items():
        values[name] = f.metadata["parse"](f.default) if f.default is not None else None
        sources[name] = "default"
    if values["cache_dir"] is None:
        values["cache_dir"] = _path(_default_cache(env))
    bases: dict[str, Path] = {}
    layers: list[tuple[str, Mapping[str, object]]] = []
    if project_file is not None:
        project_file = absolute(project_file, cwd)
    if project_file is not None and project_file.exists():
        doc = tomlfile.load(project_file)
        project = tomlfile.validate(doc, StackgateToml)  # a misspelled table is an error, not ignored
        run = project.run  # each value is parsed by its option's declaration below
        tomlfile.check_keys(doc, run, [k.replace("_", "-") for k in fields] + list(fields), "run")
        layers.append((str(project_file), {k.replace("-", "_"): v for k, v in run.items()}))
        url, repository = artifacts.from_toml(project_file)  # [registry] url, repository
        layers.append((f"{project_file} [registry]", {k: v for k, v in (("registry", url), ("repository", repository))
                                                       if v is not None}))
    layers.append(("environment", {k[len("STACKGATE_"):].lower(): v for k, v in env.items()
                                   if k.startswith("STACKGATE_") and k[len("STACKGATE_"):].lower() in fields}))
    layers.append(("command line", {k: v for k, v in cli.items() if v is not None and v not in ((), [])}))
    for source, layer in layers:
        for name, raw in layer.items():
            if name not in fields:
                continue
            try:
                values[name] = fields[name].metadata["parse"](raw)
            except (ValueError, TypeError) as exc:
                where = f"STACKGATE_{name.upper()}" if source == "environment" else (
                    f"--{name.replace('_', '-')}" if source == "command line" else f"{source} [run] {name}")
                raise ConfigError(f"{where}={raw!r}: {exc}") from None
            sources[name] = source
            if project_file is not None and source == str(project_file):
                bases[name] = project_file.parent
            else:
                bases.pop(name, None)
    matrix = values["matrix"]
    values["matrix"] = bundled_matrix(matrix if isinstance(matrix, Path) else None, bases.get("matrix", cwd))
    for name, f in fields.items():
        value = values[name]
        if f.metadata["parse"] is _path and isinstance(value, Path):
            values[name] = absolute(value, bases.get(name, cwd))
        elif f.metadata["parse"] is _paths and isinstance(value, tuple):
            values[name] = tuple(absolute(v, bases.get(name, cwd)) for v in value)
    if values["config_dir"] is None:
        values["config_dir"] = shipped.MATRIX_DIR
    reports = values["reports"]
    if values["history"] is None and isinstance(reports, Path):
        values["history"] = reports / "history.sqlite"
    target, allow = values["target"], values["allow"]
    if isinstance(target, float) and isinstance(allow, float) and allow >= target:
        raise ConfigError(f"--allow {allow}: the change that must pass must be below --target {target}")
    built = Options()
    for name, value in {**values, "sources": sources}.items():  # each value came through its field's parser
        object.__setattr__(built, name, value)
    return built


def bundled_matrix(value: Path | None, base: Path) -> Path:
    """None -> the bundled upgrade.toml; a bare name that is no file here ("nightly") -> the bundled one."""
    if value is None:
        return shipped.MATRIX_DIR / "upgrade.toml"
    if len(value.parts) == 1 and not (base / value).exists():
        name = value.name if value.suffix == ".toml" else f"{value.name}.toml"
        if (shipped.MATRIX_DIR / name).is_file():
            return shipped.MATRIX_DIR / name
    return value
