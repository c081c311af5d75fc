"""The gate's specification, as a truth table: one row per situation -> the decision and the kind of
reason that must decide it. Rows start from the selftest's recorded run of the bundled suite on a
GPU pool (the clean pair is GO) and inject one situation each. Every selftest case is a row too."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from stackgate import fleet, gate, osv, selftest, shipped, supply
from stackgate.model import PLAIN, ROLLBACK, Cell, CellResult, Decision, NotHere, Severity, Status, TestOutcome, rerun
from stackgate.policy import Policy, Waiver, load_policy

POLICY = load_policy(shipped.MATRIX_DIR / "policy.toml")
TODAY = dt.date(2026, 11, 30)


@dataclass
class Situation:
    """What the gate is given; rows change it."""

    cells: list[Cell]
    results: dict[str, CellResult]
    not_here: list[NotHere] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    policy: Policy = POLICY
    db: osv.Database | None = None  # the vulnerability database the stacks are scanned against

    @property
    def prod(self) -> Cell:
        return self.cells[0]

    @property
    def cand(self) -> Cell:
        return self.cells[1]

    def edit(self, cell: Cell, change: Callable[[CellResult], CellResult]) -> None:
        self.results[cell.id] = change(self.results[cell.id])


def _metrics(keep: Callable[[str], bool]) -> Callable[[CellResult], CellResult]:
    return lambda r: replace(r, metrics=tuple(m for m in r.metrics if keep(m.name)))


def _samples(name: str, change: Callable[[tuple[float, ...]], tuple[float, ...]]) -> Callable[[CellResult], CellResult]:
    return lambda r: replace(r, metrics=tuple(replace(m, samples=change(m.samples)) if m.name == name else m
                                              for m in r.metrics))


def _rollback(s: Situation, status: Status, reason: str, tests: tuple[TestOutcome, ...] = ()) -> None:
    rid = s.prod.result_id(ROLLBACK, s.cand)
    s.results[rid] = CellResult(rid, s.prod.role, status, reason=reason, tests=tests, phase=ROLLBACK,
                                against=s.cand.id)


def r_clean(s: Situation) -> None:
    pass


def r_candidate_without_metrics(s: Situation) -> None:
    s.edit(s.cand, _metrics(lambda _: False))


def r_gated_metric_missing_in_production(s: Situation) -> None:
    s.edit(s.prod, _metrics(lambda n: n != "busbw"))


def r_partner_pruned(s: Situation) -> None:
    prod = s.prod
    s.cells.remove(prod)
    del s.results[prod.id]


def r_partner_never_ran(s: Situation) -> None:
    del s.results[s.prod.id]


def r_failed_without_failing_test(s: Situation) -> None:
    s.edit(s.cand, lambda r: replace(r, status=Status.FAILED, reason="pytest exited 1"))


def r_numerics_nan(s: Situation) -> None:
    s.edit(s.cand, _samples("vit.loss", lambda xs: (*xs[:3], float("nan"), *xs[4:])))


def r_trajectory_cut_short(s: Situation) -> None:
    s.edit(s.cand, _samples("recsys.loss", lambda xs: xs[:2]))


def r_unreadable_results_line(s: Situation) -> None:
    s.problems.append('results.jsonl:3: not a result (TypeError: a JSON str, not an object): "oops"')


def r_unreadable_metrics_record(s: Situation) -> None:
    s.edit(s.cand, lambda r: replace(r, status=Status.ERROR, reason="1 metric/environment record(s) could not be "
                                     "read; first: results-node0.jsonl:4: unreadable record"))


def r_required_cell_left_out_by_selection(s: Situation) -> None:
    s.not_here.append(NotHere(replace(s.cand, pool=replace(s.cand.pool, name="other")),
                              "left out of this run by --only prod-*"))


def r_infra_error(s: Situation) -> None:
    s.edit(s.cand, lambda r: replace(r, status=Status.INFRA_ERROR, reason="lost the Docker engine", tests=()))


def r_rollback_infra_error(s: Situation) -> None:
    _rollback(s, Status.INFRA_ERROR, "lost the Docker engine")


def r_rollback_failed_without_test(s: Situation) -> None:
    _rollback(s, Status.FAILED, "pytest exited 1")


def r_rollback_cannot_read(s: Situation) -> None:
    _rollback(s, Status.FAILED, "1 test(s) failed", (TestOutcome(
        "test_crossversion.py::test_load_dcp_model_and_optimizer", "failed", message="KeyError: 'optim'"),))


def r_rollback_no_crossversion_tests(s: Situation) -> None:
    _rollback(s, Status.SKIPPED, "the suite has no cross-version tests (-m crossversion): nothing to roll back")


def r_baseline_failed(s: Situation) -> None:
    s.edit(s.prod, lambda r: replace(r, status=Status.TIMEOUT, reason="the suite exceeded the cell timeout"))


def r_required_test_skipped(s: Situation) -> None:
    s.edit(s.cand, lambda r: replace(r, tests=tuple(replace(t, outcome="skipped") if "recsys" in t.name else t
                                                    for t in r.tests)))


def r_required_test_missing(s: Situation) -> None:
    s.edit(s.cand, lambda r: replace(r, tests=tuple(t for t in r.tests if "vit_fsdp" not in t.name)))


def r_peak_memory_plus_20(s: Situation) -> None:
    s.edit(s.cand, _samples("vit.peak_memory", lambda xs: tuple(x * 1.2 for x in xs)))


def r_peak_memory_plus_4(s: Situation) -> None:
    s.edit(s.cand, _samples("vit.peak_memory", lambda xs: tuple(x * 1.04 for x in xs)))


def r_perf_sample_nan(s: Situation) -> None:
    s.edit(s.cand, _samples("recsys.step_time", lambda xs: (float("inf"), *xs[1:])))


def r_expired_waiver(s: Situation) -> None:
    s.edit(s.cand, lambda r: replace(r, status=Status.FAILED, tests=tuple(
        replace(t, outcome="failed", message="expected efa") if "transport" in t.name else t for t in r.tests)))
    s.policy = replace(POLICY, waivers=(Waiver("*", "test_transport.py::*", "aws-ofi-nccl#584", "", dt.date(2026, 11, 1),
                                               1),))


USER_SUITE = replace(POLICY, required_tests=tuple(t for t in POLICY.required_tests if t.startswith("test_identity")),
                     candidate_tests=(), required_metrics=(), all_tests_required=True, preexisting_failures="go")
COMPILE = "test_compile.py::test_compile_matches_eager_and_captures_a_graph"


def _fail(name: str, message: str) -> Callable[[CellResult], CellResult]:
    return lambda r: selftest._fail_test(r, name, message)


def r_preexisting_failure_user_suite(s: Situation) -> None:
    """#18 item 0: a test failing in both stacks is a known failure, not a regression (user suite: GO)."""
    s.policy = USER_SUITE
    s.edit(s.prod, _fail(COMPILE, "AssertionError: needs pytest-xdist workers"))
    s.edit(s.cand, _fail(COMPILE, "AssertionError: needs pytest-xdist workers"))


