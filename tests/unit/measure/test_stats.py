"""Level statistics and verdicts against values computed by hand (numpy's linear percentile definition:
p-th percentile of sorted x[0..n-1] sits at index p/100 * (n-1), interpolated between neighbours)."""

from __future__ import annotations

import json
from dataclasses import astuple

import pytest

from autotune.measure.client import LevelRun, LoadLevel, RequestRecord
from autotune.measure.stats import LevelStats, Limits, Percentiles, judge, level_stats

LEVEL = LoadLevel("concurrency", 4)


def rec(start, ttft, itl, end, out, prompt=10, error=None):
    return RequestRecord(start, ttft, list(itl), end, prompt, out, error)


RUN = LevelRun(
    LEVEL,
    [
        rec(0.0, 0.1, [0.02, 0.03], 0.15, 3),
        rec(0.0, 0.2, [0.04, 0.05], 0.29, 3),
        rec(1.0, 0.3, [0.01, 0.06], 1.37, 3),
        rec(0.5, None, [], 0.6, 0, error="HTTP 500: boom"),
        rec(2.0, 0.4, [], 2.4, 1),  # one output token: no TPOT
    ],
    started=0.0,
    ended=4.0,
)


def test_throughput_counts_completed_requests_over_the_level_span():
    s = level_stats(RUN, Limits())
    assert (s.completed, s.failed, s.duration_s) == (4, 1, 4.0)
    assert (s.output_tokens, s.input_tokens) == (10, 40)
    assert s.output_throughput == pytest.approx(2.5)  # 3+3+3+1 tokens / 4 s
    assert s.total_token_throughput == pytest.approx(12.5)  # (40 + 10) / 4
    assert s.request_throughput == pytest.approx(1.0)
    assert s.error_rate == pytest.approx(0.2)
    assert s.errors == {"HTTP 500: boom": 1}


def test_offered_rate_is_sends_over_the_sending_window():
    s = level_stats(RUN, Limits())
    assert s.offered_req_s == pytest.approx(2.0)  # 5 sends, the first at 0 s and the last at 2 s: 4 intervals / 2 s
    assert s.to_dict()["offered_req_s"] == pytest.approx(2.0)


def test_latency_percentiles_by_hand():
    s = level_stats(RUN, Limits())
    # TTFT [100, 200, 300, 400] ms: p90 at index 2.7 -> 300 + 0.7 * 100; p95 at 2.85 -> 300 + 0.85 * 100
    assert astuple(s.ttft) == pytest.approx((250, 250, 370, 385, 397))
    # TPOT (e2el - ttft) / (out - 1): [25, 45, 35] ms; sorted [25, 35, 45]; p90 at 1.8 -> 43; p95 at 1.9 -> 44
    assert astuple(s.tpot) == pytest.approx((35, 35, 43, 44, 44.8))
    # ITL pooled [10, 20, 30, 40, 50, 60] ms: p50 at 2.5 -> 35; p90 at 4.5 -> 55; p95 at 4.75 -> 57.5
    assert astuple(s.itl) == pytest.approx((35, 35, 55, 57.5, 59.5))
    # E2EL [150, 290, 370, 400] ms: p90 at 2.7 -> 370 + 0.7 * 30; p95 at 2.85 -> 370 + 0.85 * 30
    assert astuple(s.e2el) == pytest.approx((302.5, 330, 391, 395.5, 399.1))


@pytest.mark.parametrize(
    "limits, good",
    [
        (Limits(p95_ttft_ms=250), 2),  # 100, 200
        (Limits(p95_tpot_ms=40), 3),  # 25, 35 and the 1-token request (TPOT counted as 0, as vLLM does)
        (Limits(p95_itl_ms=45), 2),  # per-request p95 of gaps: 29.5 ok, 49.5, 57.5, none (ok)
        (Limits(p95_e2el_ms=300), 2),
        (Limits(p95_ttft_ms=250, p95_tpot_ms=40), 1),
        (Limits(), 4),
    ],
)
def test_goodput_counts_requests_meeting_every_limit(limits, good):
    assert level_stats(RUN, limits).request_goodput == pytest.approx(good / 4.0)


def test_error_messages_counted_by_first_80_chars():
    long = "x" * 100
    run = LevelRun(LEVEL, [rec(0, None, [], 1, 0, error=long + str(i)) for i in range(3)], 0.0, 1.0)
    s = level_stats(run, Limits())
    assert s.errors == {"x" * 80: 3}
    assert s.completed == 0 and s.ttft == Percentiles(0, 0, 0, 0, 0)


def stats(ttft_p95=100.0, tpot_p95=10.0, completed=100, failed=0, errors=None):
    p = lambda v: Percentiles(v, v, v, v, v)  # noqa: E731
    return LevelStats(LEVEL, completed, failed, 10, 1000, 2000, 10, 10, p(ttft_p95), p(tpot_p95), p(5), p(900),
                      errors or {})


def test_verdict_reason_names_metric_observed_limit_and_excess():
    v = judge(stats(ttft_p95=1370), Limits(p95_ttft_ms=1000))
    assert not v.passed
    assert v.misses == pytest.approx({"p95_ttft_ms": 1.37})
    assert v.reason == "p95 TTFT 1370 ms > limit 1000 ms (+37%)"


def test_verdict_lists_every_missed_limit():
    v = judge(stats(ttft_p95=1370, tpot_p95=55), Limits(p95_ttft_ms=1000, p95_tpot_ms=50, p95_e2el_ms=1000))
    assert set(v.misses) == {"p95_ttft_ms", "p95_tpot_ms"}
    assert v.reason == "p95 TTFT 1370 ms > limit 1000 ms (+37%); p95 TPOT 55.0 ms > limit 50.0 ms (+10%)"


