"""`stackgate calibrate`: how much noise does this runner add to each gated metric, and what does the
gate need (tolerance, repeats) to detect a target change?

A/A: the production stack's performance-gated tests run 2k times on this runner; consecutive runs
form pairs (as production and candidate would in interleaved repeats), and the spread of the pairs'
log ratios about 0 (of per-run summaries, as the metric's rule summarises runs; about 0, so that an
order effect counts, as it does in the gate's counterbalanced pairs) is its noise sigma. For a
target change D that must be detected, and an allowed change A (< D) that must pass, the gate says
NO-GO for D and OK (not merely "not NO-GO": INCONCLUSIVE is a red build too) for A, each with 95%
confidence and the power z(power) stands for, when

    tolerance = (A + D) / 2   and   (t(confidence, n-1) + z(power)) * sigma / sqrt(n) <= (D - A) / 2,

which gives the repeats n: D's interval must end above the tolerance, A's (and no change's) below it.
The repeats are planned for 95% power (PLAN_POWER) at the noise's 80% upper confidence bound
(NOISE_BOUND: sigma from k A/A pairs about 0 is sigma_true * sqrt(chi2_k / k)), not for ~90% at the
point estimate: a target such as "5% caught in 18 of 20 trials" is a 90% rate, which a plan for 90%
power at a sigma measured from 10 pairs meets only about half the time. Measured here
(docs/performance.md, 2026-12-04): sigma 1.0% from 10 pairs; the point-estimate plan, 5 repeats,
caught a planted 5% in fewer than 18 of 20 trials.
A tolerance at A itself (this module's rule before #22) flags a change of A at most 2.5% of the time
with fewer repeats, but leaves an A/A run INCONCLUSIVE most of the time: with its recommendation
(tolerance 1%, 3 repeats) 15 of 20 A/A trials were INCONCLUSIVE here (docs/performance.md). The
result is stored per pool in the history, and reports show the gate's power (the smallest change it
detects with the runs in use) from it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from stackgate import stats

POWER = 0.90  # what `detectable` and `runs_to_settle` describe: the gate's power, as reports state it
PLAN_POWER = 0.95  # what `recommend` plans the repeats for ...
NOISE_BOUND = 0.80  # ... at this upper confidence bound of the noise it measured
SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}  # time units a metric's samples may have


@dataclass(frozen=True)
class Noise:
    metric: str
    sigma: float  # spread (about 0) of the log ratio of two runs' summaries (A/A), the pairs apart left out
    pairs: int
    apart: int = 0  # pairs that stood apart (a whole run slowed): the gate's sign test leaves them out from 9 pairs
    span_s: float | None = None  # the time one run's samples cover (median over runs; time units only)

    def bound(self, level: float = NOISE_BOUND) -> float:
        """The `level` upper confidence bound of the noise: sigma is measured about 0 from the pairs not
        apart, so sigma**2 * k / sigma_true**2 is chi-square with k = those pairs degrees of freedom."""
        k = max(self.pairs - self.apart, 1)
        return self.sigma * math.sqrt(k / stats.chi2_quantile(1 - level, k))

    def to_json(self) -> dict[str, float | int | str | None]:
        return {"metric": self.metric, "sigma": round(self.sigma, 6), "pairs": self.pairs, "apart": self.apart,
                "span_s": None if self.span_s is None else round(self.span_s, 3)}


def noise(metric: str, runs: Sequence[Sequence[float]], summary: str = "median", better: str = "lower",
          unit: str = "") -> Noise | None:
    """Sigma of the A/A log ratios of the runs' summaries (as the gate summarises them): runs (0, 1),
    (2, 3), ... are pairs. A pair that stands apart from the rest (a run slowed whole by something no
    gauge saw: 3.46 ms against 2.45-2.51 ms best steps in one calibration here) is counted, not folded
    into sigma: one such pair in five made sigma 14% where the other four moved about 1%. The gate copes
    with such pairs by its sign test, from 9 pairs on (see `recommend`). Beside it, the time a run's
    samples cover (`span_s`, for samples in a time unit): on a shared machine whose slow phases last
    seconds, how long a run measures decides how often a run is slowed whole (docs/performance.md)."""
    values = stats.run_summaries(runs, summary, better)
    logs = [math.log(values[i + 1] / values[i]) for i in range(0, len(values) - 1, 2)
            if values[i] > 0 and values[i + 1] > 0]
    if len(logs) < 2:
        return None
    spans = [math.fsum(r) * SECONDS[unit] for r in runs if r] if unit in SECONDS else []
    span = statistics.median(spans) if spans else None
    out = stats.apart(logs) if len(logs) >= 3 else [False] * len(logs)
    kept = [x for x, away in zip(logs, out, strict=True) if not away]
    if len(kept) < 2:
        return Noise(metric, _about_zero(logs), len(logs), 0, span)
    return Noise(metric, _about_zero(kept), len(logs), len(logs) - len(kept), span)


def _about_zero(logs: Sequence[float]) -> float:
    """The spread of A/A log ratios about 0, not about their mean: an A/A pair's true ratio is 1, so a
    mean away from 0 is an order effect (the second run of a pair faster: all 9 pairs of two
    calibrations on two machines here, by ~1%), and the gate's counterbalanced pairs (P C | C P) see
    it as spread (+d, -d, ...), by which its t interval widens."""
    return math.sqrt(math.fsum(x * x for x in logs) / len(logs))


def detectable(sigma: float, repeats: int, tolerance: float, confidence: float = 0.95, power: float = POWER) -> float:
    """The smallest true change the gate flags as a regression with probability `power` (~90%) with
    `repeats` interleaved runs at `tolerance` (the gate's power, as a change)."""
    if repeats < 2:
        return float("inf")
    z = statistics.NormalDist().inv_cdf(power)
    return tolerance + (stats.t_quantile(confidence, repeats - 1) + z) * sigma / math.sqrt(repeats)


def runs_for(sigma: float, margin: float, confidence: float = 0.95, most: int = 100,
             power: float = POWER) -> int | None:
    """The fewest interleaved runs (2 .. most) with which a true change `margin` beyond the tolerance
    is told from it with probability `power` at noise `sigma` (`detectable`); None if `most` do not do."""
    return next((n for n in range(2, most + 1) if detectable(sigma, n, 0.0, confidence, power) <= margin), None)


def runs_to_settle(found: stats.Comparison, confidence: float = 0.95, most: int = 100) -> int | None:
    """For a paired INCONCLUSIVE: about how many interleaved runs would settle it at the noise its pairs
    showed, if the change is what they saw (a planning figure: the true change is not known). 0 for the
    sign test's interval (used when pairs stand apart): its ends are the pairs' own ratios, ranked, so no
    spread says how many would settle it (its robust one is 0 when most pairs agree), only that more pairs
    narrow it. None when `most` would not: the change seen sits (nearly) at the tolerance, or the runner
    is too noisy."""
    if found.method == "paired" and found.statistic == "sign":
        return 0
    if found.method != "paired" or not 0 < found.noise < math.inf or found.change <= -1:
        return None
    return runs_for(found.noise, abs(math.log1p(found.change) - math.log1p(found.tolerance)), confidence, most)


def explained(sigma: float, calibrated_pairs: int, pairs: int, level: float = 0.95) -> float:
    """The most noise a run of `pairs` pairs shows `level` of the time on a runner calibrated at `sigma`
    from `calibrated_pairs` A/A pairs: a prediction bound for their spread (about their mean, pairs - 1
    degrees of freedom; the calibrated one is about 0, one per A/A pair), sigma * sqrt(F(level; pairs - 1,
    calibrated_pairs))."""
    return sigma * math.sqrt(stats.f_quantile(level, max(pairs - 1, 1), max(calibrated_pairs, 1)))


def noisier(seen: float, pairs: int, sigma: float, calibrated_pairs: int, level: float = 0.95) -> bool:
    """Whether a run's pairs spread more than the noise `stackgate calibrate` measured can explain
    (`explained`). The runner was noisier in this run than when calibrated (its noise moves by the hour
    here: docs/performance.md): the runs the policy makes then settle fewer changes."""
    if pairs < 3 or calibrated_pairs < 2 or not 0 < sigma < math.inf or not 0 <= seen < math.inf:
        return False
    return seen > explained(sigma, calibrated_pairs, pairs, level)


@dataclass(frozen=True)
class Recommendation:
    metric: str
    sigma: float
    tolerance: float
    repeats: int
    detects: float  # the change `repeats` detect as planned: above the target when even the most allowed are not enough
    planned: float  # the noise the repeats are planned for (`Noise.bound`)
    confirm: int  # confirm_repeats: the runs for a comparison `repeats` leave unsettled, or a NO-GO to confirm
    confirm_planned: float  # the noise confirmation is planned for (`explained` at `repeats` pairs)
    allow: float = 0.0  # the change that passes as OK
    apart: int = 0
    pairs: int = 0
    confirms: bool = True  # the gate's confirmation takes a comparison with a pair apart to the sign test's pairs
    span_s: float | None = None

    def describe(self, target: float) -> str:
        span = f" (runs whose samples cover {self.span_s:.2g} s)" if self.span_s is not None else ""
        text = (f"{self.metric}: run-to-run noise {self.sigma:.1%}{span}; to detect {target:.1%} and pass "
                f"{self.allow:.1%} as OK: tolerance {self.tolerance:.1%} with repeats = {self.repeats} (repeats "
                f"planned for {PLAN_POWER:.0%} power at {self.planned:.1%}, the noise's {NOISE_BOUND:.0%} upper "
                f"bound from {self.pairs - self.apart} A/A pairs)")
        if self.confirms:
            text += (f" and confirm_repeats = {self.confirm} (for a comparison {self.repeats} runs leave unsettled, "
                     f"and before a NO-GO: at least the sign test's pairs, and planned for {PLAN_POWER:.0%} power at "
                     f"{self.confirm_planned:.1%}, the most noise a run of {self.repeats} pairs shows 95% of the time "
                     f"on this runner as calibrated; beyond it the report says to calibrate again)")
        if self.apart and self.confirms:
            text += (f" ({self.apart} of {self.pairs} A/A pairs stood apart, a run slowed whole, and are left out"
                     " of the noise; when a comparison has such a pair, confirmation runs the pairs the gate's sign "
                     "test needs to leave it out)")
        elif self.apart:
            text += (f" ({self.apart} of {self.pairs} A/A pairs stood apart, a run slowed whole, and are left out"
                     " of the noise; repeats enough for the gate's sign test to leave such a pair out, as"
                     " confirmation is off)")
        if self.detects > target:
            text += f" (not enough: {self.repeats} repeats detect {self.detects:.1%}; use a quieter runner)"
        return text


def recommend(found: Noise, target: float, allow: float, confidence: float = 0.95, most: int = 100,
              confirms: bool = True) -> Recommendation:
    """Tolerance and repeats that detect `target` and pass a change of `allow` as OK, each with 95%
    power (PLAN_POWER) at the noise's 80% upper bound (`Noise.bound`), not at its point estimate.
    When runs slowed whole happen here (A/A pairs apart), the gate needs the sign test's pairs (9 at 95%)
    to leave such a pair out: with confirmation on (`confirms`) it runs them itself when a comparison
    has one (`commands.run._sign_test_runs`), so the repeats are what the clean pairs need; with it off,
    the repeats must be that many from the start.
    With confirmation on, confirm_repeats too: no fewer than the sign test's pairs, and planned for 95%
    power at the most noise a run of `repeats` pairs shows 95% of the time on this runner as calibrated
    (`explained`, from the A/A pairs kept: the yardstick `noisier` holds a run's pairs to). The runner's
    noise is a mixture, a run now and then slowed whole by a few percent, too seldom for 10 A/A pairs to
    show (a trial's pairs spread 0.4-1.9% against a calibrated 0.6%; resampling the pairs of 15 trials of
    a planted 5%, the gate caught it with 5 pairs 76% of the time, 7: 89%, 9: 96%: docs/performance.md).
    Confirmation runs only for a comparison left unsettled, or a NO-GO to confirm: where more pairs cost
    least."""
    if not 0 <= allow < target:
        raise ValueError(f"allowed change {allow} must be below the target {target}")
    tolerance = (allow + target) / 2
    planned = found.bound()
    n = runs_for(planned, target - tolerance, confidence, most, PLAN_POWER) or most
    if found.apart and not confirms:
        n = max(n, stats.sign_test_pairs(confidence))
    noisy = explained(found.sigma, found.pairs - found.apart, n)
    confirm = n if not confirms else max(n, runs_for(noisy, target - tolerance, confidence, most, PLAN_POWER) or most,
                                         stats.sign_test_pairs(confidence))
    return Recommendation(found.metric, found.sigma, tolerance, n,
                          detectable(planned, n, tolerance, confidence, PLAN_POWER), planned, confirm, noisy, allow,
                          found.apart, found.pairs, confirms, found.span_s)

