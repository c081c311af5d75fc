"""The `venv` backend: one virtualenv per stack (uv), cached by a content hash of what went in.
Multi-node cells run one pytest process per node on this host, meeting over c10d on loopback."""

from __future__ import annotations

import base64
import csv
import dataclasses
import hashlib
import json
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from stackgate import proc
from stackgate.backends.base import (
    TORCH_PROBE,
    Described,
    EnvHandle,
    Execution,
    PrepareFailed,
    Sbom,
    checked_once,
    free_port,
    freeze_lines,
    torch_probe_problem,
)
from stackgate.compat import CompatTable
from stackgate.errors import InfraError
from stackgate.installer import cache_lock, cached_dir, is_disk_full, is_network_failure
from stackgate.masking import node_base
from stackgate.model import Stack
from stackgate.plan import requirements
from stackgate.rundir.layout import CellDir
from stackgate.shipped import BUNDLED_SUITE
from stackgate.sources import PipConfig, installer_args
from stackgate.suite import Layout, NodeCommand, NodeExit
from stackgate.suite_deps import SuiteDeps

MARKER = "stackgate-env.json"
CHECKED = "stackgate-checked.json"  # the interpreter that last imported the stack's torch: `interpreter_problem`
# a process killed with signal 9 whose output says memory ran out (the kernel's OOM killer leaves no
# other trace a process group can see)
_KILLED_FOR_MEMORY = re.compile(r"(^Killed$|OutOfMemoryError|CUDA out of memory|std::bad_alloc|MemoryError)")
LAYOUT = 2  # bump when the way environments are built changes (2: bytecode compiled at build time)


ATTEMPT = "STACKGATE_ATTEMPT"  # marks the processes of one attempt (`Execution.tag`)


