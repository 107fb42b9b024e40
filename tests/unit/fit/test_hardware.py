"""GPU profiles, NVML detection (none on this machine) and the memory sampler, the RSS mode for real."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from autotune.errors import SpecError
from autotune.fit.hardware import (
    PROFILES,
    GpuInfo,
    card_mismatch,
    detect_gpus,
    get_profile,
    profile_for,
)
from autotune.measure.memory import MemoryReading, MemorySampler, PeakTracker
from autotune.units import GiB, MiB
from tests.nvml import nvml_available

# ---- profiles ---------------------------------------------------------------------------------------------------


def test_required_profiles_exist():
    for name in ("rtx3090", "rtx4090", "a100-40gb", "a100-80gb", "l40s", "h100-80gb", "h200", "cpu"):
        assert PROFILES[name].name == name


def test_rtx3090_figures():
    p = get_profile("rtx3090")
    assert p.memory_bytes == 24576 * MiB
    assert (p.bandwidth_gbs, p.compute_capability, p.fp16_tflops, p.fp8, p.kind) == (936.0, (8, 6), 71.0, False, "cuda")
    # vLLM logs show 23.53-23.69 GiB as CUDA's total on 24 GB cards: about 384 MiB is kept by the driver
    assert p.cuda_total_bytes == (24576 - 384) * MiB


def test_fp8_and_capabilities_follow_the_architectures():
    assert [get_profile(n).fp8 for n in ("a100-80gb", "rtx4090", "l40s", "h100-80gb", "h200")] == [
        False, True, True, True, True]
    assert get_profile("h200").memory_bytes > get_profile("h100-80gb").memory_bytes > 79 * GiB
    assert get_profile("a100-40gb").memory_bytes == 40 * GiB


def test_get_profile_is_case_insensitive_and_names_the_known_ones():
    assert get_profile(" RTX3090 ") is PROFILES["rtx3090"]
    with pytest.raises(SpecError) as err:
        get_profile("rtx2080")
    assert "rtx2080" in str(err.value) and "rtx3090" in str(err.value) and "h200" in str(err.value)


def test_cpu_profile_is_the_memory_vllm_budgets_from():
    cpu = get_profile("cpu")
    assert cpu.kind == "cpu" and 0 < cpu.memory_bytes <= psutil.virtual_memory().total


# ---- detection --------------------------------------------------------------------------------------------------


def test_detect_gpus_matches_nvml():
    gpus = detect_gpus()
    if not nvml_available():
        assert gpus == []
    else:
        assert gpus and all(g.total_bytes >= g.used_bytes for g in gpus)


def test_profile_for_matches_names_and_keeps_nvml_total():
    info = GpuInfo(0, "NVIDIA GeForce RTX 3090", 24576 * MiB, 300 * MiB, 24276 * MiB, "GPU-x")
    assert profile_for(info) == PROFILES["rtx3090"]
    a100 = profile_for(GpuInfo(0, "NVIDIA A100-SXM4-40GB", 40536 * MiB, 0, 40536 * MiB, "GPU-y"))
    assert a100.name == "a100-40gb" and a100.memory_bytes == 40536 * MiB
    assert profile_for(GpuInfo(1, "NVIDIA A100 80GB PCIe", 81920 * MiB, 0, 81920 * MiB, "GPU-z")).name == "a100-80gb"
    assert profile_for(GpuInfo(0, "NVIDIA H100 80GB HBM3", 81559 * MiB, 0, 0, "u")).name == "h100-80gb"
    # NVML v2's reserved figure, where the driver reports it, replaces the profile's estimate
    h200 = profile_for(GpuInfo(0, "NVIDIA H200", 143771 * MiB, 0, 0, "u", (9, 0), 4814.3, 600 * MiB))
    assert h200.name == "h200" and h200.cuda_total_bytes == (143771 - 600) * MiB



def test_a_study_naming_a_gpu_runs_only_on_a_card_of_its_size() -> None:
    """The estimator plans for the named card, the server sizes itself from the one present (NVML's totals as the
    device's H100 and H200 reported them)."""
    h100 = GpuInfo(0, "NVIDIA H100 80GB HBM3", 81559 * MiB, 0, 0, "u", (9, 0))
    rtx4090 = GpuInfo(0, "NVIDIA GeForce RTX 4090", 24564 * MiB, 0, 0, "u", (8, 9))
    rtx3090 = GpuInfo(1, "NVIDIA GeForce RTX 3090", 24576 * MiB, 0, 0, "u", (8, 6))
    assert card_mismatch("rtx3090", [rtx3090], cpu_build=False, capped=False) is None
    assert card_mismatch("rtx3090", [rtx4090], cpu_build=False, capped=False) is None  # the same size runs
    assert card_mismatch("auto", [], cpu_build=True, capped=False) is None
    assert card_mismatch("cpu", [], cpu_build=True, capped=False) is None
    assert "CPU build" in (card_mismatch("rtx3090", [], cpu_build=True, capped=False) or "")
    assert "no NVIDIA GPU" in (card_mismatch("RTX3090", [], cpu_build=False, capped=False) or "")
    bigger = card_mismatch("rtx3090", [rtx3090, h100], cpu_build=False, capped=False) or ""
    assert "GPU 0 is NVIDIA H100 80GB HBM3 (79.6 GiB, not 24.0)" in bigger and 'memory_cap_gib = "rtx3090"' in bigger
    assert 'hardware = "auto"' in (card_mismatch("rtx3090", [h100], cpu_build=False, capped=True) or "")


def test_profile_for_unknown_gpu_falls_back_to_nvml_figures():
    info = GpuInfo(0, "NVIDIA RTX A6000", 49140 * MiB, 0, 49140 * MiB, "GPU-a", (8, 6), 768.0)
    p = profile_for(info)
    assert (p.name, p.memory_bytes, p.compute_capability, p.bandwidth_gbs, p.fp8) == (
        "NVIDIA RTX A6000", 49140 * MiB, (8, 6), 768.0, False)


# ---- the sampler ------------------------------------------------------------------------------------------------


def test_peak_tracker_keeps_first_as_baseline_and_the_maximum():
    t = PeakTracker("nvml")
    for total, proc in [(500, None), (900, 400), (700, 600), (650, None)]:
        t.observe(MemoryReading(total, proc))
    peak = t.result()
    assert (peak.baseline_bytes, peak.peak_bytes, peak.samples, peak.process_peak_bytes, peak.source) == (
        500, 900, 4, 600, "nvml")


def test_once_serving_the_peak_starts_again_and_the_boots_is_kept():
    t = PeakTracker("nvml")
    for total in (500, 3000, 900):  # booting: compiling peaks high
        t.observe(MemoryReading(total, total - 100))
    t.serving()
    for total in (2000, 2400, 2200):
        t.observe(MemoryReading(total, total - 100))
    t.serving()  # only the first mark counts
    peak = t.result()
    assert (peak.boot_peak_bytes, peak.peak_bytes, peak.process_peak_bytes, peak.baseline_bytes, peak.samples) == (
        3000, 2400, 2300, 500, 6)
    assert PeakTracker("rss").result().boot_peak_bytes is None  # never ready: the whole trial's peak alone


def test_sampler_runs_a_reader_on_its_thread():
    values = iter(range(1, 10_000))
    sampler = MemorySampler(reader=lambda: MemoryReading(next(values)), source="nvml", interval_s=0.01)
    sampler.start()
    time.sleep(0.2)
    peak = sampler.stop()
    assert peak.source == "nvml" and peak.baseline_bytes == 1
    assert peak.samples >= 5 and peak.peak_bytes == peak.samples  # one reading per sample, the last is the peak


def test_sampler_needs_something_to_watch():
    with pytest.raises(ValueError):
        MemorySampler()


# A child that starts a grandchild; the grandchild allocates 200 MB once told to, then waits to be released.
GRANDCHILD = (
    "import sys\n"
    "sys.stdin.readline()\n"
    "block = b'x' * (200 * 1024 * 1024)\n"
    "print('ready', flush=True)\n"
    "sys.stdin.readline()\n"
)
CHILD = f"import subprocess, sys\nsys.exit(subprocess.call([sys.executable, '-c', {GRANDCHILD!r}]))\n"


def test_rss_sampler_sees_a_grandchild_allocate():
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not psutil.Process(proc.pid).children(recursive=True) and time.monotonic() < deadline:
            time.sleep(0.05)
        with MemorySampler(root_pid=proc.pid, interval_s=0.05) as sampler:
            assert proc.stdin and proc.stdout
            proc.stdin.write("go\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "ready"
            time.sleep(0.4)
            proc.stdin.write("done\n")
            proc.stdin.flush()
            assert proc.wait(timeout=20) == 0
        peak = sampler.peak
        assert peak is not None and peak.source == "rss" and peak.samples >= 5
        assert peak.peak_bytes - peak.baseline_bytes >= 190 * MiB  # only the grandchild allocated
        assert peak.baseline_bytes < 150 * MiB  # two small Python interpreters before the allocation
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_rss_sampler_of_this_process_as_a_context_manager():
    with MemorySampler(root_pid=os.getpid(), interval_s=0.02) as sampler:
        block = b"y" * (100 * MiB)
        time.sleep(0.15)
        del block
    assert sampler.peak is not None and sampler.peak.peak_bytes - sampler.peak.baseline_bytes >= 90 * MiB


# A child that allocates 1 GiB on GPU 0 through the CUDA driver API (no torch needed), then waits.
CUDA_CHILD = (
    "import ctypes, sys\n"
    "cuda = ctypes.CDLL('libcuda.so.1')\n"
    "ctx, ptr = ctypes.c_void_p(), ctypes.c_uint64()\n"
    "assert cuda.cuInit(0) == 0 and cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, 0) == 0\n"
    "sys.stdin.readline()\n"
    "assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1 << 30)) == 0\n"
    "print('ready', flush=True)\n"
    "sys.stdin.readline()\n"
)


@pytest.mark.skipif(not nvml_available(), reason="needs an NVIDIA GPU and driver")
def test_nvml_sampler_sees_a_child_allocate_on_a_real_gpu():
    gpus = detect_gpus()
    assert gpus and gpus[0].total_bytes > 0 and profile_for(gpus[0]).memory_bytes == gpus[0].total_bytes
    if gpus[0].reserved_bytes is not None:  # measured on an H200 (driver 580): 644,939,776 B
        assert profile_for(gpus[0]).cuda_total_bytes == gpus[0].total_bytes - gpus[0].reserved_bytes
    proc = subprocess.Popen([sys.executable, "-c", CUDA_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdin and proc.stdout
        time.sleep(2)  # let the context come up before the baseline
        with MemorySampler(gpu_indices=[0], root_pid=proc.pid, interval_s=0.05) as sampler:
            proc.stdin.write("go\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "ready"
            time.sleep(0.5)
            proc.stdin.write("done\n")
            proc.stdin.flush()
            assert proc.wait(timeout=30) == 0
        peak = sampler.peak
        assert peak is not None and peak.source == "nvml" and peak.samples >= 5
        assert peak.peak_bytes - peak.baseline_bytes >= 1000 * MiB
        if peak.process_peak_bytes is not None:  # withheld by some drivers / containers
            assert peak.process_peak_bytes >= 1 * GiB
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