def r_preexisting_error_and_failure_user_suite(s: Situation) -> None:
    """Failed in one stack, errored in the other: both are failures that were there before."""
    s.policy = USER_SUITE
    s.edit(s.prod, lambda r: replace(r, status=Status.FAILED, tests=tuple(
        replace(t, outcome="error", message="fixture 'worker_id' not found") if t.name == COMPILE else t
        for t in r.tests)))
    s.edit(s.cand, _fail(COMPILE, "AssertionError"))


def r_preexisting_failure_policy_inconclusive(s: Situation) -> None:
    s.policy = replace(USER_SUITE, preexisting_failures="inconclusive")
    s.edit(s.prod, _fail(COMPILE, "AssertionError: known"))
    s.edit(s.cand, _fail(COMPILE, "AssertionError: known"))


def _plain(s: Situation, outcome: str) -> None:
    """Production's fidelity rerun of COMPILE: plain pytest in its environment, outside the harness."""
    rid = s.prod.result_id(PLAIN)
    s.results[rid] = CellResult(rid, s.prod.role, Status.PASSED if outcome == "passed" else Status.FAILED,
                                tests=(TestOutcome(COMPILE, outcome, message="" if outcome == "passed" else "boom"),),
                                phase=PLAIN)


def r_harness_only_failure(s: Situation) -> None:
    """#41: a test failing in both stacks under stackgate that passes as plain pytest in production's
    environment (it fails only when a stackgate variable is present) is the harness's failure: not
    pre-existing, and INCONCLUSIVE, not GO."""
    r_preexisting_failure_user_suite(s)
    _plain(s, "passed")


def r_harness_only_failure_policy_go(s: Situation) -> None:
    r_harness_only_failure(s)
    s.policy = replace(s.policy, harness_failures="go")


def r_preexisting_failure_confirmed_by_plain_pytest(s: Situation) -> None:
    """It fails as plain pytest too: pre-existing, as before (user suite: GO)."""
    r_preexisting_failure_user_suite(s)
    _plain(s, "failed")


def r_preexisting_failure_bundled_suite(s: Situation) -> None:
    """The bundled suite's policy: a failure in production too is a broken baseline, INCONCLUSIVE."""
    s.edit(s.prod, _fail(COMPILE, "AssertionError: known"))
    s.edit(s.cand, _fail(COMPILE, "AssertionError: known"))


def r_required_test_fails_in_both(s: Situation) -> None:
    """A required test of the bundled suite failing in both: the baseline is broken (INCONCLUSIVE)."""
    name = "test_recsys.py::test_recsys_ddp_sharded_embeddings"
    s.edit(s.prod, _fail(name, "RuntimeError: gloo"))
    s.edit(s.cand, _fail(name, "RuntimeError: gloo"))


def r_new_failure_user_suite(s: Situation) -> None:
    """Passed in production, fails in the candidate: a regression, NO-GO."""
    s.policy = USER_SUITE
    s.edit(s.cand, _fail(COMPILE, "AssertionError: differs from eager"))


def _reruns(s: Situation, cell: Cell, name: str, *outcomes: str) -> None:
    """The reruns of one test in one cell (what `confirm_failures` runs), with these outcomes."""
    for r, outcome in enumerate(outcomes, 1):
        rid = cell.result_id(rerun(r))
        failed = outcome in ("failed", "error")
        s.results[rid] = CellResult(rid, cell.role, Status.FAILED if failed else Status.PASSED, phase=rerun(r),
                                    tests=(TestOutcome(name, outcome, message="AssertionError: again" if failed
                                                       else ""),))


def r_new_failure_confirmed_by_reruns(s: Situation) -> None:
    """#22 item 4: fails in the main run and in both reruns of the candidate, passes in production's: NO-GO."""
    r_new_failure_user_suite(s)
    _reruns(s, s.cand, COMPILE, "failed", "failed")
    _reruns(s, s.prod, COMPILE, "passed", "passed")


def r_flaky_failure(s: Situation) -> None:
    """#22: a failure a rerun does not repeat (the SIGABRT once in five runs) is flaky, INCONCLUSIVE."""
    r_new_failure_user_suite(s)
    _reruns(s, s.cand, COMPILE, "passed", "failed")
    _reruns(s, s.prod, COMPILE, "passed", "passed")


