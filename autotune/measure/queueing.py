"""Why a configuration cannot sustain a load level, known before it boots: a wait that no kernel can shorten.

A decode step reads every weight from memory at least once, so it takes at least weights / peak bandwidth, and a
request needs (output tokens - 1) / (1 + speculative tokens) steps after its first token. At most c requests run at
once: `max_num_seqs`, or fewer when the KV cache cannot hold that many (vLLM admits a request only when it holds a
block of every KV-cache group; a hybrid model's pool holds few: estimate.max_running_seqs, its optimistic end). At a
closed-loop concurrency L above c, L - c requests are always queued, and by Little's law each waits (L - c) / c
service times on average before its prefill: that wait is part of its TTFT. When even the least such wait exceeds
the objective's p95 TTFT limit, the level cannot be sustained, and a sampled configuration, which is screened at the
incumbent's level (ladder.Prior.screen), need not boot to be screened out.

Seen on the H200 capped as a 3090 (benchmarks/data/h200-as-rtx3090-chat-bytecode-precompiled): five sampled
configurations booted (99-123 s each) to be screened out at the incumbent's level 36; four had max_num_seqs 1, 6, 16 and
18. With the H200's 4.8 TB/s the bound screens the first two; with a real 3090's 936 GB/s, all four. On the recorded GPU
surface (benchmarks/data/h200-as-rtx3090-awq/surface.json) every configuration's highest passing level was the ladder's
highest at or just above the requests its pool runs at once (blocks / (attention + mamba groups)), e.g. 16 for 79 blocks
of 4 per request, where its max_num_seqs was 52.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from autotune.measure.stats import Limits
from autotune.measure.workload import Workload


@dataclass(frozen=True)
class QueueWait:
    """The least mean queue wait of a closed loop of `level` requests on `slots` running at once."""

    level: float
    slots: int
    held_by: str  # what bounds the slots: "max_num_seqs 6", or the KV cache
    step_s: float  # the least decode step: weights / peak bandwidth
    service_s: float  # the least service time of a request: its fewest decode steps, each at least step_s
    wait_s: float  # (level - slots) / slots x service_s

    def text(self, limit_ms: float) -> str:
        return (f"{self.held_by} holds {self.slots} of the incumbent's {self.level:g} concurrent "
                f"requests; the rest queue at least {self.wait_s:.1f} s each (Little's law; a request needs at "
                f"least {self.service_s:.2f} s: its decode steps at >= {self.step_s * 1000:.1f} ms, the weights "
                f"read once per step), over the TTFT limit of {limit_ms / 1000:g} s")


def least_queue_wait(level: float, flags: Mapping[str, object], weights_bytes: int, bandwidth_gbs: float,
                     workload: Workload, pool_seqs: int | None = None) -> QueueWait | None:
    """The least wait, or None when nothing certain can be said: a level the configuration holds, no known
    bandwidth (the CPU build), or output lengths a dataset or a replayed log decides. `pool_seqs`: the most requests
    its KV cache runs at once (estimate.max_running_seqs), when the estimator knows it."""
    seqs = flags.get("max_num_seqs")
    bounds: list[tuple[int, str]] = []  # (slots, what holds them)
    if isinstance(seqs, int) and not isinstance(seqs, bool) and seqs >= 1:
        bounds.append((seqs, f"max_num_seqs {seqs}"))
    if pool_seqs is not None and pool_seqs >= 1:
        bounds.append((pool_seqs, "the KV cache (a block of each of its groups per request)"))
    if not bounds or bandwidth_gbs <= 0 or weights_bytes <= 0 or workload.dataset is not None \
            or workload.replay is not None:
        return None
    slots, held_by = min(bounds, key=lambda b: b[0])
    if level <= slots:
        return None
    spec = flags.get("speculative_config")
    draft = spec.get("num_speculative_tokens", 0) if isinstance(spec, Mapping) else 0
    per_step = 1 + (draft if isinstance(draft, int) and draft > 0 else 0)
    step_s = weights_bytes / (bandwidth_gbs * 1e9)
    service_s = max(0, workload.output_len.min - 1) / per_step * step_s
    return QueueWait(level, slots, held_by, step_s, service_s, (level - slots) / slots * service_s)


# The least share of the incumbent's level a sampled configuration must run at once (the estimator's central count)
# to be booted and screened at that level. Below it, the requests it cannot hold queue behind a whole wave: in the
# closed loop's first wave the running ones start together and end together, so each queued one waits about a service
# time (3-4 s at 16 requests on the capped card: over the chat limit's 2 s). Of the 22 configurations the two recorded
# GPU surfaces measured at 16, the 9 the estimator has running 14-24 at once sustained 16 and the 13 it has at 7-13
# failed (benchmarks/tests/test_replay.py); a share of 1 would have screened out five that sustained 16 at 14-15.
HELD_SHARE = 7 / 8


def ttft_limit(limits: Limits) -> float | None:
    """The tightest TTFT limit at p95 or above (ms): a level whose p95 misses it misses every one of them."""
    return min((ms for q, ms in limits.on("ttft").items() if q >= 95), default=None)


def held_share(noise: float = 0.0) -> float:
    """The share of the incumbent's level a configuration must run at once to boot: HELD_SHARE, or less on a machine
    whose one measurement spreads by more than HELD_SHARE leaves (`noise`, search/noise.py): the incumbent's level
    is one measurement, and a configuration within its noise of it may sustain it on another boot."""
    return min(HELD_SHARE, 1.0 - noise)


def holds_too_few(level: float, runs: float | None, limits: Limits, noise: float = 0.0) -> str | None:
    """Why a configuration that runs `runs` requests at once (ladder.capacity with the central KV cache) is not
    booted to be screened at the incumbent's `level`, else None. An estimate, not a bound (cannot_sustain's).
    `noise`: the spread of one measurement on this machine, once measured well enough (held_share)."""
    share = held_share(noise)
    if (limit := ttft_limit(limits)) is None or runs is None or runs >= share * level:
        return None
    return (f"it runs {runs:g} of the incumbent's {level:g} concurrent requests at once (the estimator's KV cache "
            f"and max_num_seqs), under {share:.3g} of them: the rest would wait about a whole request each, "
            f"past the TTFT limit of {limit / 1000:g} s")


def cannot_sustain(level: float, flags: Mapping[str, object], weights_bytes: int, bandwidth_gbs: float,
                   workload: Workload, limits: Limits, pool_seqs: int | None = None) -> str | None:
    """Why a closed loop of `level` requests must miss the p95 TTFT limit on this configuration, else None."""
    if (limit := ttft_limit(limits)) is None:
        return None
    wait = least_queue_wait(level, flags, weights_bytes, bandwidth_gbs, workload, pool_seqs)
    if wait is None or wait.wait_s * 1000 <= limit:
        return None
    return wait.text(limit)
