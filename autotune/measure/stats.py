"""Per-level statistics computed the way `vllm bench serve` computes them and named as its result JSON names
them (`output_throughput`, `p95_ttft_ms`, ...), and SLO verdicts.

Same definitions as vLLM's `calculate_metrics`, so a figure here can be checked against vLLM's own client:
numpy's (linear) percentiles; TPOT = (latency - TTFT) / (output_len - 1) over requests with more than one
output token; ITL pooled over every gap of every request. One difference, on purpose: rates are measured over
the level's steady window (`steady_window`: ramp-up and final drain excluded), not its whole wall-clock span;
`span_output_tok_s` keeps vLLM's figure for comparison.

A limit is a latency at a percentile, keyed as vLLM names the figure (`p99_tpot_ms`): any of p50/p90/p95/p99 on
TTFT, TPOT, ITL and E2EL. How many requests a level needs is decided in ladder.py (`StopRule`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autotune.measure.client import LevelRun, LoadLevel, RequestRecord
from autotune.measure.energy import PowerSample, joules_per_token

METRICS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2EL"}  # vLLM's names, and for people
PERCENTILES = (50, 90, 95, 99)


@dataclass(frozen=True)
class Limits:
    """Latency limits in milliseconds, each at a percentile, named as `vllm bench serve` names the figure
    (p95_ttft_ms: the p95 of TTFT), and energy per output token in joules (measured with NVML, on a CUDA GPU
    only); None means no limit there."""

    p50_ttft_ms: float | None = None
    p90_ttft_ms: float | None = None
    p95_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    p50_tpot_ms: float | None = None
    p90_tpot_ms: float | None = None
    p95_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    p50_itl_ms: float | None = None
    p90_itl_ms: float | None = None
    p95_itl_ms: float | None = None
    p99_itl_ms: float | None = None
    p50_e2el_ms: float | None = None
    p90_e2el_ms: float | None = None
    p95_e2el_ms: float | None = None
    p99_e2el_ms: float | None = None
    joules_per_token: float | None = None

    def set(self) -> dict[str, float]:
        """The limits given, by key: {"p95_ttft_ms": 2000.0, "joules_per_token": 0.5, ...}."""
        return {f.name: v for f in dataclasses.fields(self) if (v := getattr(self, f.name)) is not None}

    def latencies(self) -> dict[str, float]:
        """The latency limits given, by key: {"p95_ttft_ms": 2000.0, ...}."""
        return {k: v for k, v in self.set().items() if k != "joules_per_token"}

    def on(self, metric: str) -> dict[int, float]:
        """The limits on one metric ("ttft"), by percentile."""
        return {q: ms for key, ms in self.latencies().items() for q, m in [limit_parts(key)] if m == metric}


def limit_key(percentile: int, metric: str) -> str:
    return f"p{percentile}_{metric}_ms"


def limit_parts(key: str) -> tuple[int, str]:
    """(95, "ttft") from "p95_ttft_ms"."""
    q, metric, _ = key.split("_")
    return int(q[1:]), metric


def limit_name(key: str) -> str:
    """ "p95 TTFT" for "p95_ttft_ms": how people read a limit."""
    q, metric = limit_parts(key)
    return f"p{q} {METRICS[metric]}"


@dataclass(frozen=True)
class Percentiles:
    """One latency's distribution in milliseconds (all 0 when there is no sample, as in vLLM)."""

    mean_ms: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float

    @staticmethod
    def of(seconds: list[float]) -> Percentiles:
        if not seconds:
            return Percentiles(0.0, 0.0, 0.0, 0.0, 0.0)
        a = np.asarray(seconds, dtype=np.float64) * 1000.0
        return Percentiles(float(a.mean()), *(float(v) for v in np.percentile(a, PERCENTILES)))

    def at(self, percentile: int) -> float:
        return float(getattr(self, f"p{percentile}_ms"))


# What a study can maximise at its best level: the output throughput, named as `vllm bench serve` names it, or the
# output tokens per joule of GPU energy (NVML, on a CUDA GPU; vLLM's bench has no energy figure), with its unit.
MAXIMIZE = {"output_throughput": "output tok/s", "output_tokens_per_joule": "output tokens/J"}
ENERGY_FIGURE = "output_tokens_per_joule"


@dataclass(frozen=True)
class LevelStats:
    level: LoadLevel
    completed: int
    failed: int
    duration_s: float
    output_throughput: float  # output tok/s
    total_token_throughput: float  # input + output tok/s
    request_throughput: float  # req/s
    request_goodput: float  # req/s of the requests that met every limit
    ttft: Percentiles
    tpot: Percentiles
    itl: Percentiles
    e2el: Percentiles
    errors: dict[str, int] = field(default_factory=dict, hash=False)  # message (first 80 chars) -> count
    input_tokens: int = 0  # over completed requests
    output_tokens: int = 0
    window_s: float = 0.0  # the steady window the rates are measured over (== duration_s when there is none)
    span_output_tok_s: float = 0.0  # output tokens / whole span, as `vllm bench serve` reports it
    # Requests sent per second over the sending window (offered_rate); request_throughput is the achieved rate.
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
        of the requests ended in that window that met them (request_goodput / request_throughput)."""
        if self.request_throughput <= 0:
            return 0.0
        return self.output_throughput * self.request_goodput / self.request_throughput

    def figure(self, maximize: str) -> float | None:
        """The figure a study maximises (a MAXIMIZE key) at this level; None: not measured (energy without NVML)."""
        if maximize == ENERGY_FIGURE:
            return 1 / self.joules_per_token if self.joules_per_token else None
        return self.output_throughput

    def to_dict(self) -> dict[str, float]:
        """Flat, JSON-ready numbers keyed as `vllm bench serve`'s result JSON keys them (for Optuna user attrs and
        reports); autotune's own figures (window_s, span_output_tok_s, offered_req_s) have their units in the key."""
        key = "concurrency" if self.level.mode == "concurrency" else "rate_req_s"
        d: dict[str, float] = {
            key: self.level.value,
            "completed": self.completed,
            "failed": self.failed,
            "duration_s": self.duration_s,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
            "request_throughput": self.request_throughput,
            "request_goodput": self.request_goodput,
            "window_s": self.window_s,
            "span_output_tok_s": self.span_output_tok_s,
            "offered_req_s": self.offered_req_s,
        }
        if self.joules_per_token is not None:
            d["joules_per_output_token"] = self.joules_per_token
        for name in METRICS:
            p: Percentiles = getattr(self, name)
            d[f"mean_{name}_ms"] = p.mean_ms
            d[f"median_{name}_ms"] = p.p50_ms
            d |= {limit_key(q, name): p.at(q) for q in PERCENTILES}
        return d