def r_flaky_failure_policy_go(s: Situation) -> None:
    r_flaky_failure(s)
    s.policy = replace(s.policy, flaky_failures="go")


def r_flaky_failure_policy_no_go(s: Situation) -> None:
    r_flaky_failure(s)
    s.policy = replace(s.policy, flaky_failures="no-go")


def r_new_failure_fails_in_a_production_rerun(s: Situation) -> None:
    """Fails in the candidate every time, and in a rerun of production too: not caused by the upgrade."""
    r_new_failure_user_suite(s)
    _reruns(s, s.cand, COMPILE, "failed", "failed")
    _reruns(s, s.prod, COMPILE, "failed", "passed")


def r_new_failure_reruns_recorded_nothing(s: Situation) -> None:
    """The reruns could not run it (the runner died): the main run's failure stands, said unconfirmed."""
    r_new_failure_user_suite(s)
    for cell in (s.cand, s.prod):
        rid = cell.result_id(rerun(1))
        s.results[rid] = CellResult(rid, cell.role, Status.INFRA_ERROR, reason="engine gone", phase=rerun(1))


def r_new_failure_confirmation_off(s: Situation) -> None:
    r_new_failure_user_suite(s)
    s.policy = replace(s.policy, confirm_failures=0)
    _reruns(s, s.cand, COMPILE, "passed")  # recorded, but the policy does not confirm: not read


def r_fixed_by_the_upgrade_user_suite(s: Situation) -> None:
    """Failed in production, passes in the candidate: the upgrade fixed it (GO, noted)."""
    s.policy = USER_SUITE
    s.edit(s.prod, _fail(COMPILE, "AssertionError: known"))


def r_rollback_fails_in_productions_own_run_too(s: Situation) -> None:
    """A cross-version test production fails even on its own artifacts: not the candidate's doing."""
    s.policy = USER_SUITE
    name = "test_crossversion.py::test_load_torchscript"
    s.edit(s.prod, _fail(name, "RuntimeError: known"))
    s.edit(s.cand, _fail(name, "RuntimeError: known"))
    _rollback(s, Status.FAILED, "1 test(s) failed", (TestOutcome(name, "failed", message="RuntimeError: known"),))


def r_fails_in_production_not_run_in_the_candidate(s: Situation) -> None:
    """Neither pre-existing nor fixed: noted, never silently dropped."""
    s.policy = USER_SUITE
    s.edit(s.prod, _fail(COMPILE, "AssertionError: known"))
    s.edit(s.cand, lambda r: replace(r, tests=tuple(t for t in r.tests if t.name != COMPILE)))


def test_a_production_failure_the_candidate_did_not_run_is_noted() -> None:
    rec = selftest.recorded("cuda")
    s = Situation([rec.production, rec.candidate], dict(rec.results))
    r_fails_in_production_not_run_in_the_candidate(s)
    out = gate.decide(tuple(s.cells), (), s.results, s.policy, TODAY)
    assert [r.kind for r in out.verdict.reasons if r.test == COMPILE] == ["production-failure"]


def test_a_rollback_failure_production_has_on_its_own_is_listed_as_preexisting() -> None:
    rec = selftest.recorded("cuda")
    s = Situation([rec.production, rec.candidate], dict(rec.results))
    r_rollback_fails_in_productions_own_run_too(s)
    out = gate.decide(tuple(s.cells), (), s.results, s.policy, TODAY)
    rollback = s.prod.result_id(ROLLBACK, s.cand)
    assert {(k.cell, k.baseline) for k in out.evidence.preexisting} == {(s.cand.id, s.prod.id), (s.cand.id, rollback)}


def r_hundred_thousand_samples(s: Situation) -> None:
    """#18 item 7: a metric with 1e5 samples a side (1e6 took minutes of silent CPU): the gate's cost is
    bounded (the bootstrap thins to evenly spaced order statistics) and the same workload is GO."""
    many = tuple(10.0 + (i % 997) / 997 for i in range(100_000))
    s.edit(s.prod, _samples("recsys.step_time", lambda _: many))
    s.edit(s.cand, _samples("recsys.step_time", lambda _: many))


def r_extreme_finite_samples(s: Situation) -> None:
    """1e-308 in production against 1e308 in the candidate crashed in statistics.stdev: it is a regression."""
    s.edit(s.prod, _samples("recsys.step_time", lambda xs: tuple(1e-308 for _ in xs)))
    s.edit(s.cand, _samples("recsys.step_time", lambda xs: tuple(1e308 for _ in xs)))


def _records(s: Situation, data: bytes, nodes: int = 1) -> None:
    import tempfile
    from pathlib import Path

    from stackgate import suite
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "results-node0.jsonl").write_bytes(data)
        (Path(tmp) / "junit-node0-suite.xml").write_text(
            '<testsuites><testsuite><testcase file="test_recsys.py" name="test_recsys_ddp_sharded_embeddings"/>'
            "</testsuite></testsuites>")
        built = suite.build_result(s.cand, [suite.NodeExit(n, "pytest", 0) for n in range(nodes)], Path(tmp), 1.0)
    problems = built.environment.record_problems
    s.edit(s.cand, lambda r: replace(r, status=built.status, reason=built.reason,
                                     environment=r.environment.model_copy(update={"record_problems": problems})))


def r_record_not_utf8(s: Situation) -> None:
    """#18 item 8: a record that is not UTF-8 is unreadable evidence (it became U+FFFD and counted)."""
    _records(s, b'{"name": "recsys.step_time\xff", "samples": [1.0]}\n')


