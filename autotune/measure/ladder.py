"""The highest load level that meets the limits: a pure function of a measure(level) callable.

Levels rise geometrically from `start` until one fails (or `max` passes), then the gap between the last pass
and the first fail is bisected. Measuring a level is the caller's business (boot nothing here), so the search
is tested with a fake measure and reused for concurrency and request-rate modes alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Generic, Literal, TypeVar

import numpy as np

from autotune.measure.client import RequestRecord
from autotune.measure.stats import Limits, _tpot


@lru_cache(maxsize=4096)
def order_stat_ranks(n: int, q: float, confidence: float) -> tuple[int | None, int | None]:
    """1-based ranks (l, u) such that [x(l), x(u)] covers the q-quantile with probability >= confidence,
    whatever the distribution: B = #samples below the quantile is Binomial(n, q), and
    P(x(l) <= quantile <= x(u)) = P(l <= B <= u - 1). Equal tails; None where no sample is extreme enough
    (e.g. an upper bound for the p95 at 90% needs n >= 59, since 0.95^59 < 0.05)."""
    alpha = (1.0 - confidence) / 2.0
    k = np.arange(n + 1)
    logfact = np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, n + 1)))))
    logpmf = logfact[n] - logfact[k] - logfact[n - k] + k * math.log(q) + (n - k) * math.log1p(-q)
    cdf = np.cumsum(np.exp(logpmf))[:n]  # cdf[r - 1] = P(B <= r - 1) for ranks r = 1..n
    lows = np.nonzero(cdf <= alpha)[0]  # P(B <= l - 1) <= alpha
    highs = np.nonzero(cdf >= 1.0 - alpha - 1e-12)[0]  # P(B <= u - 1) >= 1 - alpha
    return (int(lows[-1]) + 1 if lows.size else None, int(highs[0]) + 1 if highs.size else None)


def percentile_interval(values: Sequence[float], q: float = 0.95, confidence: float = 0.90) -> tuple[float, float]:
    """A distribution-free confidence interval of the q-quantile: (-inf / inf where the sample is too small)."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    if x.size == 0:
        return (-math.inf, math.inf)
    lo, hi = order_stat_ranks(int(x.size), q, confidence)
    return (float(x[lo - 1]) if lo else -math.inf, float(x[hi - 1]) if hi else math.inf)


@lru_cache(maxsize=256)
def _looks(low: int, high: int) -> frozenset[int]:
    out, k = set(), 0
    while (n := math.ceil(low * 1.25**k - 1e-9)) < high:
        out.add(n)
        k += 1
    return frozenset(out)


_SAMPLES = {
    "ttft_p95_ms": lambda rs: [r.ttft for r in rs if r.ttft is not None],
    "tpot_p95_ms": lambda rs: [t for r in rs if (t := _tpot(r)) is not None],
    "itl_p95_ms": lambda rs: [g for r in rs for g in r.itl],
    "e2e_p95_ms": lambda rs: [r.end - r.start for r in rs],
}


@dataclass(frozen=True)
class StopRule:
    """When a level has measured enough requests.

    Not before `min_requests` have finished; then as soon as, for every limited p95, the `confidence` interval
    from order statistics is within +-`margin` of the estimate (relative), or lies wholly on one side of the
    limit (the verdict is known: more requests would not change it). A level that is known to fail one limit
    stops at once. Never more than `max_requests`. margin None: exactly `min_requests` (a fixed count).

    The rule looks only at min_requests x 1.25^k requests: every extra look at a growing sample is another
    chance for an interval to miss by luck, and a dozen looks keep that in bounds where hundreds would not.
    """

    min_requests: int
    max_requests: int
    margin: float | None = 0.1
    confidence: float = 0.90

    def reason(self, records: Sequence[RequestRecord], limits: Limits) -> str | None:
        """Why the level may stop now, or None to go on."""
        n = len(records)
        if n >= self.max_requests:
            return "max_requests"
        if n < self.min_requests:
            return None
        if self.margin is None:
            return "min_requests"
        if n not in _looks(self.min_requests, self.max_requests):
            return None
        ok = [r for r in records if r.error is None]
        settled = True
        for key, samples in _SAMPLES.items():
            limit = getattr(limits, key)
            if limit is None:
                continue
            values = samples(ok)
            if not values:
                return None
            lo, hi = percentile_interval(values, 0.95, self.confidence)
            lo, hi = lo * 1000.0, hi * 1000.0
            if lo > limit:
                return "fails"  # this limit is missed whatever more requests say
            p95 = float(np.percentile(values, 95)) * 1000.0
            narrow = p95 > 0 and max(hi - p95, p95 - lo) <= self.margin * p95
            settled = settled and (narrow or hi <= limit)
        return "settled" if settled else None


