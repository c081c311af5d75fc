"""What a promotion writes, from a GO run's report.json: the promoted stacks (each candidate stack that
passed, with the image it ran by digest and its tested `pip freeze`), a PEP 751 lock of each
(`pylock.toml` with the very wheels, by sha256, beside it), the new `production.toml` naming the
stacks by versions and by digest, and the changelog for the trainer owners who receive it.

Pure functions over files; the registry is touched only by `commands/promote.py`, through the engine."""

from __future__ import annotations

import difflib
import json
import os
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from stackgate.boundary.report import CellRow, Report
from stackgate.boundary.report import read as read_report_json
from stackgate.errors import ConfigError, InfraError
from stackgate.installer import file_sha256
from stackgate.report.markdown import md_escape


@dataclass(frozen=True)
class Promoted:
    """One candidate stack of a GO run, as it was tested."""

    label: str  # cu130-torch2.14.1-py3.11
    torch: str
    cuda: str
    python: str
    gpu: bool  # it ran on a GPU pool (else a CPU pool)
    image: str  # repo@sha256:... ("" when it never went through a registry)
    packages: tuple[str, ...]  # the tested `pip freeze` of its environment
    cells: tuple[str, ...]


def read_report(run_dir: Path) -> Report:
    """report.json, through the model of what the gate wrote (`boundary.report`)."""
    return read_report_json(run_dir)


def require_go(report: Report, run_dir: Path) -> None:
    """Only a GO run is promoted: anything else is exit 2, with the gate's reasons."""
    if report.decision == "GO":
        return
    reasons = [f"[{r.kind}] {r.cell} {r.message}".strip() for r in report.reasons if r.severity != "info"]
    raise ConfigError(f"run {run_dir.name} is {report.decision}, not GO: only a GO run is promoted",
                      hint="why: " + ("; ".join(reasons[:3]) or "see its report.md"))


def promoted(report: Report) -> list[Promoted]:
    """The candidate stacks that passed, one per stack (its cells may be on several pools)."""
    found: dict[str, list[CellRow]] = {}
    for cell in report.cells:
        if cell.role == "candidate" and cell.status == "passed":
            label = f"{cell.stack.cuda}-torch{cell.stack.torch.split('+')[0]}-py{cell.stack.python}"
            found.setdefault(label, []).append(cell)
    if not found:
        raise ConfigError("the run has no candidate stack that passed: nothing to promote")
    out = []
    for label, cells in sorted(found.items()):
        stack = cells[0].stack
        image = next((c.environment.image_digest for c in cells if c.environment.image_digest), "")
        # the stack's own packages, not the suite's view
        own = next((tuple(c.environment.stack_packages or c.environment.packages) for c in cells
                    if c.environment.stack_packages or c.environment.packages), ())
        out.append(Promoted(label, stack.torch, stack.cuda, stack.python, any(c.device == "cuda" for c in cells),
                            image, own, tuple(c.id for c in cells)))
    return out


# --------------------------------------------------------------------------------------------- pylock
def _pin(line: str) -> tuple[str, str, str]:
    """(canonical name, version, file url or "") of a `pip freeze` line."""
    if " @ " in line:
        name, url = (p.strip() for p in line.split(" @ ", 1))
        return str(canonicalize_name(name)), "", url
    name, _, version = line.partition("==")
    return str(canonicalize_name(name)), version.strip(), ""


def wheel_index(dirs: Iterable[Path]) -> dict[tuple[str, Version], Path]:
    """Every wheel under `dirs` (one level), by (canonical name, version)."""
    out: dict[tuple[str, Version], Path] = {}
    for directory in dirs:
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.whl")):
            try:
                name, version, _, _ = parse_wheel_filename(path.name)
            except (InvalidWheelFilename, InvalidVersion):
                continue
            out.setdefault((str(name), version), path)
    return out


def _place(src: Path, dst: Path) -> None:
    if dst.exists():
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def pylock(stack: Promoted, out: Path, index: Mapping[tuple[str, Version], Path],
           download: Callable[[Sequence[str], Path], None]) -> Path:
    """`out/pylock.toml` and `out/wheels/`: every package of the tested freeze, as the very wheel (by
    sha256) found in the run's wheelhouses and find-links, else downloaded by exact version. Installing
    it offline (`uv pip sync --offline pylock.toml`) into a fresh venv reproduces the tested freeze."""
    if not stack.packages:
        raise ConfigError(f"stack {stack.label}: the run recorded no `pip freeze` of its environment",
                          hint="promote a run whose report.json has environment.packages for its candidate cells")
    wheels = out / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found: list[tuple[str, str, Path]] = []
    missing = []
    for line in stack.packages:
        name, version, url = _pin(line)
        local = Path(url.removeprefix("file://")) if url.startswith("file://") and url.endswith(".whl") else None
        try:
            hit = local if local is not None and local.is_file() else index.get((name, Version(version)))
        except InvalidVersion:
            hit = None
        if hit is None:
            missing.append(line)
            continue
        _place(hit, wheels / hit.name)
        found.append((name, version, wheels / hit.name))
    if missing:
        download(missing, wheels)
        fetched = wheel_index([wheels])
        for line in missing:
            name, version, _ = _pin(line)
            hit = fetched.get((name, Version(version))) if version else None
            if hit is None:
                raise InfraError(f"stack {stack.label}: no wheel of {line} could be found or downloaded",
                                 hint="the tested environment must be reproducible from wheels")
            found.append((name, version, hit))
    lines = ['lock-version = "1.0"', f'requires-python = "=={stack.python}.*"', 'created-by = "stackgate"', ""]
    for name, pinned, path in sorted(found):
        version = pinned or str(parse_wheel_filename(path.name)[1])
        lines += ["[[packages]]", f"name = {json.dumps(name)}", f"version = {json.dumps(version)}", "",
                  "[[packages.wheels]]", f"name = {json.dumps(path.name)}",
                  f"path = {json.dumps('wheels/' + path.name)}", f"size = {path.stat().st_size}",
                  f'hashes = {{sha256 = "{file_sha256(path)}"}}', ""]
    target = out / "pylock.toml"
    target.write_text("\n".join(lines))
    return target


