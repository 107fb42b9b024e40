"""One trial end to end: a configuration in, a measured (or explained) result out.

Boot the server, find the highest load level that meets the objective's p95 limits, sample memory throughout,
stop the server. Every way this can go wrong becomes a field of the result, never an exception; the caller's
`on_level` hook can stop a trial between levels (a pruner, the budget's end) by returning a reason.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from autotune.engine.compile_cache import (
    CompileCache,
    boot_again_before_measuring,
    boot_again_warm,
    compile_cache_state,
)
from autotune.engine.flags import (
    Build,
    detect_build,
)
from autotune.engine.logs import BootInfo, Failure, FailureKind, while_serving
from autotune.engine.server import BootFailed, EngineSpec, Server
from autotune.fit.hardware import detect_gpus
from autotune.measure.client import STALLED, LoadLevel, measure_level
from autotune.measure.energy import PowerSampler
from autotune.measure.ladder import Ladder, SlaResult
from autotune.measure.memory import MemoryPeak, MemorySampler, MemoryWatch, memory_watch
from autotune.measure.plan import FirstBoot, TrialPlan, given_blocks, kv_may_bind, plan_first_boot
from autotune.measure.stats import LevelStats, Verdict, judge, level_stats
from autotune.measure.workload import tokenizer_of

Status = Literal["ok", "infeasible", "failed", "stopped"]


Stage = Callable[[str], None]


@dataclass(frozen=True)
class LevelOutcome:
    stats: LevelStats
    verdict: Verdict
    hung: bool = False  # the server sent nothing on any connection for the stall timeout (client.HUNG)



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
    # The objective's figure at the best level where it maximises another than the throughput (tokens per joule)
    maximized: float | None = None

    @property
    def value(self) -> float:
        """What the study maximises: the objective's figure at the best level (Objective.maximize)."""
        return self.throughput_tok_s if self.maximized is None else self.maximized

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


def run_trial(
    plan: TrialPlan,
    *,
    on_level: Callable[[int, float, LevelOutcome], str | None] | None = None,
    on_stage: Stage | None = None,
    cancel: threading.Event | None = None,
) -> TrialResult:
    """Boot (again, where _boot_again says), climb the load ladder, classify how the last server ended. The server
    is stopped however the trial ends."""
    t0 = time.monotonic()
    servers = _Servers.first(plan, detect_build(), on_stage or (lambda _s: None), cancel)
    servers.stage("booting")
    try:
        climb = _boot_and_climb(servers, on_level)
        return _classify(servers, climb, time.monotonic() - t0)
    finally:
        servers.stage("stopping")
        servers.stop()


@dataclass(frozen=True)
class _Again:
    """Boot the configuration again: why (said as a stage), and the first boot kept as the trial's ColdBoot (None:
    the port was taken, which says nothing of the configuration)."""

    why: str
    cold: ColdBoot | None = None