def r_record_beyond_the_size_limit(s: Situation) -> None:
    _records(s, b'{"name": "recsys.step_time", "samples": [1.0], "pad": "' + b"x" * (1 << 20) + b'"}\n')


# ---- #40: meaning, not only shape (each of these gave GO, or crashed, before the boundary)

def _slower(factor: float) -> Callable[[tuple[float, ...]], tuple[float, ...]]:
    return lambda xs: tuple(x * factor for x in xs)


def r_better_not_a_direction(s: Situation) -> None:
    """`"better": "LOWER"` read as higher-is-better: a 3x slowdown became an improvement."""
    _records(s, b'{"name": "recsys.step_time", "unit": "ms", "samples": [30.0, 31.0, 32.0], "better": "LOWER"}\n')


def r_sample_a_string(s: Situation) -> None:
    _records(s, b'{"name": "recsys.step_time", "unit": "ms", "samples": ["1111", 1.0, 1.0]}\n')


def r_sample_a_boolean(s: Situation) -> None:
    _records(s, b'{"name": "recsys.step_time", "unit": "ms", "samples": [true, true, true]}\n')


def r_metric_recorded_twice(s: Situation) -> None:
    """The last of two records silently won: a 3x slowdown followed by a fast copy."""
    _records(s, b'{"name": "recsys.step_time", "unit": "ms", "samples": [30.0, 31.0, 32.0]}\n'
                b'{"name": "recsys.step_time", "unit": "ms", "samples": [10.0, 10.1, 10.2]}\n')


def r_gated_metric_recorded_as_equal(s: Situation) -> None:
    """`"better": "equal"` took a performance-gated metric out of the gate: 3x slower was GO."""
    s.edit(s.cand, lambda r: replace(r, metrics=tuple(replace(m, better="equal", samples=_slower(3)(m.samples))
                                                      if m.name == "recsys.step_time" else m for m in r.metrics)))


def r_units_disagree(s: Situation) -> None:
    """Seconds against milliseconds: 1000x apart, compared as if alike."""
    s.edit(s.cand, lambda r: replace(r, metrics=tuple(replace(m, unit="s", samples=_slower(0.001)(m.samples))
                                                      if m.name == "recsys.step_time" else m for m in r.metrics)))


def r_all_zero_samples_on_both_sides(s: Situation) -> None:
    s.edit(s.prod, _samples("recsys.step_time", lambda xs: tuple(0.0 for _ in xs)))
    s.edit(s.cand, _samples("recsys.step_time", lambda xs: tuple(0.0 for _ in xs)))


def r_nan_beyond_the_step_window(s: Situation) -> None:
    """`steps = 10` compared the first 10 steps; a NaN at step 40 was ignored."""
    s.policy = replace(POLICY, numerics=tuple(replace(n, steps=10) for n in POLICY.numerics))
    s.edit(s.cand, _samples("vit.loss", lambda xs: (*xs[:40], float("nan"), *xs[41:])))


def r_node_without_junit(s: Situation) -> None:
    """A 2-node cell whose node 1 left no JUnit was judged on node 0 alone."""
    _records(s, b"", nodes=2)


def r_waiver_never_covers_missing_evidence(s: Situation) -> None:
    """A waiver that matches every reason (made in code: load_policy refuses it) never covers "no
    candidate cell ran"."""
    cand = s.cand
    s.cells.remove(cand)
    del s.results[cand.id]
    s.policy = replace(POLICY, waivers=(Waiver("*", "*", "everything", "", dt.date(2027, 1, 1), 1),))


def r_waiver_never_covers_unreadable_evidence(s: Situation) -> None:
    """A waiver naming the candidate cell waived its ERROR, unreadable records included: a 3x slowdown
    written as "1111" strings was GO under `[[waiver]] cells = [<the cell>]`."""
    _records(s, b'{"name": "recsys.step_time", "unit": "ms", "samples": ["1111", "1111", "1111"]}\n')
    s.policy = replace(POLICY, waivers=(Waiver(s.cand.id, "*", "known broken cell", "", dt.date(2027, 1, 1), 1),))


def r_typo_in_a_performance_rule(s: Situation) -> None:
    """A one-character typo in a rule's name gated nothing: a 30% slower trainer was GO."""
    s.policy = replace(POLICY, performance=tuple(replace(r, name="recsys.step_tme", line=41)
                                                 if r.name == "recsys.step_time" else r for r in POLICY.performance))
    s.edit(s.cand, _samples("recsys.step_time", _slower(1.3)))


def r_typo_in_a_rules_tag(s: Situation) -> None:
    s.policy = replace(POLICY, performance=tuple(replace(r, tags=(("clock", "devise"),))
                                                 if r.name == "recsys.step_time" else r for r in POLICY.performance))
    s.edit(s.cand, _samples("recsys.step_time", _slower(1.3)))


def r_typo_in_a_numerics_rule(s: Situation) -> None:
    s.policy = replace(POLICY, numerics=tuple(replace(n, name="*.los") for n in POLICY.numerics))
    s.edit(s.cand, _samples("vit.loss", _slower(100)))


def r_broken_cached_environment(s: Situation) -> None:
    """#18 item 3: a cached environment that fails its check and cannot be rebuilt is the machinery's
    failure (infra-error, exit 3, retried by --resume), never a failed test."""
    s.edit(s.cand, lambda r: replace(r, status=Status.INFRA_ERROR, tests=(), metrics=(), reason=(
        "the cached environment for cu130-torch2.14.1-py3.11 is broken (torch/__init__.py: size 12, RECORD says "
        "3468) and rebuilding it failed")))