T = TypeVar("T")


@dataclass(frozen=True)
class LoadSearch:
    """How load levels are chosen: double from `start` up to `max`, then bisect to `tolerance`."""

    mode: Literal["concurrency", "rate"] = "concurrency"
    start: float = 1
    max: float = 256
    factor: float = 2.0
    tolerance: float = 0.25  # stop bisecting when (fail - pass) <= tolerance * pass (and >= 1 for concurrency)
    min_requests: int = 72  # requests per level at least (concurrency mode: at least 3 x concurrency too)
    warmup_requests: int = 4  # per level, not counted
    # A level goes on until each limited p95 is known to +-p95_margin (relative, at p95_confidence, from order
    # statistics) or is clearly on one side of its limit; 0 = exactly min_requests, as a fixed count.
    p95_margin: float = 0.1
    p95_confidence: float = 0.9
    max_requests: int = 400  # per level at most (raised to the level's minimum when that is more)

    def stop_rule(self, level: float) -> StopRule:
        """How many requests the level at `level` measures (see metrics.StopRule)."""
        low = max(self.min_requests, int(3 * level)) if self.mode == "concurrency" else self.min_requests
        if self.p95_margin <= 0:
            return StopRule(low, low, None, self.p95_confidence)
        return StopRule(low, max(low, self.max_requests), self.p95_margin, self.p95_confidence)


@dataclass(frozen=True)
class SlaStep(Generic[T]):
    """One measured level: what `measure` returned and whether `passed` accepted it."""

    level: float
    outcome: T
    passed: bool


@dataclass(frozen=True)
class SlaResult(Generic[T]):
    steps: tuple[SlaStep[T], ...]  # in the order measured

    @property
    def best_step(self) -> SlaStep[T] | None:
        passes = [s for s in self.steps if s.passed]
        return max(passes, key=lambda s: s.level) if passes else None

    @property
    def best(self) -> T | None:
        """The outcome of the highest passing level; None when no level passed (the trial is infeasible)."""
        step = self.best_step
        return step.outcome if step else None

    @property
    def best_level(self) -> float | None:
        step = self.best_step
        return step.level if step else None

    @property
    def feasible(self) -> bool:
        return self.best_step is not None


def _check(search: LoadSearch) -> None:
    if search.mode not in ("concurrency", "rate"):
        raise ValueError(f"unknown load search mode {search.mode!r}")
    if not 0 < search.start <= search.max:
        raise ValueError(f"need 0 < start <= max, got start={search.start} max={search.max}")
    if search.factor <= 1:
        raise ValueError(f"factor must be > 1, got {search.factor}")
    if search.tolerance < 0 or (search.mode == "rate" and search.tolerance == 0):
        raise ValueError(f"tolerance must be > 0 (>= 0 for concurrency), got {search.tolerance}")


def find_sustainable(
    measure: Callable[[float], T], passed: Callable[[T], bool], search: LoadSearch
) -> SlaResult[T]:
    """Measure rising levels and bisect to the highest passing one; exceptions from `measure` propagate.

    Concurrency levels are integers (start rounded up, each step at least one more than the last, max rounded
    down). In a non-monotone response only measured levels count: the search never skips past a failure.
    """
    _check(search)
    ints = search.mode == "concurrency"
    top = math.floor(search.max) if ints else search.max
    level: float = max(1, math.ceil(search.start)) if ints else search.start
    if level > top:
        raise ValueError(f"no integer concurrency in [{search.start}, {search.max}]")
    steps: list[SlaStep[T]] = []

    def step(x: float) -> bool:
        outcome = measure(x)
        ok = bool(passed(outcome))
        steps.append(SlaStep(x, outcome, ok))
        return ok

    lo: float | None = None
    hi: float | None = None
    while True:
        if not step(level):
            hi = level
            break
        lo = level
        if level >= top:
            break
        nxt = level * search.factor
        level = min(top, max(level + 1, math.ceil(nxt)) if ints else nxt)

    if lo is None or hi is None:  # nothing passed, or max passed
        return SlaResult(tuple(steps))
    while hi - lo > max(search.tolerance * lo, 1 if ints else 0):
        mid = (lo + hi) // 2 if ints else (lo + hi) / 2
        if step(mid):
            lo = mid
        else:
            hi = mid
    return SlaResult(tuple(steps))
