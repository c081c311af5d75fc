from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.budgets import (
    file_of,
    pytest_addoption,
    pytest_runtest_logreport,
    pytest_terminal_summary,
    pytest_xdist_make_scheduler,
    schedule,
    select_fast,
    tier_of,
)

__all__ = ["pytest_addoption", "pytest_runtest_logreport", "pytest_terminal_summary",  # the budgets plugin's hooks
           "pytest_xdist_make_scheduler"]
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "integration_tests"))  # pure helpers (busbw, nccl_log) are tested here too


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tier is the directory: tests/torch -> `torch`, tests/docker -> `docker`, tests/slurm -> `slurm`
    (select with -m); `--fast` keeps the unit tier alone; under pytest-xdist, the longest shares first."""
    select_fast(config, items)
    for item in items:
        tier = tier_of(file_of(item.nodeid))
        if tier in ("torch", "docker", "slurm"):
            item.add_marker(getattr(pytest.mark, tier))
    schedule(config, items)


@pytest.fixture
def root() -> Path:
    return ROOT