def r_host_pip_constraint(s: Situation) -> None:
    """#18 item 3b: the host's pip configuration caps torch: not a verdict on the candidate."""
    s.edit(s.cand, lambda r: replace(r, status=Status.INFRA_ERROR, tests=(), metrics=(), reason=(
        "this host's pip configuration keeps torch==2.15.0 out: The user requested (constraint) torch<=2.14.1 "
        "(global.constraint = /etc/xdg/pip/constraints.txt)")))


def r_no_candidate(s: Situation) -> None:
    cand = s.cand
    s.cells.remove(cand)
    del s.results[cand.id]


OSV_DB = Path(__file__).resolve().parents[1] / "data" / "osv"  # real OSV records (tests/data/osv/README.md)
BASE = ["filelock==4.3.1", "Jinja2==3.1.6", "setuptools==84.2.1", "pip==25.3"]
TAR = "tar==1.34+dfsg-1.2+deb12u1"  # the bootstrapped bookworm base's


def _stack(s: Situation, cell: Cell, torch: str, extra: tuple[str, ...] = (), os_packages: tuple[str, ...] = (),
           **environment: object) -> None:
    """The SBOM (and sizes) `cell` recorded, and the real OSV records to scan it against."""
    s.db = osv.load(OSV_DB)
    s.edit(cell, lambda r: replace(r, environment={**r.environment.to_json(), "stack_packages": [*BASE, f"torch=={torch}", *extra],
                                                   "os_release": "Debian:12", "os_packages": list(os_packages),
                                                   **environment}))


def r_candidate_adds_a_fixable_critical_vulnerability(s: Situation) -> None:
    _stack(s, s.prod, "2.6.0")
    _stack(s, s.cand, "2.5.1")  # torch.load weights_only RCE, fixed in 2.6.0


def r_vulnerability_fixed_by_the_upgrade(s: Situation) -> None:
    _stack(s, s.prod, "2.5.1")
    _stack(s, s.cand, "2.6.0")


def r_vulnerability_inherited_from_production(s: Situation) -> None:
    _stack(s, s.prod, "2.5.1")
    _stack(s, s.cand, "2.5.1+cu124")


def r_vulnerability_inherited_and_the_policy_blocks_it(s: Situation) -> None:
    r_vulnerability_inherited_from_production(s)
    s.policy = replace(s.policy, supply=replace(s.policy.supply, inherited="no-go"))


def _allow(review_by: dt.date) -> Waiver:
    return Waiver("*", "*", "weights come only from our own checkpoints", "", review_by, 12,
                  advisory="CVE-2025-32434", package="torch", stacks="*")


def r_allow_listed_vulnerability_before_its_review(s: Situation) -> None:
    r_candidate_adds_a_fixable_critical_vulnerability(s)
    s.policy = replace(s.policy, waivers=(_allow(TODAY + dt.timedelta(days=30)),))


def r_allow_listed_vulnerability_past_its_review(s: Situation) -> None:
    r_candidate_adds_a_fixable_critical_vulnerability(s)
    s.policy = replace(s.policy, waivers=(_allow(TODAY - dt.timedelta(days=1)),))


def r_vulnerability_beside_a_production_without_sbom(s: Situation) -> None:
    _stack(s, s.cand, "2.5.1")
    s.edit(s.prod, lambda r: replace(r, environment={k: v for k, v in r.environment.to_json().items()
                                                     if k not in ("stack_packages", "packages")}))


def r_database_given_but_the_candidate_recorded_no_sbom(s: Situation) -> None:
    _stack(s, s.prod, "2.6.0")
    s.edit(s.cand, lambda r: replace(r, environment={k: v for k, v in r.environment.to_json().items()
                                                     if k not in ("stack_packages", "packages")}))


def r_vulnerability_without_a_fix(s: Situation) -> None:
    _stack(s, s.prod, "2.6.0")
    _stack(s, s.cand, "2.6.0", os_packages=(TAR,))  # every tar, no fix published: listed, never blocking


def r_vulnerability_below_the_threshold(s: Situation) -> None:
    _stack(s, s.prod, "2.6.0")
    _stack(s, s.cand, "2.6.0", extra=("pip==23.0.1",))  # MODERATE, fixed in 23.3


def r_unrated_fixable_debian_advisory_the_policy_counts(s: Situation) -> None:
    _stack(s, s.prod, "2.6.0", os_packages=("glibc==2.36-9+deb12u14",))
    _stack(s, s.cand, "2.6.0", os_packages=("glibc==2.36-9+deb12u2",))  # DSA-5514-1: fixed in deb12u3
    s.policy = replace(s.policy, supply=replace(s.policy.supply, unrated="block"))


def r_advisory_whose_range_cannot_be_ordered(s: Situation) -> None:
    """#40: an OSV range with a version PEP 440 cannot order was skipped: 0 findings, GO. It is an
    unclassified finding now, counted like UNRATED (here the policy blocks those)."""
    _stack(s, s.prod, "2.6.0")
    _stack(s, s.cand, "2.6.0", extra=("tinypkg==1.0",))  # new in the candidate
    from stackgate.boundary.osv import Record
    record = Record.model_validate_json(
        '{"id": "GHSA-test-unordered", "affected": [{"package": {"ecosystem": "PyPI", "name": "tinypkg"}, '
        '"ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": "4.4-final!!"}]}]}]}')
    s.db = osv.Database(OSV_DB, [osv.Advisory(record.id, (), "", "UNRATED", tuple(record.affected), "test")])
    s.policy = replace(s.policy, supply=replace(s.policy.supply, unrated="block"))


