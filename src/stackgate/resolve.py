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

from stackgate import proc
from stackgate.compat import CompatTable
from stackgate.errors import ConfigError
from stackgate.model import Stack
from stackgate.plan import SUITE_REQUIREMENTS, requirements
from stackgate.sources import PipConfig, installer_args

_NETWORK = re.compile(r"Failed to fetch|error sending request|tcp connect error|Connection refused|timed out|"
                      r"Temporary failure in name resolution|NewConnectionError|ConnectTimeoutError|"
                      r"Network is unreachable|Could not fetch URL", re.I)
_UNSATISFIABLE = re.compile(r"No solution found|there is no version of|not found in the package registry|"
                            r"no matching distribution", re.I)


@dataclass(frozen=True)
class Resolution:
    stack: Stack
    requirements: tuple[str, ...]
    pins: tuple[str, ...] = ()
    problem: str = ""  # set when the index could not be reached: the stack's cells are infra errors

    @property
    def ok(self) -> bool:
        return not self.problem


def is_network_failure(output: str) -> bool:
    """An installer's output says it could not reach an index: the machinery failed, not the stack.
    Both backends classify install failures with this."""
    return bool(_NETWORK.search(output))


def _causes(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip().startswith(("error:", "cause:", "hint:"))]
    return " / ".join(lines[-6:]) or output.strip()[-600:]


def resolve_stack(stack: Stack, table: CompatTable, host: PipConfig, env: Mapping[str, str],
                  suite_requirements: Sequence[str] = SUITE_REQUIREMENTS) -> Resolution:
    reqs = tuple(requirements(table, stack, suite_requirements))
    with tempfile.TemporaryDirectory(prefix="stackgate-resolve-") as tmp:
        infile = Path(tmp) / "requirements.in"
        infile.write_text("\n".join(reqs) + "\n")
        argv = [sys.executable, "-m", "uv", "pip", "compile", str(infile), "--python-version",
                stack.python.rstrip("t"), "--python-platform", f"{platform.machine()}-manylinux_2_28", "--no-header",
                "--no-annotate", "--quiet", *installer_args(stack.source, host)]
        result = proc.run(argv, env={**env, "UV_PYTHON_DOWNLOADS": "never"}, timeout_s=900)
    if result.ok:
        pins = tuple(line.strip() for line in result.tail.splitlines()
                     if line.strip() and not line.startswith(("#", " ", "$")) and "==" in line)
        return Resolution(stack, reqs, pins)
    if _UNSATISFIABLE.search(result.tail) and not is_network_failure(result.tail):
        raise ConfigError(f"the requirements of {stack.label} cannot be resolved: {_causes(result.tail)}",
                          hint=f"check the version ({' '.join(reqs)}) against what the wheel source offers "
                               "(`uv pip compile`); see --index-url / --find-links")
    return Resolution(stack, reqs, problem=f"resolving {' '.join(reqs)} failed (exit {result.returncode}, "
                                           f"index unreachable?): {_causes(result.tail)}")


def resolve_all(stacks: Sequence[Stack], table: CompatTable, host: PipConfig,
                env: Mapping[str, str]) -> dict[str, Resolution]:
    """By stack content hash. Raises ConfigError on the first stack that cannot exist."""
    out = {}
    for stack in stacks:
        if stack.content_hash not in out:
            out[stack.content_hash] = resolve_stack(stack, table, host, env)
    return out
