"""What stops a cell before anything is resolved or built for it: the nightly channel's guards (no
fresh, matching build), this machine's host probe (it does not match its pool, or is unhealthy);
the cells they stop are recorded with the reason, never run."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from stackgate import probe
from stackgate.boundary.environment import Environment
from stackgate.console import Printer
from stackgate.inputs import Loaded
from stackgate.model import Cell, CellResult, Role, Status
from stackgate.options import Options
from stackgate.rundir import results


def nightly_guards(opts: Options, loaded: Loaded, cells: Sequence[Cell], say: Printer) -> dict[str, str]:
    """Cell id -> why it cannot run this nightly (see `nightly.guard`), before anything is resolved."""
    from stackgate import nightly
    candidates = [c for c in cells if c.role is Role.CANDIDATE and nightly.build_date(c.stack.torch)]
    if not candidates:
        return {}
    source = candidates[0].stack.source
    installs = [*(r.text for r in loaded.deps.requirements), *(r for c in candidates for r in c.stack.extra_requirements)]
    companions = {name: nightly.wheels(source, loaded.host_pip, name) for name in nightly.companions_wanted(installs)}
    found = nightly.wheels(source, loaded.host_pip)
    for page in (*found.unlisted, *(u for w in companions.values() for u in w.unlisted)):
        say(f"notice: could not list {page}: the nightly guards check only the age of what they cannot list")
    return nightly.guard(candidates, found, today=dt.datetime.now(dt.timezone.utc).date(),
                         max_age_days=opts.nightly_max_age, table=loaded.table, companions=companions)


def probe_pools(cells: Sequence[Cell], say: Printer, remote: Collection[str] = ()) -> list[probe.ProbeResult]:
    """Probe this machine once for every GPU pool it runs cells of (see `probe`); not the pools
    whose cells run as Slurm jobs on other machines."""
    for name in sorted({c.pool.name for c in cells if c.pool.has_gpu and c.pool.name in remote}):
        say(f"host probe for pool {name}: skipped: its cells run as Slurm jobs on the cluster's nodes")
    pools = {c.pool.name: c.pool for c in cells if c.pool.has_gpu and c.pool.name not in remote}
    if not pools:
        return []
    facts = probe.gather()
    out = []
    for name, pool in sorted(pools.items()):
        needs = sorted({str(c.stack.cuda.cuda_version) for c in cells
                        if c.pool.name == name and c.stack.cuda.cuda_version is not None})
        found = probe.check(pool, facts, needs)
        say(f"host probe for pool {name}: {found.status}: {'; '.join(found.evidence)[:400]}")
        out.append(found)
    return out


def record_stopped(run_dir: Path, cells: Sequence[Cell], unfit: Mapping[str, probe.ProbeResult],
                   blocked: Mapping[str, str]) -> None:
    """A host that does not match its pool, or is unhealthy, runs nothing; nor does a cell a nightly
    guard stopped: each is recorded (unless a resumed run has its result), with the evidence."""
    done = results.read(run_dir)
    for cell in cells:
        if results.kept(done, cell.id) is not None:
            continue
        found = unfit.get(cell.pool.name)
        if found is not None:
            results.append(run_dir, CellResult(cell.id, cell.role, Status(found.status), reason="; ".join(
                found.evidence), cell=cell.record(), environment=Environment.of({"host_probe": found.to_json()})))
        elif cell.id in blocked:
            results.append(run_dir, CellResult(cell.id, cell.role, Status.NO_BUILD, reason=blocked[cell.id],
                                               cell=cell.record()))
