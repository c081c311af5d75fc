"""Noise-aware comparison of a candidate's samples with production's.

The change is the ratio of medians, oriented so that a positive number is worse (inside the gate; a
reader sees `Comparison.reading()`: the change of the metric's own value, better or worse as a word). A bootstrap over
both sample sets gives a confidence interval for it (seeded: the same samples give the same answer).
Regression only when the whole interval is beyond the tolerance; OK when the whole interval is
within it; otherwise the noise is too high to tell.
"""

from __future__ import annotations

import enum
import math
import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

# The bootstrap resamples at most this many samples per side: evenly spaced order statistics of all of
# them (the smallest, the largest and every (n-1)/(k-1)-th between), so its cost is bounded whatever a
# suite records; the medians themselves are always of every sample.
MAX_BOOTSTRAP_SAMPLES = 2000


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
    method: str = "bootstrap"  # bootstrap | threshold | paired (interleaved repeats)
    thinned_from: int = 0  # the bootstrap used MAX_BOOTSTRAP_SAMPLES of this many samples (a side with more)
    statistic: str = ""  # paired: "sign" (the median pair, distribution-free) or "t" (the mean pair)
    pairs: int = 0  # paired: the run pairs compared
    noise: float = 0.0  # paired: how much the pairs' log ratios spread (their sd; robust, from the MAD, for "sign")
    apart: int = 0  # paired: the pairs that stand apart from the rest (`apart`: a run slowed whole)
    apart_worse: int = 0  # paired: those of them on the worse side of the rest (the side of a regression)
    together: bool = False  # paired: each pair's two runs were taken at the same time (pairing = "concurrent")

    better: str = "lower"  # the metric's direction: "lower" (a time) or "higher" (a bandwidth)

    def value_change(self, change: float | None = None) -> float:
        """A change of the gate's (worse is positive) as a change of the metric's own value, cand/base - 1:
        for a higher-is-better metric a 7.3x bandwidth is +634%, not the gate's -86%."""
        c = self.change if change is None else change
        if self.better == "lower":
            return c
        return float("inf") if c <= -1 else 1 / (1 + c) - 1

    @property
    def value_interval(self) -> tuple[float, float]:
        ends = sorted((self.value_change(self.low), self.value_change(self.high)))
        return ends[0], ends[1]

    @property
    def ratio(self) -> float:
        """candidate / production, of the metric's own values."""
        return self.value_change() + 1

    @property
    def word(self) -> str:
        """"better", "worse" or "same", in the metric's own direction."""
        return "worse" if self.change > 0 else "better" if self.change < 0 else "same"

    def reading(self) -> str:
        """The change as a reader reads it: "x7.34, +634% (better)"."""
        return f"x{self.ratio:.3g}, {percent(self.value_change())} ({self.word})"

    def describe(self, unit: str = "") -> str:
        u = f" {unit}" if unit else ""
        thin = (f"; interval from {MAX_BOOTSTRAP_SAMPLES} evenly spaced order statistics of {self.thinned_from} "
                "samples" if self.thinned_from else "")
        allowed = f"at most {self.tolerance:.1%} worse allowed"
        if self.method == "threshold":
            return f"{self.base_median:.4g}{u} -> {self.cand_median:.4g}{u} ({self.reading()}; single value, {allowed})"
        how = ""
        if self.method == "paired":
            runs = "pairs of runs taken at the same time" if self.together else "interleaved runs"
            how = (f", over {self.pairs} {runs}, " + ("sign test on the median pair" if self.statistic == "sign"
                                                                 else "t interval on the mean pair"))
        low, high = self.value_interval
        return (f"{self.base_median:.4g}{u} -> {self.cand_median:.4g}{u} ({self.reading()}, CI of the change "
                f"[{percent(low)}, {percent(high)}], {allowed}{how}{thin})")


def percent(change: float) -> str:
    """+634%, +4.7%, -0.3%: whole percents from 100% on."""
    return f"{change:+.0%}" if abs(change) >= 1 else f"{change:+.1%}"


