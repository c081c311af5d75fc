"""The one boundary for subprocesses: log the command, apply a timeout, escalate
interrupt -> terminate -> kill on the whole process group, keep the output tail."""

from __future__ import annotations

import collections
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from stackgate.errors import InfraError

TAIL_LINES = 200
# A log file keeps the head and the tail of what a process printed (README "Contract"): the first
# LOG_HEAD_BYTES, then a line saying how much was left out, then the last LOG_TAIL_BYTES. Lines longer
# than LINE_BYTES arrive in pieces of that size.
LOG_HEAD_BYTES = 8 << 20
LOG_TAIL_BYTES = 2 << 20
LINE_BYTES = 64 << 10


class CappedLog:
    """The head and the tail of a process's output, in a file. A file that cannot be written (a full
    disk) never stops the process or its reader: the first error is kept in `error` (and said by
    `problem`), and nothing more is written."""

    def __init__(self, path: Path, argv: Sequence[str] = ()) -> None:
        self.path = path
        self.error: OSError | None = None
        self.fh: TextIO | None = None
        self.written = 0
        self.omitted = 0
        self.tail: collections.deque[str] = collections.deque()
        self.tail_bytes = 0
        try:
            self.fh = path.open("a", encoding="utf-8", errors="replace")
        except OSError as exc:
            self.error = exc
        if argv:
            self._put(f"$ {shlex.join(argv)}\n", flush=True)

    def _put(self, text: str, flush: bool = False) -> None:
        if self.fh is None or self.error is not None:
            return
        try:
            self.fh.write(text)
            if flush:
                self.fh.flush()
        except OSError as exc:
            self.error = exc

    @property
    def problem(self) -> str:
        """"" when every line was written, else why not (a line `installer.is_disk_full` reads)."""
        if self.error is None:
            return ""
        return f"[stackgate] cannot write the log {self.path}: [Errno {self.error.errno}] {self.error.strerror}"

    def write(self, line: str) -> None:
        size = len(line) + 1
        if self.written + size <= LOG_HEAD_BYTES and not self.tail:
            self._put(line + "\n")
            self.written += size
            return
        self.tail.append(line)
        self.tail_bytes += size
        while self.tail_bytes > LOG_TAIL_BYTES and self.tail:
            dropped = self.tail.popleft()
            self.tail_bytes -= len(dropped) + 1
            self.omitted += len(dropped) + 1

    def close(self) -> None:
        if self.omitted:
            self._put(f"[stackgate] {self.omitted} bytes of output left out here (a log keeps its first "
                      f"{LOG_HEAD_BYTES} and last {LOG_TAIL_BYTES} bytes)\n")
        for line in self.tail:
            self._put(line + "\n")
        if self.fh is not None:
            try:
                self.fh.close()
            except OSError as exc:  # the buffered rest did not fit
                self.error = self.error or exc


_LIVE: set[subprocess.Popen[str]] = set()  # every process group started by `run` and not yet reaped
_LIVE_LOCK = threading.Lock()
# set while an interrupt unwinds attempts made beside the main thread (pairs taken at the same time):
# their processes are stopped (`stop_all`), their containers removed, and they record nothing
STOPPING = threading.Event()


