#!/usr/bin/env python3
"""Refresh the selftest's recorded run from a real run of the bundled suite.

    python scripts/refresh-selftest-data.py reports/<run-id>

Keeps the production and candidate results of the first comparison pair (main phase and rollback)
with their real test names and metrics; drops log tails and package lists. `stackgate selftest`
builds its clean CPU and GPU cases from this file, so a metric the suite stops writing, or one the
policy cannot decide on a device, fails the selftest.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src" / "stackgate" / "resources" / "selftest" / "recorded-cpu.jsonl"


def main(run_dir: str) -> int:
    rows = [json.loads(line) for line in (Path(run_dir) / "results.jsonl").read_text().splitlines() if line.strip()]
    keep = []
    for row in rows:
        if row.get("status") != "passed":
            print(f"skip {row['cell_id']}: {row['status']}", file=sys.stderr)
            continue
        row["log_tail"] = ""
        env = row.get("environment", {})
        row["environment"] = {k: v for k, v in env.items() if k in ("torch", "cuda", "python", "backend")}
        keep.append(row)
    roles = {r["role"] for r in keep}
    if roles != {"production", "candidate"}:
        print(f"need passed production and candidate results, got {sorted(roles)}", file=sys.stderr)
        return 1
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in keep))
    print(f"wrote {len(keep)} results to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