class VenvBackend:
    name = "venv"
    runs_plain = True

    def __init__(self, cache_dir: Path, compat: CompatTable, host_pip: PipConfig, env: Mapping[str, str],
                 *, deps: SuiteDeps | None = None, say: Callable[[str], None] | None = None) -> None:
        self.say = say or (lambda _: None)
        self.cache_dir = cache_dir / "envs"
        self.compat = compat
        self.host_pip = host_pip
        self.env = dict(env)
        self.deps = deps or SuiteDeps()

    # ------------------------------------------------------------------------------------ prepare
    def key(self, stack: Stack, reqs: list[str]) -> str:
        """What goes into the venv, as Docker's image_key: the stack's channel is a label (production's
        2.13.0+cpu and a stable candidate of 2.13.0+cpu are one environment), not content."""
        content = {k: v for k, v in stack.to_json().items() if k != "channel"}
        blob = json.dumps({"stack": content, "requirements": reqs, "layout": LAYOUT,
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
        with cache_lock(root):
            return self._prepare_locked(stack, root, key, reqs, start, log_path)

    def _prepare_locked(self, stack: Stack, root: Path, key: str, reqs: list[str], start: float,
                        log_path: Path) -> EnvHandle:
        python = root / "bin" / "python"
        marker = root / MARKER
        if marker.exists() or python.exists() or python.is_symlink():
            damage = damaged_files(root) if marker.exists() else []
            broken = ("; ".join(map(str, damage)) or interpreter_problem(root, stack) if marker.exists()
                      else "it was never finished (no marker file)")
            if not broken:
                try:
                    sbom = json.loads(marker.read_text())
                    return EnvHandle(stack, str(python), key, reused=True, prepare_s=time.monotonic() - start,
                                     sbom=sbom)
                except (OSError, ValueError) as exc:
                    broken = f"{MARKER} cannot be read: {exc}"
            self._discard(root, broken, sorted({d.package for d in damage}), log_path)
            try:
                handle = self._build(stack, root, key, reqs, start, log_path)
            except PrepareFailed as exc:  # it was built before: what fails now is the machinery
                raise InfraError(f"the cached environment for {stack.label} was broken ({broken[:300]}) and "
                                 f"rebuilding it failed: {exc}", hint=exc.log_tail[-800:]) from None
        else:
            handle = self._build(stack, root, key, reqs, start, log_path)
        # built just now: its files must match what the installer recorded, or the machinery (disk, installer,
        # cache) failed; whether torch imports is the suite's question about the stack, not checked here
        broken = record_problems(root)
        if broken:
            raise InfraError(f"the environment for {stack.label} is broken right after it was built: {broken}",
                             hint=f"check the disk and the installer's cache (`uv cache clean`); log: {log_path}")
        return handle

    def _discard(self, root: Path, broken: str, packages: Sequence[str], log_path: Path) -> None:
        """A cached environment that fails its check is removed, and what uv's cache holds of the
        damaged packages is evicted first: uv hard-links installed files to its cache, so a damaged
        file would come straight back (and is in every other environment built from that cache)."""
        with log_path.open("a") as log:
            log.write(f"[stackgate] cached environment {root} is broken: {broken}; rebuilding it\n")
        if packages:
            proc.run([sys.executable, "-m", "uv", "cache", "clean", *packages], env=self.env, timeout_s=600,
                     log_path=log_path)
        shutil.rmtree(root, ignore_errors=True)
        if root.exists():
            raise InfraError(f"cannot remove the broken environment {root}", hint="check its permissions and the disk")
        self.say(f"  cached environment {root.name} is broken ({broken[:300]}): rebuilt"
                 + (f"; evicted {', '.join(packages)} from uv's cache" if packages else ""))

    def _build(self, stack: Stack, root: Path, key: str, reqs: list[str], start: float,
               log_path: Path) -> EnvHandle:
        python = root / "bin" / "python"
        uv = [sys.executable, "-m", "uv"]
        constraints: list[str] = []
        if self.deps.constraints:  # the suite's own constraints hold at install time too
            held = root.with_name(f"{root.name}.constraints.txt")
            held.parent.mkdir(parents=True, exist_ok=True)
            held.write_text("\n".join(self.deps.constraint_lines()) + "\n")
            constraints = ["--constraint", str(held)]
        with cached_dir(root, self.say) as staging:
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
                    if is_network_failure(result.tail):
                        raise InfraError(f"installing {stack.label} failed: an index could not be reached",
                                         hint=result.tail[-800:])
                    if is_disk_full(result.tail):
                        raise InfraError(f"installing {stack.label} failed: the disk is full under {self.cache_dir}",
                                         hint="free space, or pass --cache-dir on a larger disk")
                    raise PrepareFailed(f"installing {stack.label} failed (exit {result.returncode})", result.tail)
            freeze = proc.capture([*uv, "pip", "freeze", "--python", str(staging / "bin" / "python")], env=env)
            sbom = Sbom(key=key, requirements=reqs, packages=freeze_lines(freeze), python=stack.python, kind="venv",
                        created=time.time())
            (staging / MARKER).write_text(json.dumps(sbom, indent=1))
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
        extra = self.node_env(handle)
        exits: list[NodeExit | None] = [None] * len(commands)

        def node(i: int, command: NodeCommand) -> None:
            env = {**node_base(self.env), **command.env}  # an allow-list: no host secret reaches the suite
            env.update({**extra, "PATH": extra["PATH"] + os.pathsep + env.get("PATH", "")})
            if not exe.plain:  # the fidelity rerun carries no variable of stackgate's, its marker neither
                env[ATTEMPT] = exe.tag
            try:
                result = proc.run(command.argv, env=env, cwd=command.cwd,
                                  timeout_s=max(deadline - time.monotonic(), 1),
                                  on_line=exe.on_line if command.node == 0 else None,
                                  log_path=CellDir(exe.workdir).node_log(command.node))
            except OSError as exc:  # never a thread's traceback: the node did not run, and says why
                exits[i] = NodeExit(command.node, command.argv[0], -1,
                                    tail=f"[stackgate] node {command.node} could not start: [Errno {exc.errno}] "
                                         f"{exc.strerror}")
                return
            killed = result.returncode in (-9, 137)
            exits[i] = NodeExit(command.node, command.argv[0], result.returncode, result.timed_out,
                                oom_killed=killed and bool(_KILLED_FOR_MEMORY.search(result.tail)),
                                duration_s=result.duration_s, tail=result.tail)

        threads = [threading.Thread(target=node, args=(i, c), daemon=True) for i, c in enumerate(commands)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        done = [e for e in exits if e is not None]
        if commands and done:  # what the suite started and left running (a daemon in a session of its own)
            # this attempt's own: another attempt of the same cell may be running beside it (concurrent pairs)
            names = ("STACKGATE_RUN_ID", "STACKGATE_RUN_KEY", "STACKGATE_CELL")
            marks = {k: commands[0].env[k] for k in names if k in commands[0].env}
            ended = proc.end_marked({**marks, ATTEMPT: exe.tag}) if len(marks) == len(names) else []
            if ended:
                done[0] = dataclasses.replace(done[0], leftovers=tuple(f"pid {pid}: {cmd}" for pid, cmd in ended))
        return tuple(done)

    def node_env(self, handle: EnvHandle) -> dict[str, str]:
        """What a node's environment gets from the stack's environment: its bin directory first on PATH."""
        venv_bin = str(Path(handle.ref).parent)
        return {"PATH": venv_bin, "VIRTUAL_ENV": str(Path(venv_bin).parent)}

    def describe(self, handle: EnvHandle) -> Described:
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


CHECK_TIMEOUT_S = 300.0


def check_env(root: Path, stack: Stack) -> str:
    """Why a cached environment cannot be reused ("" when it can). Cheap enough to run on every reuse
    (measured on the 5 GB torch 2.14.1 venv here: about 1 s for the files): every file of site-packages
    that a RECORD lists exists with its recorded size, every `.py` file also has its recorded sha256 (the
    compiled libraries are checked by size only: hashing them would read gigabytes), and the interpreter
    runs and imports torch at the stack's version (4-10 s on a slow runner, so only when the interpreter
    is not the one that last did: `interpreter_problem`)."""
    return record_problems(root) or interpreter_problem(root, stack)


def interpreter_problem(root: Path, stack: Stack) -> str:
    """Why the environment's interpreter does not import the stack's torch ("" when it does). The
    import runs when the interpreter it depends on outside site-packages (the venv's `bin/python`, what
    it resolves to, pyvenv.cfg) is not, by path, inode, size and mtime, the one recorded in CHECKED by the
    last import that succeeded: with site-packages matching its RECORD files (checked first, every
    time), the same files give the same import. A change of the host's system libraries is not seen."""
    python = root / "bin" / "python"
    facts = _interpreter_facts(root, stack)

    def imports() -> str:
        try:
            result = proc.run([str(python), "-c", TORCH_PROBE], timeout_s=CHECK_TIMEOUT_S,
                              env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"})
        except (InfraError, OSError) as exc:
            return f"its interpreter {python} cannot start: {exc}"
        return torch_probe_problem(stack, None if result.timed_out else result.returncode, result.tail)

    return checked_once(root / CHECKED if facts is not None else None, json.dumps(facts), imports)


def _interpreter_facts(root: Path, stack: Stack) -> list[object] | None:
    """The stack's torch and, for the venv's `bin/python`, the interpreter it resolves to and pyvenv.cfg:
    path, mode, inode, size and mtime. None when one cannot be read."""
    python = root / "bin" / "python"
    try:
        paths = (python, python.resolve(strict=True), root / "pyvenv.cfg")
        return [stack.torch_public, *([str(p), *_stat_row(p.lstat())] for p in paths)]
    except (OSError, RuntimeError):
        return None


def _stat_row(st: os.stat_result) -> list[int]:
    return [st.st_mode, st.st_ino, st.st_size, st.st_mtime_ns]


@dataclass(frozen=True)
class Damage:
    """An installed file that does not match its RECORD, and the package it belongs to."""

    path: str
    why: str
    package: str

    def __str__(self) -> str:
        return f"{self.path}: {self.why} (package {self.package})"


def record_problems(root: Path) -> str:
    """The first installed files that do not match their RECORD, as one line: "" when all match."""
    return "; ".join(map(str, damaged_files(root)))


def damaged_files(root: Path, limit: int = 5) -> list[Damage]:
    """The first `limit` installed files of site-packages that do not match their RECORD (size; sha256
    for `.py`)."""
    found: list[Damage] = []
    for site in root.glob("lib/python*/site-packages"):
        for record in sorted(site.glob("*.dist-info/RECORD")):
            package = record.parent.name.removesuffix(".dist-info").rsplit("-", 1)[0]
            try:
                rows = list(csv.reader(record.read_text(encoding="utf-8").splitlines()))
            except (OSError, UnicodeDecodeError) as exc:
                found.append(Damage(str(record), f"unreadable ({exc})", package))
                continue
            for row in rows:
                if len(row) < 3 or not row[1] or not row[2] or row[0].startswith(".."):
                    continue  # (scripts outside site-packages are rewritten when the venv is moved into place)
                path = site / row[0]
                try:
                    size = path.stat().st_size
                    if size != int(row[2]):
                        found.append(Damage(row[0], f"{size} bytes, RECORD says {row[2]}", package))
                    elif row[0].endswith(".py") and _sha256(path) != row[1].removeprefix("sha256="):
                        found.append(Damage(row[0], "sha256 differs from RECORD", package))
                except FileNotFoundError:
                    found.append(Damage(row[0], "missing", package))
                except (OSError, ValueError) as exc:
                    found.append(Damage(row[0], str(exc), package))
                if len(found) >= limit:
                    return found
    return found


def _sha256(path: Path) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()
