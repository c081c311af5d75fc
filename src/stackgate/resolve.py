"""Resolve every stack's requirements before anything is built, in one step both backends share.

`uv pip compile` for the stack's Python and platform, with the stack's wheel source: an unknown
version (`--candidate 2.14.9`) is a configuration error (exit 2, nothing written); an index that
cannot be reached is an infrastructure problem that makes the stack's cells infra-errors (exit 3,
with a report). The pins are kept for the report.
"""

from __future__ import annotations

import platform
import re
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from stackgate import proc
from stackgate.compat import CompatTable
from stackgate.errors import ConfigError
from stackgate.installer import is_network_failure
from stackgate.model import Stack
from stackgate.plan import requirements
from stackgate.sources import PipConfig, installer_args

if TYPE_CHECKING:
    from stackgate.suite_deps import SuiteDeps

_UNSATISFIABLE = re.compile(r"No solution found|there is no version of|not found in the package registry|"
                            r"no matching distribution", re.I)
_STACK_PIN = re.compile(r"^(torch|triton|pytorch-triton|nvidia-[a-z0-9-]+|cuda-[a-z0-9-]+)(==| @ )", re.I)


@dataclass(frozen=True)
class Resolution:
    stack: Stack
    requirements: tuple[str, ...]
    pins: tuple[str, ...] = ()
    problem: str = ""  # set when the index could not be reached: the stack's cells are infra errors

    @property
    def ok(self) -> bool:
        return not self.problem


_CUDA_RUNTIME = re.compile(r"^nvidia-cuda-runtime(?:-cu[0-9]+)?==([0-9]+)\.([0-9]+)", re.I)


def cuda_of(pins: Sequence[str]) -> str | None:
    """The CUDA version a resolved torch was built for, read from the CUDA runtime wheel it pulls in
    (`nvidia-cuda-runtime==13.2.51` -> "13.2"); None when it pulls in none (a CPU build, or a wheel
    that bundles its libraries)."""
    for pin in pins:
        found = _CUDA_RUNTIME.match(pin)
        if found:
            return f"{found.group(1)}.{found.group(2)}"
    return None


def identity_problem(stack: Stack, pins: Sequence[str], table: CompatTable) -> ConfigError | None:
    """The resolved stack is not the cell's: the compatibility table says one CUDA build and the wheel
    source serves another (PyPI's default torch moved to a newer CUDA). Found before anything is built."""
    found = cuda_of(pins)
    wanted = stack.cuda.cuda_version
    runtime = next((p for p in pins if _CUDA_RUNTIME.match(p)), "")
    if wanted is None and found is None:
        return None
    if wanted is not None and (found is None or found == f"{wanted.major}.{wanted.minor}"):
        return None  # (no runtime wheel: nothing to compare; the identity tests still check the build)
    release = table.release(stack.torch)
    what = f"a CUDA {found} build (it resolves with {runtime})" if found else "a build without CUDA wheels"
    requirement = requirements(table, stack)[0]
    if release is not None and release.pypi_default == stack.cuda:
        return ConfigError(
            f"[torch.\"{release.series}\"] pypi_default = \"{stack.cuda.tag}\", but the wheel source's default "
            f"{requirement} is {what}: the table is stale, and the cell {stack.label} would test another stack",
            path=table.path, line=release.line,
            hint=(f"set pypi_default = \"cu{found.replace('.', '')}\" in that row" if found else "fix that row")
                 + "; `stackgate compat refresh --index URL` derives each release's variants and default from an index")
    return ConfigError(f"{requirement} for {stack.label} resolves to {what}, not {stack.cuda.tag}",
                       path=table.path, line=release.line if release else None,
                       hint="check the wheel source (--index-url / --find-links) and the table's row for this release")


def _causes(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip().startswith(("error:", "cause:", "hint:"))]
    return " / ".join(lines[-6:]) or output.strip()[-600:]


