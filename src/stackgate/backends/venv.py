"""The `venv` backend: one virtualenv per stack (uv), cached by a content hash of what went in.
Multi-node cells run one pytest process per node on this host, meeting over c10d on loopback."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from filelock import FileLock

from stackgate import proc
from stackgate.backends.base import EnvHandle, Execution, PrepareFailed, free_port
from stackgate.bundled import BUNDLED_SUITE
from stackgate.compat import CompatTable
from stackgate.errors import InfraError
from stackgate.model import Stack
from stackgate.plan import requirements
from stackgate.resolve import is_network_failure
from stackgate.sources import PipConfig, installer_args
from stackgate.suite import Layout, NodeCommand, NodeExit
from stackgate.suite_deps import SuiteDeps

MARKER = "stackgate-env.json"
# a process killed with signal 9 whose output says memory ran out (the kernel's OOM killer leaves no
# other trace a process group can see)
_KILLED_FOR_MEMORY = re.compile(r"(^Killed$|OutOfMemoryError|CUDA out of memory|std::bad_alloc|MemoryError)")
LAYOUT = 2  # bump when the way environments are built changes (2: bytecode compiled at build time)


class VenvBackend:
    name = "venv"

    def __init__(self, cache_dir: Path, compat: CompatTable, host_pip: PipConfig, env: Mapping[str, str],
                 *, deps: SuiteDeps | None = None) -> None:
        self.cache_dir = cache_dir / "envs"
        self.compat = compat
        self.host_pip = host_pip
        self.env = dict(env)
        self.deps = deps or SuiteDeps()

    # ------------------------------------------------------------------------------------ prepare
    def key(self, stack: Stack, reqs: list[str]) -> str:
        blob = json.dumps({"stack": stack.to_json(), "requirements": reqs, "layout": LAYOUT,
                           "constraints": list(self.deps.constraint_lines()),
                           "projects": [b.digest for b in self.deps.built],
                           "installer": installer_args(stack.source, self.host_pip)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def root_for(self, stack: Stack) -> tuple[Path, str, list[str]]:
        """Where the stack's venv lives (built or not), its key, and what it installs."""
        reqs = requirements(self.compat, stack, self.deps.install_lines())
        key = self.key(stack, reqs)
        return self.cache_dir / f"{stack.label}-{key}", key, reqs

    def prepare(self, stack: Stack, log_path: Path) -> EnvHandle:
        start = time.monotonic()
        root, key, reqs = self.root_for(stack)
        root.parent.mkdir(parents=True, exist_ok=True)
        # concurrent runs sharing a cache: one builds, the others wait and then reuse
        with FileLock(str(root.with_name(root.name + ".lock"))):
            return self._prepare_locked(stack, root, key, reqs, start, log_path)

    def _prepare_locked(self, stack: Stack, root: Path, key: str, reqs: list[str], start: float,
                        log_path: Path) -> EnvHandle:
        python = root / "bin" / "python"
        marker = root / MARKER
        if marker.exists() and python.exists():
            sbom = json.loads(marker.read_text())
            return EnvHandle(stack, str(python), key, reused=True, prepare_s=time.monotonic() - start, sbom=sbom)
        staging = root.with_name(f"{root.name}.partial-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        staging.parent.mkdir(parents=True, exist_ok=True)
        uv = [sys.executable, "-m", "uv"]
        constraints: list[str] = []
        if self.deps.constraints:  # the suite's own constraints hold at install time too
            held = root.with_name(f"{root.name}.constraints.txt")
            held.write_text("\n".join(self.deps.constraint_lines()) + "\n")
            constraints = ["--constraint", str(held)]
        steps = [
            [*uv, "venv", "--quiet", "--python", stack.python, str(staging)],
            # bytecode compiled once, into the cache: every rank of every test imports torch
            [*uv, "pip", "install", "--compile-bytecode", "--python", str(staging / "bin" / "python"),
             *installer_args(stack.source, self.host_pip), *constraints, *reqs],
        ]
        env = {**self.env, "UV_PYTHON_DOWNLOADS": "never", "VIRTUAL_ENV": str(staging)}
        for argv in steps:
            result = proc.run(argv, env=env, timeout_s=3600, log_path=log_path)
            if not result.ok:
                shutil.rmtree(staging, ignore_errors=True)
                if is_network_failure(result.tail):
                    raise InfraError(f"installing {stack.label} failed: an index could not be reached",
                                     hint=result.tail[-800:])
                raise PrepareFailed(f"installing {stack.label} failed (exit {result.returncode})", result.tail)
        freeze = proc.capture([*uv, "pip", "freeze", "--python", str(staging / "bin" / "python")], env=env)
        sbom = {"key": key, "requirements": reqs, "packages": freeze.split(),
                "python": stack.python, "kind": "venv", "created": time.time()}
        (staging / MARKER).write_text(json.dumps(sbom, indent=1))
        shutil.rmtree(root, ignore_errors=True)
        staging.rename(root)
        _fix_activation_paths(root, staging)
        return EnvHandle(stack, str(python), key, reused=False, prepare_s=time.monotonic() - start, sbom=sbom)

    # ---------------------------------------------------------------------------------------- run
    def layout(self, handle: EnvHandle, exe: Execution) -> Layout:
        """Nodes are processes on this host: every path is the host's own."""
        endpoint = f"127.0.0.1:{free_port()}" if exe.cell.topology.nodes > 1 else ""
        return Layout(python=handle.ref, out=exe.workdir, artifacts=exe.artifacts, shared=exe.shared,
                      suite=exe.suite, bundled=BUNDLED_SUITE, endpoint=endpoint)

    def execute(self, handle: EnvHandle, commands: Sequence[NodeCommand], deadline: float,
                exe: Execution) -> tuple[NodeExit, ...]:
        """One process group per node, all at once, in the venv."""
        venv_bin = str(Path(handle.ref).parent)
        exits: list[NodeExit | None] = [None] * len(commands)

        def node(i: int, command: NodeCommand) -> None:
            env = {**self.env, **command.env}
            env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
            env["VIRTUAL_ENV"] = str(Path(venv_bin).parent)
            result = proc.run(command.argv, env=env, cwd=command.cwd, timeout_s=max(deadline - time.monotonic(), 1),
                              on_line=exe.on_line if command.node == 0 else None,
                              log_path=exe.workdir / f"node{command.node}.log")
            killed = result.returncode in (-9, 137)
            exits[i] = NodeExit(command.node, command.argv[0], result.returncode, result.timed_out,
                                oom_killed=killed and bool(_KILLED_FOR_MEMORY.search(result.tail)),
                                duration_s=result.duration_s, tail=result.tail)

        threads = [threading.Thread(target=node, args=(i, c), daemon=True) for i, c in enumerate(commands)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return tuple(e for e in exits if e is not None)

    def describe(self, handle: EnvHandle) -> dict[str, Any]:
        return {"backend": "venv", "env_key": handle.key}

    def close(self) -> None:
        return None


def _fix_activation_paths(root: Path, staging: Path) -> None:
    """Scripts written by the installer name the staging path; point them at the final one."""
    old, new = str(staging), str(root)
    for script in (root / "bin").iterdir():
        if not script.is_file() or script.is_symlink():
            continue
        try:
            text = script.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        if old in text:
            script.write_text(text.replace(old, new))
    cfg = root / "pyvenv.cfg"
    if cfg.exists():
        cfg.write_text(cfg.read_text().replace(old, new))
