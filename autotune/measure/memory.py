"""Memory sampled while a server runs: NVML on a GPU, the process tree's RSS on the CPU build."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import psutil
import pynvml

from autotune.errors import EngineError
from autotune.fit.hardware import GpuInfo

MemorySource = Literal["nvml", "rss"]


class MemoryWatch(NamedTuple):
    source: MemorySource
    gpu_indices: tuple[int, ...]  # NVML indices; empty for RSS


def memory_watch(cuda_build: bool, slot_gpus: Sequence[int], cuda_visible_devices: str | None,
                 gpus: Sequence[GpuInfo]) -> MemoryWatch:
    """What a trial's memory sampler reads. With CUDA vLLM the server's memory is on the GPU, always: NVML on
    the slot's GPUs, else on those the environment's CUDA_VISIBLE_DEVICES names (indices or UUIDs), else on
    every GPU NVML sees. The host RSS of the server's processes only on the CPU build, where it is the memory."""
    if not cuda_build:
        return MemoryWatch("rss", ())
    if slot_gpus:
        return MemoryWatch("nvml", tuple(slot_gpus))
    if not gpus:
        raise EngineError("the CUDA build of vLLM is installed but NVML sees no GPU: the server's GPU memory "
                          "cannot be measured")
    named = [d.strip() for d in (cuda_visible_devices or "").split(",") if d.strip()]
    if not named:
        return MemoryWatch("nvml", tuple(g.index for g in gpus))
    indices = []
    for d in named:
        match = [g.index for g in gpus if (str(g.index) == d if d.isdigit() else g.uuid.startswith(d))]
        if len(match) != 1:
            raise EngineError(f"CUDA_VISIBLE_DEVICES={cuda_visible_devices}: {d!r} is not one GPU that NVML sees "
                              f"({', '.join(str(g.index) for g in gpus)})")
        indices.append(match[0])
    return MemoryWatch("nvml", tuple(indices))


@dataclass(frozen=True)
class MemoryPeak:
    """What a MemorySampler saw. baseline_bytes is the first sample (taken at start). Once the server was ready
    (boot_peak_bytes set), peak_bytes is the peak while it served: what the configuration holds. A boot's own
    peak can be higher and is not governed by gpu_memory_utilization (torch.compile and Triton while compiling:
    31.36 GiB recorded on the H200 capped to 24 GiB, which served at 23.05)."""

    peak_bytes: int
    source: Literal["nvml", "rss"]
    baseline_bytes: int
    samples: int
    process_peak_bytes: int | None = None  # NVML: peak summed usage of the watched processes, when reported
    boot_peak_bytes: int | None = None  # the peak until the server was ready; None: it never was
    # The reading when it became ready: what its boot left held (weights, KV cache, graphs, the CUDA context);
    # peak_bytes above it is what serving added (the caching allocator's growth beyond vLLM's profile run).
    ready_bytes: int | None = None


@dataclass(frozen=True)
class MemoryReading:
    """One sample: the device (or tree) total, and the watched processes' share where known."""

    total_bytes: int
    process_bytes: int | None = None


class PeakTracker:
    """The peak logic, apart from any reading: fed one MemoryReading per sample."""

    def __init__(self, source: Literal["nvml", "rss"]):
        self.source = source
        self.samples = 0
        self.baseline = 0
        self.peak = 0
        self.process_peak: int | None = None
        self.boot_peak: int | None = None
        self.last: int | None = None
        self.ready: int | None = None

    def serving(self) -> None:
        """The server is ready: what was seen so far is the boot's peak; the peak starts again."""
        if self.boot_peak is None:
            self.boot_peak, self.peak, self.process_peak, self.ready = self.peak, 0, None, self.last

    def observe(self, reading: MemoryReading) -> None:
        if self.samples == 0:
            self.baseline = reading.total_bytes
        self.samples += 1
        self.last = reading.total_bytes
        self.peak = max(self.peak, reading.total_bytes)
        if reading.process_bytes is not None:
            self.process_peak = max(self.process_peak or 0, reading.process_bytes)

    def result(self) -> MemoryPeak:
        return MemoryPeak(self.peak, self.source, self.baseline, self.samples, self.process_peak, self.boot_peak,
                          self.ready)


