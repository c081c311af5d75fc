"""Runs of the production stack alone on this runner, for the commands that measure production
rather than gate a candidate (`calibrate`'s A/A runs, `watch`'s canary): its cells, prepared, in a
run directory of their own that this process owns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from stackgate import inputs, masking, rundir
from stackgate.backends.base import Backend, EnvHandle
from stackgate.backends.choose import Machinery
from stackgate.console import Console
from stackgate.errors import ConfigError, InfraError
from stackgate.model import Cell, Role
from stackgate.options import Options
from stackgate.plan import plan_envs
from stackgate.runner import Runner, Unprepared
from stackgate.suite import RunContext


@dataclass
class ProductionRuns:
    loaded: inputs.Loaded
    cells: tuple[Cell, ...]
    backend: Backend
    runner: Runner
    where: rundir.RunDir
    owner: rundir.Claim

    def environment(self, cell: Cell) -> EnvHandle:
        handle = self.runner.environment(cell)
        if not isinstance(handle, EnvHandle):
            why = handle.reason if isinstance(handle, Unprepared) else str(handle)
            raise InfraError(f"the environment of {cell.stack.label} could not be prepared: {why}",
                             hint=f"the installer's log: {self.runner.log_dir / (cell.stack.label + '.log')}")
        return handle

    def close(self) -> None:
        self.backend.close()
        self.owner.release()


def start(opts: Options, env: Mapping[str, str], console: Console, machinery: Machinery, *, what: str,
          name: str) -> ProductionRuns:
    """The production cells of the selection that run here, their backend and runner, and a claimed
    run directory (`opts.run_id`, else a new id with `name`). `what`: the command's purpose, for the
    error when no production cell runs here."""
    loaded = inputs.load(opts, env, machinery.local())
    chosen = inputs.select(opts, loaded, shard=False)
    prods = tuple(c for c in chosen.cells if c.role is Role.PRODUCTION)
    if not prods:
        raise ConfigError(f"no production cell runs on this machine: nothing to {what}",
                          hint="pass --pool NAME (this runner's pool) or check --only")
    deps = inputs.build_suite_deps(opts, loaded, env, console.say)
    resolutions = machinery.resolve([p.stack for p in plan_envs(prods)], loaded.table, loaded.host_pip, env, deps)
    backend = machinery.backend(opts, loaded, env, console.say, deps)
    run_id = opts.run_id or rundir.new_run_id(f"{loaded.spec.name}-{name}")
    where = rundir.RunDir.of(opts.reports, run_id)
    owner = where.claim()  # a second run of this id exits 2
    suite = inputs.suite_spec(opts, platform_checks=False, host=env)
    ctx = RunContext(run_id=run_id, run_dir=where.root, suite=suite, mask=masking.Masker.of(env, suite.env))
    runner = Runner(backend, ctx, console, prods, resolutions, gauge=machinery.gauge)
    return ProductionRuns(loaded, prods, backend, runner, where, owner)
