"""The console: every line the run prints goes through one `Console`, which flushes it (stdout is a
pipe under nox and CI) and remembers when it last spoke. `step()` wraps a long step (base
bootstrap, wheel download, image build, environment creation, a cell) and prints a heartbeat with
the step and its elapsed time whenever nothing else was printed for `interval_s`."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator

Printer = Callable[[str], None]


def elapsed(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def stdout_line(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


class Console:
    def __init__(self, write: Printer | None = None, *, interval_s: float = 10.0) -> None:
        self._write = write or stdout_line
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._last = time.monotonic()

    def say(self, text: str) -> None:
        with self._lock:
            self._write(text)
            self._last = time.monotonic()

    @contextlib.contextmanager
    def step(self, label: str) -> Iterator[None]:
        """While the body runs, a line `... <label>: <elapsed>` whenever the console was quiet."""
        start = time.monotonic()
        done = threading.Event()

        def beat() -> None:
            while not done.wait(1.0):
                if time.monotonic() - self._last >= self.interval_s:
                    self.say(f"  ... {label}: {elapsed(time.monotonic() - start)}")

        thread = threading.Thread(target=beat, name=f"heartbeat {label}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(timeout=2)
