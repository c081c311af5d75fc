"""`stackgate run --dry-run`: the node plan of every cell, printed; nothing else happens."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from stackgate import artifacts, inputs
from stackgate.backends import containers
from stackgate.backends.base import Execution
from stackgate.backends.choose import REAL, Machinery, slurm_pools
from stackgate.backends.docker import layout as inside
from stackgate.backends.docker.backend import node_mounts
from stackgate.console import Console, Printer
from stackgate.model import SlurmSpec
from stackgate.options import Options
from stackgate.plan import run_order
from stackgate.rundir import RunDir
from stackgate.runner import stack_artifacts
from stackgate.shipped import BUNDLED_SUITE
from stackgate.suite import RDZV_PORT, Layout, RunContext, node_commands


def dry_run(opts: Options, env: Mapping[str, str], say: Printer | None = None, *,
            machinery: Machinery = REAL) -> int:
    """`stackgate run --dry-run`: what each cell would run, in run order: with Slurm, the job script
    and each node's script; else each node's command. Nothing is resolved, built, submitted or
    written (the venv paths shown are where the environments will be)."""
    from stackgate.backends import slurm
    from stackgate.backends.venv import VenvBackend
    console = Console(say)
    say = console.say
    loaded = inputs.load(opts, env, machinery.local())
    chosen = inputs.select(opts, loaded)
    remote = slurm_pools(opts, loaded)
    forced = SlurmSpec() if opts.launcher == "slurm" else None
    where = RunDir.of(opts.reports, opts.run_id or "RUN_ID")
    run_dir = where.root
    suite = inputs.suite_spec(opts, platform_checks=opts.platform_checks, host=env)
    ctx = RunContext(run_id=run_dir.name, run_dir=run_dir, suite=suite)
    say(f"dry run of {loaded.spec.name}: {len(chosen.cells)} cell(s) here; nothing is built, submitted or written")
    if loaded.deps.projects:
        say("  (the suite's local projects are built at run time: the venv paths below leave them out)")
    venvs = VenvBackend(opts.cache_dir, loaded.table, loaded.host_pip, env, deps=replace(loaded.deps, projects=()))
    pinned = artifacts.read(opts.stacks) if opts.stacks is not None else {}
    for cell in run_order(chosen.cells):
        cell_dir = where.cell(cell.id)
        workdir = cell_dir.root
        python = venvs.root_for(cell.stack)[0] / "bin" / "python"
        exe = Execution(cell, workdir, stack_artifacts(run_dir, cell), cell_dir.shared, suite.path, "DRYRUN")
        spec = slurm.spec_for(cell, forced) if cell.pool.name in remote else None
        if spec is not None and opts.container:
            spec = replace(spec, container=opts.container)
        layout = Layout(python=str(python), out=workdir, artifacts=exe.artifacts, shared=exe.shared, suite=suite.path,
                        endpoint=f"${slurm.ENDPOINT}" if spec else ("127.0.0.1:PORT" if cell.topology.nodes > 1 else ""))
        container = None
        if spec is not None and spec.container:  # the nodes run the stack's image: its paths, by digest
            found = pinned.get(cell.stack.ident)
            image = found.image if found is not None else f"stackgate/stack:{cell.stack.label}(built-at-run-time)"
            container = containers.Container(spec.container, image, tuple(node_mounts(exe, BUNDLED_SUITE)),
                                        gpu=cell.device == "cuda", name="sg-DRYRUN")
            bundled = inside.SUITE if suite.path.resolve() == BUNDLED_SUITE.resolve() else inside.BUNDLED_SUITE
            layout = Layout(python=str(inside.VENV / "bin" / "python"), out=Path(inside.OUT), artifacts=Path(inside.ARTIFACTS),
                            shared=Path(inside.SHARED), suite=Path(inside.SUITE), bundled=Path(bundled),
                            endpoint=f"${slurm.ENDPOINT}")
        say(f"\n== {cell.id}: " + (f"Slurm job(s), partition {spec.partition or '(default)'}"
                                   + (f", {spec.container} running {container.image}" if container else "")
                                   if spec else "local"))
        for group in node_commands(cell, ctx, layout):
            if spec is not None:
                files = slurm.render(spec, group, exe, seconds=suite.timeout_s, port=RDZV_PORT, container=container)
                say(f"$ sbatch --parsable {cell_dir.slurm / next(iter(files))}")
                for name, text in files.items():
                    say(f"--- {cell_dir.slurm / name}\n{text.rstrip()}")
                continue
            for command in group:
                say(f"--- node {command.node} ({command.label}), in {command.cwd}")
                say("\n".join(f"{k}={v}" for k, v in sorted(command.env.items())) + "\n" + shlex.join(command.argv))
    return 0
