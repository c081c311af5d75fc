"""`python benchmarks/paired_stats.py [--trials N]`: the paired statistic's two intervals side by side
on simulated interleaved runs, through the gate's own `stats.paired` arithmetic: the Student t
interval on the mean log ratio, and the sign test's on the median log ratio. Each trial draws `n`
run pairs: each run's summary has `sigma` log-normal noise, the candidate is `planted` slower, and
with probability `wreck` one side of a pair is slowed by 20-150% (a neighbour's job landing on the
runner). Prints, per setting, how often each interval says NO-GO (whole interval beyond the
tolerance) and INCONCLUSIVE, and the gate's own choice between them (`stats.paired`: the sign test
where pairs stand apart and there are enough of them, else t). A benchmark: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import math
import random
import sys

from stackgate import stats


def _interval(logs: list[float], how: str, confidence: float) -> tuple[float, float]:
    if how == "sign":
        found = stats.sign_interval(logs, confidence)
        assert found is not None
        return found
    n = len(logs)
    mean = math.fsum(logs) / n
    spread = math.sqrt(math.fsum((x - mean) ** 2 for x in logs) / (n - 1))
    half = stats.t_quantile(confidence, n - 1) * spread / math.sqrt(n)
    return mean - half, mean + half


def rates(n: int, planted: float, wreck: float, sigma: float, tolerance: float, trials: int,
          seed: int) -> dict[str, tuple[float, float]]:
    rng = random.Random(seed)
    counts = {"t": [0, 0], "sign": [0, 0], "gate": [0, 0]}
    for _ in range(trials):
        logs = []
        for _ in range(n):
            base, cand = rng.gauss(0, sigma), rng.gauss(math.log1p(planted), sigma)
            if rng.random() < wreck:
                hit = math.log1p(rng.uniform(0.2, 1.5))
                if rng.random() < 0.5:
                    base += hit
                else:
                    cand += hit
            logs.append(cand - base)
        outcomes = {how: stats._outcome(*(math.expm1(x) for x in _interval(logs, how, 0.95)), tolerance)
                    for how in (("t", "sign") if n >= 9 else ("t",))}
        # the gate's own choice: stats.paired on one-sample runs whose log ratios are these
        outcomes["gate"] = stats.paired([[1.0]] * n, [[math.exp(x)] for x in logs], better="lower",
                                        tolerance=tolerance).outcome
        for how, outcome in outcomes.items():
            counts[how][0] += outcome is stats.Outcome.REGRESSION
            counts[how][1] += outcome is stats.Outcome.INCONCLUSIVE
    return {how: (c[0] / trials, c[1] / trials) for how, c in counts.items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--sigma", type=float, default=0.02, help="per-run noise (log), 2% as calibrated here")
    ap.add_argument("--tolerance", type=float, default=0.025)
    args = ap.parse_args()
    print(f"per-run noise {args.sigma:.0%}, tolerance {args.tolerance:.1%}, {args.trials} trials per row; "
          "cells: NO-GO rate / INCONCLUSIVE rate")
    print(f"{'pairs':>5} {'wrecked':>8} {'planted':>8} {'t interval':>16} {'sign test':>16} {'gate (either)':>16}")
    for n in (5, 10, 20):
        for wreck in (0.0, 0.1, 0.2):
            for planted in (0.0, 0.01, 0.05, 0.10):
                found = rates(n, planted, wreck, args.sigma, args.tolerance, args.trials, seed=n * 1000 + 7)
                t, sign, gate = found["t"], found["sign"], found["gate"]
                sign_text = f"{sign[0]:6.1%} / {sign[1]:6.1%}" if n >= 9 else f"{'(n < 9)':>15}"
                print(f"{n:5d} {wreck:8.0%} {planted:+8.0%} {t[0]:6.1%} / {t[1]:6.1%}  {sign_text}  "
                      f"{gate[0]:6.1%} / {gate[1]:6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
