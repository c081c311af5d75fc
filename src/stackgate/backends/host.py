"""The `host` backend: a stack that is an interpreter the team already has (`--candidate-python`,
`--production-python`: a machine image's Python, a conda env, a venv made by hand, a GPU machine's
preinstalled torch). It is probed and never modified: nothing is installed into it.

What the suite needs beyond what the interpreter holds (pytest, numpy, the suite's own requirements)
is resolved against the interpreter with every distribution it holds as a constraint, and only what
it lacks goes into a prefix of its own in the cache, put on PYTHONPATH for the suite: no package of
the prefix can stand in for one of the stack's. Nodes run as with the venv backend: one process
group per node on this host."""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from stackgate import given, proc
from stackgate.backends.base import Described, EnvHandle, PrepareFailed, Sbom
from stackgate.backends.venv import VenvBackend
from stackgate.errors import ConfigError, InfraError
from stackgate.installer import cache_lock, cached_dir, is_network_failure
from stackgate.model import Stack
from stackgate.sources import installer_args
from stackgate.suite_deps import SuiteDeps

PREFIX_MARKER = "stackgate-prefix.json"


def _name(requirement: str) -> str:
    head = requirement.split(" @ ", 1)[0].split(";", 1)[0]
    for sep in ("==", ">=", "<=", "~=", "!=", ">", "<", "["):
        head = head.split(sep, 1)[0]
    return str(canonicalize_name(head.strip()))


def satisfied(wanted: Sequence[str], held: Sequence[str]) -> bool:
    """Whether the interpreter already holds every requirement (then nothing is resolved: a lent GPU
    machine with torch and pytest preinstalled needs no package index)."""
    versions = {_name(p): p.partition("==")[2] for p in held}
    for line in wanted:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            return False
        name = str(canonicalize_name(req.name))
        if req.url or name not in versions or not req.specifier.contains(versions[name], prereleases=True):
            return False
    return True


def lacking(pins: tuple[str, ...], held: tuple[str, ...]) -> tuple[str, ...]:
    """The resolved pins whose project the interpreter does not hold at all."""
    have = {_name(p) for p in held}
    return tuple(p for p in pins if _name(p) not in have)


def suite_prefix(cache_dir: Path, deps: SuiteDeps, probed: given.Probed, target: Sequence[str],
                 index: Sequence[str], env: Mapping[str, str], log_path: Path,
                 say: Callable[[str], None]) -> Path | None:
    """What the suite needs and the given stack lacks, resolved with everything the stack holds as a
    constraint and installed (only those, no dependencies beyond the resolution) into a cached prefix
    for the suite's PYTHONPATH; None when the stack lacks nothing (no index is asked then). `target`:
    `--python PATH` (an interpreter here), or `--python-version`/`--python-platform` (an image's)."""
    wanted = deps.install_lines()
    if satisfied(wanted, probed.packages):
        return None
    uv = [sys.executable, "-m", "uv"]
    env = {**env, "UV_PYTHON_DOWNLOADS": "never"}
    with tempfile.TemporaryDirectory(prefix="stackgate-given-") as tmp:
        (Path(tmp) / "requirements.in").write_text("\n".join(wanted) + "\n")
        (Path(tmp) / "constraints.txt").write_text("\n".join((*probed.packages, *deps.constraint_lines())) + "\n")
        result = proc.run([*uv, "pip", "compile", str(Path(tmp) / "requirements.in"), *target,
                           "--constraint", str(Path(tmp) / "constraints.txt"), "--no-header", "--no-annotate",
                           "--quiet", *index], env=env, timeout_s=900, log_path=log_path)
    if not result.ok:
        if is_network_failure(result.tail):
            raise InfraError(f"resolving the suite's requirements for {probed.ref} failed: an index could not be "
                             "reached", hint=result.tail[-800:])
        raise PrepareFailed(f"the suite's requirements ({' '.join(wanted)}) cannot be resolved with what "
                            f"{probed.ref} holds (nothing of it may change)", result.tail)
    pins = tuple(line.strip() for line in result.tail.splitlines()
                 if line.strip() and not line.startswith(("#", " ")) and ("==" in line or " @ " in line))
    missing = lacking(pins, probed.packages)
    if not missing:
        return None
    digest = hashlib.sha256(json.dumps([probed.ref, list(target), list(missing)]).encode()).hexdigest()[:16]
    prefix = cache_dir / f"given-prefix-{digest}"
    prefix.parent.mkdir(parents=True, exist_ok=True)
    with cache_lock(prefix):
        if (prefix / PREFIX_MARKER).exists():
            return prefix
        say(f"  the suite's requirements {probed.ref} lacks, into {prefix.name}: {' '.join(missing)}")
        with cached_dir(prefix, say) as staging:
            installed = proc.run([*uv, "pip", "install", "--target", str(staging), *target, "--no-deps", *index,
                                  *missing], env=env, timeout_s=1800, log_path=log_path)
            if not installed.ok:
                raise InfraError(f"installing the suite's requirements into {prefix} failed "
                                 f"(exit {installed.returncode})", hint=installed.tail[-800:])
            (staging / PREFIX_MARKER).write_text(json.dumps({"for": probed.ref, "installed": missing}))
    return prefix


class HostBackend(VenvBackend):
    name = "host"

    def prepare(self, stack: Stack, log_path: Path) -> EnvHandle:
        start = time.monotonic()
        python = Path(stack.given.removeprefix(f"{given.HOST}:"))
        try:
            probed = given.probe_host(python)
        except ConfigError as exc:  # it answered when the run started: what fails now is the machine
            raise InfraError(f"the host stack {python} no longer answers its probe: {exc}") from None
        if probed.torch != stack.torch or probed.cuda != stack.cuda:
            raise InfraError(f"the host stack {python} changed while the run went on: it holds torch {probed.torch} "
                             f"({probed.cuda.tag}), the run started with {stack.torch} ({stack.cuda.tag})")
        prefix = suite_prefix(self.cache_dir, self.deps, probed, ["--python", str(python)],
                              installer_args(stack.source, self.host_pip), self.env, log_path, self.say)
        key = hashlib.sha256(json.dumps([str(python), list(probed.packages), str(prefix or "")]).encode()).hexdigest()
        sbom = Sbom(kind="host", key=key[:16], packages=list(probed.packages), python=str(python), created=time.time(),
                    in_venv=probed.venv)
        if prefix is not None:
            sbom["suite_prefix"] = str(prefix)
        return EnvHandle(stack, str(python), key[:16], reused=True, prepare_s=time.monotonic() - start, sbom=sbom)

    def node_env(self, handle: EnvHandle) -> dict[str, str]:
        """PATH starts with the interpreter's directory; the suite's prefix (if any) is on PYTHONPATH;
        VIRTUAL_ENV only when the interpreter is a venv's."""
        bindir = str(Path(handle.ref).parent)
        env = {"PATH": bindir}
        if handle.sbom.get("in_venv"):
            env["VIRTUAL_ENV"] = str(Path(bindir).parent)
        if handle.sbom.get("suite_prefix"):
            env["PYTHONPATH"] = handle.sbom["suite_prefix"]
        return env

    def describe(self, handle: EnvHandle) -> Described:
        return {"backend": "host", "env_key": handle.key, "interpreter": handle.ref}
