"""GPU profiles, NVML detection and the memory sampler.

Profiles carry the spec-sheet figures the estimator and the reports need. Detection and sampling go through
NVML (nvidia-ml-py) on a GPU; on the CPU build the "device" is the memory node vLLM's CPU worker sizes itself
from, and memory is the resident set of the server's process tree.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from dataclasses import dataclass
from typing import Literal

import psutil
import pynvml

from autotune.errors import SpecError
from autotune.units import GiB, MiB, format_gib


@functools.cache
def host_has_avx512_bf16() -> bool:
    """Whether this CPU has AVX512-BF16: the CPU build's accelerated GDN path, which resets the state dtype."""
    try:
        with open("/proc/cpuinfo") as f:
            return "avx512_bf16" in f.read()
    except OSError:
        return False


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
    # What other processes held on the card when the study began (a desktop's display server): vLLM still budgets
    # a share of the whole card, but its startup check and every peak must fit in what they leave (held_by_others).
    held_bytes: int = 0
    # The CPU build only: whether the CPU has AVX512-BF16 (its accelerated GDN path resets the SSM state dtype).
    # A machine's fact: a recorded boot is replayed with its own machine's, never with the one running the replay.
    avx512_bf16: bool = False

    @property
    def cuda_total_bytes(self) -> int:
        return self.memory_bytes - self.driver_reserved_bytes

    @property
    def usable_bytes(self) -> int:
        """What this card's CUDA total leaves to autotune's servers beside the other processes' memory."""
        return self.cuda_total_bytes - self.held_bytes

    @property
    def label(self) -> str:
        """The card as a person reads it, with what others hold on it."""
        return self.name + (f" ({format_gib(self.held_bytes, 2)} held by other processes)" if self.held_bytes else "")


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


def cpu_profile(avx512_bf16: bool | None = None) -> GpuProfile:
    """The CPU build's 'device': the memory vLLM budgets from (its KV cache comes out of this), and whether the
    CPU has AVX512-BF16 (None: this machine's)."""
    bf16 = host_has_avx512_bf16() if avx512_bf16 is None else avx512_bf16
    return GpuProfile("cpu", _node_memory_bytes(), 0.0, (0, 0), 0.0, False, "cpu", avx512_bf16=bf16)


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


def card_mismatch(named: str, found: list[GpuInfo], cpu_build: bool, capped: bool) -> str | None:
    """Why a study that names a GPU profile cannot run on the GPUs found (None: it can). The estimator plans for
    the named card while the server sizes itself from the card present: on another size of card every refusal
    and every figure would be the wrong card's. A card of the same size (an RTX 4090 for the rtx3090 study) runs."""
    key = named.strip().lower()
    if key in ("auto", "cpu"):
        return None
    if cpu_build:
        return (f"names the GPU profile {key!r}, but the installed vLLM is the CPU build; run the study where the "
                "card is (`autotune estimate` shows its plan here)")
    if not found:
        return (f"names the GPU profile {key!r}, but NVML finds no NVIDIA GPU on this machine; run the study where "
                "the card is (`autotune estimate` shows its plan here)")
    want = PROFILES[key].memory_bytes
    for info in found:
        if abs(info.total_bytes - want) > 0.05 * want:
            present = f"GPU {info.index} is {info.name} ({info.total_bytes / GiB:.1f} GiB, not {want / GiB:.1f})"
            if capped:
                return (f"names {key!r}, but {present}: under memory_cap_gib set hardware = \"auto\", so that the cap "
                        "is translated for the card present")
            return (f"names {key!r}, but {present}: set hardware = \"auto\" to tune for this card, or add "
                    f"memory_cap_gib = \"{key}\" beside it to tune as a {key} on it")
    return None


def held_by_others(gpus: list[GpuInfo], profile: GpuProfile) -> int:
    """What processes hold on the busiest of `gpus` now, as CUDA would miss it: NVML's used (v1: the driver's
    reserve included) less the reserve. Read before autotune's first server, it is a display server, a notebook,
    another user's job: memory no configuration can have."""
    def held(g: GpuInfo) -> int:
        return max(0, g.used_bytes - (profile.driver_reserved_bytes if g.reserved_bytes is None else g.reserved_bytes))
    return max(map(held, gpus), default=0)


# How a peak is named wherever it is shown: a GPU's memory and a process tree's host memory are not comparable.
MEMORY_SOURCE_NAMES: dict[str, str] = {"nvml": "GPU memory (NVML)",
                                       "rss": "host memory (RSS of the server's processes)"}


MEMORY_SOURCE_SHORT: dict[str, str] = {"nvml": "GPU (NVML)", "rss": "host RSS"}