def _same_build_kind(s: Situation) -> None:
    """Production as a CUDA build too (the recording's is a CPU build): sizes compare like with like."""
    prod = s.prod
    s.cells[0] = replace(prod, stack=replace(prod.stack, cuda=s.cand.stack.cuda))
    s.results[s.cells[0].id] = replace(s.results.pop(prod.id), cell_id=s.cells[0].id)
    s.cells[1] = replace(s.cand, baseline=s.cells[0].id)


def r_candidate_grows_beyond_the_size_limit(s: Situation) -> None:
    _same_build_kind(s)
    _stack(s, s.prod, "2.6.0", env_size=4_000_000_000, package_sizes={"torch": 3_000_000_000})
    _stack(s, s.cand, "2.6.0", env_size=4_600_000_000, package_sizes={"torch": 3_000_000_000,
                                                                     "ballast": 600_000_000})


def r_candidate_grows_within_the_size_limit(s: Situation) -> None:
    _same_build_kind(s)
    _stack(s, s.prod, "2.6.0", env_size=4_000_000_000)
    _stack(s, s.cand, "2.6.0", env_size=4_300_000_000)


ROWS: list[tuple[Callable[[Situation], None], Decision, str]] = [
    (r_clean, Decision.GO, ""),
    (r_candidate_without_metrics, Decision.INCONCLUSIVE, "missing-metric"),
    (r_gated_metric_missing_in_production, Decision.INCONCLUSIVE, "missing-metric"),
    (r_partner_pruned, Decision.INCONCLUSIVE, "no-baseline"),
    (r_partner_never_ran, Decision.INCONCLUSIVE, "no-baseline"),
    (r_failed_without_failing_test, Decision.NO_GO, "failed-without-test"),
    (r_numerics_nan, Decision.NO_GO, "numerics"),
    (r_trajectory_cut_short, Decision.NO_GO, "numerics"),
    (r_unreadable_results_line, Decision.INCONCLUSIVE, "bad-record"),
    (r_unreadable_metrics_record, Decision.NO_GO, "cell-error"),
    (r_required_cell_left_out_by_selection, Decision.INCONCLUSIVE, "not-run-here"),
    (r_infra_error, Decision.INCONCLUSIVE, "cell-infra-error"),
    (r_rollback_infra_error, Decision.INCONCLUSIVE, "rollback"),
    (r_rollback_failed_without_test, Decision.NO_GO, "rollback"),
    (r_rollback_cannot_read, Decision.NO_GO, "rollback"),
    (r_rollback_no_crossversion_tests, Decision.GO, ""),
    (r_baseline_failed, Decision.INCONCLUSIVE, "cell-timeout"),
    (r_required_test_skipped, Decision.INCONCLUSIVE, "required-test-skipped"),
    (r_required_test_missing, Decision.INCONCLUSIVE, "required-test-missing"),
    (r_peak_memory_plus_20, Decision.NO_GO, "regression"),
    (r_peak_memory_plus_4, Decision.GO, ""),
    (r_perf_sample_nan, Decision.INCONCLUSIVE, "perf-inconclusive"),
    (r_expired_waiver, Decision.NO_GO, "failed-test"),
    (r_no_candidate, Decision.INCONCLUSIVE, "no-candidate"),
    (r_preexisting_failure_user_suite, Decision.GO, ""),
    (r_preexisting_error_and_failure_user_suite, Decision.GO, ""),
    (r_preexisting_failure_policy_inconclusive, Decision.INCONCLUSIVE, "preexisting-failure"),
    (r_harness_only_failure, Decision.INCONCLUSIVE, "harness-failure"),
    (r_harness_only_failure_policy_go, Decision.GO, ""),
    (r_preexisting_failure_confirmed_by_plain_pytest, Decision.GO, ""),
    (r_preexisting_failure_bundled_suite, Decision.INCONCLUSIVE, "preexisting-failure"),
    (r_required_test_fails_in_both, Decision.INCONCLUSIVE, "failed-test"),
    (r_new_failure_user_suite, Decision.NO_GO, "failed-test"),
    (r_new_failure_confirmed_by_reruns, Decision.NO_GO, "failed-test"),
    (r_flaky_failure, Decision.INCONCLUSIVE, "flaky"),
    (r_flaky_failure_policy_go, Decision.GO, ""),
    (r_flaky_failure_policy_no_go, Decision.NO_GO, "flaky"),
    (r_new_failure_fails_in_a_production_rerun, Decision.INCONCLUSIVE, "production-fails"),
    (r_new_failure_reruns_recorded_nothing, Decision.NO_GO, "failed-test"),
    (r_new_failure_confirmation_off, Decision.NO_GO, "failed-test"),
    (r_fixed_by_the_upgrade_user_suite, Decision.GO, ""),
    (r_rollback_fails_in_productions_own_run_too, Decision.GO, ""),
    (r_fails_in_production_not_run_in_the_candidate, Decision.GO, ""),
    (r_hundred_thousand_samples, Decision.GO, ""),
    (r_extreme_finite_samples, Decision.NO_GO, "regression"),
    (r_record_not_utf8, Decision.NO_GO, "unreadable-evidence"),
    (r_record_beyond_the_size_limit, Decision.NO_GO, "unreadable-evidence"),
    (r_broken_cached_environment, Decision.INCONCLUSIVE, "cell-infra-error"),
    (r_host_pip_constraint, Decision.INCONCLUSIVE, "cell-infra-error"),
    (r_candidate_adds_a_fixable_critical_vulnerability, Decision.NO_GO, "vulnerability"),
    (r_vulnerability_fixed_by_the_upgrade, Decision.GO, ""),
    (r_vulnerability_inherited_from_production, Decision.GO, ""),
    (r_vulnerability_inherited_and_the_policy_blocks_it, Decision.NO_GO, "vulnerability-inherited"),
    (r_allow_listed_vulnerability_before_its_review, Decision.GO, ""),
    (r_allow_listed_vulnerability_past_its_review, Decision.NO_GO, "allow-expired"),
    (r_vulnerability_beside_a_production_without_sbom, Decision.INCONCLUSIVE, "vulnerability-unclassified"),
    (r_database_given_but_the_candidate_recorded_no_sbom, Decision.INCONCLUSIVE, "not-scanned"),
    (r_vulnerability_without_a_fix, Decision.GO, ""),
    (r_vulnerability_below_the_threshold, Decision.GO, ""),
    (r_unrated_fixable_debian_advisory_the_policy_counts, Decision.NO_GO, "vulnerability"),
    (r_candidate_grows_beyond_the_size_limit, Decision.NO_GO, "size"),
    (r_candidate_grows_within_the_size_limit, Decision.GO, ""),
    (r_advisory_whose_range_cannot_be_ordered, Decision.INCONCLUSIVE, "vulnerability-unclassified"),
    (r_better_not_a_direction, Decision.NO_GO, "unreadable-evidence"),
    (r_sample_a_string, Decision.NO_GO, "unreadable-evidence"),
    (r_sample_a_boolean, Decision.NO_GO, "unreadable-evidence"),
    (r_metric_recorded_twice, Decision.NO_GO, "unreadable-evidence"),
    (r_gated_metric_recorded_as_equal, Decision.INCONCLUSIVE, "metric-mismatch"),
    (r_units_disagree, Decision.INCONCLUSIVE, "metric-mismatch"),
    (r_all_zero_samples_on_both_sides, Decision.INCONCLUSIVE, "perf-inconclusive"),
    (r_nan_beyond_the_step_window, Decision.NO_GO, "numerics"),
    (r_node_without_junit, Decision.NO_GO, "unreadable-evidence"),
    (r_waiver_never_covers_missing_evidence, Decision.INCONCLUSIVE, "no-candidate"),
    (r_waiver_never_covers_unreadable_evidence, Decision.NO_GO, "unreadable-evidence"),
    (r_typo_in_a_performance_rule, Decision.INCONCLUSIVE, "unmatched-rule"),
    (r_typo_in_a_rules_tag, Decision.INCONCLUSIVE, "unmatched-rule"),
    (r_typo_in_a_numerics_rule, Decision.INCONCLUSIVE, "unmatched-rule"),
]


