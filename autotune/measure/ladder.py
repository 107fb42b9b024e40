"""The highest load level that meets the limits: a pure function of a measure(level, exact) callable.

Where the search starts (`Prior`, `first_level`). A trial starts near its likely answer, not at 1: at the
incumbent's best level when the study has one (the screening level, below), else at the median best level of
similar configurations, else one geometric step below what the configuration can hold at once (`cap`: the
smaller of max_num_seqs and the predicted KV tokens / tokens per request), else the geometric middle of
[start, max]. From there levels go up by `factor` while they pass, or down by `factor` while they fail, and the
gap between the last pass and the first fail is bisected. `start` is the lowest level ever measured.

Screening (multi-fidelity): with `Prior.screen`, the first level is the incumbent's best level and a failure
there ends the search (`SlaResult.screened_out`): a configuration that cannot sustain the incumbent's load
costs one boot and one short level. This takes the incumbent's level as the bar, as the issue asks; it can
screen out a configuration whose fewer, faster requests would beat the incumbent's throughput at a lower level.

How long a level runs (`StopRule`). Two rules, whichever ends it first:
  - a sequential verdict (Wald's SPRT) on the share p of requests over each limit, p95 <= limit being
    p <= 5%: "inside" is p <= 2%, "outside" p >= 15%; after each request the log-likelihood ratio of the
    exceedance count is compared with log((1 - e) / e) and log(e / (1 - e)), e = `verdict_error`. A level
    clearly over a limit stops after a handful of requests; one clearly under after about 21 (+ one round
    of a closed loop's start-up burst, which the test does not count). Error rates (independent requests):
    a level with p >= 15% is passed, or one with p <= 2% failed, with probability at most e / (1 - e) ~ 5.3%
    (Wald's bound, e = 0.05; computed exactly: 4.9% and 2.6%; tests/unit/measure/test_measurement.py counts
    them on 20,000 simulated levels each). In between it may take either verdict (at p = 5%, the p95 at the
    limit, 75% pass early): the answer is therefore always a level measured exactly (below);
    A TTFT or end-to-end limit is judged on every request that started at least the limit ago, finished or still
    in flight (one still waiting for its first token past the TTFT limit is over it, whatever comes): in a closed
    loop the requests after the first round finish only after that whole round, and a queueing server's level
    took 126 s on a GPU where these show the verdict in a few. A level that clearly fails is abandoned
    (client.Abandon): its requests in flight are cancelled, not waited for;
  - the exact rule (the former one): after `min_requests`, at min x 1.25^k requests, each limited p95's
    order-statistics interval at `p95_confidence` is within +-`p95_margin` or clear of its limit.
  Only the answer is measured exactly (`exact=True`: no sequential verdict): the best level once more if it was
  only passed by the sequential test, so that the figure a trial reports is an exact p95 and a throughput over
  the full count of requests; if it fails there, the search goes below it again. Bisection levels are judged
  sequentially like the others: a mid clearly over its limit stops after a dozen requests, where an exact
  level ran ~200 on a GPU (55 at a p95 TTFT far over its limit). The error rates above hold for each of
  them (requests at a level do not depend on how it was chosen), but mids lie near the limit by construction,
  where the test may go either way (computed exactly, with no cap on requests: a level with p = 3% or 4% fails
  with probability 7% or 15%, one with p = 7% or 10% passes with 50% or 22%). A false pass costs one exact
  level: the answer is re-measured and the search comes back below it. A false fail (p between 2% and 5%)
  closes the bracket there: the answer is the highest exact pass below it, lower than exact bisection would
  find by at most the bracket being bisected (the same risk the ramp's levels always had).
  A re-measurement (`Prior.exact_first`) measures its first level, its original's best, exactly at once: it is
  most often the answer, and would otherwise be measured twice.

Compared with the tools the issue names. GuideLLM's sweep measures a synchronous run (concurrency 1) and a
throughput run (everything at once), then spreads its rates linearly between the two; vLLM 0.32's
`vllm bench sweep serve_workload` (vllm/benchmarks/sweep/serve_workload.py, explore_comb_workloads) does the
same for max_concurrency: concurrency 1 and concurrency = dataset size, estimating each end's sustained
concurrency as request throughput x mean E2E latency (Little's law), then np.linspace between them. Both map
the whole curve at fixed-size runs; neither searches for a limit. Taken from them: the bracket comes from the
configuration's own capacity (their "batch" end, here predicted, not measured, since a run at full load is
the most expensive one) and concurrency is an integer; not taken: the linear grid and fixed request counts,
since only the boundary matters here and a geometric ladder plus bisection needs log2 of the range.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Generic, Literal, TypeVar

import numpy as np

from autotune.measure.client import Abandon, RequestRecord
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

# The sequential verdict's hypotheses on p = P(one request's latency > limit); p95 <= limit is p <= 5%.
INSIDE_P = 0.02  # a level clearly inside: the limit is at its p98 or beyond
OUTSIDE_P = 0.15  # a level clearly outside: the limit is at its p85 or below


def sequential_verdict(exceed: int, n: int, error: float) -> Literal["passes", "fails"] | None:
    """Wald's SPRT of p <= INSIDE_P against p >= OUTSIDE_P after `exceed` of `n` requests were over the limit:
    "passes", "fails", or None (not certain yet). Each error rate is at most error / (1 - error)."""
    llr = exceed * math.log(OUTSIDE_P / INSIDE_P) + (n - exceed) * math.log((1 - OUTSIDE_P) / (1 - INSIDE_P))
    bound = math.log((1 - error) / error)
    return "fails" if llr >= bound else "passes" if llr <= -bound else None


def _exceedances(records: Sequence[RequestRecord], key: str, limit: float) -> tuple[int, int]:
    """(requests over the limit, requests judged) for one limited p95. ITL is judged request by request on
    the request's own p95 gap, as vLLM's goodput judges it, so that requests stay the independent unit."""
    if key == "itl_p95_ms":
        values = [float(np.percentile(r.itl, 95)) for r in records if r.itl]
    else:
        values = _SAMPLES[key](records)
    return sum(v * 1000.0 > limit for v in values), len(values)


_ELAPSED = {"ttft_p95_ms": lambda r, now: r.ttft if r.ttft is not None else now - r.start,
            "e2e_p95_ms": lambda r, now: now - r.start}  # a request in flight: its latency so far


def _exceedances_by_start(finished: Sequence[RequestRecord], in_flight: Sequence[RequestRecord], key: str,
                          limit: float, now: float) -> tuple[int, int] | None:
    """(over the limit, judged) for a TTFT or end-to-end limit among every request that started at least `limit`
    before `now`, finished or not: for each of them it is known whether it is over (one still waiting for its first
    token, or still running, has passed the limit). Chosen by when they started, not by how they did: judging
    only the finished ones, or the ones in flight whose latency happens to be known, favours the fast requests.
    None for the other limits, which only a finished request shows."""
    if key not in _ELAPSED or now == -math.inf:
        return None
    cut = now - limit / 1000.0
    values = _SAMPLES[key]([r for r in finished if r.start <= cut])
    values += [_ELAPSED[key](r, now) for r in in_flight if r.start <= cut]
    return sum(v * 1000.0 > limit for v in values), len(values)


@dataclass(frozen=True)
class StopRule:
    """When a level has measured enough requests.

    The sequential verdict (`verdict_error` > 0) may end it from `verdict_after` requests on, judging the
    requests that started after the first `burst` (a closed loop's first round starts all at once). The exact
    rule: not before `min_requests` have finished; then as soon as, for every limited p95, the `confidence`
    interval from order statistics is within +-`margin` of the estimate (relative), or lies wholly on one side
    of the limit. Never more than `max_requests`. margin None: exactly `min_requests` (a fixed count).

    The exact rule looks only at min_requests x 1.25^k requests: every extra look at a growing sample is another
    chance for an interval to miss by luck, and a dozen looks keep that in bounds where hundreds would not.
    """

    min_requests: int
    max_requests: int
    margin: float | None = 0.1
    confidence: float = 0.90
    verdict_error: float = 0.0  # 0: no sequential verdict (an exact level)
    burst: int = 0

    def reason(self, records: Sequence[RequestRecord], limits: Limits, in_flight: Sequence[RequestRecord] = (),
               now: float = -math.inf) -> str | None:
        """Why the level may stop now, or None to go on. `in_flight`: the requests sent and not finished at `now`."""
        n = len(records)
        if n >= self.max_requests:
            return "max_requests"
        if self.verdict_error > 0 and n + len(in_flight) > self.burst:
            if (why := self._sequential(records, limits, in_flight, now)) is not None:
                return why
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

    def _sequential(self, records: Sequence[RequestRecord], limits: Limits, in_flight: Sequence[RequestRecord],
                    now: float) -> str | None:
        starts = sorted(r.start for r in (*records, *in_flight))
        after = starts[self.burst - 1] if self.burst else -math.inf
        judged = [r for r in records if r.error is None and r.start > after]
        waiting = [r for r in in_flight if r.start > after]
        verdicts = []
        for key in _SAMPLES:
            limit = getattr(limits, key)
            if limit is None:
                continue
            exceed, n = _exceedances_by_start(judged, waiting, key, limit, now) or _exceedances(judged, key, limit)
            verdicts.append(sequential_verdict(exceed, n, self.verdict_error) if n else None)
        if "fails" in verdicts:
            return Abandon("clearly fails")
        return "clearly passes" if verdicts and all(v == "passes" for v in verdicts) else None


T = TypeVar("T")


@dataclass(frozen=True)
class LoadSearch:
    """How load levels are chosen: from a first level derived from the `Prior`, by `factor` up or down within
    [start, max], then bisect to `tolerance`."""

    mode: Literal["concurrency", "rate"] = "concurrency"
    start: float = 1  # the lowest level measured
    max: float = 256
    factor: float = 2.0
    tolerance: float = 0.25  # stop bisecting when (fail - pass) <= tolerance * pass (and >= 1 for concurrency)
    min_requests: int = 72  # requests per exact level at least (concurrency mode: at least 3 x concurrency too)
    warmup_requests: int = 4  # per level, not counted
    # An exact level goes on until each limited p95 is known to +-p95_margin (relative, at p95_confidence, from
    # order statistics) or is clearly on one side of its limit; 0 = exactly min_requests, as a fixed count.
    p95_margin: float = 0.1
    p95_confidence: float = 0.9
    max_requests: int = 400  # per level at most (raised to the level's minimum when that is more)
    # Each error rate of the sequential verdict (a level clearly inside or outside its limits ends early);
    # 0: none, every level is measured by the exact rule.
    verdict_error: float = 0.05

    def stop_rule(self, level: float, exact: bool = True) -> StopRule:
        """How many requests the level at `level` measures (see StopRule); not `exact`: a sequential verdict
        may end it first."""
        low = max(self.min_requests, int(3 * level)) if self.mode == "concurrency" else self.min_requests
        error = 0.0 if exact else self.verdict_error
        burst = int(level) if self.mode == "concurrency" else 0
        if self.p95_margin <= 0:
            return StopRule(low, low, None, self.p95_confidence, error, burst)
        return StopRule(low, max(low, self.max_requests), self.p95_margin, self.p95_confidence, error, burst)


@dataclass(frozen=True)
class Prior:
    """What is known before a trial's first level: from earlier trials of the study and from the configuration."""

    incumbent: float | None = None  # the best level of the study's best configuration so far
    similar: tuple[float, ...] = ()  # best levels of the most similar configurations measured
    cap: float | None = None  # the most the configuration holds at once (max_num_seqs, KV tokens / request)
    screen: bool = False  # measure at `incumbent` first and stop there if it fails
    # Measure the first level exactly: a re-measurement's first level, its original's best, is most often the
    # answer, which is measured exactly anyway; judged sequentially first, it would be measured twice.
    exact_first: bool = False


NO_PRIOR = Prior()  # nothing known: start from the geometric middle of [start, max]


def capacity(max_num_seqs: float | None, kv_tokens: float | None, tokens_per_request: float,
             running: float | None = None) -> float | None:
    """Concurrent requests a configuration can hold at once: the smaller of its batch, its KV tokens over a
    request's, and `running`, what its KV cache's blocks run at once (estimate.max_running_seqs)."""
    caps = [c for c in (max_num_seqs, kv_tokens / tokens_per_request if kv_tokens and tokens_per_request else None,
                        running) if c]
    return min(caps) if caps else None


def first_level(search: LoadSearch, prior: Prior) -> float:
    """Where the search starts (see the module docstring), within [start, max]."""
    top = search.max if prior.cap is None else max(search.start, min(search.max, prior.cap))
    if prior.screen and prior.incumbent is not None:
        guess = prior.incumbent
    elif prior.similar:
        guess = statistics.median(prior.similar)
    elif prior.incumbent is not None:
        guess = prior.incumbent
    elif prior.cap is not None:
        guess = top / search.factor
    else:
        guess = math.sqrt(search.start * search.max)
    guess = min(max(guess, search.start), top if not prior.screen else search.max)
    return max(1, round(guess)) if search.mode == "concurrency" else guess


@dataclass(frozen=True)
class SlaStep(Generic[T]):
    """One measured level: what `measure` returned, whether `passed` accepted it, and whether it was exact."""

    level: float
    outcome: T
    passed: bool
    exact: bool = True


@dataclass(frozen=True)
class SlaResult(Generic[T]):
    steps: tuple[SlaStep[T], ...]  # in the order measured
    screened_out: bool = False  # failed at the incumbent's level: ended there (Prior.screen)

    @property
    def best_step(self) -> SlaStep[T] | None:
        latest = {s.level: s for s in self.steps}  # a level measured again counts as last measured
        passes = [s for s in latest.values() if s.passed]
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


class Ladder(Generic[T]):
    """The load search as ask and tell: `next` is the (level, exact) to measure next, None once the search is
    done (then `result`); `tell` gives it what that level measured. The caller owns the loop, so it can end the
    search between any two levels (a server that died, a pruner) by not telling it more."""

    def __init__(self, passed: Callable[[T], bool], search: LoadSearch, prior: Prior = NO_PRIOR):
        self._walk = _Walk(passed, search, prior).run()
        self.result: SlaResult[T] | None = None
        self.next: tuple[float, bool] | None = self._advance(None)

    def tell(self, outcome: T) -> None:
        self.next = self._advance(outcome)

    def _advance(self, outcome: T | None) -> tuple[float, bool] | None:
        try:
            return self._walk.send(outcome)  # type: ignore[arg-type]  # the first send starts the walk: None
        except StopIteration as done:
            self.result = done.value
            return None


def find_sustainable(
    measure: Callable[[float, bool], T], passed: Callable[[T], bool], search: LoadSearch, prior: Prior = NO_PRIOR
) -> SlaResult[T]:
    """Measure levels from the prior's first level up (or down) by `factor` and bisect to the highest passing
    one; `measure(level, exact)`; exceptions from it propagate.

    Concurrency levels are integers (each step at least one away from the last, within [ceil(start), floor(max)]).
    In a non-monotone response only measured levels count: the search never skips past a failure.
    """
    ladder = Ladder(passed, search, prior)
    while ladder.next is not None:
        ladder.tell(measure(*ladder.next))
    assert ladder.result is not None  # the walk ends with its result
    return ladder.result


class _Walk(Generic[T]):
    """find_sustainable's search as a generator: each step yields (level, exact) and is sent what it measured."""

    def __init__(self, passed: Callable[[T], bool], search: LoadSearch, prior: Prior):
        _check(search)
        self.passed, self.search, self.prior = passed, search, prior
        self.ints = search.mode == "concurrency"
        self.bottom = max(1, math.ceil(search.start)) if self.ints else search.start
        self.top = math.floor(search.max) if self.ints else search.max
        if self.bottom > self.top:
            raise ValueError(f"no integer concurrency in [{search.start}, {search.max}]")
        self.steps: list[SlaStep[T]] = []

    def run(self) -> Generator[tuple[float, bool], T, SlaResult[T]]:
        level = min(max(first_level(self.search, self.prior), self.bottom), self.top)
        lo: float | None
        hi: float | None
        if (yield from self.step(level, self.prior.exact_first)):
            lo, hi = yield from self.climb(level)
        elif self.prior.screen:
            return SlaResult(tuple(self.steps), screened_out=True)
        else:
            lo, hi = yield from self.descend(level)
        while lo is not None:
            lo, hi = yield from self.bisect(lo, hi)
            if next(s for s in reversed(self.steps) if s.level == lo).exact or (yield from self.step(lo, True)):
                break
            # The best level passed only by the sequential verdict failed when measured exactly: below it again.
            latest = {s.level: s.passed for s in self.steps}
            below = [x for x, ok in latest.items() if ok and x < lo]
            lo, hi = (max(below), lo) if below else (yield from self.descend(lo))
        return SlaResult(tuple(self.steps))

    def step(self, x: float, exact: bool) -> Generator[tuple[float, bool], T, bool]:
        outcome = yield x, exact
        ok = bool(self.passed(outcome))
        self.steps.append(SlaStep(x, outcome, ok, exact))
        return ok

    def up(self, x: float) -> float:
        return min(self.top, max(x + 1, math.ceil(x * self.search.factor)) if self.ints else x * self.search.factor)

    def down(self, x: float) -> float:
        return max(self.bottom, min(x - 1, math.floor(x / self.search.factor)) if self.ints else x / self.search.factor)

    def climb(self, lo: float) -> Generator[tuple[float, bool], T, tuple[float, float | None]]:
        """Up from a pass while levels pass: (the highest pass, the first failure above it or None at the top)."""
        while lo < self.top:
            nxt = self.up(lo)
            if not (yield from self.step(nxt, False)):
                return lo, nxt
            lo = nxt
        return lo, None

    def descend(self, fail: float) -> Generator[tuple[float, bool], T, tuple[float | None, float]]:
        """Down from a failure until a level passes: (that level or None when `bottom` fails too, the lowest
        failure)."""
        while fail > self.bottom:
            x = self.down(fail)
            if (yield from self.step(x, False)):
                return x, fail
            fail = x
        return None, fail

    def bisect(self, lo: float, hi: float | None) -> Generator[tuple[float, bool], T, tuple[float, float | None]]:
        """Halve the gap between the highest pass and the lowest failure down to the search's tolerance."""
        while hi is not None and hi - lo > max(self.search.tolerance * lo, 1 if self.ints else 0):
            mid = (lo + hi) // 2 if self.ints else (lo + hi) / 2
            if (yield from self.step(mid, False)):  # judged sequentially: only the answer needs an exact figure
                lo = mid
            else:
                hi = mid
        return lo, hi
