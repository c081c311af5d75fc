"""How busy the runner was while a node command ran: CPU pressure (PSI), steal time and cgroup CPU
throttling, measured on the machine that runs the command, as deltas over the command's run.

- PSI (`/proc/pressure/cpu`, Linux >= 4.20): `some` is the share of wall time in which at least one
  runnable task waited for a CPU, `full` (cgroup v2) the share in which all non-idle tasks did.
- steal (`/proc/stat`, 8th value of the `cpu` line): the share of CPU time the hypervisor gave to
  other guests.
- throttling (`cpu.stat` of this process's cgroup: v2 `throttled_usec`, v1 `throttled_time` in ns):
  the share of wall time the cgroup's quota held it back.

The interference of a run is the largest of the three shares. A source the kernel does not offer is
absent, never zero: a runner without PSI gives no pressure figure, and the gate does not pretend it
was quiet (it uses the run, as it would have before).

Where: the machine the nodes run on. For the local backends (venv, host, Docker) that is the harness
host, read here around the cell. A Slurm job's tasks take the same counters on their compute node
before and after the node's command (`SNAPSHOT`, a shell function; `parse` reads its text), so a Slurm
cell's interference is its busiest node's, not the submitting host's.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stackgate.boundary.environment import Environment

PSI = Path("/proc/pressure/cpu")
STAT = Path("/proc/stat")
CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Counters:
    """Cumulative counters at one moment (None: the source is not offered here)."""

    at: float  # time.monotonic()
    some_us: int | None
    full_us: int | None
    steal: int | None  # jiffies
    cpu_total: int | None  # jiffies, all columns
    throttled_us: float | None


def _psi(text: str) -> tuple[int | None, int | None]:
    found = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(some|full)\b.*\btotal=([0-9]+)", text, re.M)}
    return found.get("some"), found.get("full")


def _steal(text: str) -> tuple[int | None, int | None]:
    for line in text.splitlines():
        if line.startswith("cpu "):
            values = [int(v) for v in line.split()[1:]]
            return (values[7] if len(values) > 7 else None), sum(values)
    return None, None


def _cgroup_cpu_stat(cgroup_text: str, root: Path = CGROUP_ROOT) -> Path | None:
    """This process's cpu.stat: cgroup v2 (`0::/path`), else the v1 `cpu` controller's."""
    for line in cgroup_text.splitlines():
        hierarchy, controllers, path = [*line.split(":", 2), "", ""][:3]
        rel = path.lstrip("/")
        if hierarchy == "0" and controllers == "":
            for base in (root / rel, root / "unified" / rel):
                if (base / "cpu.stat").is_file():
                    return base / "cpu.stat"
        if "cpu" in controllers.split(","):
            for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
                if (root / name / rel / "cpu.stat").is_file():
                    return root / name / rel / "cpu.stat"
    return None


def _throttled(text: str) -> float | None:
    values = dict(line.split(maxsplit=1) for line in text.splitlines() if " " in line)
    if "throttled_usec" in values:
        return float(values["throttled_usec"])
    if "throttled_time" in values:
        return float(values["throttled_time"]) / 1000
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _counters(at: float, text: str) -> Counters:
    """Counters from the kernel's texts as they are written (PSI, /proc/stat, cpu.stat), one after another."""
    some, full = _psi(text)
    steal, total = _steal(text)
    return Counters(at, some, full, steal, total, _throttled(text))


def read() -> Counters:
    stat = _cgroup_cpu_stat(_read(CGROUP))
    return _counters(time.monotonic(), "\n".join([_read(PSI), _read(STAT), _read(stat) if stat else ""]))


# The same counters taken by a shell on another machine (a Slurm task on its compute node): the
# node's name, the uptime as the clock, PSI, the `cpu` line of /proc/stat and the task's cgroup
# cpu.stat (v2, else v1's `cpu` controller), each absent where the node does not offer it.
SNAPSHOT = ("sg_snapshot() { echo \"node ${SLURMD_NODENAME:-$(hostname -s)}\"; "
            "echo \"uptime $(cut -d' ' -f1 /proc/uptime)\"; cat /proc/pressure/cpu 2>/dev/null; "
            "grep '^cpu ' /proc/stat; "
            "for f in $(awk -F: '$1==\"0\" && $2==\"\" {print \"/sys/fs/cgroup\" $3 \"/cpu.stat\"} "
            "$2 ~ /(^|,)cpu(,|$)/ {print \"/sys/fs/cgroup/\" $2 $3 \"/cpu.stat\"}' /proc/self/cgroup); do "
            "if [ -r \"$f\" ]; then cat \"$f\"; break; fi; done; }")


