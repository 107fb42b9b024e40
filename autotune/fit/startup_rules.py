"""What vLLM refuses at startup whatever the memory: the model's own limits with these flags, and the scheduler's
limits it checks (config/scheduler.py, config/model.py). fit/estimate.py adds them to the memory verdict."""

from __future__ import annotations

from autotune.engine.defaults import align_block_within_batch
from autotune.fit.hardware import GpuProfile
from autotune.fit.kv_layout import KvLayout
from autotune.fit.model_shape import ModelShape
from autotune.fit.settings import Settings


def model_rules(shape: ModelShape, s: Settings, profile: GpuProfile, lay: KvLayout,
                 vllm_version: str | None) -> list[str]:
    """What vLLM refuses of this model with these flags, whatever the memory."""
    rules = []
    if s.mtp and shape.num_mtp_layers == 0:
        rules.append("speculative_config asks for MTP but the model has no MTP layers")
    if profile.kind == "cpu" and shape.is_hybrid and shape.dtype != "bfloat16":
        # model_executor/layers/mamba/ops/cpu/gdn_attention.py asserts it at the first request (vLLM 0.32): the
        # server boots, then dies serving (seen with --dtype float32 on tiny:hybrid)
        rules.append(f"vLLM's CPU build runs Gated DeltaNet layers in bfloat16 only, not {shape.dtype}")
    if shape.is_hybrid and s.prefix:  # mamba cache mode 'align'
        if not s.chunked:
            rules.append("hybrid models need chunked prefill when prefix caching is on (mamba cache mode 'align')")
        elif lay.block > s.batched and align_block_within_batch(vllm_version):
            rules.append(f"vLLM {vllm_version} needs max_num_batched_tokens {s.batched} >= the hybrid block size "
                         f"{lay.block} with prefix caching (mamba cache mode 'align'; 0.27 lifts it)")
    return rules


def batch_rules(shape: ModelShape, s: Settings) -> list[str]:
    """The scheduler's limits vLLM checks at startup (config/scheduler.py, config/model.py)."""
    rules = []
    if s.batched < s.seqs:
        rules.append(f"max_num_batched_tokens {s.batched} must be >= max_num_seqs {s.seqs}")
    if not s.chunked and s.batched < s.max_len:
        rules.append(f"without chunked prefill max_num_batched_tokens {s.batched} must be >= max_model_len "
                     f"{s.max_len}")
    if s.max_len > shape.max_position_embeddings:
        rules.append(f"max_model_len {s.max_len:,} exceeds the model's {shape.max_position_embeddings:,} positions")
    return rules
