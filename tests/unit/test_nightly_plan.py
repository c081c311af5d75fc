"""The nightly channel's logic on synthetic data: build dates, the guards, the bisect search order
and step outcomes (issue 13). The real CLI on test wheels is tests/torch/test_nightly.py."""

from __future__ import annotations

import datetime as dt
import functools
import http.server
import socketserver
import threading
from pathlib import Path

import pytest
from packaging.version import Version

from stackgate import compat, nightly, shipped
from stackgate.commands import bisect
from stackgate.model import Cell, CellResult, GpuClass, Role, RunnerPool, Stack, Status, Topology, WheelSource
from stackgate.sources import PipConfig, Target, newest_nightly
from stackgate.versions import CudaVariant

TODAY = dt.date(2026, 11, 30)
TABLE = compat.load_compat(shipped.MATRIX_DIR / "compat.toml")  # 2.15: PyPI's default variant is cu130
POOL = RunnerPool("local", None, GpuClass.NONE, gpu="cpu", nodes=1, is_local=True)


def _cell(version: str, variant: str = "cpu", role: Role = Role.CANDIDATE) -> Cell:
    return Cell(Stack(Version(version), CudaVariant(variant), "3.11"), POOL, Topology(1, 2), role)


def _wheel(version: str, tag: str = "cp311-cp311-manylinux_2_28_x86_64", project: str = "torch") -> nightly.Wheel:
    return nightly.Wheel(f"{project}-{version}-{tag}.whl", f"/w/{project}-{version}.whl", Version(version))


def test_build_dates() -> None:
    assert nightly.build_date(Version("2.15.0.dev20261128+cu130")) == dt.date(2026, 11, 28)
    assert nightly.build_date("2.14.1") is None and nightly.build_date("2.15.0.dev20261399") is None


def test_each_guard_names_its_reason() -> None:
    found = [_wheel("2.15.0.dev20261128+cpu"), _wheel("2.15.0.dev20261129+cu130"),
             _wheel("2.15.0.dev20261125+cpu")]
    cells = [_cell("2.15.0.dev20261128"), _cell("2.15.0.dev20261129"), _cell("2.15.0.dev20261125"),
             _cell("2.13.0", role=Role.PRODUCTION)]
    out = nightly.guard(cells, found, today=TODAY, max_age_days=3, table=TABLE, companions={})
    assert set(out) == {cells[1].id, cells[2].id}  # production and a fresh, present build pass
    assert "no torch 2.15.0.dev20261129 wheel for cpu" in out[cells[1].id] and "that date has: cu130" in out[cells[1].id]
    assert "is 5 days old" in out[cells[2].id] and "limit is 3 days" in out[cells[2].id]
    vision = [_wheel("0.30.0.dev20261127", "py3-none-any", "torchvision")]
    out = nightly.guard(cells[:1], found, today=TODAY, max_age_days=3, table=TABLE,
                        companions={"torchvision": vision})
    assert "torchvision: no build for torch 2.15.0.dev20261128" in out[cells[0].id]
    assert "its newest is 0.30.0.dev20261127" in out[cells[0].id]


def test_the_pypi_default_variant_may_have_no_label() -> None:
    found = [_wheel("2.15.0.dev20261128")]
    cell = _cell("2.15.0.dev20261128", "cu132")  # compat.toml: 2.15's PyPI default is the CUDA 13.2 build
    assert nightly.for_cell(found, cell, "2.15.0.dev20261128", TABLE) is not None
    assert nightly.for_cell(found, _cell("2.15.0.dev20261128", "cu126"), "2.15.0.dev20261128", TABLE) is None


def test_companions_among_what_is_installed() -> None:
    assert nightly.companions_wanted(["einops", "torchvision>=0.20", "TorchAudio", "-c x", "torchvision"]) == [
        "torchvision", "torchaudio"]


DATES = [f"2.15.0.dev202611{d:02d}" for d in range(20, 28)]  # 8 dates


@pytest.mark.parametrize("first_bad", range(1, 8))
def test_bisect_needs_at_most_three_steps_between_the_ends_over_eight_dates(first_bad: int) -> None:
    state = bisect.Bisect("b", DATES[0], DATES[-1], list(DATES))
    while (version := bisect.next_version(state)) is not None:
        outcome = bisect.BAD if DATES.index(version) >= first_bad else bisect.GOOD
        state.steps.append(bisect.Step(version, f"r{len(state.steps)}", outcome, 0))
    assert [s.version for s in state.steps[:2]] == [DATES[0], DATES[-1]]
    assert len(state.steps) - 2 <= 3
    assert bisect.bounds(state) == (DATES[first_bad - 1], DATES[first_bad])


