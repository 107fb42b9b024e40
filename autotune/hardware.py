"""GPU profiles, NVML detection and the memory sampler.

Profiles carry the spec-sheet figures the estimator and the reports need. Detection and sampling go through
NVML (nvidia-ml-py) on a GPU; on the CPU build the "device" is the memory node vLLM's CPU worker sizes itself
from, and memory is the resident set of the server's process tree.
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import psutil
import pynvml

from autotune.errors import EngineError, SpecError

MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True)
class GpuProfile:
    """One accelerator as the estimator sees it. memory_bytes is the total the driver (NVML) reports."""

    name: str
    memory_bytes: int
    bandwidth_gbs: float
    compute_capability: tuple[int, int]
    fp16_tflops: float  # dense FP16/BF16 tensor rate with FP32 accumulate
    fp8: bool  # FP8 tensor cores (Ada, Hopper and later)
    kind: Literal["cuda", "cpu"] = "cuda"
    # Part of memory_bytes the driver keeps from CUDA: cudaMemGetInfo's total (which vLLM multiplies by
    # gpu_memory_utilization) is memory_bytes - driver_reserved_bytes. NVML v2 reports it as "reserved".
    driver_reserved_bytes: int = 0

    @property
    def cuda_total_bytes(self) -> int:
        return self.memory_bytes - self.driver_reserved_bytes


def _node_memory_bytes() -> int:
    """Total memory vLLM's CPU worker budgets from, as vllm.utils.cpu_resource_utils.get_memory_node_info
    computes it: MemTotal of the NUMA node of the first allowed CPU (system total when there is no node
    file), clamped by a cgroup memory limit. This is not the machine's `free` total on multi-node hosts."""
    node = 0
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    cpu_dir = f"/sys/devices/system/cpu/cpu{cpus[0]}"
    if os.path.isdir(cpu_dir):
        for entry in os.listdir(cpu_dir):
            if re.fullmatch(r"node\d+", entry):
                node = int(entry[4:])
    total = psutil.virtual_memory().total
    try:
        with open(f"/sys/devices/system/node/node{node}/meminfo") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 4 and parts[2] == "MemTotal:":
                    total = int(parts[3]) * 1024
    except OSError:
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < (1 << 62):
            total = min(total, int(text))
        break
    return total


def cpu_profile() -> GpuProfile:
    """The CPU build's 'device': the memory vLLM budgets from (its KV cache comes out of this)."""
    return GpuProfile("cpu", _node_memory_bytes(), 0.0, (0, 0), 0.0, False, "cpu")


