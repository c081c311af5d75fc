"""Bundles: every run directory is one, and its manifest (run.json, `rundir.manifest`) holds the run
definition (what was tested and how it is judged, independent of the machine: content hashes, not
paths) and the selection (which pools, cells and shard this runner took).

`--resume` must see the same definition and selection; `stackgate merge` needs bundles with one
definition and gates the whole matrix over their results."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stackgate.boundary.manifest import Manifest
from stackgate.errors import ConfigError
from stackgate.options import flag_of
from stackgate.policy import Policy
from stackgate.rundir import manifest as run_manifest
from stackgate.rundir import results
from stackgate.rundir.manifest import differences, digest, stack_images
from stackgate.suite import suite_digest


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


def check_same_images(bundles: Sequence[Bundle]) -> None:
    """Every bundle of a fleet run must have run one image of each stack: a stack seen by two digests
    (or by a digest in one bundle and a local build in another) is refused, naming both (exit 2)."""
    seen: dict[str, tuple[str, Path]] = {}
    for b in bundles:
        recorded = b.manifest.stacks
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


@dataclass(frozen=True)
class Bundle:
    path: Path
    manifest: Manifest
    read: results.ResultLines

    @property
    def pools(self) -> str:
        return self.manifest.pools


def _merge_hint(manifests: Sequence[tuple[Path, Manifest]], defined: Mapping[str, str]) -> str:
    """When the bundles agree with each other, it is the merge's own options that differ: say which
    to repeat (from what the bundles recorded); else they come from different fleet runs."""
    first = manifests[0][1]
    if any(differences(m.definition, first.definition) for _, m in manifests[1:]):
        return "the bundles differ from each other too: merge only the bundles of one fleet run"
    keys = {k for k in set(first.definition) | set(defined) if first.definition.get(k) != defined.get(k)}
    given = first.options
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
    manifests = [(path, run_manifest.read(path)) for path in paths]
    for path, manifest in manifests:
        changed = differences(manifest.definition, defined)
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