def test_old_names_read_as_vllms_and_said_once(capsys):
    from autotune.measure.stats import current_names, read_limits

    figures, old = current_names({"ttft_p95_ms": 500.0, "e2e_p95_ms": 9.0, "output_tok_s": 1.0, "passed": True})
    assert figures == {"p95_ttft_ms": 500.0, "p95_e2el_ms": 9.0, "output_throughput": 1.0, "passed": True}
    assert old == ["ttft_p95_ms", "e2e_p95_ms", "output_tok_s"]
    assert read_limits({"ttft_p95_ms": 500.0}) == Limits(p95_ttft_ms=500.0)
    assert current_names({"p95_ttft_ms": 1.0}) == ({"p95_ttft_ms": 1.0}, [])


def test_verdict_passes_at_the_limit():
    v = judge(stats(ttft_p95=1000), Limits(p95_ttft_ms=1000))
    assert v.passed and v.misses == {} and v.reason == "meets every limit"


def test_errors_above_allowed_rate_fail_the_level():
    s = stats(completed=95, failed=5, errors={"HTTP 500: boom": 4, "timeout after 300 s": 1})
    v = judge(s, Limits())
    assert not v.passed and v.misses == pytest.approx({"error_rate": 0.05})
    assert v.reason == "5 of 100 requests failed (5.0% > allowed 0.0%): HTTP 500: boom"
    assert judge(s, Limits(), max_error_rate=0.05).passed


def test_nothing_completed_fails_even_with_no_limits():
    assert not judge(level_stats(LevelRun(LEVEL, [], 0.0, 1.0), Limits()), Limits(), max_error_rate=1).passed


def test_a_limit_at_another_percentile_is_judged_at_that_percentile():
    """p99 TPOT 44.8 ms on RUN (p95 44): a p99 limit of 44.5 ms fails where the same p95 limit passes, and the
    reason names the percentile; goodput judges each request's own ITL at the limit's percentile."""
    s = level_stats(RUN, Limits())
    judged = lambda limits: judge(s, limits, max_error_rate=0.5)  # noqa: E731 (RUN has one failed request)
    assert judged(Limits(p95_tpot_ms=44.5)).passed
    v = judged(Limits(p99_tpot_ms=44.5))
    assert not v.passed and v.misses == pytest.approx({"p99_tpot_ms": 44.8 / 44.5})
    assert v.reason.startswith("p99 TPOT 44.8 ms > limit 44.5 ms")
    assert judged(Limits(p50_ttft_ms=250)).passed and not judged(Limits(p90_ttft_ms=369)).passed
    goodput = {q: level_stats(RUN, Limits(**{f"p{q}_itl_ms": 45})).request_goodput for q in (50, 95)}
    assert goodput[50] > goodput[95] == pytest.approx(2 / 4.0)  # a request whose gaps are 40 and 50 ms is good at p50


def test_to_dict_uses_the_keys_of_vllm_bench_serves_result_json():
    d = level_stats(RUN, Limits()).to_dict()
    assert d["concurrency"] == 4 and d["output_throughput"] == pytest.approx(2.5)
    assert d["p95_ttft_ms"] == pytest.approx(385) and d["p99_e2el_ms"] == pytest.approx(399.1)
    vllm_bench = {"request_throughput", "output_throughput", "total_token_throughput", "mean_ttft_ms",
                  "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms",
                  "median_itl_ms", "p99_itl_ms", "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms"}
    assert vllm_bench <= set(d)
    assert all(isinstance(v, (int, float)) for v in d.values())
    json.dumps(d)
    rate = level_stats(LevelRun(LoadLevel("rate", 2.5), [], 0.0, 1.0), Limits()).to_dict()
    assert rate["rate_req_s"] == 2.5 and "concurrency" not in rate


def test_rate_mode_trial_table_shows_the_offered_and_the_achieved_rate_by_the_label():
    from dataclasses import replace
    from pathlib import Path

    from rich.console import Console

    from autotune.config.objective import load_objective
    from autotune.measure.trial import LevelOutcome, TrialResult
    from autotune.show.tables import level_table

    shipped = load_objective(Path(__file__).resolve().parents[3] / "objectives" / "tiny-cpu.toml")
    objective = replace(shipped, load=replace(shipped.load, mode="rate"))
    stats = level_stats(replace(RUN, level=LoadLevel("rate", 2.5)), Limits())
    result = TrialResult("ok", stats.output_throughput, 2.5, ((2.5, LevelOutcome(stats, judge(stats, Limits()))),))
    console = Console(record=True, width=200)
    console.print(level_table(result, objective))
    text = console.export_text()
    assert "offered" in text and "request_throughput" in text
    row = next(line for line in text.splitlines() if "2.5 *" in line)
    cells = [c.strip() for c in row.split("│")]
    assert cells[1:3] == ["2.5 *", "2.00"]  # the label, then what was offered
    assert cells[6] == f"{stats.request_throughput:.2f}"  # achieved: completed in the steady window per second


def test_study_table_gives_a_rate_mode_level_with_the_rate_it_offered():
    import optuna
    from rich.console import Console

    from autotune.show.tables import study_table

    stats = level_stats(LevelRun(LoadLevel("rate", 2.5), RUN.records, 0.0, 4.0), Limits())
    trial = optuna.trial.create_trial(value=stats.output_throughput, user_attrs={
        "best_level": 2.5, "levels": [{**stats.to_dict(), "passed": True}], "constraints": [0.0]},
        system_attrs={"constraints": (0.0,)})
    console = Console(record=True, width=200)
    console.print(study_table([trial]))
    assert "2.5 req/s (offered 2.00)" in console.export_text()