def test_a_skipped_step_is_searched_around() -> None:
    state = bisect.Bisect("b", DATES[0], DATES[-1], list(DATES))
    skipped = set()
    while (version := bisect.next_version(state)) is not None:
        index = DATES.index(version)
        outcome = bisect.SKIP if index == 4 else (bisect.BAD if index >= 4 else bisect.GOOD)
        skipped |= {version} if outcome == bisect.SKIP else set()
        state.steps.append(bisect.Step(version, "r", outcome, 0))
    assert skipped == {DATES[4]}
    assert bisect.bounds(state) == (DATES[3], DATES[5])  # the culprit is 4 or 5: the skip leaves both open


def test_step_outcomes() -> None:
    cand = CellResult("c", Role.CANDIDATE, Status.FAILED)
    assert bisect.step_outcome(0, []) == bisect.GOOD
    assert bisect.step_outcome(1, [cand]) == bisect.BAD
    assert bisect.step_outcome(1, [cand], "NO-GO") == bisect.BAD
    # INCONCLUSIVE exits 1 in gating mode too: a flaky failure never makes a date bad
    assert bisect.step_outcome(1, [cand], "INCONCLUSIVE") == bisect.SKIP
    assert bisect.step_outcome(1, [cand], "unknown") == bisect.SKIP
    assert bisect.step_outcome(1, [CellResult("c", Role.CANDIDATE, Status.BUILD_FAILED)]) == bisect.SKIP
    assert bisect.step_outcome(3, [CellResult("c", Role.CANDIDATE, Status.NO_BUILD)]) == bisect.SKIP


def test_an_http_index_is_listed_and_an_unreadable_one_never_blocks_a_cell(tmp_path: Path) -> None:
    """A PEP 503 index over http (here a local server) lists the nightlies; an index that cannot be
    read leaves the listing incomplete, and an incomplete listing cannot say a wheel is missing."""
    page = tmp_path / "simple" / "torch"
    page.mkdir(parents=True)
    page.joinpath("index.html").write_text(
        '<html><body><a href="../../files/torch-2.15.0.dev20261128%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl'
        '#sha256=00">torch-2.15.0.dev20261128+cpu-cp311-cp311-manylinux_2_28_x86_64.whl</a></body></html>')
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    with socketserver.TCPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/simple"
            source = WheelSource(index_url=url, inherit_pip_config=False, pre=True)
            found = nightly.wheels(source, PipConfig())
            assert found.complete and [str(w.version) for w in found] == ["2.15.0.dev20261128+cpu"]
            assert found[0].location.endswith("/files/torch-2.15.0.dev20261128%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl")
            assert str(newest_nightly(source, PipConfig(), target=Target(variants=("cpu",)))) == "2.15.0.dev20261128"
        finally:
            server.shutdown()
    away = nightly.wheels(WheelSource(index_url="http://127.0.0.1:9/simple", inherit_pip_config=False), PipConfig())
    assert not away.complete and "127.0.0.1:9" in away.unlisted[0]
    cell = _cell("2.15.0.dev20261129")
    assert nightly.guard([cell], away, today=TODAY, max_age_days=3, table=TABLE, companions={}) == {}
    assert cell.id in nightly.guard([cell], nightly.Wheels(), today=TODAY, max_age_days=3, table=TABLE, companions={})


@pytest.mark.parametrize("text", ["{", "[]", '{"bisect_id": "b", "good": "x", "bad": "y", "candidates": "xy"}',
                                  '{"bisect_id": "b", "good": "x", "bad": "y", "candidates": [], "steps": [{"version": '
                                  '"x", "run_id": "r", "outcome": "maybe", "exit_code": 0}]}'])
def test_a_damaged_bisect_state_is_a_config_error_on_resume(tmp_path: Path, text: str) -> None:
    """#40: bisect --resume read bisect.json by key (a damaged file crashed with KeyError or TypeError)."""
    from stackgate import options
    from stackgate.errors import ConfigError
    home = tmp_path / "r" / "b1"
    home.mkdir(parents=True)
    (home / bisect.STATE).write_text(text)
    opts = options.read({"reports": str(tmp_path / "r")}, {}, None, cwd=tmp_path)
    with pytest.raises(ConfigError, match="is not a bisect's state"):
        bisect.run(opts, {}, good=None, bad=None, resume="b1", say=lambda _: None)