@dataclass
class _Servers:
    """The trial's server, one at a time, with its memory sampler. A trial boots again only through boot_again,
    when _boot_again says: the next server is sized by vLLM, and the first one's log is kept beside the trial's."""

    plan: TrialPlan
    build: Build
    first_boot: FirstBoot
    watch: MemoryWatch
    stage: Stage
    cancel: threading.Event | None
    server: Server
    blocks: int | None  # the KV blocks the server was given (warm_kv_blocks); None: sized by vLLM
    sampler: MemorySampler | None = None
    memory: MemoryPeak | None = None
    cold: ColdBoot | None = None  # the first boot, once the trial booted again after it
    boot_lines: list[str] = field(default_factory=list)  # the server's log when it came up or failed to
    hung: bool = False  # the last server measured went silent: nothing to drain when it stops

    @classmethod
    def first(cls, plan: TrialPlan, build: Build, stage: Stage, cancel: threading.Event | None) -> _Servers:
        # A boot that will compile is given the KV cache its warm boots get (compile_cache: vLLM profiles memory
        # while it compiles, 1-2 GiB short), so that one boot measures the configuration; vLLM's own sizing comes
        # back on any boot after.
        first = plan_first_boot(plan, build)
        server = Server(first.engine, plan.log_path)
        watch = server_memory_watch(plan.engine, build, plan.gpu_indices)
        return cls(plan, build, first, watch, stage, cancel, server, first.blocks)

    @property
    def cold_log(self) -> Path:
        return self.plan.log_path.with_suffix(".cold.log")

    def start(self) -> None:
        self.server.start()
        self.sampler = MemorySampler(root_pid=self.server.pid, gpu_indices=self.watch.gpu_indices or None,
                                     source=self.watch.source).start()

    def note_boot(self) -> None:
        """The log as the boot left it; a boot that compiled or loaded its key makes the key's next boot warm."""
        self.boot_lines = list(self.server.lines)
        self.first_boot.note(self.boot_lines)

    def boot_again(self, again: _Again) -> None:
        """Stop this server and make the next; a first boot's log is kept beside the trial's, and the next one
        is sized by vLLM."""
        assert self.sampler is not None
        self.sampler.stop()
        self.server.stop()
        if again.cold is not None:
            self.cold, self.blocks = again.cold, None
            self.plan.log_path.replace(self.cold_log)
        self.server = Server(given_blocks(self.plan.engine, self.blocks), self.plan.log_path)
        self.stage(again.why)

    def result(self, status: Status, levels: Sequence[tuple[float, LevelOutcome]], duration_s: float,
               **kw) -> TrialResult:
        if self.sampler is not None and self.memory is None:
            self.memory = self.sampler.stop()
        return TrialResult(status, levels=tuple(levels), duration_s=duration_s, log_path=self.plan.log_path,
                           memory=self.memory, log_error=self.server.log_error,
                           compile_cache=compile_cache_state(list(self.server.lines)), cold_boot=self.cold,
                           kv_blocks_set=self.blocks, **kw)

    def stop(self) -> None:
        if self.sampler is not None and self.memory is None:
            self.sampler.stop()
        # A failed boot or a hung server has nothing to drain.
        self.server.stop(grace_s=15.0 if self.server.healthy() and not self.hung else 3.0)


def _boot_again(s: _Servers, boot_s: float, *, failure: Failure | None = None, booting: bool = False,
                port_retried: bool = False, boot: BootInfo | None = None, passed: bool = False) -> _Again | None:
    """The boot-again policy, all of it: whether the configuration boots again, and why. Asked once a server is
    up (`boot`), once it failed to boot (`booting`, with its `failure`), and during its load search (a `failure`
    under load, or a level `passed`). The first server's figures are then not the configuration's:
      - the port was taken between our check and the server's bind (once per boot);
      - given the estimate's KV blocks (a boot that compiles), it ran out of memory, at boot or under load;
      - a cold compile (CUDA) ran out of memory at boot: the cache is warm now (compile_cache.boot_again_warm);
      - a cold CUDA server's KV cache, short by what compiling held, may not hold the first level, or a level
        passed on it, above which it would bind (compile_cache.boot_again_before_measuring).
    A server after the first, or one given the estimate's blocks, is otherwise measured as it is."""
    if failure is not None and booting and failure.kind is FailureKind.PORT_IN_USE and not port_retried:
        return _Again("booting (the port was taken; on another one)")
    if failure is not None and failure.kind.is_memory and s.blocks is not None:
        return _Again(_ran_out(s.blocks), ColdBoot(failure, boot_s, s.cold_log))
    if s.cold is not None or s.blocks is not None:
        return None
    if failure is not None:
        if booting and boot_again_warm(failure, s.boot_lines):
            return _Again("booting again: the cold boot (compiling) ran out of memory; the cache is warm now",
                          ColdBoot(failure, boot_s, s.cold_log))
        return None
    if not boot_again_before_measuring(s.build, s.boot_lines):
        return None
    if passed:
        return _Again("booting again: it passed on a cold boot, whose KV cache is short; measuring it warm",
                      ColdBoot(None, boot_s, s.cold_log))
    if boot is not None and kv_may_bind(s.plan, boot):
        return _Again("booting again: a cold boot (compiling) has less KV cache than this configuration; warm now",
                      ColdBoot(None, boot_s, s.cold_log))
    return None


