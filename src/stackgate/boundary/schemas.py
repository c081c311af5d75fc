"""The JSON Schemas of the contract's files, generated from the boundary's models and shipped in
resources/schemas (README "Contract"): a suite's records, results.jsonl's lines, report.json as
promote and bisect read it, a run's manifest (run.json, what merge and --resume read) and stacks.json
(what `run --stacks` reads). `python -m stackgate.boundary.schemas --check` (nox -s lint) fails when a
shipped schema is not what the models say; `--write` regenerates them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from stackgate.boundary.manifest import Manifest
from stackgate.boundary.records import Record
from stackgate.boundary.report import Report
from stackgate.boundary.results import ResultLine
from stackgate.boundary.stacks import StacksFile

SHIPPED = Path(__file__).resolve().parents[1] / "resources" / "schemas"


def schemas() -> dict[str, dict[str, Any]]:
    found = {"suite-record": TypeAdapter(Record).json_schema(), "results-line": ResultLine.model_json_schema(),
             "report": Report.model_json_schema(), "run-manifest": Manifest.model_json_schema(),
             "stacks": StacksFile.model_json_schema(by_alias=True)}
    for name, schema in found.items():
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["$id"] = f"stackgate/{name}.schema.json"
    return found


def text(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def stale() -> list[str]:
    return [name for name, schema in schemas().items()
            if not (SHIPPED / f"{name}.schema.json").is_file()
            or (SHIPPED / f"{name}.schema.json").read_text() != text(schema)]


def main(argv: list[str]) -> int:
    if "--write" in argv:
        SHIPPED.mkdir(parents=True, exist_ok=True)
        for name, schema in schemas().items():
            (SHIPPED / f"{name}.schema.json").write_text(text(schema))
        return 0
    old = stale()
    for name in old:
        print(f"{SHIPPED / name}.schema.json is not what the models say: run "
              "`python -m stackgate.boundary.schemas --write`", file=sys.stderr)
    return 1 if old else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