# Figures from NVIDIA's own documents; memory_bytes is the NVML/nvidia-smi total for the board.
#  rtx3090:   NVIDIA Ampere GA102 GPU Architecture whitepaper (v2.1), Appendix A: 24 GB GDDR6X, 936 GB/s,
#             FP16 tensor with FP32 accumulate 71 TFLOPS dense; CUDA compute capability 8.6 (CUDA C Guide).
#  rtx4090:   NVIDIA Ada GPU Architecture whitepaper (v2.1), Appendix A: 24 GB GDDR6X, 1008 GB/s,
#             FP16 tensor with FP32 accumulate 165.2 TFLOPS dense, FP8 tensor cores; compute capability 8.9.
#  a100-*:    NVIDIA A100 Tensor Core GPU datasheet: BF16/FP16 tensor 312 TFLOPS dense; 40GB HBM2 1,555 GB/s;
#             80GB HBM2e SXM 2,039 GB/s; compute capability 8.0.
#  l40s:      NVIDIA L40S datasheet: 48 GB GDDR6 ECC, 864 GB/s, BF16/FP16 tensor 362.05 TFLOPS dense
#             (733 with sparsity), FP8 tensor cores; compute capability 8.9. NVML total 46068 MiB.
#  h100-80gb: NVIDIA H100 Tensor Core GPU datasheet (SXM5): 80 GB HBM3, 3.35 TB/s, BF16/FP16 tensor 989.4
#             TFLOPS dense (1,979 with sparsity), FP8; compute capability 9.0. NVML total 81559 MiB.
#  h200:      NVIDIA H200 Tensor Core GPU datasheet (SXM): 141 GB HBM3e, 4.8 TB/s, BF16/FP16 tensor 989 TFLOPS
#             dense, FP8; compute capability 9.0. NVML total 143771 MiB.
# driver_reserved_bytes: H200 measured here (driver 580.159: NVML v2 reserved 644,939,776 B, and cuMemGetInfo's
# total = NVML total - that, exactly). 24 GB GeForce cards: vLLM logs show total_gpu_memory 23.53-23.69 GiB, so
# about 384 MiB. Others: an estimate (512 MiB) until measured; profile_for replaces it with NVML's figure.
PROFILES: dict[str, GpuProfile] = {
    "rtx3090": GpuProfile("rtx3090", 24576 * MiB, 936.0, (8, 6), 71.0, False, "cuda", 384 * MiB),
    "rtx4090": GpuProfile("rtx4090", 24564 * MiB, 1008.0, (8, 9), 165.2, True, "cuda", 384 * MiB),
    "a100-40gb": GpuProfile("a100-40gb", 40960 * MiB, 1555.0, (8, 0), 312.0, False, "cuda", 512 * MiB),
    "a100-80gb": GpuProfile("a100-80gb", 81920 * MiB, 2039.0, (8, 0), 312.0, False, "cuda", 512 * MiB),
    "l40s": GpuProfile("l40s", 46068 * MiB, 864.0, (8, 9), 362.05, True, "cuda", 512 * MiB),
    "h100-80gb": GpuProfile("h100-80gb", 81559 * MiB, 3350.0, (9, 0), 989.4, True, "cuda", 512 * MiB),
    "h200": GpuProfile("h200", 143771 * MiB, 4800.0, (9, 0), 989.0, True, "cuda", 644_939_776),
    "cpu": cpu_profile(),
}


def get_profile(name: str) -> GpuProfile:
    """A profile by its name (case-insensitive); SpecError naming the known ones otherwise."""
    key = name.strip().lower()
    # The CPU build budgets from NUMA node 0 as it is at each boot (it can change while a study runs).
    profile = cpu_profile() if key == "cpu" else PROFILES.get(key)
    if profile is None:
        known = ", ".join(sorted(PROFILES))
        raise SpecError("hardware", "gpu", f"unknown GPU profile {name!r}; known: {known}")
    return profile


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML reports it now. The optional figures feed profile_for's fallback."""

    index: int
    name: str
    total_bytes: int
    used_bytes: int
    free_bytes: int
    uuid: str
    compute_capability: tuple[int, int] | None = None
    bandwidth_gbs: float | None = None
    reserved_bytes: int | None = None  # NVML v2 "reserved" (kept from CUDA); None on drivers without v2


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _optional_figures(handle: object) -> tuple[tuple[int, int] | None, float | None]:
    """Compute capability and peak bandwidth (bus width x max memory clock x 2, double data rate)."""
    try:
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        cc: tuple[int, int] | None = (int(major), int(minor))
    except pynvml.NVMLError:
        cc = None
    try:
        bus_bits = pynvml.nvmlDeviceGetMemoryBusWidth(handle)
        clock_mhz = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)
        bandwidth: float | None = bus_bits / 8 * clock_mhz * 2 / 1000
    except pynvml.NVMLError:
        bandwidth = None
    return cc, bandwidth