@pytest.mark.parametrize(("situation", "decision", "kind"), ROWS, ids=[r[0].__name__[2:] for r in ROWS])
def test_truth_table(situation: Callable[[Situation], None], decision: Decision, kind: str) -> None:
    rec = selftest.recorded("cuda")
    s = Situation([rec.production, rec.candidate], dict(rec.results))
    situation(s)
    scans = supply.scan(s.cells, s.results, s.db)
    out = gate.decide(tuple(s.cells), tuple(s.not_here), s.results, s.policy, TODAY, tuple(s.problems), scans)
    assert out.verdict.decision is decision, [r.to_json() for r in out.verdict.reasons
                                              if r.severity in (Severity.BLOCKING, Severity.INCONCLUSIVE)]
    deciding = {Decision.NO_GO: Severity.BLOCKING, Decision.INCONCLUSIVE: Severity.INCONCLUSIVE}.get(decision)
    if deciding is not None:
        assert kind in {r.kind for r in out.verdict.reasons if r.severity is deciding}, out.verdict.reasons
    else:
        assert not [r for r in out.verdict.reasons if r.severity in (Severity.BLOCKING, Severity.INCONCLUSIVE)]


@pytest.mark.parametrize("case", selftest.CASES, ids=[c.name for c in selftest.CASES])
def test_every_selftest_case_is_a_row(case: selftest.Case) -> None:
    ok, outcome = selftest.run_case(case, POLICY, TODAY)
    assert ok, outcome.verdict.reasons


def test_reasons_name_outcomes_as_words() -> None:
    rec = selftest.recorded("cuda")
    failing = selftest._fail_test(rec.candidate_result, "test_identity.py::test_torch_version", "AssertionError: x")
    out = gate.decide((rec.production, rec.candidate), (), rec.with_candidate(failing), POLICY, TODAY)
    assert [r.message for r in out.verdict.blocking] == [
        "failed: AssertionError: x (not confirmed: its reruns recorded no result for it)"]


def test_a_flaky_failure_says_what_the_reruns_saw() -> None:
    rec = selftest.recorded("cuda")
    s = Situation([rec.production, rec.candidate], dict(rec.results))
    r_flaky_failure(s)
    out = gate.decide(tuple(s.cells), (), s.results, s.policy, TODAY)
    [flaky] = [r for r in out.verdict.reasons if r.kind == "flaky"]
    assert flaky.message.startswith("flaky: failed in the candidate's main run, passed in 1 of 2 rerun(s), failed "
                                    "in 1: failed: AssertionError: differs from eager"), flaky.message
    r_new_failure_confirmed_by_reruns(s := Situation([rec.production, rec.candidate], dict(rec.results)))
    out = gate.decide(tuple(s.cells), (), s.results, s.policy, TODAY)
    assert [r.message for r in out.verdict.blocking] == [
        "failed: AssertionError: differs from eager (confirmed: failed in all 3 candidate runs; production passed "
        "in 3 run(s))"]