@dataclass(frozen=True)
class _Climb:
    """How a server's load search ended: the levels it measured, and the ladder's result, or the server's
    failure, or the caller's reason to stop, or a reason to boot again (whose levels are then dropped)."""

    boot: BootInfo | None
    levels: tuple[tuple[float, LevelOutcome], ...] = ()
    sla: SlaResult[LevelOutcome] | None = None
    failure: Failure | None = None
    stop_reason: str = ""
    again: _Again | None = None


def _boot_and_climb(s: _Servers, on_level: Callable[[int, float, LevelOutcome], str | None] | None) -> _Climb:
    """Boot, then climb the load ladder, until a server's climb needs no boot again."""
    while True:
        booted = _boot(s)
        if isinstance(booted, Failure):
            return _Climb(None, failure=booted)
        climb = _climb(s, booted, on_level)
        if climb.again is None:
            return climb
        s.boot_again(climb.again)


def _boot(s: _Servers) -> BootInfo | Failure:
    """The server up (its BootInfo), booted again where _boot_again says; or why it cannot boot."""
    port_retried = False
    while True:
        s.start()
        try:
            boot = s.server.wait_ready(s.cancel)
        except BootFailed as e:
            s.note_boot()
            again = _boot_again(s, e.boot_s, failure=e.failure, booting=True, port_retried=port_retried)
            if again is None:
                return e.failure
            port_retried = port_retried or e.failure.kind is FailureKind.PORT_IN_USE
        else:
            s.note_boot()
            again = _boot_again(s, boot.boot_s, boot=boot)
            if again is None:
                assert s.sampler is not None
                s.sampler.serving()
                return boot
        s.boot_again(again)


def _climb(s: _Servers, boot: BootInfo, on_level: Callable[[int, float, LevelOutcome], str | None] | None) -> _Climb:
    """Measure the ladder's levels on this server until the ladder is done, the server fails, the caller stops
    the trial (on_level), or the configuration must boot again."""
    plan = s.plan
    ladder = Ladder(_passed, plan.objective.load, plan.prior)
    levels: list[tuple[float, LevelOutcome]] = []
    while ladder.next is not None:
        value, exact = ladder.next
        s.stage(f"level {len(levels) + 1}: {plan.objective.load.mode} {value:g}")
        outcome = _measure(s.server, plan, value, seed_offset=len(levels), cancel=s.cancel, exact=exact,
                           power_gpus=s.watch.gpu_indices if s.watch.source == "nvml" else ())
        levels.append((value, outcome))
        if (failure := _failed_at(s, value, outcome)) is not None:
            again = _boot_again(s, boot.boot_s, failure=failure)
            return _Climb(boot, tuple(levels), failure=failure, again=again)
        if outcome.verdict.passed and (again := _boot_again(s, boot.boot_s, passed=True)) is not None:
            return _Climb(boot, tuple(levels), again=again)
        if on_level is not None and (why := on_level(len(levels) - 1, value, outcome)):
            return _Climb(boot, tuple(levels), stop_reason=why)
        ladder.tell(outcome)
    return _Climb(boot, tuple(levels), sla=ladder.result)


def _passed(outcome: LevelOutcome) -> bool:
    return outcome.verdict.passed


