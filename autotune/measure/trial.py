"""One trial end to end: a configuration in, a measured (or explained) result out.

Boot the server, find the highest load level that meets the objective's p95 limits, sample memory throughout,
stop the server. Every way this can go wrong becomes a field of the result, never an exception; the caller's
`on_level` hook can stop a trial between levels (a pruner, the budget's end) by returning a reason.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from autotune.engine.compile_cache import (
    CompileCache,
    boot_again_before_measuring,
    boot_again_warm,
    compile_cache_state,
    compile_key,
    key_is_new,
    remember_key,
)
from autotune.engine.flags import (
    Build,
    detect_build,
)
from autotune.engine.logs import BootInfo, Failure, FailureKind
from autotune.engine.models import model_vocab_size, resolve_model
from autotune.engine.server import BootFailed, EngineSpec, Server, server_env
from autotune.fit import memcap
from autotune.fit.estimate import Estimate
from autotune.fit.hardware import GpuProfile, detect_gpus
from autotune.measure.client import STALLED, LoadLevel, measure_level
from autotune.measure.energy import PowerSampler
from autotune.measure.ladder import NO_PRIOR, LoadSearch, Prior, find_sustainable, first_level
from autotune.measure.memory import MemoryPeak, MemorySampler, MemoryWatch, memory_watch
from autotune.measure.stats import LevelStats, Limits, Verdict, judge, level_stats
from autotune.measure.workload import Workload, tokenizer_of


@dataclass(frozen=True)
class Objective:
    """What "good" means: the workload sent and the p95 limits it must meet, and how load rises."""

    name: str
    path: Path
    description: str
    workload: Workload
    limits: Limits
    load: LoadSearch


Status = Literal["ok", "infeasible", "failed", "stopped"]


Stage = Callable[[str], None]


@dataclass(frozen=True)
class LevelOutcome:
    stats: LevelStats
    verdict: Verdict
    hung: bool = False  # the server sent nothing on any connection for the stall timeout (load.HUNG)


@dataclass(frozen=True)
class TrialPlan:
    engine: EngineSpec
    objective: Objective
    vocab_size: int
    log_path: Path
    gpu_indices: tuple[int, ...] = ()  # the slot's GPUs (NVML indices); empty: every GPU the server may use
    prior: Prior = NO_PRIOR  # where the load search starts, and whether it screens at the incumbent's level
    warm_kv_blocks: int | None = None  # the estimator's KV blocks for a warm boot: what a compiling boot is given


def configured(model: str, flags: Mapping[str, object]) -> tuple[str, dict[str, object]]:
    """(model path, flags) as a trial boots them and the estimator judges them: the model's own defaults (a tiny
    model's) under the given flags. `autotune trial`, `autotune estimate --model` and the loop all start here."""
    path, defaults = resolve_model(model)
    return path, {**defaults, **flags}


def plan_trial(model_path: str, flags: Mapping[str, object], objective: Objective, log_path: Path, *,
               env: Mapping[str, str], boot_timeout_s: float, gpu_indices: tuple[int, ...] = (),
               memory_cap: memcap.MemoryCap | None = None, real_gpu: GpuProfile | None = None,
               prior: Prior = NO_PRIOR, warm_kv_blocks: int | None = None) -> TrialPlan:
    """The one assembly of a trial from a configured model and flags: under a memory cap the flags are translated
    for the card present (`real_gpu`), so that the server behaves as on the capped card."""
    if memory_cap is not None:
        assert real_gpu is not None, "a memory cap is translated for the card present"
        flags = memcap.engine_flags(flags, memory_cap, real_gpu)
    engine = EngineSpec(model=model_path, flags=flags, env=env, boot_timeout_s=boot_timeout_s,
                        cuda_visible_devices=",".join(map(str, gpu_indices)) if gpu_indices else None)
    return TrialPlan(engine, objective, model_vocab_size(model_path), log_path, gpu_indices, prior, warm_kv_blocks)


@dataclass(frozen=True)
class ColdBoot:
    """A first boot that compiled cold, failed for memory or came up short of KV cache (failure None), or that was
    given the estimator's KV cache and ran out of memory; the trial booted again (warm, sized by vLLM) after it
    and measured that one."""

    failure: Failure | None
    boot_s: float
    log_path: Path


