"""`stackgate run` (and the nox sessions over it): load -> select -> guards -> resolve -> the run
directory -> main attempts -> repeats and confirmation -> rollbacks -> decide and report."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from stackgate import bundle, guards, history, inputs, masking, matrix, probe, proc, repeats, resolve, rundir
from stackgate.backends.choose import REAL, Machinery, slurm_pools
from stackgate.conclude import decide_and_report, signals_held
from stackgate.console import Console, Printer
from stackgate.errors import ConfigError, InfraError
from stackgate.inputs import Loaded
from stackgate.model import MAX_ROUND, Cell, CellResult, rerun
from stackgate.options import Options
from stackgate.plan import plan_envs, run_order
from stackgate.policy import Policy
from stackgate.report.data import now
from stackgate.rundir import manifest, results
from stackgate.runner import Attempt, Runner, together_here
from stackgate.shipped import BUNDLED_SUITE
from stackgate.suite import RunContext, run_marks


def run(opts: Options, env: Mapping[str, str], say: Printer | None = None, *, machinery: Machinery = REAL) -> int:
    console = Console(say)
    say = console.say
    loaded = inputs.load(opts, env, machinery.local())
    chosen = inputs.runnable(opts, loaded)
    blocked = guards.nightly_guards(opts, loaded, chosen.cells, say)
    if blocked and loaded.spec.fallback == "last-green" and not opts.nightly_version:
        green = history.last_green(opts.history, loaded.spec.name)
        if green is not None:
            say(f"the newest nightly fails a guard ({next(iter(blocked.values()))}); the matrix falls back to "
                f"the last green nightly, {green.version} (run {green.run_id}; its age is not held against it)")
            return run(replace(opts, nightly_version=green.version, nightly_max_age=36500), env, say,
                       machinery=machinery)
        say("the newest nightly fails a guard and the history has no green nightly to fall back to")
    for cell_id, why in blocked.items():
        say(f"  no build: {cell_id}: {why}")
    # before anything is resolved or built for a host that cannot run it
    probes = guards.probe_pools(chosen.cells, say, remote=slurm_pools(opts, loaded))
    unfit = {p.pool: p for p in probes if not p.ok}
    runnable = tuple(c for c in chosen.cells if c.pool.name not in unfit and c.id not in blocked)
    deps = inputs.build_suite_deps(opts, loaded, env, say)
    if opts.stacks is not None:  # the stacks are images by digest: nothing of them is resolved or built here
        say(f"stacks by digest from {opts.stacks}: nothing is resolved or built for them")
        resolutions: Mapping[str, resolve.Resolution] = {}
    else:
        say(f"resolving the requirements of {len(plan_envs(runnable))} stack(s)")
        resolutions = machinery.resolve([p.stack for p in plan_envs(runnable)], loaded.table, loaded.host_pip, env,
                                        deps)
    backend = machinery.backend(opts, loaded, env, say, deps)
    run_id = opts.resume or opts.run_id or rundir.new_run_id(loaded.spec.name)
    run_dir = results.resume_dir(opts.reports, opts.resume) if opts.resume else rundir.RunDir.of(opts.reports, run_id).root
    owner = rundir.RunDir(run_dir).claim()  # before anything is written: a second run of this id exits 2
    try:
        _open(opts, loaded, run_id, run_dir, chosen, probes, say)
        started = now()
        say(f"stackgate {loaded.spec.name}: run {run_id}, {len(chosen.cells)} cell(s) here, "
            f"{len(chosen.not_here)} not run here, {len(chosen.pruned)} pruned -> {run_dir}")
        for left in chosen.not_here:
            say(f"  not run here: {left.cell.id}")
        guards.record_stopped(run_dir, chosen.cells, unfit, blocked)
        suite = inputs.suite_spec(opts, platform_checks=opts.platform_checks, host=env)
        say(f"suite {suite.path}; policy: {loaded.policy.origin}")
        ctx = RunContext(run_id=run_id, run_dir=run_dir, suite=suite, suite_deps={} if deps.empty else deps.describe(),
                         select=tuple(opts.tests), mask=masking.Masker.of(env, suite.env))
        runner = Runner(backend, ctx, console, runnable, resolutions, gauge=machinery.gauge)
        interrupted: KeyboardInterrupt | None = None
        try:
            attempt_all(runner, runnable, loaded.policy, rollback=opts.rollback)
        except KeyboardInterrupt as exc:
            interrupted = exc
            stopped = proc.stop_all()
            say(f"interrupted: stopped {stopped} process tree(s); writing the report from the cells that finished "
                f"(continue with --resume {run_id})")
        finally:
            backend.close()
        with signals_held() if interrupted is not None else contextlib.nullcontext():
            code, history_error = decide_and_report(opts, env, loaded, chosen, run_id, run_dir, started, say)
        if interrupted is not None:
            raise interrupted
        if history_error:
            raise InfraError(history_error + f" (the reports are written: {run_dir})",
                             hint="check the file, or pass --history PATH to use another database")
        return code
    finally:
        owner.release()


def _open(opts: Options, loaded: Loaded, run_id: str, run_dir: Path, chosen: matrix.Expansion,
          probes: Sequence[probe.ProbeResult], say: Printer) -> None:
    """The run directory, claimed: new (refused if it holds results), or resumed (its definition and
    selection checked, and what the dead run left running ended); its manifest, and a torn last line repaired."""
    where = rundir.RunDir(run_dir)
    if not opts.resume and where.results.exists():
        raise ConfigError(f"run {run_id} already has results in {run_dir}", hint="use --resume to continue it")
    defined = inputs.definition(opts, loaded)
    selected = bundle.selection(pools=opts.pool, only=opts.only, shard=str(opts.shard) if opts.shard else None)
    if opts.resume:
        manifest.check_resume(run_dir, defined, selected)
        # this run owns the directory now, so what still carries its id was left by the run that died
        ended = proc.end_marked(run_marks(run_id, run_dir))
        if ended:
            say(f"resume: ended {len(ended)} process(es) the dead run {run_id} left running: "
                + "; ".join(f"pid {pid} ({cmd[:80]})" for pid, cmd in ended[:5]))
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        if not opts.resume or probes:
            manifest.write(run_dir, defined=defined, selected=selected, cells=[c.id for c in chosen.cells],
                           host_probe={p.pool: p.to_json() for p in probes},
                           options=bundle.defining_options(opts.describe(), Path.cwd()))
    except OSError as exc:
        raise InfraError(f"cannot create {run_dir}: {exc.strerror}") from None
    torn = results.repair_tail(run_dir)
    if torn is not None:
        say(f"repaired a torn last line of {where.results.name} (kept in {where.torn.name}): {torn[:120]}")


def _quiet_runs(runner: Runner, ordered: Sequence[Cell], pairs: Sequence[Cell], policy: Policy,
                replaced: dict[str, int], budget: int) -> int:
    """Replace the performance runs taken while the runner was busy beyond `max_pressure`: one more
    interleaved round of the pairs short of quiet runs, at most `budget` rounds; returns the rounds made."""
    made = 0
    while made < budget and pairs:
        finished = results.read(runner.ctx.run_dir)
        select, why = repeats.short_of_quiet_runs(pairs, runner.by_id, finished, policy, replaced)
        if not select:
            break
        runner.console.say(f"interference: 1 more interleaved run of {repeats.listed(select)} "
                           f"({made + 1} of at most {budget}), because " + "; ".join(
                               f"{cell_id}: {reason}" for cell_id, reason in sorted(why.items())))
        _one_round(runner, ordered, select, finished, policy, replaced, why)
        made += 1
    return made


def _one_round(runner: Runner, ordered: Sequence[Cell], select: repeats.Selection, finished: Mapping[str, CellResult],
               policy: Policy, replaced: dict[str, int], busy: Iterable[str]) -> None:
    """One more interleaved round of `select`, numbered after the rounds `finished` holds; each candidate in
    `busy` (short of runs taken within max_pressure) counts it as a round made to replace one."""
    first = repeats.next_round(finished)
    _repeat(runner, ordered, select, range(first, first + 1), policy)
    for cell_id in busy:
        replaced[cell_id] = replaced.get(cell_id, 0) + 1


def _noise_rounds(runner: Runner, ordered: Sequence[Cell], pairs: Sequence[Cell], policy: Policy,
                  replaced: dict[str, int]) -> None:
    """After confirmation: one more interleaved round at a time of the tests whose gated metrics the runs
    cannot settle yet but more runs can (their pairs' noise says about how many would), or that have
    fewer pairs taken within max_pressure than were made, while the time these rounds took and the next
    one's (as long as the last) stay within `noise_budget_s`. Says each round and why, and how it ended."""
    say = runner.console.say
    budget = policy.noise_budget_s
    if budget <= 0:
        return
    spent, made = 0.0, 0
    watching: dict[str, set[str]] = {}  # cell id -> the metrics rounds were made for
    while True:
        finished = results.read(runner.ctx.run_dir)
        select, why, hopeless = repeats.worth_more(pairs, runner.by_id, finished, policy, watching)
        quiet, busy = repeats.short_of_quiet_runs(pairs, runner.by_id, finished, policy, replaced)
        select = repeats.union(select, quiet)
        first = repeats.next_round(finished)
        ahead = repeats.last_round_s(finished) if not made else spent / made
        if not select or spent + ahead > budget or first > MAX_ROUND:
            break
        because = [f"{cell_id} {key}: {reason}" for cell_id, metrics in sorted(why.items())
                   for key, reason in sorted(metrics.items())]
        because += [f"{cell_id}: {reason}" for cell_id, reason in sorted(busy.items())]
        say(f"noise: 1 more interleaved run of {repeats.listed(select)} (round {first}; {spent:.0f} s of the "
            f"{budget:.0f} s noise budget spent), because " + "; ".join(because))
        for cell_id, metrics in why.items():
            watching.setdefault(cell_id, set()).update(metrics)
        start = time.monotonic()
        _one_round(runner, ordered, select, finished, policy, replaced, busy)
        spent += time.monotonic() - start
        made += 1
    left = [f"{cell_id} {key}: {reason}" for cell_id, metrics in sorted(hopeless.items())
            for key, reason in sorted(metrics.items())]
    if select and made:
        # (what the rounds were for may still be undecided, or a regression they ran on to the budget's end for)
        say(f"noise: {made} more round(s) in {spent:.0f} s, then the budget: the next round (about {ahead:.0f} s) would "
            f"pass the {budget:.0f} s noise budget ([performance] noise_budget_s); the gate decides on all the runs of "
            f"{repeats.listed(select)}")
    elif select:
        say(f"noise: no more rounds for {repeats.listed(select)}: one (about {ahead:.0f} s) would pass the "
            f"{budget:.0f} s noise budget ([performance] noise_budget_s)")
    elif made and not left:
        say(f"noise: {made} more round(s) in {spent:.0f} s settled what they were for")
    if left:
        say((f"noise: {made} more round(s) in {spent:.0f} s, then " if made else "noise: ")
            + "no more rounds for what more runs would not settle: " + "; ".join(left))


def _repeat(runner: Runner, ordered: Sequence[Cell], select: repeats.Selection, rounds: range, policy: Policy) -> None:
    """`rounds` interleaved runs of the selected tests: pair by pair, one run after the other, or, with
    pairing = "concurrent", each round's runs at the same time on shares of the runner's CPUs (on a
    backend whose nodes run on this host: a Slurm job's do not)."""
    attempts = repeats.repeat_attempts(ordered, runner.by_id, select, rounds)
    if together_here(policy, runner.backend):
        runner.run_together(repeats.by_round(attempts, runner.by_id))
    else:
        runner.run(attempts)


def _confirm(runner: Runner, ordered: Sequence[Cell], select: repeats.Selection, why: Mapping[str, Mapping[str, str]],
             rounds: range, because: str, policy: Policy) -> None:
    """Interleaved rounds of the selected tests, after saying which metrics of which cells need them and why."""
    runner.console.say(f"confirm: {len(rounds)} more interleaved run(s) of {repeats.listed(select)}, because {because}:")
    for cell_id, metrics in sorted(why.items()):
        for key, reason in sorted(metrics.items()):
            runner.console.say(f"  {cell_id} {key}: {reason}")
    _repeat(runner, ordered, select, rounds, policy)


def _plain_reruns(runner: Runner, ordered: Sequence[Cell], finished: Mapping[str, CellResult]) -> None:
    """The fidelity check of a user's suite: production's failing tests once more as plain pytest in
    production's environment (no stackgate variable, no node init, no container restriction). The gate
    counts a failure that passes there as the harness's, not as pre-existing."""
    if runner.ctx.suite.path.resolve() == BUNDLED_SUITE.resolve():
        return  # the bundled suite is stackgate's own: it needs the harness's variables to run at all
    planned = repeats.plain_reruns(ordered, finished, runner.ctx.suite)
    if not planned:
        return
    say = runner.console.say
    if not runner.backend.runs_plain:
        say(f"fidelity: the {runner.backend.name} backend cannot run a test outside its own machinery: production's "
            "failures stay pre-existing without that check")
        return
    count = sum(len(a.select or ()) for a in planned)
    say(f"fidelity: {count} test(s) that failed in production run once more as plain pytest in its environment, "
        "outside stackgate's machinery")
    runner.run(planned)
    after = results.read(runner.ctx.run_dir)
    for attempt in planned:
        again = after.get(attempt.result_id)
        if again is None:
            continue
        passed = [t.name for t in again.tests if t.outcome == "passed"]
        say(f"  {attempt.cell.id}: {len(passed)} of {len(attempt.select or ())} pass as plain pytest"
            + (f" (harness failures, not pre-existing: {', '.join(passed[:5])}{' ...' if len(passed) > 5 else ''})"
               if passed else ": pre-existing"))


def attempt_all(runner: Runner, cells: Sequence[Cell], policy: Policy, *, rollback: bool) -> None:
    """Every attempt of a run, in order: the main runs; the reruns of each candidate's new failures,
    in both stacks (a failure counts only when it repeats); the interleaved repeats of the
    performance-gated tests and their confirmation (decided once, on all runs: a first look can only
    settle a metric as within tolerance, so confirmation never makes a false NO-GO likelier), and the
    rounds the sign test needs where a run pair stands apart; then each candidate's rollback."""
    say = runner.console.say
    ordered = run_order(cells)
    by_id = runner.by_id
    runner.run((Attempt(c) for c in ordered), say_skipped=True)
    finished = results.read(runner.ctx.run_dir)
    _plain_reruns(runner, ordered, finished)
    pairs = repeats.pairs_that_ran(ordered, finished)
    if pairs and policy.confirm_failures:
        select = repeats.new_failures(pairs, finished)
        if select:
            say(f"confirm failures: {policy.confirm_failures} more interleaved run(s), in both stacks, of the tests "
                f"that failed in a candidate and not in production ({repeats.listed(select)})")
            runner.run(repeats.repeat_attempts(ordered, by_id, select, range(1, policy.confirm_failures + 1), rerun))
            finished = results.read(runner.ctx.run_dir)
    if pairs and policy.repeats > 1:
        select = repeats.repeat_selection(pairs, finished, policy)
        planned = policy.repeat_rounds()
        if select:
            together = together_here(policy, runner.backend)
            say(f"repeats: {len(planned)} more interleaved run(s) of the performance-gated tests "
                f"({repeats.listed(select)})" + (", each pair's runs at the same time" if together else ""))
            if policy.concurrent and not together:
                say("  pairing = \"concurrent\": Slurm jobs run on their own nodes, so the pairs run one after "
                    "the other (and are compared without the main runs, as the policy asks)")
        _repeat(runner, ordered, select, planned, policy)
    replaced: dict[str, int] = {}  # candidate id -> rounds made to replace runs taken under interference
    made = _quiet_runs(runner, ordered, pairs, policy, replaced, policy.pressure_reruns)
    finished = results.read(runner.ctx.run_dir)
    if pairs and policy.confirm_repeats > policy.repeats:
        select, why = repeats.unsettled(pairs, by_id, finished, policy)
        if select:
            first = policy.repeat_rounds().stop + made  # (the same rounds again on --resume: those recorded are kept)
            _confirm(runner, ordered, select, why, range(first, first + policy.confirm_repeats - policy.repeats),
                     "the runs so far cannot settle", policy)
            made += _quiet_runs(runner, ordered, pairs, policy, replaced, policy.pressure_reruns - made)
    if pairs and policy.confirm_repeats > 1:
        # a metric that a run pair standing apart holds undecided, or pushes into a regression, runs to the
        # pairs the sign test needs to leave it out (9 at 95%), and the gate decides once on all of them
        # (`comparison.short_of_sign_test`): like confirmation, this never makes a false NO-GO likelier
        finished = results.read(runner.ctx.run_dir)
        select, why, rounds = repeats.short_of_sign_test(pairs, by_id, finished, policy)
        if select:
            first = repeats.next_round(finished)
            _confirm(runner, ordered, select, why, range(first, first + rounds),
                     "a run pair stands apart from the rest and the sign test needs more pairs to leave it out", policy)
            _quiet_runs(runner, ordered, pairs, policy, replaced, policy.pressure_reruns - made)
    if pairs:
        _noise_rounds(runner, ordered, pairs, policy, replaced)
    if rollback:  # production reads what each candidate that ran its suite wrote
        runner.run(repeats.rollbacks(ordered, by_id, results.read(runner.ctx.run_dir)))
