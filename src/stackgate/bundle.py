"""Bundles: every run directory is one. `run.json` is its manifest: the run definition (what was
tested and how it is judged, independent of the machine: content hashes, not paths), the selection
(which pools, cells and shard this runner took), the stackgate version and the host probe.

`--resume` must see the same definition and selection; `stackgate merge` needs bundles with one
definition and gates the whole matrix over their results."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stackgate import __version__, results
from stackgate.errors import ConfigError
from stackgate.model import CellResult
from stackgate.options import flag_of
from stackgate.policy import Policy
from stackgate.report.files import atomic_write
from stackgate.suite import suite_digest

MANIFEST = "run.json"


def digest(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()[:16]


def policy_fingerprint(policy: Policy) -> str:
    """What the policy decides with, without where it was read from."""
    data = {k: v for k, v in dataclasses.asdict(policy).items() if k not in ("path", "origin")}
    return digest(json.dumps(data, sort_keys=True, default=str))


def definition(*, matrix: Path, config_dir: Path, candidate: Sequence[object], policy: Policy, suite: Path,
               profile: str, pytest_args: Sequence[str], platform_checks: bool,
               suite_requirements: Sequence[str] = ()) -> dict[str, str]:
    """The run definition: equal on every runner of one fleet run (no absolute paths in it).
    `suite_requirements`: what the suite installs besides the stack, without host paths."""
    suite_hash = digest(suite.read_bytes()) if suite.is_file() else suite_digest(suite)[:16]
    config = {name: digest((config_dir / name).read_bytes()) for name in ("compat.toml", "fleet.toml",
                                                                         "production.toml")}
    defined = {
        "matrix": f"{matrix.name} sha256:{digest(matrix.read_bytes())}",
        "config": " ".join(f"{k}:{v}" for k, v in sorted(config.items())),
        "candidate": ", ".join(str(v) for v in candidate),
        "policy": f"sha256:{policy_fingerprint(policy)}",
        "suite": f"{suite.name} sha256:{suite_hash}",
        "profile": profile,
        "pytest_args": " ".join(pytest_args),
        "platform_checks": str(platform_checks),
    }
    if suite_requirements:  # (absent when empty: bundles written before it stay comparable)
        defined["suite_requirements"] = " ".join(suite_requirements)
    return defined


def definition_hash(defined: Mapping[str, str]) -> str:
    return digest(json.dumps(dict(defined), sort_keys=True))


def selection(*, pools: Sequence[str], only: Sequence[str], shard: str | None) -> dict[str, str]:
    return {"pools": " ".join(pools) or "detected", "only": " ".join(only), "shard": shard or ""}


# the options that make up each part of a run definition: what a merge must be given to match its bundles
DEFINED_BY = {"matrix": ("matrix",), "config": ("config_dir",), "candidate": ("candidate",),
              "policy": ("policy", "suite"), "suite": ("suite",), "profile": ("profile",),
              "pytest_args": ("pytest_args", "tests"), "platform_checks": ("platform_checks",),
              "suite_requirements": ("suite_requirements", "suite_install")}


def defining_options(described: Mapping[str, Any], cwd: Path) -> dict[str, Any]:
    """The options behind the run definition, as they were given (paths relative to `cwd` where
    they lie below it), for a merge's hint; defaults are left out."""
    out: dict[str, Any] = {}
    for name in sorted({n for names in DEFINED_BY.values() for n in names}):
        found = described.get(name) or {}
        if found.get("from", "default") == "default":
            continue
        value = found.get("value")
        values = value if isinstance(value, list) else [value]
        shown = []
        for v in values:
            try:
                shown.append(str(Path(str(v)).relative_to(cwd)) if Path(str(v)).is_absolute() else v)
            except ValueError:
                shown.append(v)
        out[name] = shown if isinstance(value, list) else shown[0]
    return out


def _flags(options: Mapping[str, Any]) -> str:
    words = []
    for name, value in sorted(options.items()):
        if isinstance(value, bool):
            words += [flag_of(name)] if value is False else []
            continue
        words += [f"{flag_of(name)} {v}" for v in (value if isinstance(value, list) else [value])]
    return " ".join(words)


def write_manifest(run_dir: Path, *, defined: Mapping[str, str], selected: Mapping[str, str], cells: Sequence[str],
                   host_probe: Mapping[str, Any] | None = None, merged_from: Sequence[str] = (),
                   options: Mapping[str, Any] | None = None) -> None:
    atomic_write(run_dir / MANIFEST, json.dumps({
        "definition": dict(defined), "definition_hash": definition_hash(defined), "selection": dict(selected),
        "options": dict(options or {}),
        "stackgate_version": __version__, "cells": list(cells), "host_probe": dict(host_probe or {}),
        "merged_from": list(merged_from),
    }, indent=1, sort_keys=True))


LOCAL_BUILD = "local build (no registry digest)"


def stack_images(found: Mapping[str, CellResult]) -> dict[str, list[str]]:
    """Stack label -> the images (by registry digest, else "local build") its cells ran, from the
    results' environments (the Docker backend's account of each cell)."""
    out: dict[str, set[str]] = {}
    for result in found.values():
        label = result.environment.stack_label
        if label:
            out.setdefault(label, set()).add(result.environment.image_digest or LOCAL_BUILD)
    return {k: sorted(v) for k, v in sorted(out.items())}


