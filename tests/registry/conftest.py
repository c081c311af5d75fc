from __future__ import annotations

import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.docker.conftest import engine  # noqa: F401  (the real Docker engine)

STATE = Path(os.environ.get("STACKGATE_REGISTRY_STATE", "/var/lib/stackgate-registry"))


@dataclass(frozen=True)
class Registries:
    plain: str  # host:port, no authentication
    auth: str  # host:port, htpasswd
    user: str
    password: str


@pytest.fixture(scope="session")
def registries() -> Registries:
    """The two real registries of scripts/local-registry.sh (Debian's docker-registry)."""
    problem = ""
    found: dict[str, str] = {}
    try:
        found = dict(line.split("=", 1) for line in (STATE / "registry.env").read_text().split() if "=" in line)
        for key in ("STACKGATE_TEST_REGISTRY", "STACKGATE_TEST_AUTH_REGISTRY"):
            try:
                urllib.request.urlopen(f"http://{found[key]}/v2/", timeout=5)
            except urllib.error.HTTPError as exc:
                if exc.code != 401:
                    raise
    except (OSError, KeyError) as exc:
        problem = f"no local registries ({exc}): run scripts/local-registry.sh start"
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the registry tier: {problem}")
        pytest.skip(problem)
    return Registries(found["STACKGATE_TEST_REGISTRY"], found["STACKGATE_TEST_AUTH_REGISTRY"],
                      found["STACKGATE_TEST_AUTH_USER"], Path(found["STACKGATE_TEST_AUTH_PASSWORD_FILE"]).read_text().strip())
