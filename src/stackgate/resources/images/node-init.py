"""PID 1 of every stackgate node container (run as `python -c <this file> REPORT -- ARGV...`; it
imports nothing of stackgate). It runs the node's command, forwards SIGTERM/SIGINT to it, reaps the
orphans the kernel hands to PID 1, and when the command has ended it ends every process still alive in
the container (a daemon a test started in a session of its own) and writes one line per process to
REPORT ("pid N: command line"), so the harness can name what the suite left behind. Exits with the
command's exit status (128 + N when a signal N ended it, as a shell would)."""

import os
import signal
import subprocess
import sys
import time

report, argv = sys.argv[1], sys.argv[sys.argv.index("--") + 1:]


def alive() -> list[tuple[int, str]]:
    """Every process of this container but this one that has not exited (zombies have)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X"):
            found.append((int(name), cmdline[:200]))
    return found


def reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


child = subprocess.Popen(argv)
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda s, _f: child.send_signal(s))
code = child.wait()
left = alive()
for sig in (signal.SIGTERM, signal.SIGKILL):
    for pid, _ in left:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    deadline = time.monotonic() + 3
    while alive() and time.monotonic() < deadline:
        reap()
        time.sleep(0.1)
    if not alive():
        break
reap()
if left:
    with open(report, "w") as f:
        f.writelines(f"pid {pid}: {cmd}\n" for pid, cmd in left)
sys.exit(code if code >= 0 else 128 - code)