@dataclass(frozen=True)
class TrialResult:
    """ok: some level met every limit. infeasible: it ran out of memory or no level met the limits (a
    configuration's verdict the sampler learns from). failed: anything else (crash, bad flag, timeout).
    stopped: the caller's on_level hook stopped it (pruned, or the budget ran out), or it was screened out (it
    failed at the incumbent's level, SCREENED: not measured further, so no figure of its own); `reason` says which."""

    status: Status
    throughput_tok_s: float = 0.0
    best_level: float | None = None
    levels: tuple[tuple[float, LevelOutcome], ...] = ()
    boot: BootInfo | None = None
    failure: Failure | None = None
    memory: MemoryPeak | None = None
    miss_ratio: float | None = None  # no level passed: the worst observed/limit ratio at the lowest level
    duration_s: float = 0.0
    log_path: Path | None = None
    stop_reason: str = ""
    log_error: str | None = None
    compile_cache: CompileCache | None = None  # the (last) boot's: "cold" compiled, "warm" loaded, None eager
    cold_boot: ColdBoot | None = None  # a cold boot's memory failure that was booted again warm
    kv_blocks_set: int | None = None  # the KV blocks the measured server was given (warm_kv_blocks), if it was

    @property
    def best(self) -> LevelOutcome | None:
        return next((o for lvl, o in self.levels if lvl == self.best_level), None)

    @property
    def reason(self) -> str:
        if self.failure is not None:
            return self.failure.reason
        if self.stop_reason:
            return self.stop_reason
        if self.status == "infeasible" and self.levels:
            return "no load level met the limits: " + min(self.levels, key=lambda lv: lv[0])[1].verdict.reason
        return ""


SCREENED = "screened out: did not sustain the incumbent's load level"


CANCELLED = "cancelled"  # a level's stop reason once the caller's cancel is set: its requests in flight end it


class ServerDied(Exception):
    def __init__(self, failure: Failure):
        super().__init__(failure.reason)
        self.failure = failure


class _Stop(Exception):
    pass


class _BootWarm(Exception):
    """A level passed on a cold CUDA server: measure the configuration on a warm boot instead."""


