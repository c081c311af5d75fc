"""The suite's side of the results contract: JSON lines appended to $STACKGATE_RESULTS.

Record kinds: metric, environment, warning. A user's own suite may write the same lines (only
`name`, `unit` and `value` or `samples` are required for a metric). Without STACKGATE_RESULTS
the records go nowhere, so the suite also runs under plain pytest.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any


def _write(record: dict[str, Any]) -> None:
    path = os.environ.get("STACKGATE_RESULTS")
    if not path:
        return
    if os.environ.get("STACKGATE_NODE_RANK", "0") != "0" and record.get("kind") != "warning":
        return
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, default=str) + "\n")


def _nodeid() -> str:
    """The pytest node id of the test recording (pytest sets PYTEST_CURRENT_TEST), so the harness can
    repeat exactly the tests whose metrics it gates."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "")
    return current.rsplit(" (", 1)[0] if current else ""


def metric(name: str, value: float | Iterable[float], unit: str, *, test: str = "", better: str = "lower",
           **tags: Any) -> None:
    samples = [float(v) for v in value] if isinstance(value, Iterable) else [float(value)]
    _write({"kind": "metric", "name": name, "unit": unit, "samples": samples, "test": test, "better": better,
            "tags": {k: str(v) for k, v in tags.items()}, "nodeid": _nodeid()})


def environment(data: dict[str, Any]) -> None:
    _write({"kind": "environment", **data})


def warning(category: str, message: str, test: str, filename: str = "", lineno: int = 0) -> None:
    _write({"kind": "warning", "category": category, "message": message, "test": test, "where": f"{filename}:{lineno}"})
