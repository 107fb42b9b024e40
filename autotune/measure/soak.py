"""The soak: before a winner is final, it serves the objective's load for a while on a fresh boot.

A measurement climbs the load ladder for a minute or two; what a user meets in the first hour is not in it: a
request that errors or comes back empty now and then, memory that creeps past what vLLM reserved until the card
runs out (what owners of a 24 GB card check by hand before they keep a configuration). So the winner serves its
own load level for `seconds`, and `Soak.verdict` says whether it held up: no request errored, no reply was empty,
and the memory did not grow past what vLLM reserved. What vLLM reserved is the reading once the server was ready
on a GPU (NVML: the KV cache, weights and graphs are allocated at boot); on the CPU build the KV cache's pages are
counted in the process tree's RSS only once first touched, so there it is the peak over the soak's first quarter.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pynvml

from autotune.engine.flags import detect_build
from autotune.engine.server import BootFailed, Server
from autotune.measure.client import LoadLevel, RequestRecord, measure_level
from autotune.measure.memory import MemoryReading, read_nvml, read_rss
from autotune.measure.plan import TrialPlan
from autotune.measure.trial import server_memory_watch
from autotune.measure.workload import tokenizer_of
from autotune.units import format_gib

WARM_SHARE = 0.25  # of the soak: on the CPU build, the KV cache's pages are touched while this much is served


GROWTH_SHARE = 0.02  # memory may grow this share past what vLLM reserved (allocator and Python noise) ...


GROWTH_MIN_BYTES = 128 * 2**20  # ... and at least this much (a small CPU server's RSS moves by tens of MiB)


SAMPLE_S = 0.5  # between memory readings


EMPTY = "stream carried no tokens"  # client._settle's error for a reply without a token


@dataclass(frozen=True)
class MemorySample:
    at_s: float  # seconds since the server was ready
    used_bytes: int


@dataclass(frozen=True)
class Soak:
    """What the soak saw; `verdict` judges it. Stored with the comparison (as_attr, from_attr)."""

    seconds: float  # how long it served the load (0: it never served)
    level: str  # the load it served: "concurrency 14"
    requests: int
    errors: int  # requests that failed, empty replies not counted
    empty: int  # replies that carried no token
    source: str  # "nvml" or "rss"
    reserved_bytes: int | None  # what vLLM reserved (see the module's note); None: not measured
    peak_bytes: int | None  # the peak after that
    first_error: str = ""
    failure: str = ""  # why it never served or stopped serving (a boot that failed, a server that died)

    @property
    def growth_bytes(self) -> int:
        if self.reserved_bytes is None or self.peak_bytes is None:
            return 0
        return max(0, self.peak_bytes - self.reserved_bytes)

    @property
    def allowed_growth_bytes(self) -> int:
        return max(GROWTH_MIN_BYTES, int(GROWTH_SHARE * (self.reserved_bytes or 0)))

    @property
    def verdict(self) -> str:
        """Why it failed its soak ("3 of 240 requests errored: ..."), or "" when it held up."""
        if self.failure:
            return self.failure
        if self.requests == 0:
            return "no request completed"
        if self.errors:
            return f"{self.errors} of {self.requests} requests errored ({self.first_error})"
        if self.empty:
            return f"{self.empty} of {self.requests} replies were empty"
        if self.growth_bytes > self.allowed_growth_bytes:
            return (f"its memory grew {format_gib(self.growth_bytes, 2)} past what vLLM reserved "
                    f"({format_gib(self.reserved_bytes or 0, 2)})")
        return ""

    @property
    def text(self) -> str:
        """"soaked 120 s at concurrency 14: 240 requests, no error, no empty reply, memory within what vLLM
        reserved (+0.01 GiB)", or why it failed."""
        if self.verdict:
            return f"failed its soak: {self.verdict}"
        return (f"soaked {self.seconds:.0f} s at {self.level}: {self.requests} requests, no error, no empty reply, "
                f"memory within what vLLM reserved (+{format_gib(self.growth_bytes, 2)})")

    def as_attr(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_attr(doc: dict[str, Any]) -> Soak:
        return Soak(**doc)


def memory_after_warm_up(samples: Sequence[MemorySample], ready_bytes: int | None, source: str,
                         seconds: float) -> tuple[int | None, int | None]:
    """(what vLLM reserved, the peak after it) from the readings of a soak of `seconds` (see the module's note)."""
    if not samples:
        return ready_bytes, None
    warm = WARM_SHARE * seconds if source == "rss" else 0.0
    during = [s.used_bytes for s in samples if s.at_s <= warm]
    reserved = max([*during, *([ready_bytes] if ready_bytes is not None else [])], default=None)
    after = [s.used_bytes for s in samples if s.at_s > warm]
    return reserved, max(after, default=None)


def count_replies(records: Sequence[RequestRecord]) -> tuple[int, int, str]:
    """(errored, empty, the first error) of a soak's requests."""
    empty = [r for r in records if r.error == EMPTY or (r.error is None and r.output_tokens == 0)]
    errored = [r for r in records if r.error is not None and r.error != EMPTY]
    return len(errored), len(empty), next((r.error or "" for r in errored), "")


class _Readings:
    """Memory read every SAMPLE_S on a thread, each reading kept with its time since `t0`."""

    def __init__(self, read: Any, t0: float):
        self.read, self.t0 = read, t0
        self.samples: list[MemorySample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-memory", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            reading: MemoryReading = self.read()
            self.samples.append(MemorySample(time.monotonic() - self.t0, reading.total_bytes))

    def __enter__(self) -> _Readings:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_soak(plan: TrialPlan, level: LoadLevel, seconds: float, cancel: threading.Event | None = None) -> Soak:
    """Boot the plan's server, serve `level` of the objective's load for `seconds`, stop it; what it saw."""
    watch = server_memory_watch(plan.engine, detect_build(), plan.gpu_indices)
    at = f"{level.mode} {level.value:g}"
    server = Server(plan.engine, plan.log_path)
    if watch.source == "nvml":
        pynvml.nvmlInit()
    try:
        server.start()
        try:
            server.wait_ready(cancel)
        except BootFailed as e:
            return Soak(0.0, at, 0, 0, 0, watch.source, None, None, failure=f"it did not boot: {e.failure.reason}")
        assert server.pid is not None
        pid = server.pid

        def read() -> MemoryReading:
            return read_nvml(watch.gpu_indices, pid) if watch.source == "nvml" else read_rss(pid)

        ready, t0 = read().total_bytes, time.monotonic()
        with _Readings(read, t0) as readings:
            records, failure = _serve(server, plan, level, t0 + seconds, cancel)
        served = time.monotonic() - t0
    finally:
        server.stop()
        if watch.source == "nvml":
            pynvml.nvmlShutdown()
    reserved, peak = memory_after_warm_up(readings.samples, ready, watch.source, served)
    errors, empty, first = count_replies(records)
    return Soak(served, at, len(records), errors, empty, watch.source, reserved, peak, first, failure)


def _serve(server: Server, plan: TrialPlan, level: LoadLevel, until: float,
           cancel: threading.Event | None) -> tuple[list[RequestRecord], str]:
    """Rounds of the objective's requests at `level` until the monotonic time `until`: the records, and why the
    server stopped serving ("" while it served to the end)."""
    workload, load = plan.objective.workload, plan.objective.load
    tokenize, decode = tokenizer_of(workload, plan.engine.model)
    per_round = max(load.max_requests, 4 * int(level.value))
    records: list[RequestRecord] = []
    round_ = 0
    while time.monotonic() < until and not (cancel is not None and cancel.is_set()):
        specs = workload.requests(per_round + load.warmup_requests, plan.vocab_size, seed_offset=1000 + round_,
                                  tokenize=tokenize, decode=decode)
        warm = specs[:load.warmup_requests] if round_ == 0 else []
        run = measure_level(server.base_url, server.model, specs[len(warm):], level, warmup=warm,
                            seed=workload.arrival_seed(1000 + round_), chat=workload.api == "chat",
                            enough=lambda done, flying, now: "soaked" if time.monotonic() >= until else None)
        records += run.records
        if (died := server.died()) is not None:
            return records, f"the server died: {died.reason}"
        if run.hung:
            return records, run.stop_reason
        round_ += 1
    return records, ""
