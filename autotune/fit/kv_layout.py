"""The KV cache's layout as vLLM derives it at startup: block size, bytes per block, and the groups a request takes
blocks of, with a hybrid model's recurrent (GDN) state padded into the attention page.

Blocks (vllm/v1/core/kv_cache_utils.py, vllm/platforms/interface.py _align_hybrid_block_size):
    attention page per layer = block_size x 2 x kv_heads x head_dim x kv-dtype bytes. Hybrid models raise
    block_size to align x ceil(mamba_page / (align x page_per_token)) (align = 16 on CUDA, 128 on the CPU
    build) and pad the mamba page to the attention page; layers are grouped (group size = the smaller layer
    count, or the larger one when it is < 1.5x the smaller), a block holds one page of every layer of a group,
    num_blocks = kv_bytes // bytes_per_block. A request at max_model_len takes ceil(max_model_len /
    block_size) blocks per attention group plus (1, or 2 with prefix caching, + speculative tokens) per mamba
    group. vLLM prints "KV cache size: int(num_blocks / blocks_per_request x max_model_len) tokens" and
    "Maximum concurrency: num_blocks / blocks_per_request", and needs num_blocks >= blocks_per_request + 1
    (one block is the pool's null block).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.fit.hardware import GpuProfile
from autotune.fit.model_shape import DTYPE_BYTES, ModelShape
from autotune.fit.settings import Settings


@dataclass(frozen=True)
class KvLayout:
    block: int
    bytes_per_block: int
    g_attn: int  # attention groups: each takes ceil(len / block) blocks per request
    g_mamba: int  # mamba groups: each takes per_state blocks per request
    per_state: int
    n_attn: int
    attn_1tok: int  # bytes per token per attention layer
    state_seq: int  # unpadded GDN state of one sequence


def kv_layout(shape: ModelShape, s: Settings, profile: GpuProfile, ssm_asked: str) -> KvLayout:
    """Block size, block bytes and groups as _align_hybrid_block_size and get_kv_cache_groups derive them."""
    cpu = profile.kind == "cpu"
    n_attn = shape.num_full_attention_layers + (shape.num_mtp_layers if s.mtp else 0)
    attn_1tok = s.kv_token_bytes  # settings.kv_bytes_per_token: the KV dtype's layout, scales included
    block = s.user_block if s.user_block is not None else (128 if cpu else 16)
    n_mamba, state_seq, per_state = shape.num_linear_attention_layers, 0, 0
    if shape.is_hybrid:
        # mamba_utils.py _mamba_state_dtype: the conv state takes --mamba-cache-dtype (auto: the model dtype), the
        # recurrent state --mamba-ssm-cache-dtype, whose "auto" is the checkpoint's mamba_ssm_dtype for Qwen3.5
        # (models/config.py) and the conv state's dtype otherwise.
        conv = shape.dtype if s.mamba_dtype == "auto" else s.mamba_dtype
        ssm = shape.mamba_ssm_dtype if ssm_asked == "auto" and shape.mamba_ssm_dtype else ssm_asked
        if cpu and profile.avx512_bf16 and ssm not in ("float16", "bfloat16", "float32"):
            ssm = "float32"  # platforms/cpu.py: the accelerated GDN path resets "auto" to float32
        conv_e, rec_e = shape.gdn_state_elems(s.num_spec)
        mamba_page = conv_e * DTYPE_BYTES.get(conv, 2) + rec_e * DTYPE_BYTES.get(ssm if ssm != "auto" else conv, 2)
        state_seq = n_mamba * mamba_page
        align = max(32 if cpu else 16, block)  # the attention backend's smallest kernel block, or the user's
        block = max(block, align * math.ceil(mamba_page / (align * attn_1tok)))
        per_state = (2 if s.prefix else 1) + s.num_spec  # prefix caching = mamba cache mode "align"
    page = block * attn_1tok
    if shape.is_hybrid and n_attn:
        small, large = min(n_attn, n_mamba), max(n_attn, n_mamba)
        size = large if large < 1.5 * small else small
        g_attn, g_mamba = math.ceil(n_attn / size), math.ceil(n_mamba / size)
        bytes_per_block = max(math.ceil(n_attn / g_attn), math.ceil(n_mamba / g_mamba)) * page
    else:
        # a packed KV dtype's full-width boundary layers have pages of their own size in the same block
        # (kv_cache_utils.py UniformTypeKVCacheSpecs)
        wide = s.kv_full_width_layers
        full_page = block * 2 * shape.num_kv_heads * shape.head_dim * DTYPE_BYTES.get(shape.dtype, 2)
        g_attn, g_mamba, bytes_per_block = 1, 0, max(n_attn - wide, 1) * page + wide * full_page
    return KvLayout(block, bytes_per_block, g_attn, g_mamba, per_state, n_attn, attn_1tok, state_seq)