def parse(text: str) -> Counters | None:
    """Counters from one `SNAPSHOT` (None: it has no clock, e.g. the file was cut short)."""
    uptime = re.search(r"^uptime ([0-9]+(?:\.[0-9]+)?)$", text, re.M)
    return _counters(float(uptime.group(1)), text) if uptime else None


def snapshot_node(text: str) -> str:
    """The node a `SNAPSHOT` was taken on ("" if it does not say)."""
    found = re.search(r"^node (\S+)$", text, re.M)
    return found.group(1) if found else ""


@dataclass(frozen=True)
class Pressure:
    """Shares (0..1) of one run's wall time; None where the source is not offered."""

    wall_s: float
    some: float | None = None
    full: float | None = None
    steal: float | None = None
    throttled: float | None = None
    where: str = ""  # "" the harness host; else the machine measured, e.g. "slurm node n2"

    @property
    def interference(self) -> float | None:
        """The largest share the runner's other work took: None when nothing was measurable."""
        shares = [x for x in (self.some, self.steal, self.throttled) if x is not None]
        return max(shares) if shares else None

    def describe(self) -> str:
        parts = [f"{name} {value:.0%}" for name, value in (("CPU pressure (PSI some)", self.some),
                                                           ("steal", self.steal), ("throttled", self.throttled))
                 if value is not None]
        return (", ".join(parts) or "not measurable here") + (f" on {self.where}" if self.where else "")

    def to_json(self) -> dict[str, Any]:
        return {"wall_s": round(self.wall_s, 3), "some": _r(self.some), "full": _r(self.full), "steal": _r(self.steal),
                "throttled": _r(self.throttled), "interference": _r(self.interference),
                **({"where": self.where} if self.where else {})}



def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _f(x: Any) -> float | None:
    return None if x is None else float(x)


def between(start: Counters, end: Counters) -> Pressure:
    wall = max(end.at - start.at, 1e-9)

    def share(a: float | None, b: float | None, per: float) -> float | None:
        if a is None or b is None or b < a:
            return None
        return min(max((b - a) / per, 0.0), 1.0)

    steal = None
    if start.steal is not None and end.steal is not None and start.cpu_total is not None and end.cpu_total:
        steal = share(start.steal, end.steal, max(end.cpu_total - start.cpu_total, 1))
    return Pressure(wall, share(start.some_us, end.some_us, wall * 1e6), share(start.full_us, end.full_us, wall * 1e6),
                    steal, share(start.throttled_us, end.throttled_us, wall * 1e6))


def busiest(parts: Sequence[Pressure]) -> Pressure | None:
    """One figure for a cell measured on several machines, several times (a Slurm cell: each
    invocation's job, on each node): per machine, each share over all its runs (weighted by their wall
    time, over the runs that offer it); then the machine with the largest interference."""
    by_where: dict[str, list[Pressure]] = {}
    for part in parts:
        by_where.setdefault(part.where, []).append(part)

    def over(shares: list[tuple[float | None, float]]) -> float | None:
        offered = [(v, w) for v, w in shares if v is not None]
        weight = sum(w for _, w in offered)
        if not offered:
            return None
        return sum(v * w for v, w in offered) / weight if weight > 0 else max(v for v, _ in offered)

    machines = [Pressure(sum(r.wall_s for r in runs), some=over([(r.some, r.wall_s) for r in runs]),
                         full=over([(r.full, r.wall_s) for r in runs]), steal=over([(r.steal, r.wall_s) for r in runs]),
                         throttled=over([(r.throttled, r.wall_s) for r in runs]), where=where)
                for where, runs in by_where.items()]
    return max(machines, key=lambda m: -1.0 if m.interference is None else m.interference, default=None)


def of_result(environment: Environment) -> Pressure | None:
    """The pressure a result recorded (None: not measured, e.g. a result from before it was)."""
    found = environment.pressure
    if found is None:
        return None
    return Pressure(found.wall_s, some=found.some, full=found.full, steal=found.steal, throttled=found.throttled,
                    where=found.where)
