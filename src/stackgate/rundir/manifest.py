"""run.json, a run directory's manifest: the run definition (what was tested and how it is judged,
independent of the machine), the selection (which pools, cells and shard this runner took), the
options behind them, the stackgate version, the host probe, and the images each stack ran. Written
whole (atomically) before any cell runs; read back through `boundary.manifest`."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from stackgate import __version__
from stackgate.boundary import manifest as boundary
from stackgate.boundary.manifest import Manifest
from stackgate.errors import ConfigError
from stackgate.model import CellResult
from stackgate.report.files import atomic_write
from stackgate.rundir.layout import RunDir

LOCAL_BUILD = "local build (no registry digest)"


def digest(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()[:16]


def definition_hash(defined: Mapping[str, str]) -> str:
    return digest(json.dumps(dict(defined), sort_keys=True))


def write(run_dir: Path, *, defined: Mapping[str, str], selected: Mapping[str, str], cells: Sequence[str],
          host_probe: Mapping[str, Any] | None = None, merged_from: Sequence[str] = (),
          options: Mapping[str, Any] | None = None) -> None:
    manifest = Manifest.model_validate({
        "definition": dict(defined), "definition_hash": definition_hash(defined), "selection": dict(selected),
        "options": dict(options or {}), "stackgate_version": __version__, "cells": list(cells),
        "host_probe": dict(host_probe or {}), "merged_from": list(merged_from)}, strict=False)
    _write(RunDir(run_dir).manifest, manifest)


def _write(path: Path, manifest: Manifest) -> None:
    atomic_write(path, json.dumps(manifest.model_dump(mode="json"), indent=1, sort_keys=True))


def read(run_dir: Path) -> Manifest:
    return boundary.read(RunDir(run_dir).manifest)


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
    """run.json gains `stacks`: the image of every stack the run ran (what a merge compares). A run
    without a readable manifest keeps none (the report says what the results hold)."""
    stacks = stack_images(found)
    try:
        manifest = read(run_dir)
    except ConfigError:
        return stacks
    if manifest.stacks != stacks:
        _write(RunDir(run_dir).manifest, manifest.model_copy(update={"stacks": stacks}))
    return stacks


def differences(before: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    return [f"{k}: was {before.get(k)!r}, now {now.get(k)!r}" for k in sorted(set(before) | set(now))
            if before.get(k) != now.get(k)]


def check_resume(run_dir: Path, defined: Mapping[str, str], selected: Mapping[str, str]) -> None:
    """A resumed run must be the same run: same definition, same selection."""
    manifest = read(run_dir)
    changed = differences(manifest.definition, defined) + differences(manifest.selection, selected)
    if changed:
        raise ConfigError(f"cannot resume {run_dir.name}: the run's definition changed: " + "; ".join(changed),
                          hint="resume with the same matrix, candidate, policy, suite and selection, or start a "
                               "new run")
