"""Per-level statistics computed the way `vllm bench serve` computes them, and SLO verdicts.

Same definitions as vLLM's `calculate_metrics`, so a figure here can be checked against vLLM's own client:
numpy's (linear) percentiles; TPOT = (latency - TTFT) / (output_len - 1) over requests with more than one
output token; ITL pooled over every gap of every request. One difference, on purpose: rates are measured over
the level's steady window (`steady_window`: ramp-up and final drain excluded), not its whole wall-clock span;
`span_output_tok_s` keeps vLLM's figure for comparison.

How many requests a level needs is decided here too (`StopRule`): a distribution-free confidence interval of
each limited p95, from order statistics, must be narrow enough or lie clear of its limit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from autotune.measure.client import LevelRun, LoadLevel, RequestRecord
from autotune.measure.energy import PowerSample, joules_per_token


@dataclass(frozen=True)
class Limits:
    """p95 latency limits in milliseconds, and energy per output token in joules (measured with NVML, on a CUDA
    GPU only); None means no limit on that metric."""

    ttft_p95_ms: float | None = None
    tpot_p95_ms: float | None = None
    itl_p95_ms: float | None = None
    e2e_p95_ms: float | None = None
    joules_per_token: float | None = None


@dataclass(frozen=True)
class Percentiles:
    """One latency's distribution in milliseconds (all 0 when there is no sample, as in vLLM)."""

    mean_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float

    @staticmethod
    def of(seconds: list[float]) -> Percentiles:
        if not seconds:
            return Percentiles(0.0, 0.0, 0.0, 0.0)
        a = np.asarray(seconds, dtype=np.float64) * 1000.0
        p50, p95, p99 = np.percentile(a, [50, 95, 99])
        return Percentiles(float(a.mean()), float(p50), float(p95), float(p99))


@dataclass(frozen=True)
class LevelStats:
    level: LoadLevel
    completed: int
    failed: int
    duration_s: float
    output_tok_s: float
    total_tok_s: float
    req_s: float
    goodput_req_s: float
    ttft: Percentiles
    tpot: Percentiles
    itl: Percentiles
    e2el: Percentiles
    errors: dict[str, int] = field(default_factory=dict, hash=False)  # message (first 80 chars) -> count
    input_tokens: int = 0  # over completed requests
    output_tokens: int = 0
    window_s: float = 0.0  # the steady window the rates are measured over (== duration_s when there is none)
    span_output_tok_s: float = 0.0  # output tokens / whole span, as `vllm bench serve` reports it
    # Requests sent per second over the sending window (offered_rate); req_s is the achieved rate beside it.
    offered_req_s: float = 0.0
    # The GPUs' energy over the steady window per output token in it (measure/energy.py); None: not measured (the
    # CPU build has no NVML).
    joules_per_token: float | None = None

    @property
    def error_rate(self) -> float:
        total = self.completed + self.failed
        return self.failed / total if total else 0.0

    @property
    def goodput_output_tok_s(self) -> float:
        """The output throughput of the requests that met every limit: the steady-window figure times the share
        of the requests ended in that window that met them (goodput_req_s / req_s)."""
        return self.output_tok_s * self.goodput_req_s / self.req_s if self.req_s > 0 else 0.0

    def to_dict(self) -> dict[str, float]:
        """Flat, JSON-ready numbers with their units in the keys (for Optuna user attrs and reports)."""
        key = "concurrency" if self.level.mode == "concurrency" else "rate_req_s"
        d: dict[str, float] = {
            key: self.level.value,
            "completed": self.completed,
            "failed": self.failed,
            "duration_s": self.duration_s,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "output_tok_s": self.output_tok_s,
            "total_tok_s": self.total_tok_s,
            "req_s": self.req_s,
            "goodput_req_s": self.goodput_req_s,
            "window_s": self.window_s,
            "span_output_tok_s": self.span_output_tok_s,
            "offered_req_s": self.offered_req_s,
        }
        if self.joules_per_token is not None:
            d["joules_per_output_token"] = self.joules_per_token
        for name in ("ttft", "tpot", "itl", "e2el"):
            p: Percentiles = getattr(self, name)
            for stat in ("mean", "p50", "p95", "p99"):
                d[f"{name}_{stat}_ms"] = getattr(p, f"{stat}_ms")
        return d


def request_tpot(r: RequestRecord) -> float | None:
    if r.output_tokens > 1 and r.ttft is not None:
        return (r.end - r.start - r.ttft) / (r.output_tokens - 1)
    return None