def _failed_at(s: _Servers, value: float, outcome: LevelOutcome) -> Failure | None:
    """Why the server can measure no further after this level: it died, no request completed, it hung (then
    nothing is drained when it stops), or a process of it was stopped from outside (frozen). Requests that all
    failed can be seen before the log's cause: an out-of-memory line, once there, wins."""
    server, stats = s.server, outcome.stats
    at = f"{s.plan.objective.load.mode} {value:g}"
    if (failure := server.died(grace_s=3.0 if _going(stats.errors) else 0.0)) is not None:
        pass
    elif stats.completed == 0 and stats.failed > 0:
        failure = Failure(FailureKind.UNRESPONSIVE, f"no request completed at {at}: {next(iter(stats.errors), '')}")
    elif outcome.hung:  # alive, but silent: whatever the requests before it did, the trial ends here
        stalled = next((e for e in stats.errors if e.startswith(STALLED)), "")
        failure = Failure(FailureKind.UNRESPONSIVE, f"the server hung at {at}: {stalled}")
    else:
        return None
    if failure.kind is FailureKind.UNRESPONSIVE:  # silent: its own doing, or stopped from outside (not its flags')
        failure = server.frozen() or failure
    s.hung = failure.kind in (FailureKind.UNRESPONSIVE, FailureKind.FROZEN)
    seen = server.died()
    return while_serving(seen if seen is not None and seen.kind.is_memory else failure, at)


# vLLM's answer to a request once its engine died (EngineDeadError), as an HTTP 500 or a streamed error.
ENGINE_DEAD_REPLY = "EngineCore encountered an issue"


def _going(errors: Mapping[str, int]) -> bool:
    """Whether the requests' errors say the server is on its way out (a refused connection, or its engine dead):
    then it is given a moment to exit and its log to name the cause (an out-of-memory line)."""
    return any(e.startswith("connection error") or ENGINE_DEAD_REPLY in e for e in errors)


def _classify(s: _Servers, climb: _Climb, duration_s: float) -> TrialResult:
    """The trial's result from how its last server ended: failed to boot or died (infeasible when for memory),
    stopped by the caller, screened out at the incumbent's level, no level passed, or its best level."""
    levels, boot = climb.levels, climb.boot
    if climb.failure is not None:
        status: Status = "infeasible" if climb.failure.kind.is_memory else "failed"
        return s.result(status, levels, duration_s, boot=boot, failure=climb.failure)
    if climb.stop_reason:
        return s.result("stopped", levels, duration_s, boot=boot, stop_reason=climb.stop_reason)
    sla = climb.sla
    assert sla is not None  # a climb that neither failed nor stopped ran the ladder to its end
    if sla.screened_out:
        return s.result("stopped", levels, duration_s, boot=boot, stop_reason=SCREENED)
    if sla.best is None:
        lowest = min(levels, key=lambda lv: lv[0])[1].verdict  # the search may have come down to it
        return s.result("infeasible", levels, duration_s, boot=boot,
                        miss_ratio=max(lowest.misses.values(), default=None))
    maximize = s.plan.objective.maximize
    figure = sla.best.stats.figure(maximize)
    if figure is None:  # NVML gave no energy figure: the machine's doing, not the configuration's
        unmeasured = Failure(FailureKind.NOT_MEASURED, f"{maximize}: no energy figure (NVML gave no samples)")
        return s.result("failed", levels, duration_s, boot=boot, failure=unmeasured)
    return s.result("ok", levels, duration_s, boot=boot, throughput_tok_s=sla.best.stats.output_throughput,
                    maximized=None if maximize == "output_throughput" else figure, best_level=sla.best_level)


def _ran_out(blocks: int) -> str:
    return f"booting again: given the estimate's {blocks:,} KV blocks it ran out of memory; now sized by vLLM"


def server_memory_watch(engine: EngineSpec, build: Build, gpu_indices: Sequence[int] = ()) -> MemoryWatch:
    """NVML whenever vLLM is the CUDA build (memory.memory_watch), on the GPUs the server may use."""
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
    context = plan.engine.flags.get("max_model_len")
    requests = workload.requests(rule.max_requests + w, plan.vocab_size, seed_offset=seed_offset,
                                 tokenize=tokenize, decode=decode,
                                 context=context if isinstance(context, int) else None)
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
