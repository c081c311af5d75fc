"""`stackgate calibrate`: A/A runs of the production stack on this runner, the noise of each gated
metric, and the tolerance and repeats it recommends (stored in the history for the gate's power)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from stackgate import history, inputs, masking, rundir
from stackgate.backends.base import EnvHandle
from stackgate.backends.choose import REAL, Machinery
from stackgate.console import Console, Printer
from stackgate.errors import ConfigError, InfraError
from stackgate.model import CellResult, Role, aa
from stackgate.options import Options
from stackgate.plan import plan_envs
from stackgate.repeats import gated_keys, gated_tests
from stackgate.report.data import now
from stackgate.report.files import atomic_write
from stackgate.runner import Attempt, Runner, Unprepared
from stackgate.suite import RunContext


def calibrate(opts: Options, env: Mapping[str, str], *, runs: int, target: float, allow: float,
              say: Printer | None = None, machinery: Machinery = REAL) -> int:
    """`stackgate calibrate`: A/A runs of the production stack on this runner (see `calibrate`)."""
    from stackgate import calibrate as cal
    console = Console(say)
    say = console.say
    loaded = inputs.load(opts, env, machinery.local())
    chosen = inputs.select(opts, loaded, shard=False)
    prods = tuple(c for c in chosen.cells if c.role is Role.PRODUCTION)
    if not prods:
        raise ConfigError("no production cell runs on this machine: nothing to calibrate",
                          hint="pass --pool NAME (this runner's pool) or check --only")
    deps = inputs.build_suite_deps(opts, loaded, env, say)
    resolutions = machinery.resolve([p.stack for p in plan_envs(prods)], loaded.table, loaded.host_pip, env, deps)
    backend = machinery.backend(opts, loaded, env, say, deps)
    run_id = opts.run_id or rundir.new_run_id(f"{loaded.spec.name}-calibrate")
    run_dir = opts.reports / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    suite = inputs.suite_spec(opts, platform_checks=False, host=env)
    ctx = RunContext(run_id=run_id, run_dir=run_dir, suite=suite, mask=masking.Masker.of(env, suite.env))
    runner = Runner(backend, ctx, console, prods, resolutions, gauge=machinery.gauge)
    report: dict[str, Any] = {"run_id": run_id, "target": target, "allow": allow, "runs": runs, "pools": {}}
    try:
        for cell in prods:
            handle = runner.environment(cell)
            if not isinstance(handle, EnvHandle):
                why = handle.reason if isinstance(handle, Unprepared) else str(handle)
                raise InfraError(f"the environment of {cell.stack.label} could not be prepared: {why}",
                                 hint=f"the installer's log: {runner.log_dir / (cell.stack.label + '.log')}")
            found: list[CellResult] = []
            select: tuple[str, ...] = ()
            for r in range(runs):
                result = runner.attempt(Attempt(cell, aa(r), select=select), handle,
                                        step=f"A/A run {r + 1}/{runs} of {cell.id}")
                if not result.status.ran_suite:
                    raise InfraError(f"calibration run {r + 1} of {cell.id} did not run its tests: {result.status.value}"
                                     f": {result.reason[:300]}")
                found.append(result)
                select = select or gated_tests(cell, found, loaded.policy)
            rows = []  # (noise, recommendation, what the other per-run summary would need, or "")
            for key in sorted(gated_keys(cell, found, loaded.policy)):
                metric = next(m for f in found for m in f.metrics if m.key == key)
                rule = loaded.policy.metric_rule(metric.name, dict(metric.tags), cell.device)
                summary = rule.summary if rule is not None else "median"
                series = [next((m.samples for m in f.metrics if m.key == key), ()) for f in found]
                measured = cal.noise(key, series, summary, metric.better)
                if measured is None:
                    continue
                other = "best" if summary == "median" else "median"
                alt = cal.noise(key, series, other, metric.better)
                hint = ""
                if alt is not None and alt.sigma < measured.sigma / 2:
                    needs = cal.recommend(alt, target, allow, loaded.policy.confidence).repeats
                    hint = (f"each run's {other} sample moved {alt.sigma:.1%}: with summary = \"{other}\" "
                            f"in its [[performance.metric]] rule, repeats = {needs} would do")
                rows.append((measured, cal.recommend(measured, target, allow, loaded.policy.confidence), hint))
            say(f"\ncalibration of pool {cell.pool.name} ({cell.stack.label}, {runs} A/A runs):")
            for _, rec, hint in rows:
                say(f"  {rec.describe(target)}")
                if hint:
                    say(f"    {hint}")
            history.record_calibration(opts.history, pool=cell.pool.name, run_id=run_id, recorded=now(),
                                       noise=[(n.metric, n.sigma, n.pairs) for n, _, _ in rows])
            report["pools"][cell.pool.name] = [{**n.to_json(), "recommended_tolerance": r.tolerance,
                                                "recommended_repeats": r.repeats} for n, r, _ in rows]
    finally:
        backend.close()
    atomic_write(run_dir / "calibration.json", json.dumps(report, indent=1))
    say(f"calibration: {run_dir}/calibration.json; stored in {opts.history}")
    return 0
