"""`stackgate merge`: the bundles of one fleet run, merged into one run directory, gated once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from stackgate import bundle, fleet, inputs, matrix, rundir
from stackgate.conclude import decide_and_report
from stackgate.console import Console, Printer
from stackgate.errors import ConfigError, InfraError
from stackgate.model import CellResult, NotHere
from stackgate.options import Options
from stackgate.report.data import now
from stackgate.rundir import manifest, results


def merge(opts: Options, env: Mapping[str, str], paths: list[Path], say: Printer | None = None) -> int:
    """`stackgate merge`: one verdict over the bundles of a fleet run. The whole matrix is gated once;
    a required cell that no bundle ran is "not run" and makes the verdict INCONCLUSIVE, by pool."""
    console = Console(say)
    say = console.say
    loaded = inputs.load(opts, env, fleet.LocalHost())
    remote = {n: replace(p, is_local=False) for n, p in loaded.pools.items()}  # the merge machine runs nothing
    everything = inputs.expand(loaded, remote)
    defined = inputs.definition(opts, loaded)
    bundles = bundle.load_bundles(paths, defined)
    merged: dict[str, CellResult] = {}
    problems: list[str] = []
    for b in bundles:
        merged.update(b.read.results)
        problems += [f"{b.path.name}: {p}" for p in b.read.problems]
    ran_pools = sorted({p for b in bundles for p in b.pools.split()})
    cells = tuple(n.cell for n in everything.not_here if n.cell.id in merged)
    missing = tuple(NotHere(n.cell, f"not run: no bundle ran pool {n.cell.pool.name} (bundles ran: "
                                    f"{', '.join(ran_pools) or 'none'})")
                    for n in everything.not_here if n.cell.id not in merged)
    chosen = matrix.Expansion(cells=cells, not_here=missing, pruned=everything.pruned)
    run_id = opts.run_id or rundir.new_run_id(f"{loaded.spec.name}-merged")
    where = rundir.RunDir.of(opts.reports, run_id)
    run_dir = where.root
    owner = where.claim()  # before anything is written: a second merge (or run) of this id exits 2
    try:
        if where.results.exists():
            raise ConfigError(f"{run_dir} already holds results", hint="pass another --run-id or --reports")
        try:
            for result in merged.values():
                results.append(run_dir, result)
            manifest.write(run_dir, defined=defined, selected=bundle.selection(pools=ran_pools, only=(), shard=None),
                           cells=[c.id for c in cells], merged_from=[str(b.path) for b in bundles])
        except OSError as exc:
            raise InfraError(f"cannot write {run_dir}: {exc.strerror}") from None
        say(f"stackgate merge: {len(bundles)} bundle(s) (pools {', '.join(ran_pools) or 'none'}), {len(cells)} "
            f"cell(s) with results, {len(missing)} without -> {run_dir}")
        code, history_error = decide_and_report(opts, env, loaded, chosen, run_id, run_dir, now(), say,
                                                extra_problems=problems)
    finally:
        owner.release()
    if history_error:
        raise InfraError(history_error + f" (the reports are written: {run_dir})")
    return code