def _compile(stack: Stack, reqs: Sequence[str], constraints: Sequence[str], host: PipConfig,
             env: Mapping[str, str]) -> proc.ProcResult:
    with tempfile.TemporaryDirectory(prefix="stackgate-resolve-") as tmp:
        infile = Path(tmp) / "requirements.in"
        infile.write_text("\n".join(reqs) + "\n")
        argv = [sys.executable, "-m", "uv", "pip", "compile", str(infile), "--python-version",
                stack.python.rstrip("t"), "--python-platform", f"{platform.machine()}-manylinux_2_28", "--no-header",
                "--no-annotate", "--quiet", *installer_args(stack.source, host)]
        if constraints:
            (Path(tmp) / "constraints.txt").write_text("\n".join(constraints) + "\n")
            argv += ["--constraint", str(Path(tmp) / "constraints.txt")]
        return proc.run(argv, env={**env, "UV_PYTHON_DOWNLOADS": "never"}, timeout_s=900)


def _pins(output: str) -> tuple[str, ...]:
    return tuple(line.strip() for line in output.splitlines()
                 if line.strip() and not line.startswith(("#", " ", "$")) and ("==" in line or " @ " in line))


def stack_constraints(pins: Sequence[str]) -> tuple[str, ...]:
    """The pins a suite may not move: torch and what comes with it (CUDA wheels, triton)."""
    return tuple(p for p in pins if _STACK_PIN.match(p))


def resolve_stack(stack: Stack, table: CompatTable, host: PipConfig, env: Mapping[str, str],
                  deps: SuiteDeps | None = None) -> Resolution:
    """The stack alone first; then, when the suite brings requirements, the stack plus the suite with
    the stack's torch family pinned as a constraint. A suite requirement that cannot live with that
    torch is named (exit 2): the stack under test always wins."""
    base = tuple(requirements(table, stack))
    result = _compile(stack, base, (), host, env)
    if not result.ok:
        return _failed(stack, base, result)
    pins = _pins(result.tail)
    wrong = identity_problem(stack, pins, table)
    if wrong is not None:
        raise wrong
    if deps is None or deps.empty:
        return Resolution(stack, base, pins)
    reqs = tuple(requirements(table, stack, deps.install_lines()))
    held = (*stack_constraints(pins), *deps.constraint_lines())
    result = _compile(stack, reqs, held, host, env)
    if result.ok:
        return Resolution(stack, reqs, _pins(result.tail))
    if not _UNSATISFIABLE.search(result.tail) or is_network_failure(result.tail):
        return _failed(stack, reqs, result)
    culprits = []  # each suite requirement alone beside the stack's torch: which one cannot be had?
    for requirement in deps.own_lines():
        alone = _compile(stack, (base[0], requirement), held, host, env)
        if not alone.ok and _UNSATISFIABLE.search(alone.tail):
            culprits.append((requirement, _causes(alone.tail)))
    if culprits:
        named = "; ".join(f"{r!r} ({deps.origin_of(r)})" for r, _ in culprits)
        raise ConfigError(f"the suite's requirement(s) {named} cannot be installed with the stack under test, "
                          f"{base[0]} ({stack.label}): {culprits[0][1]}",
                          hint="the stack's torch (and the CUDA wheels that come with it) always wins: relax or drop "
                               "the requirement; companion packages (torchvision, torchaudio) must be the builds "
                               "made for this torch")
    raise ConfigError(f"the suite's requirements cannot be resolved together with {base[0]} ({stack.label}): "
                      f"{_causes(result.tail)}", hint=f"read from: {', '.join(deps.sources) or 'the flags'}")


def _failed(stack: Stack, reqs: Sequence[str], result: proc.ProcResult) -> Resolution:
    if _UNSATISFIABLE.search(result.tail) and not is_network_failure(result.tail):
        raise ConfigError(f"the requirements of {stack.label} cannot be resolved: {_causes(result.tail)}",
                          hint=f"check the version ({' '.join(reqs)}) against what the wheel source offers "
                               "(`uv pip compile`); see --index-url / --find-links")
    return Resolution(stack, tuple(reqs), problem=f"resolving {' '.join(reqs)} failed (exit {result.returncode}, "
                                                  f"index unreachable?): {_causes(result.tail)}")


def resolve_all(stacks: Sequence[Stack], table: CompatTable, host: PipConfig,
                env: Mapping[str, str], deps: SuiteDeps | None = None) -> dict[str, Resolution]:
    """By stack content hash. Raises ConfigError on the first stack that cannot exist."""
    out = {}
    for stack in stacks:
        if stack.given:  # an interpreter or image the team has: nothing of it is resolved or installed
            continue
        if stack.content_hash not in out:
            out[stack.content_hash] = resolve_stack(stack, table, host, env, deps)
    return out
