"""What a promotion writes, from a recorded report.json: only after GO; one entry per candidate stack
with its own SBOM (not the suite's view); a production.toml that loads and names the images by
digest; a pylock.toml of the very wheels (sha256), downloading only what no cache holds; a changelog
that escapes what it quotes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import tomllib

from stackgate import matrix, promotion
from stackgate.boundary.report import Report
from stackgate.errors import ConfigError

DIGEST = "reg.example/team/stack@sha256:" + "c" * 64


def _report(decision: str = "GO") -> Report:
    stack = {"torch": "2.14.1", "cuda": "cu130", "python": "3.11"}
    env = {"image_digest": DIGEST, "stack_packages": ["torch==2.14.1", "numpy==2.1.0"],
           "packages": ["torch==2.14.1", "numpy==2.1.0", "pytest==8.4.1"]}
    return Report.model_validate({"schema_version": 1, "decision": decision, "run": {"id": "r1"},
            "reasons": [{"severity": "error", "kind": "test-failed", "cell": "c", "message": "test_x failed"}],
            "cells": [{"id": "prod-x", "role": "production", "status": "passed", "device": "cpu",
                       "stack": {**stack, "torch": "2.13.0+cpu", "cuda": "cpu"}, "environment": {}},
                      {"id": "local-x", "role": "candidate", "status": "passed", "device": "cpu", "stack": stack,
                       "environment": env},
                      {"id": "h100-x", "role": "candidate", "status": "passed", "device": "cuda", "stack": stack,
                       "environment": env}],
            "new_warnings": {"local-x": ["FutureWarning: `torch.load` <default> changes"]},
            "comparisons": [{"cell": "local-x", "metric": "step_time_s", "change": -0.12, "outcome": "improved"}]})


def test_only_a_go_run_is_promoted_and_the_refusal_says_why(tmp_path: Path) -> None:
    promotion.require_go(_report(), tmp_path)
    with pytest.raises(ConfigError, match="is NO-GO, not GO") as refused:
        promotion.require_go(_report("NO-GO"), tmp_path)
    assert "test_x failed" in str(refused.value.hint)


def test_each_candidate_stack_once_with_its_own_sbom_and_a_production_toml_that_loads(tmp_path: Path) -> None:
    [stack] = promotion.promoted(_report())
    assert stack.label == "cu130-torch2.14.1-py3.11" and stack.gpu and stack.image == DIGEST
    assert stack.packages == ("torch==2.14.1", "numpy==2.1.0")  # the stack's SBOM, not pytest from the suite's view
    assert stack.cells == ("local-x", "h100-x")
    (tmp_path / "production.toml").write_text(promotion.production_toml([stack], "r1", "2026-12-01T00:00:00Z"))
    loaded = matrix.load_production(tmp_path / "production.toml")
    assert str(loaded.torch) == "2.14.1" and loaded.cuda.tag == "cu130"
    data = tomllib.loads((tmp_path / "production.toml").read_text())
    assert data["production"]["images"] == {stack.label: DIGEST} and data["production"]["run"] == "r1"
    (tmp_path / "bad.toml").write_text('[production]\ntorch = "2.14.1"\ncuda = "cu130"\npython = "3.11"\n'
                                       '[production.images]\nx = "reg/x:latest"\n')
    with pytest.raises(ConfigError, match="must be named by digest"):
        matrix.load_production(tmp_path / "bad.toml")


def test_the_lock_holds_the_very_wheels_and_downloads_only_what_no_cache_has(tmp_path: Path) -> None:
    cache = tmp_path / "wheelhouse"
    cache.mkdir()
    (cache / "torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"torch bytes")
    (cache / "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"another torch")
    asked: list[str] = []

    def download(pins: object, to: Path) -> None:
        asked.extend(pins)  # type: ignore[call-overload]
        (to / "numpy-2.1.0-cp311-cp311-manylinux_2_17_x86_64.whl").write_bytes(b"numpy bytes")

    [stack] = promotion.promoted(_report())
    lock = promotion.pylock(stack, tmp_path / "out", promotion.wheel_index([cache]), download)
    assert asked == ["numpy==2.1.0"]
    data = tomllib.loads(lock.read_text())
    assert data["lock-version"] == "1.0" and data["requires-python"] == "==3.11.*"
    by_name = {p["name"]: p for p in data["packages"]}
    assert set(by_name) == {"torch", "numpy"} and by_name["torch"]["version"] == "2.14.1"
    [wheel] = by_name["torch"]["wheels"]
    assert wheel["path"] == "wheels/torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert wheel["hashes"]["sha256"] == hashlib.sha256(b"torch bytes").hexdigest()
    assert (tmp_path / "out" / wheel["path"]).read_bytes() == b"torch bytes"


def test_the_changelog_lists_the_work_and_escapes_what_it_quotes() -> None:
    [stack] = promotion.promoted(_report())
    text = promotion.changelog(_report(), [stack], "r1", "now", "alice", ["reg.example/team/stack:production"])
    assert "## Your work list" in text and "&lt;default&gt;" in text and "<default>" not in text
    assert "-12.0%" in text and DIGEST in text and "uv pip sync --offline cu130-torch2.14.1-py3.11/pylock.toml" in text


def test_a_direct_url_line_of_a_freeze_is_one_package_with_its_wheel() -> None:
    """A --suite-install project is frozen as `name @ file:///...whl`: a split on whitespace made it two
    "packages" (`recsys-kit` with no version, and the URL), so the report's package list, the stack diff
    and the promoted lock never had it."""
    from stackgate.backends.base import freeze_lines
    from stackgate.promotion import _pin
    url = "file:///root/.cache/stackgate/projects/recsys_kit-ad08/recsys_kit-0.3.0-py3-none-any.whl"
    lines = freeze_lines(f"einops==0.8.2\n\nrecsys-kit @ {url}\n# a comment\ntorch==2.13.0+cpu\n")
    assert lines == ["einops==0.8.2", f"recsys-kit @ {url}", "torch==2.13.0+cpu"]
    assert [_pin(line) for line in lines] == [("einops", "0.8.2", ""), ("recsys-kit", "", url), ("torch", "2.13.0+cpu", "")]