def run_trial(
    plan: TrialPlan,
    *,
    on_level: Callable[[int, float, LevelOutcome], str | None] | None = None,
    on_stage: Stage | None = None,
    cancel: threading.Event | None = None,
) -> TrialResult:
    stage = on_stage or (lambda _s: None)
    t0 = time.monotonic()
    build = detect_build()
    # A boot that will compile is given the KV cache its warm boots get (compile_cache: vLLM profiles memory while
    # it compiles, 1-2 GiB short), so that one boot measures the configuration; vLLM's own sizing comes back on
    # any boot after.
    first = plan_first_boot(plan, build)
    blocks = first.blocks
    server = Server(first.engine, plan.log_path)
    sampler: MemorySampler | None = None
    memory: MemoryPeak | None = None
    levels: list[tuple[float, LevelOutcome]] = []
    cold: ColdBoot | None = None
    cold_log = plan.log_path.with_suffix(".cold.log")

    def done(status: Status, **kw) -> TrialResult:
        nonlocal memory
        if sampler is not None and memory is None:
            memory = sampler.stop()
        return TrialResult(status, levels=tuple(levels), duration_s=time.monotonic() - t0,
                           log_path=plan.log_path, memory=memory, log_error=server.log_error,
                           compile_cache=compile_cache_state(list(server.lines)), cold_boot=cold,
                           kv_blocks_set=blocks, **kw)

    def again(why: str, first_boot: ColdBoot | None = None) -> None:
        """Stop this server and make the next; a first boot's log is kept beside the trial's, and the next one
        is sized by vLLM."""
        nonlocal server, cold, blocks
        assert sampler is not None
        sampler.stop()
        server.stop()
        if first_boot is not None:
            cold, blocks = first_boot, None
            plan.log_path.replace(cold_log)
        server = Server(_given_blocks(plan.engine, blocks), plan.log_path)
        stage(why)

    def compiled() -> list[str]:
        lines = list(server.lines)
        first.note(lines)
        return lines

    def boot_server() -> BootInfo | TrialResult:
        """The server up (its BootInfo), or the trial's result if it cannot boot."""
        nonlocal sampler
        port_retried = False
        while True:
            server.start()
            sampler = MemorySampler(root_pid=server.pid, gpu_indices=watch.gpu_indices or None,
                                    source=watch.source).start()
            try:
                boot = server.wait_ready(cancel)
                lines = compiled()
                if blocks is not None or cold is not None or not boot_again_before_measuring(build, lines) \
                        or not _kv_may_bind(plan, boot):
                    assert sampler is not None
                    sampler.serving()
                    return boot
                again("booting again: a cold boot (compiling) has less KV cache than this configuration; warm now",
                      ColdBoot(None, boot.boot_s, cold_log))
            except BootFailed as e:
                lines = compiled()
                if e.failure.kind is FailureKind.PORT_IN_USE and not port_retried:
                    # Another program took the free port between our check and the server's bind: once more.
                    port_retried = True
                    again("booting (the port was taken; on another one)")
                elif blocks is not None and e.failure.kind.is_memory:
                    again(_ran_out(blocks), ColdBoot(e.failure, e.boot_s, cold_log))
                elif cold is None and boot_again_warm(e.failure, lines):
                    # A cold compile's memory failure is no verdict: the cache is warm now (compile_cache.py).
                    again("booting again: the cold boot (compiling) ran out of memory; the cache is warm now",
                          ColdBoot(e.failure, e.boot_s, cold_log))
                else:
                    status: Status = "infeasible" if e.failure.kind.is_memory else "failed"
                    return done(status, failure=e.failure)

    def boot_anew(why: str, first_boot: ColdBoot) -> BootInfo | TrialResult:
        """The same flags booted again, sized by vLLM, after a first server whose figures are not this
        configuration's: they are dropped."""
        levels.clear()
        again(why, first_boot)
        return boot_server()

    hung = False
    watch = server_memory_watch(plan.engine, build, plan.gpu_indices)
    stage("booting")
    try:
        booted = boot_server()
        if isinstance(booted, TrialResult):
            return booted
        boot = booted
        # A cold CUDA server whose KV cache holds the first level judges a failure there as well as a warm one; a
        # pass is measured further, where its short KV cache would bind: on a warm boot (compile_cache.py).
        warm_for_passes = cold is None and blocks is None and boot_again_before_measuring(build, list(server.lines))

        def measure(value: float, exact: bool) -> LevelOutcome:
            k = len(levels)
            stage(f"level {k + 1}: {plan.objective.load.mode} {value:g}")
            outcome = _measure(server, plan, value, seed_offset=k, cancel=cancel, exact=exact,
                               power_gpus=watch.gpu_indices if watch.source == "nvml" else ())
            levels.append((value, outcome))
            refused = any(e.startswith("connection error") for e in outcome.stats.errors)
            if (failure := server.died(grace_s=3.0 if refused else 0.0)) is not None:
                raise ServerDied(failure)
            at = f"{plan.objective.load.mode} {value:g}"
            if outcome.stats.completed == 0 and outcome.stats.failed > 0:
                top = next(iter(outcome.stats.errors), "")
                raise ServerDied(Failure(FailureKind.UNRESPONSIVE, f"no request completed at {at}: {top}"))
            if outcome.hung:  # alive, but silent: whatever the requests before it did, the trial ends here
                stalled = next((e for e in outcome.stats.errors if e.startswith(STALLED)), "")
                raise ServerDied(Failure(FailureKind.UNRESPONSIVE, f"the server hung at {at}: {stalled}"))
            if warm_for_passes and outcome.verdict.passed:
                raise _BootWarm
            if on_level is not None and (why := on_level(k, value, outcome)):
                raise _Stop(why)
            return outcome

        while True:
            try:
                sla = find_sustainable(measure, lambda o: o.verdict.passed, plan.objective.load, plan.prior)
                break
            except _BootWarm:
                warm_for_passes = False
                booted = boot_anew("booting again: it passed on a cold boot, whose KV cache is short; measuring it "
                                   "warm", ColdBoot(None, boot.boot_s, cold_log))
                if isinstance(booted, TrialResult):
                    return booted
                boot = booted
            except ServerDied as e:
                hung = e.failure.kind is FailureKind.UNRESPONSIVE
                # Requests that all failed can be seen before the log's cause: an out-of-memory line, once there,
                # wins.
                seen = server.died()
                failure = seen if seen is not None and seen.kind.is_memory else e.failure
                if blocks is not None and failure.kind.is_memory:  # the estimate's KV cache, not vLLM's, ran out
                    booted = boot_anew(_ran_out(blocks), ColdBoot(failure, boot.boot_s, cold_log))
                    if isinstance(booted, TrialResult):
                        return booted
                    boot = booted
                    continue
                status: Status = "infeasible" if failure.kind.is_memory else "failed"
                return done(status, boot=boot, failure=failure)
            except _Stop as e:
                return done("stopped", boot=boot, stop_reason=str(e))
        if sla.screened_out:
            return done("stopped", boot=boot, stop_reason=SCREENED)
        if sla.best is None:
            lowest = min(levels, key=lambda lv: lv[0])[1].verdict  # the search may have come down to it
            return done("infeasible", boot=boot, miss_ratio=max(lowest.misses.values(), default=None))
        return done("ok", boot=boot, throughput_tok_s=sla.best.stats.output_tok_s, best_level=sla.best_level)
    finally:
        stage("stopping")
        if sampler is not None and memory is None:
            sampler.stop()
        # A failed boot or a hung server has nothing to drain.
        server.stop(grace_s=15.0 if server.healthy() and not hung else 3.0)


