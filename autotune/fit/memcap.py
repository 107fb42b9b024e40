"""A memory cap: make vLLM on the card present behave, memory-wise, like a smaller card.

"Behave as a 24 GiB card" is what a person planning a purchase, sharing a card, or testing the RTX 3090 study on
a big GPU asks for. vLLM has no such option; it sizes everything from the real card. So the cap is translated:

- gpu_memory_utilization: vLLM reserves ceil(CUDA total x utilization) (vllm/v1/worker/utils.py request_memory)
  and carves weights, activations, graphs and KV cache out of that. The translated utilization makes the real
  card's reservation equal, to the byte, to what the capped card would reserve at the requested utilization;
  so weights, the profile run and the KV cache come out as they would on the small card.
- Defaults that vLLM derives from the card's size (EngineArgs.get_batch_defaults, engine/defaults.batch_defaults)
  are pinned to the capped card's values when the configuration leaves them unset.
- The estimator gets the capped profile (capped_profile): the small card's totals with the real card's speed.

Only memory carries over: an H200 capped to 24 GiB still has an H200's bandwidth and compute.
The configuration a study records and exports stays the logical one (for the small card); only the flags handed
to the server on the big card are translated (engine_flags).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from autotune.engine.defaults import DEFAULT_UTILIZATION, batch_defaults
from autotune.errors import SpecError
from autotune.fit.hardware import PROFILES, GpuProfile, detect_gpus, profile_for
from autotune.units import GiB, MiB


@dataclass(frozen=True)
class MemoryCap:
    """The card to behave as, memory-wise. total_bytes is its total as nvidia-smi/NVML shows it; the driver keeps
    driver_reserved_bytes of that from CUDA (what vLLM sees as total is the difference)."""

    name: str
    total_bytes: int
    driver_reserved_bytes: int

    @property
    def cuda_total_bytes(self) -> int:
        return self.total_bytes - self.driver_reserved_bytes

    @property
    def cuda_total_gib(self) -> float:
        """What CUDA has on the capped card, in GiB: the figure a peak is compared with (search/record.over_cap)."""
        return round(self.cuda_total_bytes / GiB, 3)

    @property
    def gib(self) -> float:
        return self.total_bytes / GiB


def parse_cap(value: object, source: str = "--memory-cap", key: str | None = None) -> MemoryCap:
    """A cap from a number of GiB (24, "24", "24GiB", "24G") or a known profile's name ("rtx3090").

    A number is the card's total as nvidia-smi shows it; the driver's reserve is that of the known card with the
    same total (24 GiB: the 24 GB GeForce cards, 384 MiB), else none (the whole cap is usable by CUDA)."""
    if isinstance(value, bool):
        raise SpecError(source, key, f"expected a size in GiB or a GPU profile name, got {value!r}")
    if isinstance(value, str):
        text = value.strip().lower()
        if text in PROFILES and PROFILES[text].kind == "cuda":
            p = PROFILES[text]
            return MemoryCap(p.name, p.memory_bytes, p.driver_reserved_bytes)
        m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(gib|gb|g)?", text)
        if not m:
            known = ", ".join(sorted(k for k, p in PROFILES.items() if p.kind == "cuda"))
            raise SpecError(source, key, f"expected a size in GiB (24, 24GiB) or a GPU profile ({known}), "
                                         f"got {value!r}")
        value = float(m.group(1))
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise SpecError(source, key, f"expected a positive size in GiB, got {value!r}")
    total = int(round(float(value) * GiB))
    if total < 1 * GiB:
        raise SpecError(source, key, f"a cap of {value} GiB leaves no room for any model")
    same = [p for p in PROFILES.values() if p.kind == "cuda" and p.memory_bytes == total]
    reserved = same[0].driver_reserved_bytes if same else 0
    return MemoryCap(f"{float(value):g} GiB card", total, reserved)


def capped_profile(real: GpuProfile, cap: MemoryCap) -> GpuProfile:
    """The profile the estimator plans with: the cap's memory, the real card's speed and features."""
    check_cap(real, cap)
    return dataclasses.replace(real, name=f"{real.name} capped to {cap.gib:g} GiB", memory_bytes=cap.total_bytes,
                               driver_reserved_bytes=cap.driver_reserved_bytes)


def present_gpu(index: int = 0) -> GpuProfile:
    """The real card a cap applies to, as NVML sees it (its driver reserve included)."""
    gpus = [g for g in detect_gpus() if g.index == index]
    if not gpus:
        raise SpecError("--memory-cap", None, f"no GPU {index} found by NVML: a memory cap needs a CUDA GPU")
    return profile_for(gpus[0])


def check_cap(real: GpuProfile, cap: MemoryCap) -> None:
    if real.kind != "cuda":
        raise SpecError("memory cap", None, "a memory cap needs a CUDA GPU (the CPU build sizes its KV cache with "
                                            "VLLM_CPU_KVCACHE_SPACE)")
    if cap.cuda_total_bytes > real.cuda_total_bytes:
        raise SpecError("memory cap", None, f"the cap ({cap.gib:g} GiB) is larger than {real.name} "
                                            f"({real.memory_bytes / GiB:.1f} GiB)")


def reserved_bytes(cuda_total: int, utilization: float) -> int:
    """What vLLM reserves: ceil(CUDA total x gpu_memory_utilization)."""
    return math.ceil(cuda_total * utilization)


def cap_utilization(real: GpuProfile, cap: MemoryCap, utilization: float = DEFAULT_UTILIZATION) -> float:
    """The gpu_memory_utilization on the real card that reserves what `utilization` reserves on the capped one."""
    check_cap(real, cap)
    if not 0 < utilization <= 1:
        raise SpecError("config", "gpu_memory_utilization", f"must be in (0, 1], got {utilization!r}")
    target = reserved_bytes(cap.cuda_total_bytes, utilization)
    # target / real_total can land one ulp over, making ceil() one byte more: step down until it reserves target.
    util = target / real.cuda_total_bytes
    while reserved_bytes(real.cuda_total_bytes, util) > target:
        util = math.nextafter(util, 0.0)
    return util


def engine_flags(flags: Mapping[str, object], cap: MemoryCap, real: GpuProfile,
                 default_utilization: float = DEFAULT_UTILIZATION) -> dict[str, object]:
    """The flags to hand vLLM on the real card so that it budgets memory as on the capped one."""
    out = dict(flags)
    util = flags.get("gpu_memory_utilization")
    asked = float(util) if util is not None else default_utilization  # type: ignore[arg-type]
    out["gpu_memory_utilization"] = cap_utilization(real, cap, asked)
    cap_defaults = batch_defaults(cap.cuda_total_bytes, cap.name)
    if cap_defaults != batch_defaults(real.cuda_total_bytes, real.name):
        seqs, batched = cap_defaults
        if out.get("max_num_seqs") is None:
            out["max_num_seqs"] = seqs
        if out.get("max_num_batched_tokens") is None:
            chunked = out.get("enable_chunked_prefill")
            if chunked is None or chunked is True or str(chunked).lower() in ("true", "1"):
                out["max_num_batched_tokens"] = batched
            elif out.get("max_model_len") is not None:  # without chunked prefill vLLM raises it to max_model_len
                out["max_num_batched_tokens"] = max(batched, int(out["max_model_len"]))  # type: ignore[call-overload]
    return out


def describe(real: GpuProfile, cap: MemoryCap, utilization: float = DEFAULT_UTILIZATION) -> str:
    util = cap_utilization(real, cap, utilization)
    return (f"{real.name} capped to {cap.gib:g} GiB: gpu_memory_utilization {utilization:g} of "
            f"{cap.cuda_total_bytes / MiB:,.0f} MiB -> {util:.6f} of {real.cuda_total_bytes / MiB:,.0f} MiB "
            f"({reserved_bytes(cap.cuda_total_bytes, utilization) / GiB:.2f} GiB reserved)")