# ----------------------------------------------------------------------------------- production.toml
def production_toml(stacks: Sequence[Promoted], run_id: str, when: str) -> str:
    """The new production.toml: the promoted release by versions (the GPU pools' CUDA build and the
    CPU pools' build), and every promoted image by digest, with the run that proved it."""
    gpu = next((s for s in stacks if s.gpu), None)
    cpu = next((s for s in stacks if not s.gpu), None)
    first = gpu or cpu
    assert first is not None
    lines = [f"# The production stack: promoted by `stackgate promote` from run {run_id} (GO) on {when}.",
             "[production]", f'torch = "{first.torch.split("+")[0]}"', f'cuda = "{first.cuda}"',
             f'python = "{first.python}"', f'run = "{run_id}"', ""]
    if cpu is not None:
        lines += ["# Pools without a GPU run this build of the same release.", "[production.cpu]",
                  f'cuda = "{cpu.cuda}"', ""]
    images = [s for s in stacks if s.image]
    if images:
        lines += ["# The tested images, by digest: what a rollout pulls.", "[production.images]"]
        lines += [f'"{s.label}" = "{s.image}"' for s in images] + [""]
    return "\n".join(lines)


def patch(old_path: Path, new_text: str) -> str:
    old = old_path.read_text() if old_path.is_file() else ""
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new_text.splitlines(keepends=True),
                                        fromfile=f"a/{old_path.name}", tofile=f"b/{old_path.name}"))


# ---------------------------------------------------------------------------------------- changelog
def changelog(report: Report, stacks: Sequence[Promoted], run_id: str, when: str, who: str,
              tags: Sequence[str]) -> str:
    """For the trainer owners who receive the stack: what changed, the work list (new deprecation
    warnings), the performance changes, and the waivers still in force."""
    e = md_escape
    out = [f"# Stack promotion: {', '.join(e(s.label) for s in stacks)}", "",
           f"Promoted on {e(when)} by {e(who)}, from run `{e(run_id)}` (GO). The evidence is that run's report.", ""]
    out += ["## The stacks", "", "| stack | torch | CUDA build | Python | image (by digest) |", "|---|---|---|---|---|"]
    out += [f"| {e(s.label)} | {e(s.torch)} | {e(s.cuda)} | {e(s.python)} | `{e(s.image or 'no registry image')}` |"
            for s in stacks]
    out += [""] + ([f"Registry tags moved: {', '.join(f'`{e(t)}`' for t in tags)}.", ""] if tags else [])
    for diff in report.stack_diff:
        out += [f"## What changed: {e(diff.production_cell)} → {e(diff.candidate_cell)}", "",
                "| | production | candidate |", "|---|---|---|"]
        out += [f"| {e(f.what)} | {e(f.production)} | {e(f.candidate)} |" for f in diff.facts]
        changed = [p for p in diff.packages if p.production != p.candidate]
        if changed:
            out += ["", "| package | production | candidate |", "|---|---|---|"]
            out += [f"| {e(p.name)} | {e(p.production or '—')} | {e(p.candidate or '—')} |" for p in changed]
        out.append("")
    warnings = report.new_warnings
    out += ["## Your work list: new warnings in the candidate", ""]
    out += ([f"- {e(cell)}: {e(w)}" for cell, ws in sorted(warnings.items()) for w in ws]
            or ["- none: the candidate raised no warning that production did not"]) + [""]
    comparisons = report.comparisons
    out += ["## Performance (candidate vs production)", ""]
    if comparisons:
        out += ["| cell | metric | change | outcome |", "|---|---|---|---|"]
        out += [f"| {e(c.cell)} | {e(c.metric)} | {format(c.change, '+.1%') if c.change is not None else 'n/a'} | "
                f"{e(c.outcome)} |" for c in comparisons]
    else:
        out.append("- no performance metric was compared")
    waived = [r for r in report.reasons if r.severity == "waived"]
    out += ["", "## Waivers still in force", ""]
    out += [f"- {e(r.cell)}: {e(r.message)}" for r in waived] or ["- none"]
    out += ["", "## Install it", ""]
    for s in stacks:
        if s.image:
            out.append(f"- `docker pull {e(s.image)}`")
        out.append(f"- a Python environment: `uv pip sync --offline {e(s.label)}/pylock.toml` (the tested wheels, "
                   "by sha256, are beside it)")
    return "\n".join(out) + "\n"
