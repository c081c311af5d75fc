"""Fixtures for the trainer integration suite. Never imports the harness: the contract is
environment variables in (STACKGATE_*) and JSON lines out (record.py)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import launch  # noqa: E402
import record  # noqa: E402


@dataclass(frozen=True)
class Expectation:
    """What the harness asked this stack to be."""

    torch: str
    cuda: str
    device: str
    transport: str
    profile: str
    artifacts: Path | None
    role: str
    phase: str
    given: str = ""  # the stack is an environment the team has ("host:..." or "image:..."), not one stackgate built


@pytest.fixture(scope="session")
def expect() -> Expectation:
    env = os.environ
    artifacts = env.get("STACKGATE_ARTIFACTS")
    return Expectation(
        torch=env.get("STACKGATE_EXPECT_TORCH", ""),
        cuda=env.get("STACKGATE_EXPECT_CUDA", ""),
        device=env.get("STACKGATE_DEVICE", "cpu"),
        transport=env.get("STACKGATE_EXPECT_TRANSPORT", "none"),
        profile=env.get("STACKGATE_PROFILE", "default"),
        artifacts=Path(artifacts) if artifacts else None,
        role=env.get("STACKGATE_ROLE", "candidate"),
        phase=env.get("STACKGATE_PHASE", "main"),
        given=env.get("STACKGATE_STACK_GIVEN", ""),
    )


@pytest.fixture(scope="session")
def quick(expect: Expectation) -> bool:
    return expect.profile == "quick"


@pytest.fixture
def dist(request: pytest.FixtureRequest, tmp_path: Path):
    """`dist(target, nproc=None, **config)` runs MODULE:FUNCTION under torchrun, returns rank results."""

    default_timeout = float(os.environ.get("STACKGATE_DIST_TIMEOUT", "240"))

    def run(target: str, nproc: int | None = None, timeout_s: float | None = None, extra_env: dict | None = None,
            **config):
        timeout_s = timeout_s or default_timeout
        results = launch.launch(target, tmp_path / "ranks", nproc_per_node=nproc, timeout_s=timeout_s,
                                config=config, test_id=request.node.nodeid, extra_env=extra_env)
        seen = set()
        for result in results:
            for category, message, filename, lineno in result.get("warnings", []):
                if (category, message) not in seen and category in _RECORDED_WARNINGS:
                    seen.add((category, message))
                    record.warning(category, message, request.node.nodeid, filename, lineno)
        return results

    return run


@pytest.fixture
def world_size() -> int:
    return launch.topology_from_env().world_size


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "distributed: runs under torchrun on every rank")
    config.addinivalue_line("markers", "crossversion: reads artifacts written by another stack")
    config.addinivalue_line("markers", "slow: skipped in the quick profile")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("STACKGATE_PROFILE") == "quick":
        skip = pytest.mark.skip(reason="quick profile")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(skip)
    phase = os.environ.get("STACKGATE_PHASE", "main")
    if phase == "rollback":
        skip = pytest.mark.skip(reason="rollback phase runs only cross-version readers")
        for item in items:
            if "crossversion" not in item.keywords:
                item.add_marker(skip)


_RECORDED_WARNINGS = ("DeprecationWarning", "FutureWarning", "PendingDeprecationWarning", "UserWarning")


def pytest_warning_recorded(warning_message, when, nodeid, location) -> None:  # noqa: ANN001
    category = warning_message.category.__name__
    if category in _RECORDED_WARNINGS:
        record.warning(category, str(warning_message.message)[:500], nodeid, warning_message.filename,
                       warning_message.lineno)