def median(samples: Sequence[float] | Iterable[float]) -> float:
    """The median, safe at the ends of the float range: the two middle values of an even count are
    halved before they are added (statistics.median adds first: 1e308 and 1e308 give inf)."""
    xs = sorted(samples)
    if not xs:
        raise ValueError("median of no samples")
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else xs[mid - 1] / 2 + xs[mid] / 2


def mad(samples: Sequence[float]) -> float:
    med = median(samples)
    return median(abs(s - med) for s in samples)


def _change(base: float, cand: float, better: str) -> float:
    """The relative change, worse positive; a ratio beyond the float range is infinitely worse (or
    better), never an exception."""
    if base <= 0 or cand <= 0:
        return 0.0 if base == cand else float("inf")
    try:
        return cand / base - 1 if better == "lower" else base / cand - 1
    except (OverflowError, ZeroDivisionError):
        return float("inf")


def _exp_minus_1(x: float) -> float:
    """exp(x) - 1 for a log ratio, inf where it overflows."""
    try:
        return math.expm1(x)
    except OverflowError:
        return float("inf")


def thin(samples: Sequence[float], limit: int = MAX_BOOTSTRAP_SAMPLES) -> list[float]:
    """At most `limit` samples: evenly spaced order statistics of all of them (the median and the
    spread survive; the cost of a bootstrap over them is bounded)."""
    if len(samples) <= limit:
        return list(samples)
    ordered = sorted(samples)
    n = len(ordered)
    return [ordered[(i * (n - 1)) // (limit - 1)] for i in range(limit)]


def _outcome(low: float, high: float, tolerance: float) -> Outcome:
    """Regression only when the whole interval is beyond the tolerance; OK when all of it is within."""
    if low > tolerance:
        return Outcome.REGRESSION
    if high <= tolerance:
        return Outcome.IMPROVEMENT if high < -tolerance else Outcome.OK
    return Outcome.INCONCLUSIVE


def bootstrap_changes(base: Sequence[float], cand: Sequence[float], *, better: str, resamples: int,
                      seed: int) -> list[float]:
    """The change of each of `resamples` bootstrap resamples (medians of draws with replacement from each
    side), in resample order. The very draws `random.Random(seed)` makes with `choices` (numpy's
    Mersenne Twister handed Python's state: the same stream, the same `floor(random() * n)`), each
    resample's median and change in the same float arithmetic as `median` and `_change`: the same list
    as the loop over `choices` (`bootstrap_changes_loop`; tests/unit/test_gate_stats.py checks they are
    equal), 7-14 times faster here from 20 to 2000 samples a side."""
    import numpy as np

    b, c = np.asarray(base, dtype=np.float64), np.asarray(cand, dtype=np.float64)
    if np.isnan(b).any() or np.isnan(c).any():  # NaN's place in a sort follows the input order: the loop's
        return bootstrap_changes_loop(base, cand, better=better, resamples=resamples, seed=seed)
    state = random.Random(seed).getstate()[1]
    stream = np.random.RandomState()
    stream.set_state(("MT19937", np.array(state[:624], dtype=np.uint32), int(state[624]), 0, 0.0))  # no cached gauss
    nb, nc = len(b), len(c)
    rows = max(1, _BOOTSTRAP_BLOCK // (nb + nc))  # resamples drawn at once: bounded memory
    changes: list[float] = []
    with np.errstate(all="ignore"):
        for start in range(0, resamples, rows):
            draws = stream.random_sample((min(rows, resamples - start), nb + nc))
            bm = _row_medians(b[np.floor(draws[:, :nb] * float(nb)).astype(np.intp)])
            cm = _row_medians(c[np.floor(draws[:, nb:] * float(nc)).astype(np.intp)])
            ratio = cm / bm if better == "lower" else bm / cm
            change = np.where((bm <= 0) | (cm <= 0), np.where(bm == cm, 0.0, np.inf), ratio - 1)
            changes += change.tolist()
    return changes


_BOOTSTRAP_BLOCK = 1 << 20  # draws per block of resamples (8 MiB)


def bootstrap_changes_loop(base: Sequence[float], cand: Sequence[float], *, better: str, resamples: int,
                           seed: int) -> list[float]:
    """`bootstrap_changes` one resample at a time, with `random.choices`: for samples holding NaN."""
    rng = random.Random(seed)
    return [_change(median(rng.choices(base, k=len(base))), median(rng.choices(cand, k=len(cand))), better)
            for _ in range(resamples)]


def _row_medians(rows: Any) -> Any:
    """`median` of each row, its arithmetic (the two middle values halved, then added)."""
    import numpy as np

    ordered = np.sort(rows, axis=1)
    mid = ordered.shape[1] // 2
    return ordered[:, mid] if ordered.shape[1] % 2 else ordered[:, mid - 1] / 2 + ordered[:, mid] / 2


def compare(base: Sequence[float], cand: Sequence[float], *, better: str, tolerance: float,
            confidence: float = 0.95, resamples: int = 2000, min_samples: int = 3, seed: int = 0) -> Comparison:
    if not base or not cand:
        raise ValueError("both sample sets must be non-empty")
    bm, cm = median(base), median(cand)
    point = _change(bm, cm, better)
    if len(base) < min_samples or len(cand) < min_samples:
        return Comparison(bm, cm, point, float("-inf"), float("inf"), tolerance, Outcome.INCONCLUSIVE,
                          mad(base), mad(cand), better=better)
    most = max(len(base), len(cand))
    changes = sorted(bootstrap_changes(thin(base), thin(cand), better=better, resamples=resamples, seed=seed))
    tail = (1 - confidence) / 2
    low = changes[int(tail * (resamples - 1))]
    high = changes[int((1 - tail) * (resamples - 1))]
    outcome = _outcome(low, high, tolerance)
    return Comparison(bm, cm, point, low, high, tolerance, outcome, mad(base), mad(cand),
                      thinned_from=most if most > MAX_BOOTSTRAP_SAMPLES else 0, better=better)


def threshold(base: Sequence[float], cand: Sequence[float], *, better: str, tolerance: float) -> Comparison:
    """A single-valued metric (peak memory): the candidate's value may be at most `tolerance` worse
    than production's. With several samples the medians are compared the same way."""
    if not base or not cand:
        raise ValueError("both sample sets must be non-empty")
    bm, cm = median(base), median(cand)
    change = _change(bm, cm, better)
    if not math.isfinite(bm) or not math.isfinite(cm) or math.isnan(change):
        outcome = Outcome.INCONCLUSIVE
    elif change > tolerance:
        outcome = Outcome.REGRESSION
    else:
        outcome = Outcome.IMPROVEMENT if change < -tolerance else Outcome.OK
    return Comparison(bm, cm, change, change, change, tolerance, outcome, 0.0, 0.0, method="threshold", better=better)


def t_quantile(confidence: float, df: int) -> float:
    """Two-sided Student t critical value (Cornish-Fisher expansion around the normal quantile;
    exact for one degree of freedom). Within 1% of the tables for df >= 2."""
    p = 1 - (1 - confidence) / 2
    if df <= 1:
        return math.tan(math.pi * (p - 0.5))
    z = statistics.NormalDist().inv_cdf(p)
    v = float(df)
    return (z + (z**3 + z) / (4 * v) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
            + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * v**4))


def chi2_quantile(p: float, df: int) -> float:
    """The chi-square distribution's p-quantile with `df` degrees of freedom (Wilson-Hilferty). Checked
    against the tables: within 1% at p = 0.2 (the bound `calibrate` plans with) from df = 2, within 0.1%
    at p = 0.1 from df = 5; 7% low at p = 0.1 with df = 2."""
    z = statistics.NormalDist().inv_cdf(p)
    return df * max(1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df)), 0.0) ** 3


