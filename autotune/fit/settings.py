"""A configuration as vLLM will read it: the flags the estimator needs, parsed, and the ones left unset given
vLLM's defaults (engine/defaults.py), so the arithmetic in estimate.py reads plain numbers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autotune.engine.defaults import batch_defaults
from autotune.engine.flags import speculative_tokens
from autotune.errors import SpecError
from autotune.fit.hardware import GpuProfile
from autotune.fit.model_shape import DTYPE_BYTES, ModelShape

# vllm/config/cache.py CacheDType and MambaDType (vLLM 0.32): every value --kv-cache-dtype and
# --mamba-cache-dtype / --mamba-ssm-cache-dtype accept.
KV_CACHE_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla",
                   "nvfp4_ds_mla", "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc",
                   "ultraquant_4bit", "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head", "nvfp4",
                   "nvfp4_4over6")
MAMBA_DTYPES = ("auto", "float32", "float16", "bfloat16")
# vllm/model_executor/layers/quantization/turboquant/config.py TQ_PRESETS: (key bits, value bits)
_TURBOQUANT_BITS = {"turboquant_k8v4": (8, 4), "turboquant_4bit_nc": (4, 4), "turboquant_k3v4_nc": (3, 4),
                    "turboquant_3bit_nc": (3, 3)}


def kv_bytes_per_token(kv_dtype: str, kv_heads: int, head_dim: int, model_dtype: str) -> int | None:
    """K and V of one token in one attention layer, as the attention spec's page holds them (vllm/v1/
    kv_cache_interface.py AttentionSpec: num_heads x state_content_size_bytes, which a backend's customize_spec
    sets for packed formats). None for the MLA-only layouts, which a non-MLA model does not have."""
    if kv_dtype == "auto":
        return 2 * kv_heads * head_dim * DTYPE_BYTES.get(model_dtype, 2)
    if kv_dtype in ("float16", "bfloat16"):
        return 2 * kv_heads * head_dim * 2
    if kv_dtype in ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc"):  # one byte, per-tensor scales outside the cache
        return 2 * kv_heads * head_dim
    if kv_dtype in ("int8_per_token_head", "fp8_per_token_head"):  # triton_attn.py: data + an fp32 scale per side
        return kv_heads * (2 * head_dim + 2 * 4)
    if kv_dtype == "int4_per_token_head":  # two 4-bit values a byte, an fp32 scale per side
        return kv_heads * (head_dim + 2 * 4)
    if kv_dtype.startswith("nvfp4") and kv_dtype != "nvfp4_ds_mla":
        # flashinfer.py: 2 x kv_heads slots of fp4 data + an fp8 scale per 16 (torch_utils.nvfp4_kv_cache_full_dim)
        return 2 * kv_heads * (head_dim // 2 + head_dim // 16)
    if kv_dtype in _TURBOQUANT_BITS:  # turboquant_attn.py: one slot per head, TurboQuantConfig.slot_size_aligned
        key_bits, value_bits = _TURBOQUANT_BITS[kv_dtype]
        key = head_dim if key_bits == 8 else -(-head_dim * key_bits // 8) + 2  # fp8 keys, or codes + fp16 norm
        value = -(-head_dim * value_bits // 8) + 4  # codes + fp16 scale and zero
        slot = key + value
        return kv_heads * (slot + slot % 2)
    if kv_dtype == "ultraquant_4bit":  # ultraquant/format.py slot_size: 4-bit K and V + an E8M0 byte per 32
        return kv_heads * (head_dim + 2 * (head_dim // 32))
    return None


def full_width_kv_layers(kv_dtype: str, shape: ModelShape) -> int:
    """TurboQuant and UltraQuant keep the first and last two attention layers of a dense model at the model
    dtype (engine/arg_utils.py, TurboQuantConfig.get_boundary_skip_layers); hybrid models keep none."""
    if not (kv_dtype.startswith("turboquant_") or kv_dtype == "ultraquant_4bit") or shape.is_hybrid:
        return 0
    n = min(2, shape.num_layers // 2)
    return len(set(range(n)) | set(range(shape.num_layers - n, shape.num_layers)))


@dataclass(frozen=True)
class Settings:
    """The configuration with vLLM's defaults filled in (engine/arg_utils.py get_batch_defaults)."""

    max_len: int
    seqs: int
    batched: int
    chunked: bool
    prefix: bool
    util: float
    eager: bool
    kv_b: int
    explicit_kv: int | None
    user_block: int | None
    mtp: bool
    num_spec: int
    vision: bool
    kv_dtype: str = "auto"
    kv_token_bytes: int = 0  # K + V of one token in one attention layer, scales included (kv_bytes_per_token)
    kv_full_width_layers: int = 0  # attention layers a packed KV dtype leaves at the model dtype
    mamba_dtype: str = "auto"  # --mamba-cache-dtype: the conv state (and the recurrent one unless ssm is set)
    mamba_ssm_dtype: str = "auto"  # --mamba-ssm-cache-dtype
    not_modelled: tuple[str, ...] = ()