def _ran_out(blocks: int) -> str:
    return f"booting again: given the estimate's {blocks:,} KV blocks it ran out of memory; now sized by vLLM"


def _compile_key(plan: TrialPlan) -> tuple[Path, str]:
    """The compile cache's folder the server will use, and the trial's key in it (compile_cache.compile_key)."""
    env = server_env(plan.engine, os.environ)
    return Path(env["VLLM_CACHE_ROOT"]), compile_key(plan.engine.model, plan.engine.flags, env)


@dataclass(frozen=True)
class FirstBoot:
    """How a configuration's first server boots (plan_first_boot): its engine, given the estimate's KV blocks where
    it will compile (`blocks`; None: sized by vLLM), and its compile key in the cache, noted once a boot has compiled
    or loaded it. Shared by run_trial and benchmarks/record_surface.py."""

    engine: EngineSpec
    blocks: int | None
    cache_root: Path
    key: str

    def note(self, lines: list[str]) -> None:
        """After a boot: one that compiled or loaded the key leaves its artifacts in the cache, so the key's next
        boot is warm (and sized by vLLM)."""
        if compile_cache_state(lines) is not None:
            remember_key(self.cache_root, self.key)


def plan_first_boot(plan: TrialPlan, build: Build) -> FirstBoot:
    """The first boot of `plan`: given plan.warm_kv_blocks where its compile key is new (blocks_for_first_boot)."""
    cache_root, key = _compile_key(plan)
    blocks = blocks_for_first_boot(plan, build, key_is_new(cache_root, key))
    return FirstBoot(_given_blocks(plan.engine, blocks), blocks, cache_root, key)


def warm_kv_blocks(estimate: Estimate, cuda: bool) -> int | None:
    """The KV blocks the estimator predicts for a warm boot, which a boot that compiles is given (TrialPlan's
    warm_kv_blocks): on a GPU, where the central prediction fits, or where only a boot peak is in doubt (inside the
    band, not refused), which the blocks given do not move: vLLM sizing a boot that compiles leaves it 1-2 GiB short
    (h100-as-rtx3090-awq-marlin: the recipe, held down to a 3090's total, was left 36 Mamba blocks for 48 sequences
    and failed, then served warm with one block more than predicted). A KV cache that fits only at the band's optimistic
    end is left to vLLM."""
    usable = estimate.kv_fits and not estimate.refused  # an estimate that fits does both
    return estimate.num_blocks if cuda and usable and estimate.num_blocks > 0 else None


