"""Noise-aware comparison of a candidate's samples with production's.

The change is the ratio of medians, oriented so that a positive number is worse. A bootstrap over
both sample sets gives a confidence interval for it (seeded: the same samples give the same answer).
Regression only when the whole interval is beyond the tolerance; OK when the whole interval is
within it; otherwise the noise is too high to tell.
"""

from __future__ import annotations

import enum
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


class Outcome(str, enum.Enum):
    OK = "ok"
    REGRESSION = "regression"
    INCONCLUSIVE = "inconclusive"
    IMPROVEMENT = "improvement"


@dataclass(frozen=True)
class Comparison:
    base_median: float
    cand_median: float
    change: float  # +0.10 = 10% worse
    low: float
    high: float
    tolerance: float
    outcome: Outcome
    base_mad: float
    cand_mad: float

    def describe(self, unit: str = "") -> str:
        u = f" {unit}" if unit else ""
        return (f"{self.base_median:.4g}{u} -> {self.cand_median:.4g}{u} ({self.change:+.1%} worse-is-positive, "
                f"CI [{self.low:+.1%}, {self.high:+.1%}], tolerance {self.tolerance:.0%})")


def mad(samples: Sequence[float]) -> float:
    med = statistics.median(samples)
    return statistics.median(abs(s - med) for s in samples)


def _change(base: float, cand: float, better: str) -> float:
    if base <= 0 or cand <= 0:
        return 0.0 if base == cand else float("inf")
    return cand / base - 1 if better == "lower" else base / cand - 1


def compare(base: Sequence[float], cand: Sequence[float], *, better: str, tolerance: float,
            confidence: float = 0.95, resamples: int = 2000, min_samples: int = 3, seed: int = 0) -> Comparison:
    if not base or not cand:
        raise ValueError("both sample sets must be non-empty")
    bm, cm = statistics.median(base), statistics.median(cand)
    point = _change(bm, cm, better)
    if len(base) < min_samples or len(cand) < min_samples:
        return Comparison(bm, cm, point, float("-inf"), float("inf"), tolerance, Outcome.INCONCLUSIVE,
                          mad(base), mad(cand))
    rng = random.Random(seed)
    changes = []
    for _ in range(resamples):
        b = statistics.median(rng.choices(base, k=len(base)))
        c = statistics.median(rng.choices(cand, k=len(cand)))
        changes.append(_change(b, c, better))
    changes.sort()
    tail = (1 - confidence) / 2
    low = changes[int(tail * (resamples - 1))]
    high = changes[int((1 - tail) * (resamples - 1))]
    if low > tolerance:
        outcome = Outcome.REGRESSION
    elif high <= tolerance:
        outcome = Outcome.IMPROVEMENT if high < -tolerance else Outcome.OK
    else:
        outcome = Outcome.INCONCLUSIVE
    return Comparison(bm, cm, point, low, high, tolerance, outcome, mad(base), mad(cand))


@dataclass(frozen=True)
class Parity:
    bitwise: bool
    within: bool
    worst_index: int
    worst_abs: float
    worst_rel: float
    compared: int


def parity(base: Sequence[float], cand: Sequence[float], *, rtol: float, atol: float, steps: int | None = None) -> Parity:
    """Elementwise trajectory comparison (losses, grad norms) over the first `steps` values."""
    n = min(len(base), len(cand), steps or max(len(base), len(cand)))
    worst_i, worst_abs, worst_rel, within = -1, 0.0, 0.0, len(base) >= n and len(cand) >= n > 0
    for i in range(n):
        diff = abs(cand[i] - base[i])
        rel = diff / abs(base[i]) if base[i] else (0.0 if diff == 0 else float("inf"))
        if diff > worst_abs:
            worst_i, worst_abs, worst_rel = i, diff, rel
        if diff > atol + rtol * abs(base[i]):
            within = False
    bitwise = n > 0 and list(base[:n]) == list(cand[:n])
    return Parity(bitwise, within, worst_i, worst_abs, worst_rel, n)