def f_quantile(p: float, d1: int, d2: int) -> float:
    """The F distribution's p-quantile with (d1, d2) degrees of freedom (Paulson's approximation, from
    Wilson-Hilferty's cube root of each chi-square). Checked against the tables at p = 0.95: within 1%
    from d1 = 2 and d2 = 5, 2% with d1 = 1 or d2 = 4, 7% high with d2 = 3."""
    z = statistics.NormalDist().inv_cdf(p)
    a, b = 2 / (9 * d1), 2 / (9 * d2)
    lead = (1 - b) ** 2 - z * z * b
    root = (1 - a) ** 2 * b + (1 - b) ** 2 * a - z * z * a * b
    if lead <= 0 or root < 0:  # too few degrees of freedom for the approximation: no finite bound
        return math.inf
    return (((1 - a) * (1 - b) + z * math.sqrt(root)) / lead) ** 3


def run_summaries(runs: Sequence[Sequence[float]], summary: str = "median", better: str = "lower") -> list[float]:
    """One number per run (its samples are the steps or iterations of one process): their median,
    or with `summary="best"` the best of them (the smallest if lower is better, else the largest)."""
    if summary == "best":
        pick = min if better == "lower" else max
        return [pick(r) for r in runs if r]
    return [median(r) for r in runs if r]