def request_tpot(r: RequestRecord) -> float | None:
    if r.output_tokens > 1 and r.ttft is not None:
        return (r.end - r.start - r.ttft) / (r.output_tokens - 1)
    return None


def request_value(r: RequestRecord, metric: str, percentile: int) -> float | None:
    """One request's own figure for a limit on `metric`, in seconds: its TTFT, TPOT (0 for a 1-token output, as
    in vLLM) or E2EL; for ITL, its own gaps' percentile. None: it has no such figure (no first token)."""
    if metric == "ttft":
        return r.ttft
    if metric == "tpot":
        return request_tpot(r) or 0.0
    if metric == "itl":
        return float(np.percentile(r.itl, percentile)) if r.itl else 0.0
    return r.end - r.start


def _good(r: RequestRecord, limits: Limits) -> bool:
    """Whether one request meets every latency limit (vLLM's goodput)."""
    for key, limit in limits.latencies().items():
        q, metric = limit_parts(key)
        value = request_value(r, metric, q)
        if value is None or value * 1000.0 > limit:
            return False
    return True


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
        output_throughput=per_s(out_win),
        total_token_throughput=per_s(in_win + out_win),
        request_throughput=per_s(len(ended)),
        request_goodput=per_s(sum(_good(r, limits) for r in ended)),
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


def _ms(v: float) -> str:
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


@dataclass(frozen=True)
class Verdict:
    """Whether a level meets the objective; `misses` maps each failed limit to observed figure / limit.

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
                    f"{limit_name(key)} {_ms(ratio * limit)} ms > limit {_ms(limit)} ms (+{(ratio - 1) * 100:.0f}%)"
                )
        return "; ".join(parts)


UNMEASURED_MISS = 2.0  # the miss ratio of a limit not measured: a clear miss for the sampler, not an infinite one


def judge(stats: LevelStats, limits: Limits, *, max_error_rate: float = 0.0) -> Verdict:
    """Pass when every limited percentile is within its limit and at most `max_error_rate` of requests failed.

    A level in which nothing completed always fails (its percentiles would read 0).
    """
    misses: dict[str, float] = {}
    total = stats.completed + stats.failed
    if stats.completed == 0 or stats.error_rate > max_error_rate:
        misses["error_rate"] = stats.error_rate
    for key, limit in limits.latencies().items():
        q, metric = limit_parts(key)
        value = getattr(stats, metric).at(q)
        if stats.completed and value > limit:
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


# The names figures had before vLLM's were taken (objective files, stored studies): still read, with a notice.
OLD_NAMES = {
    "ttft_p95_ms": "p95_ttft_ms", "tpot_p95_ms": "p95_tpot_ms", "itl_p95_ms": "p95_itl_ms",
    "e2e_p95_ms": "p95_e2el_ms", "output_tok_s": "output_throughput", "total_tok_s": "total_token_throughput",
    "req_s": "request_throughput", "goodput_req_s": "request_goodput",
} | {f"{m}_{stat}_ms": f"{stat}_{m}_ms" for m in METRICS for stat in ("mean", "p50", "p95", "p99")}


def current_names(figures: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The figures under vLLM's names, and the old names that were read (empty when none was)."""
    old = [k for k in figures if k in OLD_NAMES and OLD_NAMES[k] not in figures]
    return {OLD_NAMES.get(k, k) if k in old else k: v for k, v in figures.items()}, old


def read_limits(recorded: Mapping[str, float]) -> Limits:
    """Limits from a mapping recorded under either name (a dataset's provenance, a stored study's attribute)."""
    return Limits(**current_names(recorded)[0])


def limits_text(limits: Mapping[str, float]) -> str:
    """{"p95_ttft_ms": 2000, "p95_tpot_ms": 100} -> "p95 TTFT 2 s and TPOT 100 ms" (old names read too)."""
    parts = []
    for key, value in current_names(limits)[0].items():
        q, metric = limit_parts(key)
        amount = f"{value / 1000:g} s" if value >= 1000 else f"{value:g} ms"
        parts.append((f"p{q}", f"{METRICS[metric]} {amount}"))
    if not parts:
        return "no limits"
    pct = parts[0][0] if len({p for p, _ in parts}) == 1 else ""
    words = [text if pct else f"{p} {text}" for p, text in parts]
    return (f"{pct} " if pct else "") + " and ".join(words)