def tree_pids(root_pid: int) -> list[int]:
    """The root and all its living descendants (empty when the root is gone)."""
    try:
        root = psutil.Process(root_pid)
        return [root_pid] + [child.pid for child in root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def read_rss(root_pid: int) -> MemoryReading:
    """Summed RSS of a process tree; processes that exit mid-read count as zero."""
    total = 0
    for pid in tree_pids(root_pid):
        try:
            total += psutil.Process(pid).memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return MemoryReading(total, total)


def _used_bytes(handle: object) -> int:
    # NVML's v2 "used" leaves out what the driver reserves (615 MiB on an H200): the figure nvidia-smi shows,
    # and what the processes on the GPU hold. Older drivers only answer v1, whose "used" includes it.
    try:
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).used)
    except (pynvml.NVMLError, AttributeError, TypeError):
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)


def read_nvml(indices: Sequence[int], root_pid: int | None = None) -> MemoryReading:
    """Device memory used on the given GPUs; with root_pid, also what that tree's processes hold there.
    NVML must be initialised by the caller. Per-process figures are None where the driver withholds them."""
    used = 0
    process: int | None = None
    pids = set(tree_pids(root_pid)) if root_pid is not None else set()
    for index in indices:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        used += _used_bytes(handle)
        if pids:
            try:
                running = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except pynvml.NVMLError:
                continue
            for proc in running:
                if proc.pid in pids and proc.usedGpuMemory is not None:
                    process = (process or 0) + int(proc.usedGpuMemory)
    return MemoryReading(used, process)


class MemorySampler:
    """Samples memory every interval_s on a background thread and keeps the peak.

    With gpu_indices it reads NVML (device memory used, plus the per-process share of root_pid's tree);
    without, it reads the summed RSS of root_pid's tree (the CPU build). `reader` replaces the reading for
    tests of the peak logic. Use start()/stop() or `with MemorySampler(...) as s:` then `s.peak`.
    """

    def __init__(
        self,
        *,
        root_pid: int | None = None,
        gpu_indices: Sequence[int] | None = None,
        interval_s: float = 0.2,
        reader: Callable[[], MemoryReading] | None = None,
        source: MemorySource | None = None,
    ):
        if reader is None and not gpu_indices and root_pid is None:
            raise ValueError("MemorySampler needs gpu_indices (NVML) or root_pid (RSS)")
        self.source: Literal["nvml", "rss"] = source or ("nvml" if gpu_indices else "rss")
        self.interval_s = interval_s
        self._gpu_indices = tuple(gpu_indices or ())
        self._root_pid = root_pid
        self._reader = reader
        self._tracker = PeakTracker(self.source)
        self._lock = threading.Lock()  # the sampling thread observes; the trial's thread marks serving
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml_started = False
        self.peak: MemoryPeak | None = None

    def _read(self) -> MemoryReading:
        if self._reader is not None:
            return self._reader()
        if self.source == "nvml":
            return read_nvml(self._gpu_indices, self._root_pid)
        assert self._root_pid is not None
        return read_rss(self._root_pid)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            reading = self._read()
            with self._lock:
                self._tracker.observe(reading)

    def start(self) -> MemorySampler:
        if self._thread is not None:
            raise RuntimeError("MemorySampler already started")
        if self.source == "nvml" and self._reader is None:
            pynvml.nvmlInit()  # NVMLError propagates: asked for NVML where there is none
            self._nvml_started = True
        self._tracker.observe(self._read())  # the baseline, before anything else runs
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)
        self._thread.start()
        return self

    def serving(self) -> None:
        """The server is ready: from here the peak is the serving one (MemoryPeak)."""
        reading = self._read()
        with self._lock:
            self._tracker.observe(reading)
            self._tracker.serving()

    def stop(self) -> MemoryPeak:
        if self._thread is None:
            raise RuntimeError("MemorySampler was not started")
        self._stop.set()
        self._thread.join()
        try:
            self._tracker.observe(self._read())
        finally:
            if self._nvml_started:
                pynvml.nvmlShutdown()
                self._nvml_started = False
        self.peak = self._tracker.result()
        return self.peak

    def __enter__(self) -> MemorySampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