def _value(config: Mapping[str, object], key: str, kind: type, default: Any) -> Any:
    """config[key] made a `kind` (the caller's conversion says which), or `default` when it is absent."""
    value = config.get(key)
    if value is None:
        return default
    if kind is bool and isinstance(value, str):
        return value.lower() in ("1", "true", "yes", "on")
    if kind is not str and isinstance(value, bool) and kind is not bool:
        raise SpecError("config", key, f"expected a number, got {value!r}")
    try:
        return kind(value)
    except (TypeError, ValueError) as e:
        raise SpecError("config", key, f"expected {kind.__name__}, got {value!r}") from e


def settings(shape: ModelShape, profile: GpuProfile, config: Mapping[str, object], util: float,
             cpu_kvcache_bytes: int | None, prefix_default: bool = True) -> Settings:
    """config (vLLM flag dest names) read as vLLM reads it on this card; util and prefix_default are the
    installed vLLM's defaults for gpu_memory_utilization and prefix caching."""
    cpu = profile.kind == "cpu"
    default_seqs, default_batched = batch_defaults(profile.cuda_total_bytes, profile.name, cpu=cpu)
    max_len = int(_value(config, "max_model_len", int, shape.max_position_embeddings))
    chunked = bool(_value(config, "enable_chunked_prefill", bool, True))
    batched = int(_value(config, "max_num_batched_tokens", int, default_batched))
    if config.get("max_num_batched_tokens") is None and not chunked:
        batched = max(batched, max_len)
    kv_dtype = str(_value(config, "kv_cache_dtype", str, "auto"))
    if kv_dtype not in KV_CACHE_DTYPES:
        raise SpecError("config", "kv_cache_dtype", f"unknown KV-cache dtype {kv_dtype!r} (vLLM accepts "
                                                    f"{', '.join(KV_CACHE_DTYPES)})")
    mamba = {key: str(_value(config, key, str, "auto")) for key in ("mamba_cache_dtype", "mamba_ssm_cache_dtype")}
    for key, value in mamba.items():
        if value not in MAMBA_DTYPES:
            raise SpecError("config", key, f"must be one of {', '.join(MAMBA_DTYPES)}, got {value!r}")
    token = kv_bytes_per_token(kv_dtype, shape.num_kv_heads, shape.head_dim, shape.dtype)
    not_modelled = () if token is not None else (
        f"not modelled: booted to learn: the {kv_dtype} KV-cache layout (an MLA layout; counted at 1 byte a value)",)
    explicit = _value(config, "kv_cache_memory_bytes", int, None)
    if cpu and cpu_kvcache_bytes is not None:
        explicit = cpu_kvcache_bytes  # platforms/cpu.py: VLLM_CPU_KVCACHE_SPACE overrides the flag
    method, num_spec = speculative_tokens(config)
    block = config.get("block_size")
    return Settings(
        max_len=max_len,
        seqs=int(_value(config, "max_num_seqs", int, default_seqs)),
        batched=batched,
        chunked=chunked,
        prefix=bool(_value(config, "enable_prefix_caching", bool, prefix_default)),
        util=float(_value(config, "gpu_memory_utilization", float, util)),
        eager=bool(_value(config, "enforce_eager", bool, False)),
        kv_b=DTYPE_BYTES.get(shape.dtype, 2) if kv_dtype == "auto" else DTYPE_BYTES.get(kv_dtype, 1),
        kv_dtype=kv_dtype,
        kv_token_bytes=token if token is not None else 2 * shape.num_kv_heads * shape.head_dim,
        kv_full_width_layers=full_width_kv_layers(kv_dtype, shape),
        mamba_dtype=mamba["mamba_cache_dtype"],
        mamba_ssm_dtype=mamba["mamba_ssm_cache_dtype"],
        not_modelled=not_modelled,
        explicit_kv=None if explicit is None else int(explicit),
        user_block=None if block is None else int(_value(config, "block_size", int, block)),
        mtp=method is not None and "mtp" in method,
        num_spec=num_spec,
        vision=shape.vision_params > 0 and not bool(_value(config, "language_model_only", bool, False)),
    )
