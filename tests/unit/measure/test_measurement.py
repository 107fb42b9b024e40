"""How long a level runs and what its throughput is measured over: the p95 confidence interval from order
statistics, the stopping rule on synthetic latencies with known percentiles, and the steady window."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autotune.measure.client import DROPPED, Abandon, LevelRun, LoadLevel, RequestRecord
from autotune.measure.ladder import LoadSearch
from autotune.measure.stats import Limits, judge, level_stats, steady_window
from autotune.measure.stop_rule import (
    INSIDE_P,
    OUTSIDE_P,
    StopRule,
    hypotheses,
    looks,
    order_stat_ranks,
    percentile_interval,
    sequential_verdict,
)


def binom_cdf(k: int, n: int, q: float) -> float:
    return sum(math.comb(n, i) * q**i * (1 - q) ** (n - i) for i in range(k + 1))


# --- the interval ---------------------------------------------------------------------------------------------


def test_an_upper_bound_for_the_p95_needs_59_samples_at_90_percent():
    # x(n) >= p95 fails only if all n samples fall below it: 0.95^n; that must be <= 5% (one tail of 90%).
    assert 0.95**58 > 0.05 > 0.95**59
    assert order_stat_ranks(58, 0.95, 0.90)[1] is None
    assert order_stat_ranks(59, 0.95, 0.90)[1] == 59


@pytest.mark.parametrize("n", [59, 100, 200, 1000])
def test_ranks_are_the_tightest_with_the_promised_tails(n):
    lo, hi = order_stat_ranks(n, 0.95, 0.90)
    assert binom_cdf(lo - 1, n, 0.95) <= 0.05 < binom_cdf(lo, n, 0.95)  # P(x(l) > p95) <= 5%, l the largest
    assert binom_cdf(hi - 1, n, 0.95) >= 0.95 > binom_cdf(hi - 2, n, 0.95)  # P(x(u) < p95) <= 5%, u the least


def test_the_interval_covers_the_true_p95_about_as_often_as_promised():
    rng = np.random.default_rng(7)
    true_p95 = math.log(20.0)  # exponential(1): P(X > x) = e^-x = 0.05
    covered = 0
    for _ in range(1000):
        lo, hi = percentile_interval(rng.exponential(1.0, 200), 0.95, 0.90)
        covered += lo <= true_p95 <= hi
    assert 0.88 <= covered / 1000 <= 0.97  # at least the promised 90% (order statistics are conservative)


def test_too_few_samples_give_open_bounds():
    assert percentile_interval([]) == (-math.inf, math.inf)
    lo, hi = percentile_interval([0.1] * 20)
    assert lo == 0.1 and hi == math.inf


# --- the stopping rule --------------------------------------------------------------------------------------


def records(ttfts) -> list[RequestRecord]:
    return [RequestRecord(float(i), float(t), [], float(i) + float(t), 10, 1, None) for i, t in enumerate(ttfts)]


def stop_count(rule: StopRule, ttfts, limits: Limits) -> tuple[int, str]:
    """The rule asked after every finished request, as the load client asks it."""
    recs = records(ttfts)
    for n in range(1, len(recs) + 1):
        if why := rule.reason(recs[:n], limits):
            return n, why
    return len(recs), ""


def test_the_rule_looks_at_geometric_counts_only():
    assert sorted(looks(32, 200)) == [32, 40, 50, 63, 79, 98, 123, 153, 191]  # ceil(32 * 1.25^k)


def test_a_level_far_below_its_limit_stops_at_the_first_look_with_an_upper_bound():
    ttft = np.random.default_rng(1).exponential(0.05, 2000)  # p95 = 0.05 * ln 20 = 150 ms; limit 2 s
    n, why = stop_count(StopRule(32, 1000, margin=0.1), ttft, Limits(p95_ttft_ms=2000))
    assert (n, why) == (63, "settled")  # 50 < 59 <= 63


def test_a_level_clearly_over_its_limit_stops_early():
    ttft = np.random.default_rng(2).exponential(0.5, 2000)  # p95 = 1.5 s; limit 300 ms
    n, why = stop_count(StopRule(32, 1000, margin=0.1), ttft, Limits(p95_ttft_ms=300))
    assert why == "fails" and n == 32


def van_der_corput_exponential(n: int, scale: float) -> list[float]:
    """Exponential samples at low-discrepancy quantiles: every prefix is spread like the distribution, so the
    limit (set at the true p95) stays inside the interval and only the margin can end the level."""
    def vdc(i: int) -> float:
        x, d = 0.0, 1.0
        while i:
            d /= 2
            x, i = x + d * (i % 2), i // 2
        return x
    return [-math.log(1 - vdc(i + 1)) * scale for i in range(n)]


def test_a_level_at_its_limit_runs_until_the_margin_is_met_and_the_interval_covers_the_truth():
    scale = 0.1
    true_p95_ms = scale * math.log(20.0) * 1000
    ttft = np.array(van_der_corput_exponential(5000, scale))
    rule = StopRule(32, 5000, margin=0.1)
    n, why = stop_count(rule, ttft, Limits(p95_ttft_ms=true_p95_ms))
    # Normal approximation: a 90% half-width of 1.645 * sqrt(.95 * .05 / n) / (f(p95) * p95) = 2.39 / sqrt(n)
    # relative, so about 570 requests for +-10%, more for the wider upper side of a skewed distribution: the
    # looks at 728 and 910 requests bracket it.
    assert (n, why) == (910, "settled")
    lo, hi = percentile_interval(ttft[:n], 0.95, 0.90)
    p95 = float(np.percentile(ttft[:n], 95))
    assert lo * 1000 <= true_p95_ms <= hi * 1000
    assert max(hi - p95, p95 - lo) <= 0.1 * p95


def test_max_requests_caps_and_a_zero_margin_is_a_fixed_count():
    ttft = van_der_corput_exponential(2000, 0.1)  # p95 300 ms, at the limit: not settled by 300 requests
    limits = Limits(p95_ttft_ms=0.1 * math.log(20.0) * 1000)
    assert stop_count(StopRule(32, 300, margin=0.1), ttft, limits) == (300, "max_requests")
    rule = LoadSearch(min_requests=40, p95_margin=0).stop_rule(4)
    assert (rule.min_requests, rule.max_requests, rule.margin) == (40, 40, None)
    assert stop_count(rule, ttft, limits) == (40, "max_requests")


def test_stop_rule_from_load_search_keeps_three_rounds_of_a_closed_loop():
    rule = LoadSearch(min_requests=32, max_requests=100).stop_rule(64)
    assert (rule.min_requests, rule.max_requests) == (192, 192)
    assert LoadSearch(mode="rate", min_requests=32).stop_rule(64).min_requests == 32


def test_every_limited_metric_must_be_known():
    # TTFT is far below its limit, TPOT (= (end - start - ttft) / (out - 1)) sits at it: the level goes on.
    rng = np.random.default_rng(5)
    recs = [RequestRecord(0.0, 0.01, [], 0.01 + 9 * t, 10, 10, None) for t in rng.exponential(0.02, 400)]
    limits = Limits(p95_ttft_ms=1000, p95_tpot_ms=0.02 * math.log(20) * 1000)
    assert StopRule(32, 1000, margin=0.1).reason(recs[:98], limits) is None  # 98 is a look
    assert StopRule(32, 1000, margin=0.1).reason(recs[:98], Limits(p95_ttft_ms=1000)) == "settled"
    assert StopRule(32, 1000, margin=0.1).reason(recs[:99], Limits(p95_ttft_ms=1000)) is None  # 99 is not


# --- the steady window --------------------------------------------------------------------------------------


def rec(start, ttft, end, tokens=2):
    """A request whose `tokens` tokens arrive evenly from start + ttft to end."""
    gaps = [(end - start - ttft) / (tokens - 1)] * (tokens - 1) if tokens > 1 else []
    return RequestRecord(start, ttft, gaps, end, 5, tokens, None)


# Closed loop, 2 in flight: r1 and r2 start the level (in flight reaches 2 at 0.1), the last request starts at
# 2.0, and the first completion after that (the drain begins) is r4's at 2.6.
CLOSED = LevelRun(LoadLevel("concurrency", 2), [
    rec(0.0, 0.5, 1.0), rec(0.1, 0.5, 1.5), rec(1.0, 0.5, 2.0), rec(1.5, 0.5, 2.6), rec(2.0, 0.5, 3.0),
], started=0.0, ended=3.0)


def test_steady_window_of_a_closed_loop():
    assert steady_window(CLOSED) == (0.1, 2.6)


def test_rates_are_measured_over_the_steady_window():
    s = level_stats(CLOSED, Limits())
    # Tokens arriving in [0.1, 2.6]: r1 (0.5, 1.0), r2 (0.6, 1.5), r3 (1.5, 2.0), r4 (2.0, 2.6), r5 (2.5) = 9.
    assert s.window_s == pytest.approx(2.5)
    assert s.output_throughput == pytest.approx(9 / 2.5)
    assert s.request_throughput == pytest.approx(4 / 2.5)  # r1..r4 end inside the window
    assert s.total_token_throughput == pytest.approx((9 + 5 * 5) / 2.5)  # prompts whose first token is inside: all five
    assert s.span_output_tok_s == pytest.approx(10 / 3.0)  # vLLM's figure: all tokens over the whole span
    assert s.duration_s == 3.0 and s.output_tokens == 10


def test_no_steady_part_falls_back_to_the_whole_span():
    never_full = LevelRun(LoadLevel("concurrency", 4), CLOSED.records, 0.0, 3.0)  # at most 2 in flight
    assert steady_window(never_full) == (0.0, 3.0)
    one_round = LevelRun(LoadLevel("concurrency", 2), [rec(0.0, 0.5, 1.0), rec(0.0, 0.5, 1.2)], 0.0, 1.2)
    assert steady_window(one_round) == (0.0, 1.2)
    assert level_stats(never_full, Limits()).output_throughput == pytest.approx(10 / 3.0)


def test_steady_window_in_rate_mode_excludes_the_drain():
    run = LevelRun(LoadLevel("rate", 2.0), CLOSED.records, 0.0, 3.0)
    assert steady_window(run) == (0.0, 2.6)


# --- the client stops sending when told -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["concurrency", "rate"])
def test_the_client_stops_sending_once_enough_and_keeps_what_was_in_flight(mode):
    from test_client import (  # the protocol tests' small OpenAI-format server
        Server,
        drive,
    )

    from autotune.measure.workload import RequestSpec

    server = Server(gap=0.002)
    specs = [RequestSpec((20 + i,), 3) for i in range(40)]
    level = LoadLevel("concurrency", 3) if mode == "concurrency" else LoadLevel("rate", 200.0, max_in_flight=3)
    run = drive(server, specs, level, enough=lambda done, _flying, _now: "enough" if len(done) >= 5 else None)
    assert run.stop_reason == "enough"
    assert 5 <= len(run.records) <= 7 and len(server.bodies) == len(run.records)  # 5, plus at most 2 in flight
    if mode == "concurrency":
        assert len(run.records) == 7  # a closed loop always has the other 2 in flight when the 5th ends
    assert all(r.error is None for r in run.records)
    full = drive(Server(), specs[:6], LoadLevel("concurrency", 3))
    assert full.stop_reason == "" and len(full.records) == 6


# --- the sequential verdict ---------------------------------------------------------------------------------


def simulate_levels(rng, p_over: float, error: float, levels: int, most: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """Levels of lognormal latencies whose limit is exceeded with probability p_over, each judged request by
    request by the sequential test: (verdict per level: 1 passes, -1 fails, 0 none; requests it took)."""
    from scipy.stats import norm

    limit = math.exp(0.5 * norm.ppf(1 - p_over))  # P(latency > limit) = p_over
    over = np.cumsum(rng.lognormal(0.0, 0.5, (levels, most)) > limit, axis=1)
    n = np.arange(1, most + 1)
    llr = over * math.log(OUTSIDE_P / INSIDE_P) + (n - over) * math.log((1 - OUTSIDE_P) / (1 - INSIDE_P))
    bound = math.log((1 - error) / error)
    decided = (llr >= bound) | (llr <= -bound)
    first = np.where(decided.any(axis=1), decided.argmax(axis=1), most - 1)
    at = llr[np.arange(levels), first]
    verdicts = np.where(at >= bound, -1, np.where(at <= -bound, 1, 0))
    # the vectorised test is the module's: spot-check a few levels against sequential_verdict itself
    for i in range(5):
        v = sequential_verdict(int(over[i, first[i]]), int(first[i]) + 1, error)
        assert {"passes": 1, "fails": -1, None: 0}[v] == verdicts[i]
    return verdicts, first + 1


@pytest.mark.parametrize(("p_over", "wrong"), [(INSIDE_P, -1), (OUTSIDE_P, 1)])
def test_the_sequential_verdict_is_wrong_at_most_as_often_as_stated(p_over, wrong):
    # Stated (ladder docstring): each error rate <= e / (1 - e) = 5.3% at e = 0.05, at the hypotheses' edges
    # (2% and 15% of requests over the limit). 20,000 simulated levels each (one standard error: 0.15%).
    verdicts, _ = simulate_levels(np.random.default_rng(11), p_over, 0.05, 20_000)
    assert np.mean(verdicts == wrong) <= 0.05 / 0.95
    assert np.mean(verdicts == 0) < 0.01  # it decides, within 400 requests


def test_clear_levels_are_decided_by_a_few_requests():
    rng = np.random.default_rng(12)
    verdicts, n = simulate_levels(rng, 0.6, 0.05, 500)
    assert np.all(verdicts == -1) and np.median(n) <= 3
    verdicts, n = simulate_levels(rng, 0.001, 0.05, 500)
    assert np.mean(verdicts == 1) >= 0.99 and np.median(n) == 21


def test_a_level_judged_early_stops_long_before_min_requests_and_an_exact_one_does_not():
    ttft = np.random.default_rng(1).exponential(0.05, 2000)  # p95 = 150 ms; limit 2 s: clearly inside
    limits = Limits(p95_ttft_ms=2000)
    early = LoadSearch(min_requests=72, max_requests=400).stop_rule(8, exact=False)
    assert stop_count(early, ttft, limits) == (8 + 21, "clearly passes")  # the first round is not judged
    exact = LoadSearch(min_requests=72, max_requests=400).stop_rule(8, exact=True)
    assert stop_count(exact, ttft, limits) == (72, "settled")
    slow = np.random.default_rng(2).exponential(0.5, 2000)  # p95 1.5 s against a 300 ms limit
    n, why = stop_count(early, slow, Limits(p95_ttft_ms=300))
    assert why == "clearly fails" and n <= 8 + 6


# --- the sequential verdict counts what requests in flight already show ----------------------------------------


def closed_loop_of_a_queueing_server(now: float) -> tuple[list[RequestRecord], list[RequestRecord]]:
    """Concurrency 37 on a server that runs one sequence at a time (the device's trial 4: each request ~1.7 s).
    Burst requests start at 0; each completion starts one more. Returns (finished, in flight) at `now`."""
    finished = [RequestRecord(0.0, 1.7 * i, [], 1.7 * (i + 1), 512, 192, None) for i in range(int(now // 1.7))]
    later = [RequestRecord(r.end, None, [], 0.0, 512, 192, None) for r in finished]
    burst = [RequestRecord(0.0, None, [], 0.0, 512, 192, None) for _ in range(37 - len(finished))]
    return finished, burst + later


@pytest.mark.parametrize("now", [7.0, 9.0])  # two, then three waited past 2 s
def test_a_level_whose_waiting_requests_are_already_over_the_limit_fails_without_waiting_for_them(now):
    rule = StopRule(72, 76, verdict_error=0.05, burst=37)
    finished, flying = closed_loop_of_a_queueing_server(now)
    limits = Limits(p95_ttft_ms=2000, p95_tpot_ms=100)
    why = rule.reason(finished, limits, flying, now)
    assert why == "clearly fails" and isinstance(why, Abandon)  # the client drops the requests in flight
    assert rule.reason(finished, limits) is None  # judging finished requests only: nothing after the burst yet


def test_requests_in_flight_that_have_not_waited_past_the_limit_are_not_judged():
    rule = StopRule(72, 76, verdict_error=0.05, burst=37)
    finished, flying = closed_loop_of_a_queueing_server(3.5)  # the first two after the burst waited 1.8 and 0.1 s
    assert rule.reason(finished, Limits(p95_ttft_ms=2000), flying, 3.5) is None


@pytest.mark.parametrize("mode", ["concurrency", "rate"])
def test_an_abandoned_level_drops_its_requests_in_flight_where_a_settled_one_waits_for_them(mode):
    """The server streams the first three requests, then holds every later one for a while (a queue): the
    verdict comes when the third finishes. Abandoned, the two sent after it are cancelled and not recorded."""
    from test_client import Server, drive

    from autotune.measure.workload import RequestSpec

    specs = [RequestSpec((20 + i,), 3) for i in range(20)]
    level = LoadLevel("concurrency", 3) if mode == "concurrency" else LoadLevel("rate", 200.0, max_in_flight=3)
    seen: list[int] = []

    def verdict(answer):
        def enough(done, flying, now):
            seen.append(len(flying))
            return answer if len(done) >= 3 else None
        return enough

    server = Server(mode="hang_later", stuck_s=1.0)
    dropped = drive(server, specs, level, enough=verdict(Abandon("clearly fails")))
    assert dropped.stop_reason == "clearly fails" and len(dropped.records) == 3
    assert len(server.bodies) > 3 and max(seen) >= 1  # sent, seen in flight, then dropped
    assert len(dropped.dropped) == len(server.bodies) - 3 and all(d.error == DROPPED for d in dropped.dropped)
    waited = drive(Server(mode="hang_later", stuck_s=1.0), specs, level, enough=verdict("settled"))
    assert waited.stop_reason == "settled" and len(waited.records) > 3 and waited.dropped == ()
    assert all(r.error is None for r in waited.records)


def test_the_requests_served_first_do_not_pass_a_level_whose_queue_has_not_shown_its_wait_yet():
    """A server runs 21 of 30 requests and queues 9 (started within the last second, TTFT limit 2 s): the 21
    with a fast first token would pass the level if judged alone; judged by start time, nothing is known yet."""
    served = [RequestRecord(i / 30, 0.05, [], 0.0, 512, 192, None) for i in range(21)]
    queued = [RequestRecord(0.7 + i / 30, None, [], 0.0, 512, 192, None) for i in range(9)]
    rule = StopRule(72, 400, verdict_error=0.05)
    assert rule.reason([], Limits(p95_ttft_ms=2000), served + queued, now=1.2) is None
    later = [RequestRecord(r.start, 0.05 if r in served else None, [], 0.0, 512, 192, None) for r in served + queued]
    assert rule.reason([], Limits(p95_ttft_ms=2000), later, now=3.0) == "clearly fails"  # 9 waited past 2 s


def test_an_abandoned_levels_dropped_requests_keep_it_failing():
    """Served first, three fast requests; dropped, five that had waited 3 s for their first token: the level's
    p95 TTFT is at least 3 s (a lower bound), and it fails a 2 s limit as its sequential verdict did."""
    fast = [RequestRecord(0.1 * i, 0.05, [0.01] * 9, 0.1 * i + 0.15, 512, 10, None) for i in range(3)]
    waiting = tuple(RequestRecord(0.2, 3.0, [], 3.2, 512, 0, DROPPED) for _ in range(5))
    run = LevelRun(LoadLevel("concurrency", 8), fast, 0.0, 3.2, Abandon("clearly fails"), waiting)
    stats = level_stats(run, Limits(p95_ttft_ms=2000))
    assert stats.ttft.p95_ms >= 3000 and stats.e2el.p95_ms >= 3000
    assert stats.completed == 3 and stats.failed == 0  # dropped requests are neither
    assert not judge(stats, Limits(p95_ttft_ms=2000)).passed
    assert judge(level_stats(LevelRun(run.level, fast, 0.0, 3.2), Limits()), Limits(p95_ttft_ms=2000)).passed


def test_a_limit_at_another_percentile_tests_its_own_share_over_the_limit():
    """p95's hypotheses stay 2% and 15%; a p99 limit allows 1% over it, so 3 of 40 over fails it at once where a
    p95 limit is not decided yet; a p50 limit passes 8 of 40 over (20%) as surely inside."""
    assert hypotheses(95) == (INSIDE_P, OUTSIDE_P)
    assert hypotheses(99) == pytest.approx((0.004, 0.03)) and hypotheses(50) == pytest.approx((0.2, 0.75))
    assert sequential_verdict(3, 40, 0.05, 95) is None
    assert sequential_verdict(3, 40, 0.05, 99) == "fails"
    assert sequential_verdict(8, 40, 0.05, 50) == "passes"
    records = [RequestRecord(i, 1.0 if i < 3 else 0.1, [], i + 1.2, 10, 2, None) for i in range(40)]  # 3 of 40 at 1 s
    rule = StopRule(100, 400, margin=0.1, verdict_error=0.05)
    assert rule.reason(records, Limits(p95_ttft_ms=500)) is None
    assert str(rule.reason(records, Limits(p99_ttft_ms=500))) == "clearly fails"