def record_stacks(run_dir: Path, found: Mapping[str, CellResult]) -> dict[str, list[str]]:
    """run.json gains `stacks`: the image of every stack the run ran (what a merge compares)."""
    stacks = stack_images(found)
    path = run_dir / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return stacks
    if manifest.get("stacks") != stacks:
        manifest["stacks"] = stacks
        atomic_write(path, json.dumps(manifest, indent=1, sort_keys=True))
    return stacks


def check_same_images(bundles: Sequence[Bundle]) -> None:
    """Every bundle of a fleet run must have run one image of each stack: a stack seen by two digests
    (or by a digest in one bundle and a local build in another) is refused, naming both (exit 2)."""
    seen: dict[str, tuple[str, Path]] = {}
    for b in bundles:
        recorded = b.manifest.get("stacks") or {}
        ran = stack_images(b.read.results)
        for label in sorted(set(recorded) | set(ran)):
            images = sorted({*recorded.get(label, ()), *ran.get(label, ())})
            if len(images) > 1:
                raise ConfigError(f"bundle {b.path} ran stack {label} as {len(images)} different images: "
                                  + ", ".join(images), hint="every cell of a stack must run one image")
            first = seen.setdefault(label, (images[0], b.path))
            if first[0] != images[0]:
                raise ConfigError(f"stack {label} ran as different images: {first[0]} in bundle {first[1]}, "
                                  f"{images[0]} in bundle {b.path}",
                                  hint="a fleet verdict covers one image per stack: build and push once "
                                       "(`stackgate build --push`), then give every pool the same stacks.json "
                                       "(`stackgate run --pool NAME --stacks stacks.json`)")


def read_manifest(run_dir: Path) -> dict[str, Any]:
    path = run_dir / MANIFEST
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        raise ConfigError(f"{path} is missing or unreadable: {run_dir} is not a stackgate run (bundle)",
                          hint="a bundle is the run directory `stackgate run` wrote (reports/<run-id>)") from None
    if not isinstance(data, dict) or not isinstance(data.get("definition"), dict):
        raise ConfigError(f"{path} has no run definition", hint="was it written by an older stackgate?")
    return data


def differences(before: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    return [f"{k}: was {before.get(k)!r}, now {now.get(k)!r}" for k in sorted(set(before) | set(now))
            if before.get(k) != now.get(k)]


def check_resume(run_dir: Path, defined: Mapping[str, str], selected: Mapping[str, str]) -> None:
    """A resumed run must be the same run: same definition, same selection."""
    manifest = read_manifest(run_dir)
    changed = differences(manifest["definition"], defined) + differences(manifest.get("selection", {}), selected)
    if changed:
        raise ConfigError(f"cannot resume {run_dir.name}: the run's definition changed: " + "; ".join(changed),
                          hint="resume with the same matrix, candidate, policy, suite and selection, or start a "
                               "new run")


@dataclass(frozen=True)
class Bundle:
    path: Path
    manifest: dict[str, Any]
    read: results.ResultLines

    @property
    def pools(self) -> str:
        return str(self.manifest.get("selection", {}).get("pools", "?"))


def _merge_hint(manifests: Sequence[tuple[Path, Mapping[str, Any]]], defined: Mapping[str, str]) -> str:
    """When the bundles agree with each other, it is the merge's own options that differ: say which
    to repeat (from what the bundles recorded); else they come from different fleet runs."""
    first = manifests[0][1]
    if any(differences(m["definition"], first["definition"]) for _, m in manifests[1:]):
        return "the bundles differ from each other too: merge only the bundles of one fleet run"
    keys = {k for k in set(first["definition"]) | set(defined) if first["definition"].get(k) != defined.get(k)}
    given = first.get("options") or {}
    wanted = {n: given[n] for k in sorted(keys) for n in DEFINED_BY.get(k, ()) if n in given}
    named = sorted({n for k in keys for n in DEFINED_BY.get(k, ())})
    if wanted:
        return (f"the bundles agree with each other; give the merge the options they were run with: {_flags(wanted)} "
                "(from the repository root the runs used)")
    return ("the bundles agree with each other; give the merge the same "
            + (", ".join(flag_of(n) for n in named) or "options") + " as the pool runs")


def load_bundles(paths: Sequence[Path], defined: Mapping[str, str]) -> list[Bundle]:
    """Every bundle, checked against the merge's own definition: a bundle of another candidate,
    policy, suite or matrix is refused (exit 2), saying which differ. A cell in two bundles too."""
    bundles = []
    owner: dict[str, Path] = {}
    manifests = [(path, read_manifest(path)) for path in paths]
    for path, manifest in manifests:
        changed = differences(manifest["definition"], defined)
        if changed:
            raise ConfigError(f"bundle {path} belongs to another run definition: " + "; ".join(changed),
                              hint=_merge_hint(manifests, defined))
        read = results.read_all(path)
        for cell_id in read.results:
            if cell_id in owner:
                raise ConfigError(f"cell {cell_id} is in two bundles: {owner[cell_id]} and {path}",
                                  hint="each pool (or shard) must be merged once")
            owner[cell_id] = path
        bundles.append(Bundle(path, manifest, read))
    check_same_images(bundles)
    return bundles