def _good(r: RequestRecord, limits: Limits) -> bool:
    """Whether one request meets every limit (vLLM's goodput; a request's ITL is judged by its own p95)."""
    checks = (
        (limits.ttft_p95_ms, r.ttft),
        (limits.tpot_p95_ms, request_tpot(r) or 0.0),  # as in vLLM: TPOT of a 1-token output counts as 0
        (limits.itl_p95_ms, float(np.percentile(r.itl, 95)) if limits.itl_p95_ms and r.itl else 0.0),
        (limits.e2e_p95_ms, r.end - r.start),
    )
    return all(limit is None or (value is not None and value * 1000.0 <= limit) for limit, value in checks)


def steady_window(run: LevelRun) -> tuple[float, float]:
    """The steady part of a level: from the moment the in-flight count first reaches its target (concurrency
    mode: the level's concurrency, or the number of requests if fewer; rate mode: the first request's start)
    to the first completion after the last request started (the final drain begins there).

    Requests that failed count as in flight. Falls back to the whole span [started, ended] when the target is
    never reached or fewer than one round (target requests, 1 in rate mode) ends inside the window.
    """
    span = (run.started, run.ended)
    records = run.records
    if not records:
        return span
    if run.level.mode == "concurrency":
        target = min(int(run.level.value), len(records))
        events = sorted([(r.start, 1) for r in records] + [(r.end, -1) for r in records], key=lambda e: (e[0], e[1]))
        in_flight, t0 = 0, None
        for t, step in events:  # at equal times, ends first: reaching the target must not be an artefact
            in_flight += step
            if in_flight >= target:
                t0 = t
                break
        if t0 is None:
            return span
    else:
        target, t0 = 1, min(r.start for r in records)
    last_start = max(r.start for r in records)
    t1 = min((r.end for r in records if r.end > last_start), default=None)
    if t1 is None or t1 <= t0 or sum(t0 <= r.end <= t1 for r in records) < target:
        return span
    return t0, t1


def offered_rate(send_times: Sequence[float]) -> float:
    """Requests sent per second: the n - 1 intervals between n sends over the window from the first send to the
    last (0 with fewer than two). What a rate-mode level really offered, against the rate on its label."""
    if len(send_times) < 2 or (window := max(send_times) - min(send_times)) <= 0:
        return 0.0
    return (len(send_times) - 1) / window


def _tokens_between(r: RequestRecord, t0: float, t1: float) -> float:
    """Output tokens of a completed request that arrived in [t0, t1] (chunk times; tokens shared evenly
    among chunks when the server packed several into one)."""
    if r.ttft is None:
        return 0.0
    times = np.cumsum([r.start + r.ttft, *r.itl])
    inside = int(np.count_nonzero((times >= t0) & (times <= t1)))
    return inside * r.output_tokens / len(times) if inside < len(times) else float(r.output_tokens)


def level_stats(run: LevelRun, limits: Limits, power: Sequence[PowerSample] = ()) -> LevelStats:
    """Throughput over the steady window, latency percentiles over every completed request, goodput, errors; with
    `power` (NVML samples through the level), the energy per output token over the same window."""
    ok = [r for r in run.records if r.error is None]
    failed = [r for r in run.records if r.error is not None]
    duration = run.ended - run.started
    t0, t1 = steady_window(run)
    window = t1 - t0
    whole = (t0, t1) == (run.started, run.ended)
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    if whole:
        out_win, in_win, ended = float(out_tokens), float(in_tokens), ok
    else:
        out_win = sum(_tokens_between(r, t0, t1) for r in ok)
        in_win = float(sum(r.prompt_tokens for r in ok if r.ttft is not None and t0 <= r.start + r.ttft <= t1))
        ended = [r for r in ok if t0 <= r.end <= t1]
    tpots = [t for r in ok if (t := request_tpot(r)) is not None]
    itls = [gap for r in ok for gap in r.itl]
    per_s = (lambda x: x / window) if window > 0 else (lambda x: 0.0)
    return LevelStats(
        level=run.level,
        completed=len(ok),
        failed=len(failed),
        duration_s=duration,
        output_tok_s=per_s(out_win),
        total_tok_s=per_s(in_win + out_win),
        req_s=per_s(len(ended)),
        goodput_req_s=per_s(sum(_good(r, limits) for r in ended)),
        # A dropped request's TTFT and end-to-end time are what it had reached, lower bounds: without them an
        # abandoned level's percentiles would be those of the requests served first.
        ttft=Percentiles.of([r.ttft for r in ok if r.ttft is not None] + [d.ttft for d in run.dropped if d.ttft]),
        tpot=Percentiles.of(tpots),
        itl=Percentiles.of(itls),
        e2el=Percentiles.of([r.end - r.start for r in (*ok, *run.dropped)]),
        errors=dict(Counter((r.error or "")[:80] for r in failed).most_common()),
        input_tokens=in_tokens,
        output_tokens=out_tokens,
        window_s=window,
        span_output_tok_s=out_tokens / duration if duration > 0 else 0.0,
        offered_req_s=offered_rate([r.start for r in run.records]),
        joules_per_token=joules_per_token(power, t0, t1, out_win) if power else None,
    )