def blocks_for_first_boot(plan: TrialPlan, build: Build, compiles: bool) -> int | None:
    """The KV blocks a trial's first boot is given: the estimate's for a warm boot, where the boot will compile on
    the CUDA build (the CPU build's KV cache is VLLM_CPU_KVCACHE_SPACE either way) and the configuration does not
    size its KV cache itself."""
    if build is not Build.CUDA or not compiles or any(plan.engine.flags.get(f) for f in _OWN_KV_SIZE):
        return None
    return plan.warm_kv_blocks


_OWN_KV_SIZE = ("num_gpu_blocks_override", "kv_cache_memory_bytes")  # a configuration that sizes its KV cache itself


def _given_blocks(engine: EngineSpec, blocks: int | None) -> EngineSpec:
    """The engine with its KV cache set to `blocks`: vLLM still profiles (and compiles), then logs the figure it
    overrides ("Overriding num_gpu_blocks=X with num_gpu_blocks_override=Y"); the flag is in no compile key
    (config/cache.py, 0.25.0 and 0.32.0), so the next boot finds the artifacts this one compiled."""
    if blocks is None:
        return engine
    return dataclasses.replace(engine, flags={**engine.flags, "num_gpu_blocks_override": blocks})


def _kv_may_bind(plan: TrialPlan, boot: BootInfo) -> bool:
    """Whether a server's KV cache might not hold the search's first level at once (at most max_num_seqs of its
    requests run together). vLLM prints how many requests of max_model_len tokens it holds ("Maximum concurrency
    for N tokens per request"); shorter ones never need more. Its token count says less for a hybrid model, whose
    blocks hold 800-1568 tokens: 22,755 tokens held only 6 chat requests of ~700
    (benchmarks/data/h200-as-rtx3090-chat-cold-then-warm, trial 2). Not printed, or rate mode: it might."""
    search = plan.objective.load
    if search.mode != "concurrency" or not boot.max_concurrency:
        return True
    seqs = plan.engine.flags.get("max_num_seqs")
    running = first_level(search, plan.prior)
    if isinstance(seqs, int | float) and seqs > 0:
        running = min(running, float(seqs))
    return boot.max_concurrency < running


def server_memory_watch(engine: EngineSpec, build: Build, gpu_indices: Sequence[int] = ()) -> MemoryWatch:
    """NVML whenever vLLM is the CUDA build (hardware.memory_watch), on the GPUs the server may use."""
    cuda = build is Build.CUDA
    visible = engine.env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    return memory_watch(cuda, gpu_indices, visible, detect_gpus() if cuda else [])


def _measure(server: Server, plan: TrialPlan, value: float, seed_offset: int,
             cancel: threading.Event | None = None, exact: bool = True, power_gpus: Sequence[int] = ()) -> LevelOutcome:
    """One level; with `power_gpus` (NVML indices: the CUDA build), their power sampled through it for the energy
    per output token."""
    search, limits = plan.objective.load, plan.objective.limits
    level = LoadLevel(search.mode, value)
    # As many requests as it takes to know each limited p95 well enough (ladder.LoadSearch.stop_rule), within
    # [min, max]; a closed loop gets at least 3 rounds so that its steady window is not all ramp. A level that
    # is not `exact` may end sooner, once a sequential verdict is certain.
    rule = search.stop_rule(value, exact)
    w = search.warmup_requests
    workload = plan.objective.workload
    tokenize, decode = tokenizer_of(workload, plan.engine.model)
    requests = workload.requests(rule.max_requests + w, plan.vocab_size, seed_offset=seed_offset,
                                 tokenize=tokenize, decode=decode)
    cancelled = cancel or threading.Event()  # set: the level ends with the requests in flight (Ctrl-C)
    power = PowerSampler(power_gpus) if power_gpus else None
    if power is not None:
        power.start()
    try:
        run = measure_level(server.base_url, server.model, requests[w:], level, warmup=requests[:w],
                            seed=workload.arrival_seed(seed_offset), chat=workload.api == "chat",
                            enough=lambda done, flying, now: CANCELLED if cancelled.is_set() else
                            rule.reason(done, limits, flying, now))
    finally:
        samples = power.stop() if power is not None else []
    stats = level_stats(run, limits, samples)
    return LevelOutcome(stats, judge(stats, limits), hung=run.hung)
