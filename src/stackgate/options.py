"""One configuration cascade: defaults < stackgate.toml [run] < STACKGATE_* environment < command line.

Resolved in one function that records where each value came from, so the report can show it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stackgate import bundled, tomlfile
from stackgate.errors import ConfigError


def _path(v: Any) -> Path:
    return Path(str(v)).expanduser()


def _list(v: Any) -> tuple[str, ...]:
    if isinstance(v, (list, tuple)):
        return tuple(str(x) for x in v)
    return tuple(x for x in str(v).replace(",", " ").split() if x)


def _env_list(v: Any) -> tuple[str, ...]:
    """KEY=VALUE items; a string from the environment or TOML holds them one per line."""
    if isinstance(v, (list, tuple)):
        return tuple(str(x) for x in v)
    return tuple(x.strip() for x in str(v).splitlines() if x.strip())


def _choice(*allowed: str) -> Callable[[Any], str]:
    def parse(v: Any) -> str:
        if str(v) not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}")
        return str(v)
    return parse


def _positive(v: Any) -> float:
    x = float(v)
    if x <= 0:
        raise ValueError("must be > 0")
    return x


def _bool(v: Any) -> bool:
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


# name -> (parser, default)
FIELDS: dict[str, tuple[Callable[[Any], Any], Any]] = {
    "matrix": (_path, None),  # None: the bundled upgrade.toml; a bare name ("nightly") picks a bundled matrix
    "config_dir": (_path, None),  # None: the bundled compat/fleet/production/policy data
    "policy": (_path, None),  # None: the suite's own policy (see suite_policy), else <config_dir>/policy.toml
    "backend": (_choice("auto", "venv", "docker"), "auto"),
    "candidate": (str, None),
    "only": (_list, ()),
    "shard": (str, None),
    "profile": (_choice("default", "quick"), "default"),
    "timeout": (_positive, 1800.0),
    "reports": (_path, "reports"),
    "run_id": (str, None),
    "resume": (str, None),
    "cache_dir": (_path, None),
    "suite": (_path, None),
    "pytest_args": (_list, ()),
    "index_url": (str, None),
    "extra_index_url": (_list, ()),
    "find_links": (_list, ()),
    "nightly_version": (str, None),
    "history": (_path, None),
    "rollback": (_bool, True),
    "platform_checks": (_bool, True),
    "suite_env": (_env_list, ()),
    "bootstrap_base": (_bool, True),
    "debian_mirror": (str, "http://deb.debian.org/debian"),
    "ca_bundle": (str, None),
}


@dataclass(frozen=True)
class Options:
    values: Mapping[str, Any]
    sources: Mapping[str, str] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None

    def describe(self) -> dict[str, Any]:
        return {k: {"value": str(v) if isinstance(v, Path) else v, "from": self.sources.get(k, "default")}
                for k, v in self.values.items()}


def absolute(path: Path, base: Path) -> Path:
    """`path` made absolute against `base`, without resolving symbolic links."""
    return Path(os.path.normpath(base / path.expanduser()))


def resolve(cli: Mapping[str, Any], env: Mapping[str, str], project_file: Path | None = None,
            cwd: Path | None = None) -> Options:
    """Every path option comes out absolute: relative values on the command line or in the
    environment are taken against `cwd`, those in stackgate.toml against that file's directory.
    Nothing downstream (a bind mount, a subprocess cwd) ever sees a relative path."""
    cwd = cwd or Path.cwd()
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, (parse, default) in FIELDS.items():
        values[name] = parse(default) if default is not None else None
        sources[name] = "default"
    if values["cache_dir"] is None:
        values["cache_dir"] = _path(_default_cache(env))
    bases: dict[str, Path] = {}
    layers: list[tuple[str, Mapping[str, Any]]] = []
    if project_file is not None:
        project_file = absolute(project_file, cwd)
    if project_file is not None and project_file.exists():
        doc = tomlfile.load(project_file)
        tomlfile.check_keys(doc, doc.data, ["run"])  # a misspelled table is an error, not silently ignored
        run = tomlfile.get(doc, doc.data, "run", dict, default={})
        tomlfile.check_keys(doc, run, [k.replace("_", "-") for k in FIELDS] + list(FIELDS), "run")
        layers.append((str(project_file), {k.replace("-", "_"): v for k, v in run.items()}))
    layers.append(("environment", {k[len("STACKGATE_"):].lower(): v for k, v in env.items()
                                   if k.startswith("STACKGATE_") and k[len("STACKGATE_"):].lower() in FIELDS}))
    layers.append(("command line", {k: v for k, v in cli.items() if v is not None and v not in ((), [])}))
    for source, layer in layers:
        for name, raw in layer.items():
            if name not in FIELDS:
                continue
            parse = FIELDS[name][0]
            try:
                values[name] = parse(raw)
            except (ValueError, TypeError) as exc:
                where = f"STACKGATE_{name.upper()}" if source == "environment" else (
                    f"--{name.replace('_', '-')}" if source == "command line" else f"{source} [run] {name}")
                raise ConfigError(f"{where}={raw!r}: {exc}") from None
            sources[name] = source
            if project_file is not None and source == str(project_file):
                bases[name] = project_file.parent
            else:
                bases.pop(name, None)
    values["matrix"] = bundled_matrix(values["matrix"], bases.get("matrix", cwd))
    for name, (parse, _) in FIELDS.items():
        if parse is _path and values[name] is not None:
            values[name] = absolute(values[name], bases.get(name, cwd))
    if values["config_dir"] is None:
        values["config_dir"] = bundled.MATRIX_DIR
    if values["history"] is None:
        values["history"] = values["reports"] / "history.sqlite"
    return Options(values, sources)


def bundled_matrix(value: Path | None, base: Path) -> Path:
    """None -> the bundled upgrade.toml; a bare name that is no file here ("nightly") -> the bundled one."""
    if value is None:
        return bundled.MATRIX_DIR / "upgrade.toml"
    if len(value.parts) == 1 and not (base / value).exists():
        name = value.name if value.suffix == ".toml" else f"{value.name}.toml"
        if (bundled.MATRIX_DIR / name).is_file():
            return bundled.MATRIX_DIR / name
    return value


def parse_shard(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise ConfigError(f"--shard {text!r} must be INDEX/COUNT, for example 0/4") from None
    if count < 1 or not 0 <= index < count:
        raise ConfigError(f"--shard {text!r}: need 0 <= INDEX < COUNT")
    return index, count
