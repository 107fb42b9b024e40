"""Will this configuration fit? The estimator, corrected by what this study has already seen.

Every warm boot that succeeds tells the KV-cache size vLLM really computed; every warm out-of-memory is a fact. From
those the study fits an overhead term both ways (the bytes vLLM used beyond, or short of, the model) and refuses any
configuration at least as demanding as one that already ran out of memory, so a failure is paid for once. A cold
boot (its compile cache missed: torch.compile ran inside vLLM's memory profiling, 1-2 GiB more peak) teaches
nothing: the configuration boots warm. Every proposal is judged under the corrections of that moment, so one
refused under an estimate calibration has since moved is judged again when it comes back.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from optuna.trial import FrozenTrial, TrialState

from autotune.engine.defaults import (
    default_gpu_memory_utilization,
    installed_vllm_version,
)
from autotune.engine.logs import MEMORY_FAILURE_KINDS
from autotune.engine.models import model_config
from autotune.fit import memcap
from autotune.fit.estimate import Corrections, Estimate, estimate
from autotune.fit.hardware import (
    GpuInfo,
    GpuProfile,
    cpu_profile,
    detect_gpus,
    get_profile,
    held_by_others,
    host_has_avx512_bf16,
    profile_for,
)
from autotune.fit.memcap import MemoryCap
from autotune.fit.model_shape import ModelShape
from autotune.fit.weight_bytes import disabled_kernels_in
from autotune.units import GiB, MiB

# Flags where a larger value needs more memory, and where a smaller one does.
_MORE_IS_HEAVIER = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "kv_cache_memory_bytes")


_LESS_IS_HEAVIER = ("gpu_memory_utilization",)


# The narrowest band a calibrated estimate keeps: the boot-to-boot spread of one configuration's non-KV memory
# (gpu-boots: the same flags warm printed 2.74-2.76 GiB of KV; CUDA-graph capture varied by 0.07 GiB).
CALIBRATED_FLOOR_BYTES = 128 * MiB


@dataclass(frozen=True)
class Observation:
    """One booted trial of this study, as the estimator sees it."""

    trial: int
    flags: dict[str, object]
    predicted_kv_tokens: int | None
    observed_kv_tokens: int | None
    kv_bytes_per_token: float | None
    memory_failed: bool
    predicted_on: str | None = None  # the card and vLLM version it was predicted for (absent on old trials)


@dataclass(frozen=True)
class Verdict:
    estimate: Estimate
    fits: bool
    reason: str  # why not, when it does not fit; why it is booted anyway, when it is inside the band
    excess_gib: float  # how far from fitting (the constraint value Optuna learns from)
    calibrated_by: int = 0  # warm boots of this study, on this card and vLLM version, the estimate is fitted on
    predicted_on: str | None = None  # where(): recorded on the trial, so only boots here calibrate later ones


@functools.cache
def model_shape(model: str) -> ModelShape:
    shape = ModelShape.from_config(model_config(model))
    q = shape.quantization
    if q.method == "gptq" and not q.scope and _folder_without_safetensors(model):
        # auto_gptq.py maybe_update_config (vLLM 0.25 to 0.33): a GPTQ config without modules_in_block_to_quantize
        # quantizes the layers whose safetensors headers hold a packed dtype, so a folder without any (a config
        # served with --load-format dummy) is served with every layer in the model dtype (seen on an H100: the
        # GPTQ-Int4 config's MLPs asked for bf16: benchmarks/data/h100-as-rtx3090-gptq-marlin-config-only)
        shape = dataclasses.replace(shape, quantization=dataclasses.replace(q, default=None, overrides=(),
                                                                             lm_head=None))
    return shape


def _folder_without_safetensors(model: str) -> bool:
    folder = Path(model).expanduser()
    return folder.is_dir() and not any(folder.glob("*.safetensors"))


def slow_dtype_warning(model: str, flags: Mapping[str, object], cpu_build: bool) -> str | None:
    """On a CPU without AVX512-BF16, vLLM's CPU build runs bfloat16 matmuls on a fallback 16-58x slower than float32
    (benchmarks/cpu_dtype.py): every latency limit then looks out of reach (seen: p95 TTFT 700 ms at concurrency 1,
    no feasible configuration). Said before the first boot; model is a resolved path or hub id."""
    if not cpu_build or host_has_avx512_bf16():
        return None
    shape = model_shape(model).served_as(flags.get("dtype"))
    if shape.dtype != "bfloat16":
        return None
    head = ("warning: this CPU has no AVX512-BF16 and the model is served in bfloat16, which vLLM's CPU build runs "
            "16-58x slower than float32 (benchmarks/cpu_dtype.py); ")
    if shape.is_hybrid:  # estimate.py: the CPU build's Gated DeltaNet layers take bfloat16 only
        return head + "its Gated DeltaNet layers take nothing else there, so give the objective limits to match"
    return head + "serve it in float32: dtype = \"float32\" in the study's [engine], or --set dtype=float32"


def resolve_profile(hardware: str, cpu_build: bool, gpus: list[GpuInfo] | None = None) -> GpuProfile:
    """A named profile, or with "auto" the first of `gpus` (None: those NVML finds; the CPU profile on the CPU
    build or with none)."""
    if hardware != "auto":
        return get_profile(hardware)
    if cpu_build:
        return cpu_profile()
    gpus = detect_gpus() if gpus is None else gpus
    return profile_for(gpus[0]) if gpus else cpu_profile()


def planned_profiles(hardware: str, cap: MemoryCap | None, cpu_build: bool,
                     gpus: list[GpuInfo]) -> tuple[GpuProfile, GpuProfile]:
    """The card the estimator plans on and the card present (a trial's flags are translated for it). Under a memory
    cap the first is the capped card; else it is the card present with what other processes hold on `gpus` (the
    GPUs the servers run on, read before the first one) set aside: a desktop's display server holds 0.3-1 GiB of a
    24 GiB card, which vLLM's budget (a share of the whole card) does not leave out."""
    real = resolve_profile(hardware, cpu_build, gpus)
    if cap is not None:
        return memcap.capped_profile(real, cap), real
    if not cpu_build and (held := held_by_others(gpus, real)):
        real = dataclasses.replace(real, held_bytes=held)
    return real, real


COLD = "cold"  # the trial user attr compile_cache: "cold" | "warm" (absent on old trials and eager boots: usable)


def observations(trials: Sequence[FrozenTrial]) -> list[Observation]:
    """Booted trials that teach the estimator: never a cold-cache boot (its figures and failures are the compile's)
    nor one given the estimate's KV cache (its figures are the estimate's)."""
    out = []
    for t in trials:
        a = t.user_attrs
        if (t.state != TrialState.COMPLETE or not a.get("booted", True) or "flags" not in a
                or a.get("compile_cache") == COLD or "kv_blocks_set" in a):
            continue
        memory_failed = a.get("failure_kind") in MEMORY_FAILURE_KINDS
        if "kv_cache_tokens" not in a and not memory_failed:
            continue
        out.append(Observation(t.number, json.loads(a["flags"]), a.get("predicted_kv_tokens"),
                               a.get("kv_cache_tokens"), a.get("predicted_kv_bytes_per_token"), memory_failed,
                               a.get("predicted_on")))
    return out


def where(profile: GpuProfile, version: str | None) -> str:
    """The card and vLLM version a prediction is for: boots elsewhere do not calibrate it."""
    return f"{profile.name}, vLLM {version or 'unknown'}"


def corrections(obs: Sequence[Observation], predict: Callable[[Mapping[str, object]], Estimate] | None = None,
                here: str | None = None) -> Corrections:
    """The median residual of the warm boots (predicted minus printed KV memory, in bytes), so more KV printed than
    predicted lowers the overhead and less raises it; its band is the residuals' spread around it plus one block.

    `predict` is the uncorrected estimator: each boot's residual is taken against today's model, not the one
    (perhaps older, perhaps already corrected) that predicted it when it ran. Without it, the recorded prediction
    and its bytes per token are used."""
    residuals: list[float] = []
    blocks: list[int] = []
    for o in obs:
        if o.observed_kv_tokens is None or (here is not None and o.predicted_on not in (None, here)):
            continue
        if predict is not None:
            est = predict(o.flags)
            if not (est.max_model_len and est.blocks_per_request and est.bytes_per_block):
                continue
            seen_blocks = o.observed_kv_tokens / est.max_model_len * est.blocks_per_request + 0.5
            residuals.append(est.kv_cache_bytes - seen_blocks * est.bytes_per_block)
            blocks.append(est.bytes_per_block)
        elif o.predicted_kv_tokens is not None and o.kv_bytes_per_token:
            residuals.append((o.predicted_kv_tokens - o.observed_kv_tokens) * o.kv_bytes_per_token)
    if not residuals:
        return Corrections()
    mid = statistics.median(residuals)
    spread = max(abs(r - mid) for r in residuals) + max(blocks, default=0)
    return Corrections(overhead_bytes=int(mid), calibrated_by=len(residuals),
                       uncertainty_bytes=int(max(spread, CALIBRATED_FLOOR_BYTES)))


def dominated_by_failure(flags: Mapping[str, object], obs: Sequence[Observation]) -> Observation | None:
    """A configuration at least as demanding as one that ran out of memory (same model, dtype and the rest)."""
    for o in obs:
        if not o.memory_failed:
            continue
        keys = set(flags) | set(o.flags)
        same_rest = all(flags.get(k) == o.flags.get(k) for k in keys - set(_MORE_IS_HEAVIER) - set(_LESS_IS_HEAVIER))
        heavier = all(_num(flags.get(k), 0) >= _num(o.flags.get(k), 0) for k in _MORE_IS_HEAVIER if k in o.flags)
        heavier &= all(_num(flags.get(k), 1) <= _num(o.flags.get(k), 1) for k in _LESS_IS_HEAVIER if k in o.flags)
        if same_rest and heavier and all(k in flags for k in _MORE_IS_HEAVIER if k in o.flags):
            return o
    return None


def judge(model: str, profile: GpuProfile, flags: Mapping[str, object], env: Mapping[str, str],
          obs: Sequence[Observation] = (), vllm_version: str | None = None) -> Verdict:
    """Boot it, or refuse it before boot: refused only when a startup rule fails, it is at least as demanding as a
    warm boot that ran out of memory, or it misses by more than the estimate's uncertainty (and is modelled).
    vllm_version: the version to predict for (None: the installed one); a refusal names the version modelled."""
    cpu_kv = env.get("VLLM_CPU_KVCACHE_SPACE")
    version = vllm_version or installed_vllm_version()
    run = functools.partial(estimate, model_shape(model), profile,
                            cpu_kvcache_bytes=int(float(cpu_kv) * GiB) if cpu_kv else None,
                            default_gpu_memory_utilization=default_gpu_memory_utilization(version),
                            vllm_version=version,
                            disabled_kernels=disabled_kernels_in({**os.environ, **env}))  # what the server inherits
    here = where(profile, version)
    fitted = corrections(obs, run, here)
    est = run(flags, corrections=fitted)
    calibrated = fitted.calibrated_by
    if (failed := dominated_by_failure(flags, obs)) is not None:
        return Verdict(est, False, f"at least as demanding as trial {failed.trial}, which ran out of memory", 1.0,
                       calibrated, here)
    if est.refused:
        excess = est.excess_bytes / GiB if est.excess_bytes > 0 else 1.0
        return Verdict(est, False, f"{'; '.join(est.reasons) or 'does not fit'} (modelled for {est.vllm_version})",
                       excess, calibrated, here)
    if est.not_modelled:
        return Verdict(est, True, "not modelled: booted to learn: " + "; ".join(est.not_modelled), 0.0, calibrated,
                       here)
    if not est.fits:
        return Verdict(est, True, "inside the estimate's uncertainty: booted to learn: " + "; ".join(est.reasons),
                       0.0, calibrated, here)
    return Verdict(est, True, "", 0.0, calibrated, here)


def prediction_attrs(est: Estimate, predicted_on: str | None = None) -> dict[str, object]:
    """What the estimator predicted, recorded on every trial so it can be read against what vLLM printed."""
    # Bytes a request of max_model_len tokens takes per token: attention blocks and, for hybrid models, the
    # state blocks too (what a token more or less in vLLM's figure means in memory).
    if est.max_model_len and est.blocks_per_request:
        per_token = est.blocks_per_request * est.bytes_per_block / est.max_model_len
    else:
        per_token = est.bytes_per_block / est.block_size if est.block_size else 0
    where_attr = {"predicted_on": predicted_on} if predicted_on else {}
    return {
        **where_attr,
        "predicted_fits": est.fits,
        "predicted_kv_tokens": est.kv_tokens,
        "predicted_weights_gib": round(est.weights_bytes / GiB, 3),
        "predicted_kv_cache_gib": round(est.kv_cache_bytes / GiB, 3),
        "predicted_kv_bytes_per_token": per_token,
        "predicted_kv_tokens_low": est.kv_tokens_low,
        "predicted_kv_tokens_high": est.kv_tokens_high,
    }


def _num(value: object, default: float) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default