_NAMES = {"ttft_p95_ms": "TTFT", "tpot_p95_ms": "TPOT", "itl_p95_ms": "ITL", "e2e_p95_ms": "E2E latency"}


def _ms(v: float) -> str:
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


@dataclass(frozen=True)
class Verdict:
    """Whether a level meets the objective; `misses` maps each failed limit to observed p95 / limit.

    A level with too many failed requests also fails: then `misses["error_rate"]` is the observed fraction.
    """

    passed: bool
    misses: dict[str, float] = field(default_factory=dict, hash=False)
    limits: Limits = Limits()
    max_error_rate: float = 0.0
    failed: int = 0
    total: int = 0
    top_error: str | None = None
    unmeasured: tuple[str, ...] = ()  # limits missed because their metric was not measured (energy without NVML)

    @property
    def reason(self) -> str:
        """One line for people: e.g. "p95 TTFT 1370 ms > limit 1000 ms (+37%)"."""
        if self.passed:
            return "meets every limit"
        parts = []
        for key, ratio in self.misses.items():
            if key == "error_rate":
                if self.total == 0:
                    parts.append("no requests were measured")
                    continue
                msg = (
                    f"{self.failed} of {self.total} requests failed ({ratio:.1%}"
                    f" > allowed {self.max_error_rate:.1%})"
                )
                parts.append(msg + (f": {self.top_error}" if self.top_error else ""))
            elif key == "joules_per_token":
                limit = self.limits.joules_per_token or 0.0
                parts.append("energy per token not measured (NVML, on a CUDA GPU only)" if key in self.unmeasured
                             else f"{ratio * limit:.3g} J per output token > limit {limit:g} J")
            else:
                limit = getattr(self.limits, key)
                parts.append(
                    f"p95 {_NAMES[key]} {_ms(ratio * limit)} ms > limit {_ms(limit)} ms (+{(ratio - 1) * 100:.0f}%)"
                )
        return "; ".join(parts)


UNMEASURED_MISS = 2.0  # the miss ratio of a limit not measured: a clear miss for the sampler, not an infinite one


def judge(stats: LevelStats, limits: Limits, *, max_error_rate: float = 0.0) -> Verdict:
    """Pass when every limited p95 is within its limit and at most `max_error_rate` of requests failed.

    A level in which nothing completed always fails (its percentiles would read 0).
    """
    misses: dict[str, float] = {}
    total = stats.completed + stats.failed
    if stats.completed == 0 or stats.error_rate > max_error_rate:
        misses["error_rate"] = stats.error_rate
    observed = {
        "ttft_p95_ms": stats.ttft.p95_ms,
        "tpot_p95_ms": stats.tpot.p95_ms,
        "itl_p95_ms": stats.itl.p95_ms,
        "e2e_p95_ms": stats.e2el.p95_ms,
    }
    for key, value in observed.items():
        limit = getattr(limits, key)
        if limit is not None and stats.completed and value > limit:
            misses[key] = value / limit
    unmeasured: tuple[str, ...] = ()
    if limits.joules_per_token is not None and stats.completed:
        measured = stats.joules_per_token
        if measured is None:  # a limit that could not be measured is not met
            misses["joules_per_token"], unmeasured = UNMEASURED_MISS, ("joules_per_token",)
        elif measured > limits.joules_per_token:
            misses["joules_per_token"] = measured / limits.joules_per_token
    top = next(iter(stats.errors), None)
    return Verdict(not misses, misses, limits, max_error_rate, stats.failed, total, top, unmeasured)
