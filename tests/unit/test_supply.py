"""Issue 23: the OSV database on disk (real records, tests/data/osv), the SBOM read from an image's dpkg
status (a real bookworm one, cut to four packages), and what the supply-chain reasons say."""

from __future__ import annotations

import datetime as dt
import json
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from stackgate import gate, osv, selftest, shipped, supply
from stackgate.errors import ConfigError
from stackgate.model import Decision, Severity
from stackgate.policy import load_policy
from stackgate.report.supply_section import stub

DATA = Path(__file__).resolve().parents[1] / "data"
DB = osv.load(DATA / "osv")
POLICY = load_policy(shipped.MATRIX_DIR / "policy.toml")


def _found(ecosystem: str, name: str, version: str) -> list[tuple[str, str, str | None]]:
    return [(f.advisory, f.severity, f.fixed) for f in DB.scan([osv.Package(ecosystem, name, version)])]


def test_pypi_versions_match_by_pep_440_ranges() -> None:
    assert _found("PyPI", "torch", "2.5.1") == [("GHSA-53q9-r3pm-6pq6", "CRITICAL", "2.6.0")]
    assert _found("PyPI", "torch", "2.6.0") == []  # the first fixed version
    assert _found("PyPI", "torch", "2.13.0+cpu") == []  # a local label is still 2.13.0
    assert _found("PyPI", "Jinja2", "3.1.5") == [("GHSA-cpwx-vrp4-4pq7", "MODERATE", "3.1.6")]  # names by PEP 503
    assert _found("PyPI", "pip", "23.0.1") == [("GHSA-mq26-g339-26xf", "MODERATE", "23.3")]


def test_debian_versions_match_in_dpkg_order_per_release() -> None:
    assert _found("Debian:12", "glibc", "2.36-9+deb12u2") == [("DSA-5514-1", "UNRATED", "2.36-9+deb12u3")]
    assert _found("Debian:12", "glibc", "2.36-9+deb12u14") == []  # deb12u14 > deb12u3 (not as strings)
    assert _found("Debian:11", "glibc", "2.31-13+deb11u6") == [("DSA-5514-1", "UNRATED", "2.31-13+deb11u7")]
    assert _found("Debian:12", "tar", "1.34+dfsg-1.2+deb12u1") == [("DEBIAN-CVE-2005-2541", "UNRATED", None)]
    assert _found("Debian:13", "tar", "1.35+dfsg-3") == []  # no entry for that release


def test_the_sbom_of_an_image_is_its_source_packages() -> None:
    status = (DATA / "dpkg-status-bookworm").read_text()
    assert osv.dpkg_sources(status) == ["glibc==2.36-9+deb12u14", "openssl==3.0.20-1~deb12u2",
                                        "tar==1.34+dfsg-1.2+deb12u1", "zlib==1:1.2.13.dfsg-1"]
    assert osv.os_release((DATA / "os-release-bookworm").read_text()) == "Debian:12"
    assert osv.os_release('ID=ubuntu\nVERSION_ID="24.04"\n') == ""  # OSV's Debian data is not Ubuntu's


def test_a_zip_of_records_is_a_database_and_a_withdrawn_record_is_left_out(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "all.zip", "w") as archive:
        for path in (DATA / "osv" / "PyPI").glob("*.json"):
            archive.write(path, path.name)
        gone = json.loads((DATA / "osv" / "PyPI" / "GHSA-mq26-g339-26xf.json").read_text())
        archive.writestr("GHSA-gone.json", json.dumps({**gone, "id": "GHSA-gone", "withdrawn": "2024-01-01T00:00:00Z"}))
    db = osv.load(tmp_path / "all.zip")
    assert len(db) == 4 and "GHSA-gone" not in db.by_id


@pytest.mark.parametrize(("setup", "words"), [
    (lambda p: p, "does not exist"),
    (lambda p: (p.mkdir(), p)[1], "holds no OSV record"),
    (lambda p: (p.mkdir(), (p / "x.json").write_text("{oops"), p)[2], "is not JSON"),
    (lambda p: (p.mkdir(), (p / "x.json").write_text('{"affected": []}'), p)[2], "is not an OSV record"),
    (lambda p: (p.write_text("not a zip"), p)[1], "not a readable zip"),
])
def test_a_database_that_cannot_be_read_is_a_config_error(tmp_path: Path, setup, words: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=words):
        osv.load(setup(tmp_path / "db.zip" if "zip" in words else tmp_path / "db"))


