"""`stackgate watch` (#44) on a promotion made here by the real `promote` (a fake registry at the Tags
seam): a new OSV record against a wheel in production's lock is a finding naming it and its fix; what
the promoted run's scan already knew is not; an allow-list entry whose advisory gained a fix fails,
naming its file:line; a missing `:previous`, a tag moved elsewhere and a changed locked wheel are
rollback findings; a clean production is exit 0 with every check done; no database is exit 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from stackgate import history, options, shipped
from stackgate.commands import promote, watch
from stackgate.errors import ConfigError
from stackgate.policy import DriftRule
from stackgate.watch import Measured, in_force, shift

REPO = "reg.example/team/stack"
TESTED = REPO + "@sha256:" + "c" * 64
OLD = REPO + "@sha256:" + "a" * 64
STACK = {"torch": "2.14.1", "cuda": "cu130", "python": "3.11"}


class FakeRegistry:
    """Tags by (repository, tag) -> image reference; `head` answers like a manifest request."""

    def __init__(self) -> None:
        self.tags: dict[tuple[str, str], str] = {(REPO, "production"): OLD}

    def resolve_tag(self, name: str, tag: str) -> str | None:
        return self.tags.get((name, tag))

    def move_tag(self, ref: str, name: str, tag: str) -> str:
        self.tags[(name, tag)] = ref
        return ref

    def head(self, name: str, tag: str) -> str | None:
        ref = self.tags.get((name, tag))
        return ref.rpartition("@")[2] if ref else None


def _advisory(advisory: str, package: str, fixed: str | None, severity: str = "HIGH") -> dict[str, object]:
    events: list[dict[str, str]] = [{"introduced": "0"}] + ([{"fixed": fixed}] if fixed else [])
    return {"id": advisory, "modified": "2026-12-01T00:00:00Z", "summary": f"{package} is broken",
            "affected": [{"package": {"ecosystem": "PyPI", "name": package},
                          "ranges": [{"type": "ECOSYSTEM", "events": events}]}],
            "database_specific": {"severity": severity}}


def _db(root: Path, *records: dict[str, object]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for record in records:
        (root / f"{record['id']}.json").write_text(json.dumps(record))
    return root


def _setup(tmp_path: Path, registry: FakeRegistry, allow: str = "") -> options.Options:
    """A GO run whose candidate stack (torch 2.14.1, numpy 2.1.0; its scan knew GHSA-known in numpy)
    promoted to production: the history, the run's lock and wheels, `:production` and `:previous`."""
    cfg = tmp_path / "cfg"
    shutil.copytree(shipped.MATRIX_DIR, cfg)
    (cfg / "fleet.toml").write_text((cfg / "fleet.toml").read_text().split("[registry]")[0]
                                    + '\n[registry]\nurl = "reg.example"\nrepository = "team/stack"\n')
    if allow:
        (cfg / "policy.toml").write_text((cfg / "policy.toml").read_text() + allow)
    run = tmp_path / "reports" / "r1"
    run.mkdir(parents=True)
    env = {"image_digest": TESTED, "stack_packages": ["torch==2.14.1", "numpy==2.1.0"]}
    known = {"stack": "cu130-torch2.14.1-py3.11", "scanned": True,
             "findings": [{"advisory": "GHSA-known", "package": "numpy", "aliases": ["CVE-2026-1"]}]}
    (run / "report.json").write_text(json.dumps({
        "schema_version": 1, "decision": "GO", "run": {"id": "r1"},
        "cells": [{"id": "local-x", "role": "candidate", "status": "passed", "device": "cpu", "stack": STACK,
                   "environment": env}],
        "supply_chain": [{"cell": "local-x", "candidate": known}]}))
    wheels = tmp_path / "cache" / "wheelhouse" / "w"
    wheels.mkdir(parents=True)
    (wheels / "torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"torch bytes")
    (wheels / "numpy-2.1.0-cp311-cp311-manylinux_2_17_x86_64.whl").write_bytes(b"numpy bytes")
    opts = options.read({"reports": str(tmp_path / "reports"), "cache_dir": str(tmp_path / "cache"),
                         "config_dir": str(cfg)}, {}, tmp_path / "none.toml", cwd=tmp_path)
    assert promote.promote(opts, {"USER": "tester"}, "r1", say=lambda _: None, tags=lambda: registry) == 0
    return opts


def _watch(opts: options.Options, registry: FakeRegistry, db: Path | None,
           canary: watch.Canary | None = None) -> tuple[int, dict[str, dict[str, object]]]:
    if db is not None:
        opts = options.read({"reports": str(opts.reports), "config_dir": str(opts.config_dir), "vuln_db": str(db)},
                            {}, Path("/nonexistent/stackgate.toml"))
    lines: list[str] = []
    code = watch.watch(opts, {}, say=lines.append, head=lambda: registry.head, canary=canary)
    [out] = sorted(opts.reports.glob("watch-*/watch.json"))
    data = json.loads(out.read_text())
    shutil.rmtree(out.parent)
    assert data["exit_code"] == code
    return code, {c["name"]: c for c in data["checks"]}


def test_a_clean_production_is_exit_0_with_every_check_done(tmp_path: Path) -> None:
    registry = FakeRegistry()
    opts = _setup(tmp_path, registry)
    assert registry.tags[(REPO, "production")] == TESTED and registry.tags[(REPO, "previous")] == OLD
    db = _db(tmp_path / "osv", _advisory("GHSA-known", "numpy", None), _advisory("GHSA-old", "torch", "2.6.0"))
    code, checks = _watch(opts, registry, db)
    assert code == 0, checks
    assert {name: c["state"] for name, c in checks.items()} == {"advisories": "clean", "allow-list": "clean",
                                                                "rollback": "clean", "drift": "skipped"}
    assert "1 known then" in str(checks["advisories"]["detail"])  # known at the promotion: not a finding
    rows = history.watches(opts.history)
    assert [(r.check_name, r.state, r.run_id) for r in rows] == [("advisories", "clean", "r1"),
                                                                 ("allow-list", "clean", "r1"), ("rollback", "clean", "r1"),
                                                                 ("drift", "skipped", "r1")]


def test_a_new_advisory_against_a_locked_wheel_names_it_and_its_fix(tmp_path: Path) -> None:
    registry = FakeRegistry()
    opts = _setup(tmp_path, registry)
    db = _db(tmp_path / "osv", _advisory("GHSA-new1", "numpy", None, "CRITICAL"),
             _advisory("GHSA-new2", "numpy", "2.2.1", "MODERATE"), _advisory("GHSA-known", "numpy", "2.2.0"))
    code, checks = _watch(opts, registry, db)
    assert code == 1
    found = checks["advisories"]["findings"]
    assert [f["message"].split()[0] for f in found] == ["GHSA-new2", "GHSA-new1"]  # fixable first
    assert found[0]["fix"] == "upgrade numpy to >= 2.2.1" and "numpy 2.1.0" in found[0]["message"]
    assert found[1]["fix"] == "no fix published yet"


def test_an_allow_list_entry_whose_advisory_gained_a_fix_fails_naming_its_line(tmp_path: Path) -> None:
    registry = FakeRegistry()
    allow = ('\n[[vulnerabilities.allow]]\nid = "CVE-2026-7"\npackage = "torch"\n'
             'reason = "no fix available; we never load untrusted checkpoints"\nreview_by = 2027-06-30\n')
    opts = _setup(tmp_path, registry, allow)
    line = (opts.config_dir / "policy.toml").read_text().splitlines().index("[[vulnerabilities.allow]]") + 1
    without_fix = dict(_advisory("GHSA-allowed", "torch", None), aliases=["CVE-2026-7"])
    code, checks = _watch(opts, registry, _db(tmp_path / "osv1", without_fix))
    assert checks["allow-list"]["state"] == "clean"  # waived, and still no fix: the entry holds
    with_fix = dict(_advisory("GHSA-allowed", "torch", "2.14.2"), aliases=["CVE-2026-7"])
    code, checks = _watch(opts, registry, _db(tmp_path / "osv2", with_fix))
    assert code == 1
    [found] = checks["allow-list"]["findings"]
    assert f"policy.toml:{line}" in found["subject"] and "torch 2.14.2 fixes it" in found["message"]
    assert found["fix"].startswith("move torch to >= 2.14.2")


def test_a_missing_previous_a_moved_tag_and_a_changed_wheel_are_rollback_findings(tmp_path: Path) -> None:
    registry = FakeRegistry()
    opts = _setup(tmp_path, registry)
    db = _db(tmp_path / "osv", _advisory("GHSA-other", "pandas", "3.0.0"))
    del registry.tags[(REPO, "previous")]
    code, checks = _watch(opts, registry, db)
    assert code == 1
    [gone] = checks["rollback"]["findings"]
    assert gone["subject"] == f"{REPO}:previous" and gone["fix"] == f"re-push {OLD} as {REPO}:previous"
    assert "nothing to go back to" in gone["message"]
    registry.tags[(REPO, "previous")] = OLD
    registry.tags[(REPO, "production")] = REPO + "@sha256:" + "d" * 64
    wheel = next((opts.reports / "r1" / "promotion").rglob("numpy-*.whl"))
    wheel.write_bytes(b"not the tested numpy")
    code, checks = _watch(opts, registry, db)
    messages = [f["message"] for f in checks["rollback"]["findings"]]
    assert any("production names sha256:" + "d" * 64 in m for m in messages), messages
    assert any("is not the wheel the lock names" in m for m in messages), messages


def test_no_database_is_exit_2_after_the_other_checks_and_no_promotion_is_a_config_error(tmp_path: Path) -> None:
    registry = FakeRegistry()
    opts = _setup(tmp_path, registry)
    code, checks = _watch(opts, registry, None)
    assert code == 2
    assert checks["advisories"]["state"] == "not-run" and "--vuln-db" in str(checks["advisories"]["detail"])
    assert checks["rollback"]["state"] == "clean"
    empty = options.read({"reports": str(tmp_path / "elsewhere")}, {}, Path("/nonexistent/stackgate.toml"))
    with pytest.raises(ConfigError, match="no promotion recorded"):
        watch.watch(empty, {}, say=lambda _: None, head=lambda: registry.head)


def test_a_rollback_undoes_the_promotion_in_force() -> None:
    step = history.Promotion(at="t1", who="w", action="promote", run_id="r1", stack="s", image="", tag="",
                             previous="", production_toml="", previous_toml="")
    later = step.model_copy(update={"at": "t2", "run_id": "r2"})
    back = later.model_copy(update={"at": "t3", "action": "rollback"})
    assert [p.run_id for p in in_force([step, later])] == ["r1", "r2"]
    assert [p.run_id for p in in_force([step, later, back])] == ["r1"]


def test_a_version_1_history_gains_the_run_directory_and_keeps_its_promotions(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "history.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE promotions (at TEXT, who TEXT, action TEXT, run_id TEXT, stack TEXT, image TEXT, "
                 "tag TEXT, previous TEXT, production_toml TEXT, previous_toml TEXT)")
    conn.execute("INSERT INTO promotions VALUES ('t1','w','promote','r1','s','','','','p','q')")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    [old] = history.promotions(path)
    assert (old.run_id, old.run_dir) == ("r1", "")  # read as before; watch looks in <reports>/r1
    history.record_promotion(path, [old.model_copy(update={"at": "t2", "run_id": "r2", "run_dir": "/runs/r2"})])
    assert [(p.run_id, p.run_dir) for p in history.promotions(path)] == [("r1", ""), ("r2", "/runs/r2")]
    assert in_force(history.promotions(path))[-1].run_dir == "/runs/r2"


def _canary(medians: list[float], seen: list[tuple[float, ...]]) -> watch.Canary:
    """A canary that measured `medians` in turn (one per watch), and saw the earlier medians the real
    one would read from the history (what the watch recorded before)."""
    def run(opts: options.Options, env: object, console: object) -> watch.CanaryRun:
        earlier = history.canary_baseline(opts.history, cell_id="prod-local", suite="bundled", profile=opts.profile,
                                          metric="canary.step_time[clock=cpu]", limit=10)
        seen.append(tuple(earlier))
        return watch.CanaryRun(f"canary-{len(seen)}", DriftRule(),
                               (Measured("local", "prod-local", "canary.step_time[clock=cpu]", medians[len(seen) - 1],
                                         tuple(earlier)),))
    return run


def test_the_canary_builds_its_baseline_then_flags_a_pool_that_moved(tmp_path: Path) -> None:
    """Five canaries build the baseline (recording, exit 0); a sixth 30% slower is the pool that changed
    (exit 1, naming pool, metric and shift); the gate run after it says so beside its comparison."""
    registry = FakeRegistry()
    opts = _setup(tmp_path, registry)
    db = _db(tmp_path / "osv", _advisory("GHSA-other", "pandas", "3.0.0"))
    medians = [100.0, 102.0, 99.0, 101.0, 100.5, 100.8, 131.0]
    seen: list[tuple[float, ...]] = []
    canary = _canary(medians, seen)
    states = []
    for _ in medians:
        code, checks = _watch(opts, registry, db, canary)
        states.append((code, checks["drift"]["state"]))
    assert states == [(0, "recording")] * 5 + [(0, "clean"), (1, "findings")]
    assert seen[-1][:6] == (100.8, 100.5, 101.0, 99.0, 102.0, 100.0)  # newest first, from the history
    [moved] = checks["drift"]["findings"]
    assert moved["subject"] == "pool local: canary.step_time[clock=cpu]"
    assert "the pool changed, not the stack" in moved["message"] and "+30.2%" in moved["message"]
    [last] = history.last_canaries(opts.history, ["prod-local"])
    assert last.flagged == 1 and last.baseline == pytest.approx(100.65)


def test_a_shift_needs_the_tolerance_and_the_spread() -> None:
    rule = DriftRule(tolerance=0.15, runs=10, min_runs=5, spread_k=3.0)
    quiet = (100.0, 101.0, 99.0, 100.0, 100.5, 99.5)
    assert shift(Measured("p", "c", "m", 100.0, quiet[:4]), rule) is None  # too few earlier canaries
    assert not shift(Measured("p", "c", "m", 110.0, quiet), rule).flagged  # type: ignore[union-attr]  # within 15%
    assert shift(Measured("p", "c", "m", 80.0, quiet), rule).flagged  # type: ignore[union-attr]  # faster counts too
    noisy = (100.0, 70.0, 130.0, 85.0, 120.0, 95.0)
    assert not shift(Measured("p", "c", "m", 125.0, noisy), rule).flagged  # type: ignore[union-attr]  # its own noise


def test_the_gate_run_after_a_moved_canary_says_so_beside_the_comparison_and_decides_nothing() -> None:
    import datetime as dt

    from stackgate import gate, selftest
    from stackgate.model import Decision
    from stackgate.policy import load_policy

    rec = selftest.recorded("cpu")
    policy = load_policy(shipped.MATRIX_DIR / "policy.toml")
    row = history.Canary(at="2026-12-06T03:00:00Z", run_id="c1", pool=rec.production.pool.name,
                         cell_id=rec.production.id, suite="bundled", profile="quick",
                         metric="recsys.step_time[clock=cpu]", median=131.0, baseline=100.65, shift=0.3016, flagged=1)
    plain = gate.decide((rec.production, rec.candidate), (), rec.results, policy, dt.date(2026, 12, 7))
    told = gate.decide((rec.production, rec.candidate), (), rec.results, policy, dt.date(2026, 12, 7), canaries=[row])
    assert told.verdict.decision is plain.verdict.decision is Decision.GO
    [said] = [r for r in told.verdict.reasons if r.kind == "pool-drift"]
    assert said.cell == rec.candidate.id and "the pool changed, not the stack" in said.message
    assert "+30.2%" in said.message
    quiet = row.model_copy(update={"flagged": 0, "shift": 0.01})
    calm = gate.decide((rec.production, rec.candidate), (), rec.results, policy, dt.date(2026, 12, 7), canaries=[quiet])
    assert not [r for r in calm.verdict.reasons if r.kind == "pool-drift"]


def test_a_canary_that_cannot_start_keeps_the_other_checks_and_says_why(tmp_path: Path) -> None:
    from stackgate.errors import InfraError

    registry = FakeRegistry()
    opts = _setup(tmp_path, registry)
    db = _db(tmp_path / "osv", _advisory("GHSA-new", "numpy", "2.2.1"))

    def broken(kind: type[Exception]) -> watch.Canary:
        def run(opts: options.Options, env: object, console: object) -> watch.CanaryRun:
            raise kind("upgrade.toml:6: unknown runner pool 'local'")
        return run

    for kind, state, code in ((ConfigError, "not-run", 2), (InfraError, "error", 3)):
        got, checks = _watch(opts, registry, db, broken(kind))
        assert got == code and checks["drift"]["state"] == state
        assert "unknown runner pool 'local'" in str(checks["drift"]["detail"])
        assert checks["advisories"]["state"] == "findings"  # found before the canary, and kept
