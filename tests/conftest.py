from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "integration_tests"))  # pure helpers (busbw, nccl_log) are tested here too


@pytest.fixture
def root() -> Path:
    return ROOT
