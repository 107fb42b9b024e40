"""Will this configuration fit? The estimator, corrected by what this study has already seen.

Every boot that succeeds tells the KV-cache size vLLM really computed; every out-of-memory is a fact. From those
the study fits an overhead term (the bytes vLLM used that the model did not predict) and refuses any
configuration at least as demanding as one that already ran out of memory, so a failure is paid for once.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from optuna.trial import FrozenTrial, TrialState

from autotune.engine.defaults import (
    default_gpu_memory_utilization,
    installed_vllm_version,
)
from autotune.engine.logs import MEMORY_FAILURE_KINDS
from autotune.engine.models import model_config
from autotune.fit.estimate import Corrections, Estimate, estimate
from autotune.fit.hardware import (
    GpuProfile,
    cpu_profile,
    detect_gpus,
    get_profile,
    profile_for,
)
from autotune.fit.model_shape import ModelShape
from autotune.units import GiB

# Flags where a larger value needs more memory, and where a smaller one does.
_MORE_IS_HEAVIER = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "kv_cache_memory_bytes")


_LESS_IS_HEAVIER = ("gpu_memory_utilization",)


@dataclass(frozen=True)
class Observation:
    """One booted trial of this study, as the estimator sees it."""

    trial: int
    flags: dict[str, object]
    predicted_kv_tokens: int | None
    observed_kv_tokens: int | None
    kv_bytes_per_token: float | None
    memory_failed: bool


@dataclass(frozen=True)
class Verdict:
    estimate: Estimate
    fits: bool
    reason: str  # why not, when it does not fit
    excess_gib: float  # how far from fitting (the constraint value Optuna learns from)


@functools.cache
def model_shape(model: str) -> ModelShape:
    return ModelShape.from_config(model_config(model))


def resolve_profile(hardware: str, cpu_build: bool) -> GpuProfile:
    """A named profile, or with "auto" the GPU NVML finds (the CPU profile on the CPU build)."""
    if hardware != "auto":
        return get_profile(hardware)
    if cpu_build:
        return cpu_profile()
    gpus = detect_gpus()
    return profile_for(gpus[0]) if gpus else cpu_profile()


def observations(trials: Sequence[FrozenTrial]) -> list[Observation]:
    out = []
    for t in trials:
        a = t.user_attrs
        if t.state != TrialState.COMPLETE or not a.get("booted", True) or "flags" not in a:
            continue
        memory_failed = a.get("failure_kind") in MEMORY_FAILURE_KINDS
        if "kv_cache_tokens" not in a and not memory_failed:
            continue
        out.append(Observation(t.number, json.loads(a["flags"]), a.get("predicted_kv_tokens"),
                               a.get("kv_cache_tokens"), a.get("predicted_kv_bytes_per_token"), memory_failed))
    return out


def corrections(obs: Sequence[Observation]) -> Corrections:
    """The largest over-prediction of KV memory seen so far becomes an overhead term (a safe, simple fit)."""
    over = [
        (o.predicted_kv_tokens - o.observed_kv_tokens) * o.kv_bytes_per_token
        for o in obs
        if o.predicted_kv_tokens is not None and o.observed_kv_tokens is not None and o.kv_bytes_per_token
    ]
    return Corrections(overhead_bytes=int(max(0.0, *over)) if over else 0)


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
          obs: Sequence[Observation] = ()) -> Verdict:
    cpu_kv = env.get("VLLM_CPU_KVCACHE_SPACE")
    version = installed_vllm_version()
    est = estimate(model_shape(model), profile, flags, corrections=corrections(obs),
                   cpu_kvcache_bytes=int(float(cpu_kv) * GiB) if cpu_kv else None,
                   default_gpu_memory_utilization=default_gpu_memory_utilization(version), vllm_version=version)
    if (failed := dominated_by_failure(flags, obs)) is not None:
        return Verdict(est, False, f"at least as demanding as trial {failed.trial}, which ran out of memory", 1.0)
    if not est.fits:
        excess = est.excess_bytes / GiB if est.excess_bytes > 0 else 1.0
        return Verdict(est, False, "; ".join(est.reasons) or "does not fit", excess)
    return Verdict(est, True, "", 0.0)


def prediction_attrs(est: Estimate) -> dict[str, object]:
    """What the estimator predicted, recorded on every trial so it can be read against what vLLM printed."""
    # Bytes a request of max_model_len tokens takes per token: attention blocks and, for hybrid models, the
    # state blocks too (what a token more or less in vLLM's figure means in memory).
    if est.max_model_len and est.blocks_per_request:
        per_token = est.blocks_per_request * est.bytes_per_block / est.max_model_len
    else:
        per_token = est.bytes_per_block / est.block_size if est.block_size else 0
    return {
        "predicted_fits": est.fits,
        "predicted_kv_tokens": est.kv_tokens,
        "predicted_weights_gib": round(est.weights_bytes / GiB, 3),
        "predicted_kv_cache_gib": round(est.kv_cache_bytes / GiB, 3),
        "predicted_kv_bytes_per_token": per_token,
    }


def _num(value: object, default: float) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default
