"""GPU-only code paths, exercised on CPU machines with real output captured on an H200 (vLLM 0.25.0 CUDA,
Qwen3.5-27B-shaped AWQ model with random weights, capped to behave as a 24 GiB card; the runbook is
benchmarks/h200/).

Logs, NVML readings and nvidia-smi readings under tests/data/gpu are verbatim from that run (the NVML and
nvidia-smi series thinned to one sample a second, their peaks kept).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from autotune.config.study_file import load_study
from autotune.engine import defaults
from autotune.engine.defaults import (
    default_gpu_memory_utilization,
    hybrid_prefix_caching_default,
)
from autotune.engine.logs import (
    FailureKind,
    classify_line,
    classify_log,
    parse_boot_info,
)
from autotune.errors import SpecError
from autotune.fit import memcap
from autotune.fit.estimate import estimate
from autotune.fit.hardware import PROFILES, GpuInfo, profile_for
from autotune.fit.model_shape import ModelShape
from autotune.measure.memory import MemoryReading, PeakTracker
from autotune.units import GiB, MiB

DATA = Path(__file__).parents[2] / "data" / "gpu"
ROOT = Path(__file__).parents[3]
CONFIG = ROOT / "autotune" / "engine" / "known_models" / "qwen3.5-27b-awq.json"  # the model the run served


def lines(name: str) -> list[str]:
    return (DATA / name).read_text().splitlines()


def h200() -> GpuInfo:
    info = json.loads((DATA / "h200-idle.json").read_text())["nvml"][0]
    return GpuInfo(**{**info, "compute_capability": tuple(info["compute_capability"])})


# ---- the engine on CUDA logs --------------------------------------------------------------------------------


def within_cap(process_peak_bytes: int, cap: memcap.MemoryCap) -> bool:
    """Whether what the server's processes held on the GPU (NVML per-process peak) fits the capped card's CUDA
    total. That memory includes the CUDA context, which the small card would hold too."""
    return process_peak_bytes <= cap.cuda_total_bytes


def test_cuda_boot_log_is_healthy_and_reports_its_sizes():
    log = lines("cuda-0.25-boot-eager.log")
    # vLLM 0.25 logs a "ValueError: Tokenizer not available" traceback as a WARNING with --skip-tokenizer-init:
    # it must not read as a failure.
    assert any("ValueError: Tokenizer not available" in line for line in log)
    assert [line for line in log if classify_line(line)] == []
    assert classify_log(log, exited=False) is None
    info = parse_boot_info(log, 191.7)
    assert (info.kv_cache_tokens, info.max_concurrency, info.max_concurrency_len) == (36408, 8.89, 4096)
    assert info.weights_gib == 17.21


def test_cuda_kv_cache_too_small_for_vllm_defaults_under_the_cap():
    failure = classify_log(lines("cuda-0.25-kv-too-small.log"))
    assert failure is not None and failure.kind is FailureKind.KV_CACHE_TOO_SMALL and failure.kind.is_memory
    assert "max seq len (262144)" in failure.reason and "16.17 GiB KV cache is needed" in failure.reason
    assert "ValueError" in failure.excerpt


def test_cuda_too_many_seqs_for_the_mamba_blocks():
    log = lines("cuda-0.25-mamba-blocks.log")
    failure = classify_log(log)
    assert failure is not None and failure.kind is FailureKind.TOO_MANY_SEQS_FOR_STATE and failure.kind.is_memory
    assert "max_num_seqs (32) exceeds available Mamba cache blocks (30)" in failure.reason
    # the pool was sized (and printed) before the CUDA-graph check refused it
    assert parse_boot_info(log, 0).kv_cache_tokens == 17554


# ---- NVML against nvidia-smi ----------------------------------------------------------------------------------


def test_nvml_peak_against_nvidia_smi():
    rows = [json.loads(line) for line in (DATA / "nvml-eager-trial.jsonl").read_text().splitlines()]
    tracker = PeakTracker("nvml")
    for row in rows:
        tracker.observe(MemoryReading(row["v1_used"], sum(p[1] for p in row["procs"]) or None))
    peak = tracker.result()
    recorded = json.loads((DATA / "eager-trial-result.json").read_text())["memory"]
    # the trial's own MemorySampler (v1 "used", per-process sum) saw the same peaks
    assert (peak.peak_bytes, peak.process_peak_bytes) == (recorded["peak_bytes"], recorded["process_peak_bytes"])
    assert peak.baseline_bytes == 644_939_776  # an idle H200: v1 "used" is the driver's reserve alone
    # NVML v1 "used" includes what the driver reserves; nvidia-smi's memory.used (and NVML v2) does not
    assert all(r["v1_used"] - r["v2_used"] == r["v2_reserved"] == 644_939_776 for r in rows)
    smi = [int(line.split(",")[2]) for line in (DATA / "nvidia-smi-eager-trial.csv").read_text().splitlines()
           if not line.startswith("#")]
    v2_peak = max(r["v2_used"] for r in rows)
    assert max(smi) == round(v2_peak / MiB) == 23169
    assert peak.peak_bytes - v2_peak == 644_939_776  # autotune's recorded peak reads 615 MiB above nvidia-smi's
    # what vLLM's processes held stayed inside the capped card's CUDA total (24 GiB - 384 MiB)
    assert within_cap(peak.process_peak_bytes, memcap.parse_cap(24))


def test_a_compiling_boot_peaks_over_the_cap_and_serves_under_it():
    """Trial 2 of the stop-21 chat study (H200 capped as a 24 GiB card, state dtype auto): NVML saw 31.36 GiB
    while it compiled, which the cap (gpu_memory_utilization) does not govern, and at most 23 GiB while it
    served. The trial's figure is the serving one; the boot's is kept beside it."""
    head, *rows = [json.loads(line) for line in (DATA / "nvml-chat-as-3090-trial2.jsonl").read_text().splitlines()]
    tracker = PeakTracker("nvml")
    for row in rows:
        if row["t"] >= head["ready_t"] and tracker.boot_peak is None:
            tracker.serving()
        tracker.observe(MemoryReading(row["v2_used"]))
    peak = tracker.result()
    assert peak.boot_peak_bytes is not None
    assert round(peak.boot_peak_bytes / GiB, 3) == head["peak_memory_gib_recorded"] == 31.362  # what it recorded
    cap = memcap.parse_cap(24)
    assert peak.boot_peak_bytes > 24 * GiB > cap.cuda_total_bytes > peak.peak_bytes > 22 * GiB
    # Ready, it held what vLLM budgets (the capped card's CUDA total x vLLM's default 0.92: 21.73 GiB); serving
    # added 1.29 GiB more, beyond what gpu_memory_utilization governs: on the small card that has to fit beside it.
    budget = memcap.reserved_bytes(cap.cuda_total_bytes, 0.92)
    assert peak.ready_bytes is not None and abs(peak.ready_bytes - budget) < 0.05 * GiB
    assert round((peak.peak_bytes - peak.ready_bytes) / GiB, 2) == 1.29


# ---- the memory cap -------------------------------------------------------------------------------------------


def test_memcap_on_the_captured_h200():
    real = profile_for(h200())
    torch_total = int(json.loads((DATA / "h200-idle.json").read_text())["cuda_mem_get_info"].split()[1])
    assert real.cuda_total_bytes == torch_total == 150_109_880_320  # NVML total - NVML v2 reserved = CUDA's total
    cap = memcap.parse_cap(24)
    assert cap.cuda_total_bytes == 24 * GiB - 384 * MiB == 25_367_150_592
    util = memcap.cap_utilization(real, cap, 0.92)
    # ceil(25,367,150,592 x 0.92) = ceil(23,337,778,544.64): the small card's reservation, to the byte
    assert math.ceil(real.cuda_total_bytes * util) == 23_337_778_545
    flags = memcap.engine_flags({"enforce_eager": True}, cap, real)
    assert flags == {"enforce_eager": True, "gpu_memory_utilization": util, "max_num_seqs": 256,
                     "max_num_batched_tokens": 2048}
    argv = lines("cuda-0.25-kv-too-small.log")[0]
    assert f"--gpu-memory-utilization {util!r}" in argv  # what vLLM was given on the device
    args = next(line for line in lines("cuda-0.25-kv-too-small.log") if "non-default args" in line)
    assert "'max_num_batched_tokens': 2048, 'max_num_seqs': 256" in args  # the small card's defaults, pinned


@pytest.mark.parametrize("util", [0.05, 0.5, 0.85, 0.9, 0.92, 0.97, 1.0])
def test_memcap_reserves_what_the_small_card_would(util):
    real, cap = PROFILES["h200"], memcap.parse_cap("rtx3090")
    translated = memcap.cap_utilization(real, cap, util)
    assert memcap.reserved_bytes(real.cuda_total_bytes, translated) == math.ceil(cap.cuda_total_bytes * util)


def test_memcap_parsing_and_refusals():
    assert memcap.parse_cap("24GiB") == memcap.parse_cap(24) == memcap.parse_cap("24")
    assert memcap.parse_cap("rtx3090").total_bytes == 24576 * MiB
    assert memcap.parse_cap(40).driver_reserved_bytes == 512 * MiB  # the A100 40GB's (an estimate in PROFILES)
    assert memcap.parse_cap(30).driver_reserved_bytes == 0  # no known 30 GiB card: all of it for CUDA
    with pytest.raises(SpecError, match="size in GiB"):
        memcap.parse_cap("lots")
    with pytest.raises(SpecError, match="positive"):
        memcap.parse_cap(-4)
    with pytest.raises(SpecError, match="larger than"):
        memcap.capped_profile(PROFILES["rtx3090"], memcap.parse_cap(48))
    with pytest.raises(SpecError, match="CUDA GPU"):
        memcap.capped_profile(PROFILES["cpu"], memcap.parse_cap(24))


def test_memcap_keeps_explicit_batch_flags_and_chunked_prefill_rules():
    real, cap = PROFILES["h200"], memcap.parse_cap(24)
    assert defaults.batch_defaults(real.cuda_total_bytes, real.name) == (1024, 8192)
    assert defaults.batch_defaults(cap.cuda_total_bytes, cap.name) == (256, 2048)
    kept = memcap.engine_flags({"max_num_seqs": 8, "max_num_batched_tokens": 4096}, cap, real)
    assert (kept["max_num_seqs"], kept["max_num_batched_tokens"]) == (8, 4096)
    whole = memcap.engine_flags({"enable_chunked_prefill": False, "max_model_len": 8192}, cap, real)
    assert whole["max_num_batched_tokens"] == 8192  # without chunked prefill vLLM raises it to max_model_len
    # a cap in the same default class as the card changes only the utilization
    same = memcap.engine_flags({}, memcap.parse_cap(80), real)
    assert set(same) == {"gpu_memory_utilization"}


def test_study_memory_cap_key():
    spec = load_study(DATA / "smoke-study.toml")
    assert spec.memory_cap == memcap.parse_cap(24)
    assert load_study(ROOT / "studies" / "qwen3.5-27b-h200-as-3090.toml").memory_cap == memcap.parse_cap("rtx3090")


def test_study_memory_cap_key_errors_name_the_key(tmp_path):
    text = (DATA / "smoke-study.toml").read_text().replace("memory_cap_gib = 24", 'memory_cap_gib = "huge"')
    (tmp_path / "smoke-objective.toml").write_text((DATA / "smoke-objective.toml").read_text())
    (tmp_path / "s.toml").write_text(text)
    with pytest.raises(SpecError, match="memory_cap_gib"):
        load_study(tmp_path / "s.toml")


# ---- the estimator against the CUDA boots ---------------------------------------------------------------------

FIXED = {"load_format": "dummy", "language_model_only": True, "skip_tokenizer_init": True}
# (flags, what vLLM 0.25 did: KV-cache blocks in the pool or None, booted, compile cache); blocks from the printed
# token count: tokens / max_model_len x blocks per request (ceil(len / 784) attention blocks + 3 GDN groups x 1 state
# block). The two compiled boots were the device's first (cold: "Compiling a graph for compile range"): their
# profiling ran torch.compile, so they printed less KV than the same flags warm, and a cold failure is no verdict.
BOOTS = [
    ({"enforce_eager": True, "max_num_seqs": 16, "max_num_batched_tokens": 2048, "max_model_len": 4096},
     36408 / 4096 * 9, True, "eager"),
    ({"enforce_eager": True, "max_num_seqs": 32, "max_num_batched_tokens": 8192, "max_model_len": 8192},
     36278 / 8192 * 14, True, "eager"),
    ({"enforce_eager": False, "max_num_seqs": 16, "max_num_batched_tokens": 2048, "max_model_len": 4096},
     15473 / 4096 * 9, True, "cold"),
    ({"enforce_eager": True, "max_num_seqs": 9, "max_num_batched_tokens": 8192, "max_model_len": 4096},
     28216 / 4096 * 9, True, "eager"),
    ({"enforce_eager": False, "max_num_seqs": 32, "max_num_batched_tokens": 8192, "max_model_len": 8192},
     17554 / 8192 * 14, False, "cold"),  # 30 blocks < 32 sequences: CUDA-graph capture refused, on a cold boot
    ({"enforce_eager": True}, None, False, "eager"),  # vLLM's defaults: max_model_len 262,144 needs 16.17 GiB of KV
]


@pytest.mark.parametrize("flags,blocks,booted,cache", BOOTS)
def test_estimator_against_cuda_boots(flags, blocks, booted, cache):
    capped = memcap.capped_profile(profile_for(h200()), memcap.parse_cap(24))
    shape = ModelShape.from_config(json.loads(CONFIG.read_text()))
    est = estimate(shape, capped, {**FIXED, **flags}, vllm_version="0.25.0")
    assert abs(est.weights_bytes / GiB - 17.21) < 0.05  # "Model loading took 17.21 GiB"
    assert est.blocks_per_request == math.ceil(est.max_model_len / 784) + 3  # no prefix caching for hybrids in 0.25
    if cache == "cold":  # predicted as the warm boot: more than the cold one printed, and booted (never refused)
        assert est.fits and not est.refused, est.reasons
        assert est.num_blocks > round(blocks) + 10
        return
    assert est.fits == booted and est.refused == (not booted), est.reasons
    if blocks is not None:
        observed = round(blocks)
        assert est.kv_tokens_low <= blocks / est.blocks_per_request * est.max_model_len <= est.kv_tokens_high
        # eager at 8192 tokens peaked ~0.23 GiB under the compiled warm peak the model is fitted on (5 blocks)
        assert 0 <= observed - est.num_blocks <= 6


def test_version_dependent_defaults():
    assert default_gpu_memory_utilization("0.25.0") == 0.92  # vLLM 0.25.0's config/cache.py
    assert hybrid_prefix_caching_default("0.25.0") is False  # its log: enable_prefix_caching=False
    assert hybrid_prefix_caching_default("0.32.0") is True and hybrid_prefix_caching_default(None) is True
