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
    if kv_dtype != "auto" and kv_dtype not in DTYPE_BYTES:
        raise SpecError("config", "kv_cache_dtype", f"unknown KV-cache dtype {kv_dtype!r}")
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
        kv_b=DTYPE_BYTES.get(shape.dtype, 2) if kv_dtype == "auto" else DTYPE_BYTES[kv_dtype],
        explicit_kv=None if explicit is None else int(explicit),
        user_block=None if block is None else int(_value(config, "block_size", int, block)),
        mtp=method is not None and "mtp" in method,
        num_spec=num_spec,
        vision=shape.vision_params > 0 and not bool(_value(config, "language_model_only", bool, False)),
    )
