"""The run directory's one owner. A run directory (`<reports>/<run-id>`) is where a run, a merge or a
calibration writes everything; this package holds

- its layout (`layout.RunDir`: every path under a run directory is spelled there, once) and the
  live-run claim (`RunDir.claim`: a second run of the same id exits 2, naming the owner);
- the manifest, run.json (`manifest`: read through `boundary.manifest`, written whole);
- the results, results.jsonl (`results`: appended and fsynced per cell, read through
  `boundary.results`).

The reports are written under the names `RunDir` gives them (`conclude.write_reports`) and read back
through `boundary.report`. Commands ask this package for a path; nothing else joins path strings
under a run directory.
"""

from stackgate.rundir.layout import Claim, RunDir, new_run_id

__all__ = ["Claim", "RunDir", "new_run_id"]