def detect_gpus() -> list[GpuInfo]:
    """Every GPU NVML sees; [] where NVML cannot start (no driver, no GPU)."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)  # v1: "used" includes the reserved part
            try:
                reserved: int | None = int(
                    pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).reserved
                )
            except pynvml.NVMLError:
                reserved = None
            cc, bandwidth = _optional_figures(handle)
            found.append(
                GpuInfo(
                    index=index,
                    name=_text(pynvml.nvmlDeviceGetName(handle)),
                    total_bytes=int(mem.total),
                    used_bytes=int(mem.used),
                    free_bytes=int(mem.free),
                    uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                    compute_capability=cc,
                    bandwidth_gbs=bandwidth,
                    reserved_bytes=reserved,
                )
            )
        return found
    finally:
        pynvml.nvmlShutdown()


# (pattern on the lower-cased NVML name, profile; a100 picks by memory below)
_NAME_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"rtx 3090", "rtx3090"),
    (r"rtx 4090", "rtx4090"),
    (r"l40s", "l40s"),
    (r"h200", "h200"),
    (r"h100.*(80gb|hbm3|sxm|pcie)", "h100-80gb"),
    (r"a100", "a100"),
)


def profile_for(info: GpuInfo) -> GpuProfile:
    """The known profile whose name matches NVML's (with NVML's real total), else one built from NVML."""
    lowered = info.name.lower()
    for pattern, key in _NAME_PATTERNS:
        if re.search(pattern, lowered) and not ("rtx 3090 ti" in lowered and key == "rtx3090"):
            if key == "a100":
                key = "a100-80gb" if info.total_bytes > 48 * GiB else "a100-40gb"
            known = PROFILES[key]
            reserved = known.driver_reserved_bytes if info.reserved_bytes is None else info.reserved_bytes
            return dataclasses.replace(known, memory_bytes=info.total_bytes, driver_reserved_bytes=reserved)
    cc = info.compute_capability or (0, 0)
    return GpuProfile(
        name=info.name,
        memory_bytes=info.total_bytes,
        bandwidth_gbs=info.bandwidth_gbs or 0.0,
        compute_capability=cc,
        fp16_tflops=0.0,  # unknown: NVML has no tensor-rate query
        fp8=cc >= (8, 9),
        kind="cuda",
        driver_reserved_bytes=info.reserved_bytes if info.reserved_bytes is not None else 512 * MiB,
    )


# ---- the memory sampler -------------------------------------------------------------------------------------

MemorySource = Literal["nvml", "rss"]
# How a peak is named wherever it is shown: a GPU's memory and a process tree's host memory are not comparable.
MEMORY_SOURCE_NAMES: dict[str, str] = {"nvml": "GPU memory (NVML)", "rss": "host memory (RSS of the server's processes)"}


def memory_source_name(source: str | None) -> str:
    return MEMORY_SOURCE_NAMES.get(source or "", "memory (source not recorded)")


MEMORY_SOURCE_SHORT: dict[str, str] = {"nvml": "GPU (NVML)", "rss": "host RSS"}


def memory_text(gib: float | None, source: str | None, short: bool = False) -> str:
    """'20.57 GiB GPU memory (NVML)', '3.40 GiB host RSS' (short): a peak with what it measured."""
    if gib is None:
        return "-"
    return f"{gib:.2f} GiB " + (MEMORY_SOURCE_SHORT.get(source or "", "(source?)") if short
                                else memory_source_name(source))


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
    """What a MemorySampler saw. baseline_bytes is the first sample (taken at start)."""

    peak_bytes: int
    source: Literal["nvml", "rss"]
    baseline_bytes: int
    samples: int
    process_peak_bytes: int | None = None  # NVML: peak summed usage of the watched processes, when reported


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

    def observe(self, reading: MemoryReading) -> None:
        if self.samples == 0:
            self.baseline = reading.total_bytes
        self.samples += 1
        self.peak = max(self.peak, reading.total_bytes)
        if reading.process_bytes is not None:
            self.process_peak = max(self.process_peak or 0, reading.process_bytes)

    def result(self) -> MemoryPeak:
        return MemoryPeak(self.peak, self.source, self.baseline, self.samples, self.process_peak)


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
            self._tracker.observe(self._read())

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

