"""How often `stackgate watch`'s drift check flags production's canary (#44's acceptance), for real.

    python benchmarks/watch_drift.py [--history-runs 10] [--trials 10] [--slower 0.3]

Production's cell of the default matrix (2.13.0+cpu, venv) runs `tests/data/canary_suite` (a fixed CPU
workload timed on the process's CPU clock): first `--history-runs` canaries, recorded in a fresh
history as `stackgate watch` records them; then `--trials` canaries with the same work and as many
with `--slower` more real work per step (CANARY_EXTRA through --suite-env), interleaved, each judged
by the policy's `[watch]` rule against that history and not recorded (so every trial sees the same
baseline). Prints one row per trial and the counts: flagged / trials, per condition."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from stackgate import options  # noqa: E402
from stackgate import watch as checks  # noqa: E402
from stackgate.commands import watch  # noqa: E402
from stackgate.console import Console  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--history-runs", type=int, default=10)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--slower", type=float, default=0.3)
    args = parser.parse_args()
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="watch-drift-") as tmp:
        def canary(extra: float) -> tuple[watch.CanaryRun, options.Options]:
            opts = options.read({"suite": str(ROOT / "tests" / "data" / "canary_suite"), "reports": f"{tmp}/r",
                                 "backend": "venv", "profile": "quick", "suite_env": [f"CANARY_EXTRA={extra}"]},
                                env, Path(tmp) / "none.toml", cwd=Path(tmp))
            ran = watch.run_canary(opts, env, Console(lambda _: None))
            if ran.failed or not ran.measured:
                raise SystemExit(f"the canary did not measure: {ran.failed}")
            return ran, opts

        t0 = time.monotonic()
        for i in range(args.history_runs):
            ran, opts = canary(0.0)
            watch.record_canary(opts, f"history-{i}", ran)  # as `stackgate watch` records it
            print(f"history {i + 1:2d}/{args.history_runs}: {ran.measured[0].median:.3f} ms", flush=True)
        flagged = {0.0: 0, args.slower: 0}
        print("\n| trial | extra work | median (ms) | baseline (ms) | shift | spread (ms) | flagged |\n|---|---|---|---|---|---|---|")
        for i in range(args.trials):
            for extra in (0.0, args.slower) if i % 2 == 0 else (args.slower, 0.0):
                ran, _ = canary(extra)
                m = ran.measured[0]
                found = checks.shift(m, ran.rule)
                assert found is not None, "the history is shorter than the rule's min_runs"
                flagged[extra] += found.flagged
                print(f"| {i + 1} | {extra:.0%} | {m.median:.3f} | {found.baseline:.3f} | {found.change:+.1%} | "
                      f"{found.sigma:.3f} | {'yes' if found.flagged else 'no'} |", flush=True)
        rule = ran.rule
        print(f"\nrule: median of the last {rule.runs} canaries, flagged beyond {rule.tolerance:.0%} and "
              f"{rule.spread_k:g} x MAD-sigma; {time.monotonic() - t0:.0f} s in all")
        print("| extra work | flagged | trials |\n|---|---|---|")
        for extra, count in flagged.items():
            print(f"| {extra:.0%} | {count} | {args.trials} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