@dataclass(frozen=True)
class ProcResult:
    argv: tuple[str, ...]
    returncode: int
    timed_out: bool
    duration_s: float
    tail: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout_s: float | None = None,
    on_line: Callable[[str], None] | None = None,
    log_path: Path | None = None,
    grace_s: float = 10.0,
) -> ProcResult:
    """Run `argv` in its own process group, streaming lines to `on_line` and `log_path`."""
    start = time.monotonic()
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    log = CappedLog(log_path, argv) if log_path else None
    try:
        proc = subprocess.Popen(
            list(argv), env=dict(env) if env is not None else None, cwd=cwd,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            text=True, errors="replace", bufsize=1, start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise InfraError(f"cannot start {argv[0]}: {exc.strerror}", hint="is it installed and on PATH?") from None

    def pump() -> None:
        assert proc.stdout is not None
        for raw in iter(lambda: proc.stdout.readline(LINE_BYTES), ""):  # type: ignore[union-attr]
            line = raw.rstrip("\n")
            tail.append(line)
            if log:
                log.write(line)
            if on_line:
                on_line(line)

    with _LIVE_LOCK:
        _LIVE.add(proc)
    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        tail.append(f"[stackgate] timeout after {timeout_s:.0f}s: interrupting process group")
        stop_group(proc, grace_s)
    except KeyboardInterrupt:
        stop_group(proc, grace_s)
        raise
    finally:
        with _LIVE_LOCK:
            _LIVE.discard(proc)
        reader.join(timeout=5)
        if proc.stdout is not None:
            proc.stdout.close()
        if log:
            log.close()
            if log.problem:
                tail.append(log.problem)
    return ProcResult(tuple(argv), proc.returncode, timed_out, time.monotonic() - start, "\n".join(tail))


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc), including those that started sessions of their own
    (torchrun and its ranks do), so that stopping a suite leaves nothing behind."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _signal_tree(pids: list[int], sig: signal.Signals) -> None:
    for target in pids:
        for kill in (os.killpg, os.kill):
            try:
                kill(target, sig)
            except (ProcessLookupError, PermissionError):
                continue


def stop_group(proc: subprocess.Popen[str], grace_s: float) -> None:
    """SIGINT, then SIGTERM, then SIGKILL to the process's group and to every descendant and its
    group (torchrun starts a session of its own), each after `grace_s`. Descendants are remembered
    across rounds: once their parent dies they are orphans that /proc no longer links to it."""
    known: set[int] = set()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        known.update(descendants(proc.pid))
        alive = [pid for pid in known if _alive(pid)]
        if proc.poll() is not None and not alive:
            return
        _signal_tree([proc.pid, *alive], sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            known.update(descendants(proc.pid))
            if proc.poll() is not None and not any(_alive(pid) for pid in known):
                return
            time.sleep(0.1)


def stop_all(grace_s: float = 5.0) -> int:
    """Stop every process tree `run` started that is still alive (on Ctrl-C / SIGTERM, from the main
    thread, while worker threads wait on them). Returns how many were stopped."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    threads = [threading.Thread(target=stop_group, args=(p, grace_s), daemon=True) for p in live]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=4 * grace_s)
    return len(live)


def capture(argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout_s: float = 60) -> str:
    """Run a short query command and return its stdout; raise InfraError on failure."""
    try:
        proc = subprocess.run(list(argv), env=dict(env) if env is not None else None, capture_output=True,
                              text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InfraError(f"{shlex.join(argv)} failed: {exc}") from None
    if proc.returncode != 0:
        raise InfraError(f"{shlex.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return proc.stdout


def marked(marks: Mapping[str, str]) -> list[tuple[int, str]]:
    """Live processes (pid, command line) whose environment carries every `NAME=value` of `marks`,
    e.g. the STACKGATE_RUN_ID and STACKGATE_CELL a node's command sets: what a suite started, whatever
    session it escaped into. Never this process."""
    needles = [f"{k}={v}".encode() for k, v in marks.items()]
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        pid = int(environ.parent.name)
        if pid == os.getpid():
            continue
        try:
            entries = environ.read_bytes().split(b"\0")
            if all(n in entries for n in needles) and _alive(pid):
                cmdline = (environ.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
                found.append((pid, cmdline.strip()[:200]))
        except OSError:
            continue  # gone, or not ours to read
    return found


def end_marked(marks: Mapping[str, str], grace_s: float = 3.0) -> list[tuple[int, str]]:
    """End every process `marked` finds (SIGTERM, then SIGKILL after `grace_s`); returns what it ended."""
    found = marked(marks)
    pids = [pid for pid, _ in found]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        _signal_tree(pids, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
            time.sleep(0.1)
        if not any(_alive(pid) for pid in pids):
            break
    return found