def test_a_preexisting_failure_is_listed_with_both_messages() -> None:
    s = Situation([selftest.recorded("cuda").production, selftest.recorded("cuda").candidate],
                  dict(selftest.recorded("cuda").results))
    r_preexisting_error_and_failure_user_suite(s)
    out = gate.decide(tuple(s.cells), (), s.results, s.policy, TODAY)
    [known] = out.evidence.preexisting
    assert (known.cell, known.baseline, known.test) == (s.cand.id, s.prod.id, COMPILE)
    assert known.candidate == "failed: AssertionError"
    assert known.production == "error: fixture 'worker_id' not found"
    assert [r.kind for r in out.verdict.reasons if r.test == COMPILE] == ["preexisting-failure"]


def test_a_harness_failure_is_named_with_both_outcomes_and_never_listed_as_preexisting() -> None:
    rec = selftest.recorded("cuda")
    s = Situation([rec.production, rec.candidate], dict(rec.results))
    r_harness_only_failure(s)
    out = gate.decide(tuple(s.cells), (), s.results, s.policy, TODAY)
    assert out.evidence.preexisting == ()
    [reason] = [r for r in out.verdict.reasons if r.test == COMPILE]
    assert reason.kind == "harness-failure" and reason.cell == s.cand.id
    assert "needs pytest-xdist workers" in reason.message and "plain pytest in production: passed" in reason.message
    s = Situation([rec.production, rec.candidate], dict(rec.results))
    r_preexisting_failure_confirmed_by_plain_pytest(s)
    [known] = gate.decide(tuple(s.cells), (), s.results, s.policy, TODAY).evidence.preexisting
    assert known.test == COMPILE


# ---- situations that must never reach the gate: bad input that would give a false verdict is exit 2

def _config_required_glob_typo() -> None:
    """#18 item 1: `required = ["lcoal-*"]` made nothing required (a failing candidate was GO)."""
    from stackgate import matrix
    from tests.unit.test_matrix import _expand
    matrix.require(_expand("upgrade.toml", fleet.LocalHost()), ["lcoal-*"])


def _config_rtol_nan() -> None:
    """#18 item 2: `rtol = nan` turned a 100x loss divergence into GO."""
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "policy.toml"
        path.write_text("[[numerics.metric]]\nname = '*.loss'\nrtol = nan\n")
        load_policy(path)


def _config_stale_pypi_default() -> None:
    """#18 item 3c: PyPI's 2.15.0 is a CUDA 13.2 build; a table saying cu130 built the wrong stack."""
    import tempfile
    from pathlib import Path

    from stackgate import compat, resolve
    from stackgate.model import Stack
    from stackgate.versions import CudaVariant, parse_torch
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "compat.toml"
        path.write_text((shipped.MATRIX_DIR / "compat.toml").read_text().replace('pypi_default = "cu132"',
                                                                                  'pypi_default = "cu130"'))
        wrong = resolve.identity_problem(Stack(parse_torch("2.15.0"), CudaVariant("cu130"), "3.11"),
                                         ("torch==2.15.0", "nvidia-cuda-runtime==13.2.86"), compat.load_compat(path))
    if wrong is not None:
        raise wrong


def _config_policy(name: str, text: str) -> Callable[[], None]:
    def load() -> None:
        import tempfile
        from pathlib import Path
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "policy.toml"
            path.write_text(text)
            load_policy(path)
    load.__name__ = f"_config_{name}"
    return load


_config_typo_in_a_rules_device = _config_policy("typo_in_a_rules_device",
    "[[performance.metric]]\nname = 'recsys.step_time'\ntolerance = 0.05\ndevices = ['cdua']\n")
_config_waiver_that_names_nothing = _config_policy("waiver_that_names_nothing",
    "[[waiver]]\nreason = 'flaky'\nexpires = 2027-01-01\n")


CONFIG_ROWS = [
    (_config_typo_in_a_rules_device, "policy.toml:4: devices = 'cdua' is not one of \"cpu\", \"cuda\""),
    (_config_waiver_that_names_nothing, "policy.toml:1: [[waiver]] ('flaky') names no cells and no tests"),
    (_config_required_glob_typo, "matches no cell of the matrix"),
    (_config_rtol_nan, "'rtol' = nan is not a finite number"),
    (_config_stale_pypi_default, 'pypi_default = "cu130", but the wheel source\'s default torch==2.15.0 is a CUDA 13.2'),
]


@pytest.mark.parametrize(("situation", "words"), CONFIG_ROWS, ids=[r[0].__name__[8:] for r in CONFIG_ROWS])
def test_bad_input_that_would_give_a_false_verdict_never_reaches_the_gate(situation: Callable[[], None],
                                                                          words: str) -> None:
    from stackgate.errors import ConfigError, ExitCode
    with pytest.raises(ConfigError) as info:
        situation()
    assert words in str(info.value) and info.value.exit_code is ExitCode.CONFIG


def test_a_rollback_failure_names_the_compile_caches_production_ran_on() -> None:
    """#43 item 3: production's rollback runs on the compile caches the candidate left (the harness points
    TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR there); a failure there names them, with where they are in
    the run directory, whatever the suite's own message says."""
    rec = selftest.recorded("cuda")
    s = Situation([rec.production, rec.candidate], dict(rec.results))
    _rollback(s, Status.FAILED, "1 test(s) failed", (TestOutcome(
        "test_model.py::test_compiled_matches_eager", "failed", message="AssertionError: Tensor-likes are not close!"),))
    out = gate.decide(tuple(s.cells), (), s.results, s.policy, TODAY)
    assert out.verdict.decision is Decision.NO_GO
    [reason] = [r for r in out.verdict.reasons if r.kind == "rollback"]
    pool, topology = s.cand.comparison_key
    where = f"artifacts/{pool}-{topology}/{s.cand.stack.label}/production/compile-cache"
    assert "TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR" in reason.message and where in reason.message
    assert reason.message.endswith("AssertionError: Tensor-likes are not close!")