def sign_interval(logs: Sequence[float], confidence: float) -> tuple[float, float] | None:
    """A distribution-free interval for the median of `logs` (the sign test's): the k-th smallest and
    k-th largest values, with the largest k such that P(Binomial(n, 1/2) <= k - 1) <= (1 - confidence) / 2.
    None unless k >= 2, i.e. unless the interval leaves out at least one value at each end (at 95%: from
    9 pairs on): below that it is the range of the values, which one wrecked pair moves as far as it likes."""
    n = len(logs)
    tail = (1 - confidence) / 2
    k, below = 0, 0.0
    for j in range(n):
        below += math.comb(n, j) / 2**n  # P(X <= j)
        if below > tail:
            break
        k = j + 1
    if k < 2:
        return None
    ordered = sorted(logs)
    return ordered[k - 1], ordered[n - k]


def sign_test_pairs(confidence: float, most: int = 1000) -> int:
    """The fewest pairs for which `sign_interval` leaves a value out at each end (9 at 95%)."""
    return next(n for n in range(2, most + 1) if sign_interval([0.0] * n, confidence) is not None)


def robust_sd(values: Sequence[float]) -> float:
    """A standard deviation that a few values far out do not move: 1.4826 MAD (the sd for normal data)."""
    return 1.4826 * mad(values)


APART_FLOOR = 1e-6  # a log ratio this close to the rest is the same run, whatever the MAD (rounding: 1e-16)


def apart(logs: Sequence[float], limit: float = 3.5) -> list[bool]:
    """Which values stand apart from the rest: a modified z-score |x - median| / (1.4826 MAD) beyond
    `limit` (Iglewicz and Hoaglin's rule for outliers). The spread is at least `APART_FLOOR`, so that
    pairs equal but for floating-point rounding (MAD ~1e-16) are not told apart."""
    centre, spread = median(logs), max(robust_sd(logs), APART_FLOOR)
    return [abs(x - centre) / spread > limit for x in logs]


