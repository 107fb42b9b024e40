"""How long a level runs (`StopRule`). Two rules, whichever ends it first:
  - a sequential verdict (Wald's SPRT) on the share p of requests over each limit, p95 <= limit being p <= 5%:
    "inside" is p <= 2%, "outside" p >= 15% (at another percentile: `hypotheses`); after each request the
    log-likelihood ratio of the exceedance count is compared with log((1 - e) / e) and log(e / (1 - e)), e =
    `verdict_error`. A level clearly over a limit stops after a handful of requests; one clearly under after about
    21 (+ one round of a closed loop's start-up burst, which the test does not count). Error rates (independent
    requests): a level with p >= 15% is passed, or one with p <= 2% failed, with probability at most e / (1 - e) ~
    5.3% (Wald's bound, e = 0.05; computed exactly: 4.9% and 2.6%; tests/unit/measure/test_measurement.py counts
    them on 20,000 simulated levels each). In between it may take either verdict (at p = 5%, the p95 at the limit,
    75% pass early): the answer is therefore always a level measured exactly (below);
    A TTFT or end-to-end limit is judged on every request that started at least the limit ago, finished or still
    in flight (one still waiting for its first token past the TTFT limit is over it, whatever comes): in a closed
    loop the requests after the first round finish only after that whole round, and a queueing server's level
    took 126 s on a GPU where these show the verdict in a few. A level that clearly fails is abandoned
    (client.Abandon): its requests in flight are cancelled, not waited for;
  - the exact rule (the former one): after `min_requests`, at min x 1.25^k requests, each limit's
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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np

from autotune.measure.client import Abandon, RequestRecord
from autotune.measure.stats import Limits, limit_parts, request_tpot, request_value


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
def looks(low: int, high: int) -> frozenset[int]:
    out, k = set(), 0
    while (n := math.ceil(low * 1.25**k - 1e-9)) < high:
        out.add(n)
        k += 1
    return frozenset(out)


_SAMPLES = {
    "ttft": lambda rs: [r.ttft for r in rs if r.ttft is not None],
    "tpot": lambda rs: [t for r in rs if (t := request_tpot(r)) is not None],
    "itl": lambda rs: [g for r in rs for g in r.itl],
    "e2el": lambda rs: [r.end - r.start for r in rs],
}

# The sequential verdict's hypotheses on p = P(one request's latency > limit); p95 <= limit is p <= 5%.
INSIDE_P = 0.02  # a level clearly inside: the limit is at its p98 or beyond
OUTSIDE_P = 0.15  # a level clearly outside: the limit is at its p85 or below


def hypotheses(percentile: int) -> tuple[float, float]:
    """(inside, outside) shares over the limit for a limit at `percentile`: at p95 the ones above; at any other,
    the share allowed over it (1 - q) scaled as at p95 (x 0.4 and x 3, the latter at most halfway to 1):
    p99 0.4% and 3%, p90 4% and 30%, p50 20% and 75%."""
    allowed = 1 - percentile / 100
    if percentile == 95:
        return INSIDE_P, OUTSIDE_P
    return allowed * INSIDE_P / 0.05, min(allowed * OUTSIDE_P / 0.05, (1 + allowed) / 2)


def sequential_verdict(exceed: int, n: int, error: float, percentile: int = 95) -> Literal["passes", "fails"] | None:
    """Wald's SPRT of p <= inside against p >= outside (`hypotheses`) after `exceed` of `n` requests were over the
    limit: "passes", "fails", or None (not certain yet). Each error rate is at most error / (1 - error)."""
    inside, outside = hypotheses(percentile)
    llr = exceed * math.log(outside / inside) + (n - exceed) * math.log((1 - outside) / (1 - inside))
    bound = math.log((1 - error) / error)
    return "fails" if llr >= bound else "passes" if llr <= -bound else None


def _exceedances(records: Sequence[RequestRecord], key: str, limit: float) -> tuple[int, int]:
    """(requests over the limit, requests judged) for one limit. ITL is judged request by request on the
    request's own gaps at the limit's percentile, as vLLM's goodput judges it, so that requests stay the
    independent unit."""
    q, metric = limit_parts(key)
    if metric == "itl":
        values = [v for r in records if r.itl and (v := request_value(r, "itl", q)) is not None]
    else:
        values = _SAMPLES[metric](records)
    return sum(v * 1000.0 > limit for v in values), len(values)


_ELAPSED = {"ttft": lambda r, now: r.ttft if r.ttft is not None else now - r.start,
            "e2el": lambda r, now: now - r.start}  # a request in flight: its latency so far


def _exceedances_by_start(finished: Sequence[RequestRecord], in_flight: Sequence[RequestRecord], key: str,
                          limit: float, now: float) -> tuple[int, int] | None:
    """(over the limit, judged) for a TTFT or end-to-end limit among every request that started at least `limit`
    before `now`, finished or not: for each of them it is known whether it is over (one still waiting for its first
    token, or still running, has passed the limit). Chosen by when they started, not by how they did: judging
    only the finished ones, or the ones in flight whose latency happens to be known, favours the fast requests.
    None for the other limits, which only a finished request shows."""
    metric = limit_parts(key)[1]
    if metric not in _ELAPSED or now == -math.inf:
        return None
    cut = now - limit / 1000.0
    values = _SAMPLES[metric]([r for r in finished if r.start <= cut])
    values += [_ELAPSED[metric](r, now) for r in in_flight if r.start <= cut]
    return sum(v * 1000.0 > limit for v in values), len(values)


@dataclass(frozen=True)
class StopRule:
    """When a level has measured enough requests.

    The sequential verdict (`verdict_error` > 0) may end it from `verdict_after` requests on, judging the
    requests that started after the first `burst` (a closed loop's first round starts all at once). The exact
    rule: not before `min_requests` have finished; then as soon as, for every limit at its percentile, the `confidence`
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
        if n not in looks(self.min_requests, self.max_requests):
            return None
        ok = [r for r in records if r.error is None]
        settled = True
        for key, limit in limits.latencies().items():
            q, metric = limit_parts(key)
            values = _SAMPLES[metric](ok)
            if not values:
                return None
            lo, hi = percentile_interval(values, q / 100, self.confidence)
            lo, hi = lo * 1000.0, hi * 1000.0
            if lo > limit:
                return "fails"  # this limit is missed whatever more requests say
            at_q = float(np.percentile(values, q)) * 1000.0
            narrow = at_q > 0 and max(hi - at_q, at_q - lo) <= self.margin * at_q
            settled = settled and (narrow or hi <= limit)
        return "settled" if settled else None

    def _sequential(self, records: Sequence[RequestRecord], limits: Limits, in_flight: Sequence[RequestRecord],
                    now: float) -> str | None:
        starts = sorted(r.start for r in (*records, *in_flight))
        after = starts[self.burst - 1] if self.burst else -math.inf
        judged = [r for r in records if r.error is None and r.start > after]
        waiting = [r for r in in_flight if r.start > after]
        verdicts = []
        for key, limit in limits.latencies().items():
            exceed, n = _exceedances_by_start(judged, waiting, key, limit, now) or _exceedances(judged, key, limit)
            verdicts.append(sequential_verdict(exceed, n, self.verdict_error, limit_parts(key)[0]) if n else None)
        if "fails" in verdicts:
            return Abandon("clearly fails")
        return "clearly passes" if verdicts and all(v == "passes" for v in verdicts) else None