def _decide(prod: list[str], cand: list[str], policy=POLICY, db: osv.Database | None = DB):  # type: ignore[no-untyped-def]
    rec = selftest.recorded("cuda")
    results = dict(rec.results)
    for cell, packages in ((rec.production, prod), (rec.candidate, cand)):
        results[cell.id] = replace(results[cell.id], environment={**results[cell.id].environment.to_json(),
                                                                  "stack_packages": packages})
    cells = (rec.production, rec.candidate)
    scans = supply.scan(cells, results, db)
    return gate.decide(cells, (), results, policy, dt.date(2026, 12, 1), (), scans), scans


def test_a_blocking_finding_names_package_version_advisory_severity_and_the_fix() -> None:
    out, scans = _decide(["torch==2.6.0"], ["torch==2.5.1", "setuptools==70.0.0"])
    assert out.verdict.decision is Decision.NO_GO
    torch, setuptools = (r.message for r in out.verdict.reasons if r.severity is Severity.BLOCKING)
    assert "GHSA-53q9-r3pm-6pq6 (CRITICAL) in torch 2.5.1 [PyPI]" in torch and "upgrade torch to >= 2.6.0" in torch
    assert "GHSA-5rjg-fvgr-3xxf (HIGH) in setuptools 70.0.0" in setuptools and ">= 78.1.1" in setuptools
    pasted = "\n".join(stub(scans[0].added, scans[0].candidate.stack))
    allow = load_policy_text(pasted)
    assert {w.advisory for w in allow.waivers} == {"GHSA-53q9-r3pm-6pq6", "GHSA-5rjg-fvgr-3xxf"}


def load_policy_text(text: str):  # type: ignore[no-untyped-def]
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "policy.toml"
        path.write_text(text)
        return load_policy(path)


def test_without_a_database_the_stack_is_not_scanned_and_says_so() -> None:
    out, scans = _decide(["torch==2.6.0"], ["torch==2.5.1"], db=None)
    assert out.verdict.decision is Decision.GO and not scans[0].candidate.scanned
    said = [r.message for r in out.verdict.reasons if r.kind == "not-scanned"]
    assert said and "was not scanned: no vulnerability database given" in said[0]
    assert "no vulnerabilities" not in " ".join(r.message for r in out.verdict.reasons)


def test_the_diff_lists_findings_added_and_removed_by_the_upgrade() -> None:
    _, scans = _decide(["torch==2.5.1", "pip==23.0.1"], ["torch==2.6.0", "pip==23.0.1", "Jinja2==3.1.5"])
    pair = scans[0]
    assert [f.advisory for f in pair.removed] == ["GHSA-53q9-r3pm-6pq6"]
    assert [f.advisory for f in pair.added] == ["GHSA-cpwx-vrp4-4pq7"]
    assert [f.advisory for f in pair.inherited] == ["GHSA-mq26-g339-26xf"]


def test_a_bad_supply_policy_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[vulnerabilities]\nthreshold = "SEVERE"\n')
    with pytest.raises(ConfigError, match=r"threshold") as info:
        load_policy(path)
    assert "p.toml" in str(info.value) and ":2" in str(info.value)
    path.write_text('[[vulnerabilities.allow]]\nid = "GHSA-x"\nreason = "r"\nreview_by = "soon"\n')
    with pytest.raises(ConfigError, match=r"review_by"):
        load_policy(path)