def paired(base_runs: Sequence[Sequence[float]], cand_runs: Sequence[Sequence[float]], *, better: str,
           tolerance: float, confidence: float = 0.95, summary: str = "median") -> Comparison:
    """Interleaved repeats (P C | C P | ...): run i of production is paired with run i of the candidate,
    so that drift on the runner hits both. The statistic works on per-run summaries: the log ratio of
    each pair's summaries (medians, or best samples). The interval is a Student t interval on the mean
    log ratio, unless some pairs stand apart (`apart`: a run that a busy neighbour slowed) and there
    are enough pairs (9 at 95%) for the sign test's interval on the median log ratio to leave out at
    least one at each end: that one is distribution-free, and a few wrecked pairs move neither its
    ends nor its centre (benchmarks/paired_stats.py compares the two; the report names the one used). On
    clean pairs the t interval is the narrower, so it stays the statistic there."""
    base, cand = run_summaries(base_runs, summary, better), run_summaries(cand_runs, summary, better)
    n = min(len(base), len(cand))
    if n < 2 or any(not (0 < x < math.inf) for x in (*base[:n], *cand[:n])):
        bm = median(base) if base else 0.0
        cm = median(cand) if cand else 0.0
        return Comparison(bm, cm, _change(bm, cm, better) if bm and cm else 0.0, float("-inf"), float("inf"),
                          tolerance, Outcome.INCONCLUSIVE, 0.0, 0.0, method="paired", better=better)
    sign = 1.0 if better == "lower" else -1.0
    # the log of each value, then the difference: finite for every positive finite pair (1e-308 vs 1e308
    # is a log ratio of 1418; their quotient overflows)
    logs = [sign * (math.log(cand[i]) - math.log(base[i])) for i in range(n)]
    out, middle = apart(logs), median(logs)
    away, worse = sum(out), sum(x > middle for x, o in zip(logs, out, strict=True) if o)
    robust = sign_interval(logs, confidence) if away else None
    if robust is not None:
        centre, (lo, hi), statistic = median(logs), robust, "sign"
        spread = robust_sd(logs)  # the spread of the pairs the sign test keeps, not of the wrecked ones
    else:
        centre = math.fsum(logs) / n
        spread = math.sqrt(math.fsum((x - centre) ** 2 for x in logs) / (n - 1))
        half = t_quantile(confidence, n - 1) * spread / math.sqrt(n)
        lo, hi, statistic = centre - half, centre + half, "t"
    low, high = _exp_minus_1(lo), _exp_minus_1(hi)
    outcome = _outcome(low, high, tolerance)
    return Comparison(median(base[:n]), median(cand[:n]), _exp_minus_1(centre), low, high,
                      tolerance, outcome, mad(base[:n]), mad(cand[:n]), method="paired", statistic=statistic, pairs=n,
                      better=better, noise=spread, apart=away, apart_worse=worse)


@dataclass(frozen=True)
class Parity:
    bitwise: bool
    within: bool
    worst_index: int
    worst_abs: float
    worst_rel: float
    compared: int
    expected: int = 0  # steps that should have been compared (production's length, capped by `steps`)
    problem: str = ""  # why not within, when it is not a plain difference (short trajectory, NaN/inf)


def parity(base: Sequence[float], cand: Sequence[float], *, rtol: float, atol: float, steps: int | None = None) -> Parity:
    """Elementwise trajectory comparison (losses, grad norms) over the first `steps` values of
    production's trajectory. A candidate trajectory shorter than that, or any NaN/inf on either side,
    is never within tolerance (and never bitwise identical)."""
    expected = min(len(base), steps) if steps else len(base)
    n = min(expected, len(cand))
    worst_i, worst_abs, worst_rel, within = -1, 0.0, 0.0, n > 0
    problem = ""
    if len(cand) < expected:
        within, problem = False, f"candidate trajectory has {len(cand)} of {expected} steps"
    elif expected == 0:
        problem = "production recorded an empty trajectory"
    for i in range(n):
        if not (math.isfinite(base[i]) and math.isfinite(cand[i])):
            within = False
            problem = problem or f"step {i} is not finite (production {base[i]}, candidate {cand[i]})"
            worst_i, worst_abs, worst_rel = i, float("inf"), float("inf")
            continue
        diff = abs(cand[i] - base[i])
        rel = diff / abs(base[i]) if base[i] else (0.0 if diff == 0 else float("inf"))
        if diff > worst_abs:
            worst_i, worst_abs, worst_rel = i, diff, rel
        if diff > atol + rtol * abs(base[i]):
            within = False
    beyond = [(side, i, x) for side, series in (("candidate", cand), ("production", base))
              for i, x in enumerate(series) if i >= n and not math.isfinite(x)]
    if beyond:  # NaN or inf anywhere fails numerics, beyond the compared steps too (README)
        side, i, x = beyond[0]
        within, problem = False, problem or f"step {i} of the {side}'s trajectory is not finite ({x}), beyond the steps compared"
    bitwise = within and n == expected and list(base[:n]) == list(cand[:n])
    return Parity(bitwise, within, worst_i, worst_abs, worst_rel, n, expected, problem)
