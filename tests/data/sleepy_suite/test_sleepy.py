"""A suite that outlives any cell timeout: for the tests that a time limit ends a cell as `timeout`.
It writes its pid first, so a test can check that nothing of it is left running."""

import os
import time
from pathlib import Path


def test_sleeps_past_the_time_limit() -> None:
    Path(os.environ["STACKGATE_SHARED_DIR"], f"sleepy-{os.environ['STACKGATE_NODE_RANK']}.pid").write_text(
        str(os.getpid()))
    time.sleep(3600)