def test_a_second_copy_on_ld_library_path_competes_with_the_wheels(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    monkeypatch.syspath_prepend(str(shipped.BUNDLED_SUITE))
    sys.modules.pop("loader", None)
    import loader  # the bundled suite's (it runs inside each stack; no harness import)
    base, also = tmp_path / "base-image-cuda" / "lib64", tmp_path / "other"
    for folder in (base, also):
        folder.mkdir(parents=True)
        (folder / "libcudart.so.13").write_bytes(folder.name.encode())
    (also / "libcudart.so").symlink_to(also / "libcudart.so.13")  # a link to the same file is one copy
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{also}:{base}")
    copies = loader.loader_copies()
    assert copies["libcudart"]["competing"] == sorted([str(base / "libcudart.so.13"), str(also / "libcudart.so.13")])
    monkeypatch.setenv("LD_LIBRARY_PATH", str(also))
    assert len(loader.loader_copies()["libcudart"]["competing"]) == 1
    sizes = loader.package_sizes()
    assert sizes["pytest"] > 100_000  # its files on disk, bytecode left out


def test_sizes_are_kept_in_the_history(tmp_path: Path) -> None:
    import sqlite3

    from stackgate import history
    rec = selftest.recorded("cuda")
    result = rec.results[rec.candidate.id]
    result = replace(result, environment={**result.environment.to_json(), "image_size": 6_210_000_000, "env_size": 5_000_000_000,
                                          "package_sizes": {"torch": 1_900_000_000, "nvidia-cublas": 800_000_000}})
    history.record(tmp_path / "h.sqlite", run_id="r1", matrix="m", channel="stable", started="s", finished="f",
                   decision="GO", verdict="GO", candidate="2.14.1", results=[result], summary={})
    with sqlite3.connect(tmp_path / "h.sqlite") as conn:
        rows = dict(conn.execute("SELECT metric, median FROM metrics WHERE metric LIKE 'stack.%'").fetchall())
    assert rows == {"stack.image_size": 6.21e9, "stack.env_size": 5e9, "stack.package_size[package=torch]": 1.9e9,
                    "stack.package_size[package=nvidia-cublas]": 8e8}


def test_pip_check_without_pip_names_what_an_installed_package_lacks(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    monkeypatch.syspath_prepend(str(shipped.BUNDLED_SUITE))
    sys.modules.pop("loader", None)
    import loader
    assert loader.broken_requirements() == []  # this environment is consistent
    info = tmp_path / "trainer_kit-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: trainer-kit\nVersion: 1.0\n"
                                   "Requires-Dist: pytest<1\nRequires-Dist: not-installed-anywhere>=2\n"
                                   "Requires-Dist: numpy; extra == 'fast'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    broken = loader.broken_requirements()
    assert broken is not None and len(broken) == 2
    assert "trainer-kit 1.0 has requirement pytest<1, but" in broken[0]
    assert "trainer-kit 1.0 requires not-installed-anywhere>=2, which is not installed" in broken[1]


MAPS = """\
7f0000000000-7f0000001000 r--p 00000000 08:01 1 /venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so
7f0000001000-7f0000002000 r-xp 00001000 08:01 1 /venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so
7f0000002000-7f0000003000 r--p 00000000 08:01 2 /venv/lib/python3.11/site-packages/torch/lib/libgomp-a34b3233.so.1
7f0000003000-7f0000004000 r--p 00000000 08:01 3 /opt/base/lib64/libgomp.so.1 (deleted)
7f0000004000-7f0000005000 r--p 00000000 08:01 4 /usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.30
7f0000005000-7f0000006000 r--p 00000000 08:01 5 /usr/lib/x86_64-linux-gnu/libnccl.so.2.27.3
7f0000006000-7f0000007000 r--p 00000000 08:01 6 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000007000-7f0000008000 rw-p 00000000 00:00 0 [heap]
7f0000008000-7f0000009000 rw-p 00000000 00:00 0
"""


def test_what_the_process_mapped_names_each_second_copy_and_each_library_from_outside(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """#43 item 1, the rule on a captured /proc/self/maps: one library from two files (the wheel's
    auditwheel copy and a base image's), one from the system that the stack ships (NCCL), and the
    system's libstdc++, which is allowed."""
    import sys
    monkeypatch.syspath_prepend(str(shipped.BUNDLED_SUITE))
    sys.modules.pop("loader", None)
    import loader
    mapped = loader.mapped_libraries(MAPS)
    assert mapped == {"libgomp": ["/opt/base/lib64/libgomp.so.1", "/venv/lib/python3.11/site-packages/torch/lib/libgomp-a34b3233.so.1"],
                      "libnccl": ["/usr/lib/x86_64-linux-gnu/libnccl.so.2.27.3"],
                      "libstdc++": ["/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.30"],
                      "libtorch_cpu": ["/venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so"]}
    problems = loader.mapped_problems(mapped, ["/venv", "/venv/lib/python3.11/site-packages"])
    assert problems == [
        "libgomp is mapped from 2 files: /opt/base/lib64/libgomp.so.1, /venv/lib/python3.11/site-packages/torch/lib/libgomp-a34b3233.so.1",
        "libgomp comes from /opt/base/lib64/libgomp.so.1, outside the stack's environment (/venv, /venv/lib/python3.11/site-packages)",
        "libnccl comes from /usr/lib/x86_64-linux-gnu/libnccl.so.2.27.3, outside the stack's environment (/venv, /venv/lib/python3.11/site-packages)",
    ]
    assert loader.mapped_problems({k: v for k, v in mapped.items() if k in ("libtorch_cpu", "libstdc++")},
                                  ["/venv"]) == []
    assert loader.origin("/venvother/lib/libgomp.so.1", ["/venv"]) == "outside"  # a prefix of a name is not a parent
