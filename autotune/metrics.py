"""Per-level statistics computed the way `vllm bench serve` computes them, and SLO verdicts.

Same definitions as vLLM's `calculate_metrics`, so a figure here can be checked against vLLM's own client:
numpy's (linear) percentiles; TPOT = (latency - TTFT) / (output_len - 1) over requests with more than one
output token; ITL pooled over every gap of every request; throughputs over the level's wall-clock span.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from autotune.load import LevelRun, LoadLevel, RequestRecord


@dataclass(frozen=True)
class Limits:
    """p95 latency limits in milliseconds; None means no limit on that metric."""

    ttft_p95_ms: float | None = None
    tpot_p95_ms: float | None = None
    itl_p95_ms: float | None = None
    e2e_p95_ms: float | None = None


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

    @property
    def error_rate(self) -> float:
        total = self.completed + self.failed
        return self.failed / total if total else 0.0

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
        }
        for name in ("ttft", "tpot", "itl", "e2el"):
            p: Percentiles = getattr(self, name)
            for stat in ("mean", "p50", "p95", "p99"):
                d[f"{name}_{stat}_ms"] = getattr(p, f"{stat}_ms")
        return d


def _tpot(r: RequestRecord) -> float | None:
    if r.output_tokens > 1 and r.ttft is not None:
        return (r.end - r.start - r.ttft) / (r.output_tokens - 1)
    return None


def _good(r: RequestRecord, limits: Limits) -> bool:
    """Whether one request meets every limit (vLLM's goodput; a request's ITL is judged by its own p95)."""
    checks = (
        (limits.ttft_p95_ms, r.ttft),
        (limits.tpot_p95_ms, _tpot(r) or 0.0),  # as in vLLM: TPOT of a 1-token output counts as 0
        (limits.itl_p95_ms, float(np.percentile(r.itl, 95)) if limits.itl_p95_ms and r.itl else 0.0),
        (limits.e2e_p95_ms, r.end - r.start),
    )
    return all(limit is None or (value is not None and value * 1000.0 <= limit) for limit, value in checks)


def level_stats(run: LevelRun, limits: Limits) -> LevelStats:
    """Throughput, latency percentiles, goodput and error counts of one measured level."""
    ok = [r for r in run.records if r.error is None]
    failed = [r for r in run.records if r.error is not None]
    duration = run.ended - run.started
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    tpots = [t for r in ok if (t := _tpot(r)) is not None]
    itls = [gap for r in ok for gap in r.itl]
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)
    return LevelStats(
        level=run.level,
        completed=len(ok),
        failed=len(failed),
        duration_s=duration,
        output_tok_s=per_s(out_tokens),
        total_tok_s=per_s(in_tokens + out_tokens),
        req_s=per_s(len(ok)),
        goodput_req_s=per_s(sum(_good(r, limits) for r in ok)),
        ttft=Percentiles.of([r.ttft for r in ok if r.ttft is not None]),
        tpot=Percentiles.of(tpots),
        itl=Percentiles.of(itls),
        e2el=Percentiles.of([r.end - r.start for r in ok]),
        errors=dict(Counter((r.error or "")[:80] for r in failed).most_common()),
        input_tokens=in_tokens,
        output_tokens=out_tokens,
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
            else:
                limit = getattr(self.limits, key)
                parts.append(
                    f"p95 {_NAMES[key]} {_ms(ratio * limit)} ms > limit {_ms(limit)} ms (+{(ratio - 1) * 100:.0f}%)"
                )
        return "; ".join(parts)


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
    top = next(iter(stats.errors), None)
    return Verdict(not misses, misses, limits, max_error_rate, stats.failed, total, top)
