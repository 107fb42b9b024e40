"""What a trial boots: the objective it is measured against, its plan (the one assembly of a configured model,
its flags and the slot's GPUs), and its first boot's KV cache, which a boot that will compile is given from the
estimate (compile_cache.py says why)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from autotune.engine.compile_cache import compile_cache_state, compile_key, key_is_new, remember_key
from autotune.engine.flags import Build
from autotune.engine.logs import BootInfo
from autotune.engine.models import model_vocab_size, resolve_model
from autotune.engine.server import EngineSpec, server_env
from autotune.fit import memcap
from autotune.fit.estimate import Estimate
from autotune.fit.hardware import GpuProfile
from autotune.measure.ladder import NO_PRIOR, LoadSearch, Prior, first_level
from autotune.measure.stats import ENERGY_FIGURE, Limits
from autotune.measure.workload import Workload


@dataclass(frozen=True)
class Objective:
    """What "good" means: the workload sent, the limits it must meet, how load rises, and the figure maximised at
    the best level within the limits (a stats.MAXIMIZE key)."""

    name: str
    path: Path
    description: str
    workload: Workload
    limits: Limits
    load: LoadSearch
    maximize: str = "output_throughput"

    @property
    def energy_key(self) -> str | None:
        """The objective file's key that needs energy measured (NVML), if any: what the CPU build refuses."""
        if self.maximize == ENERGY_FIGURE:
            return "maximize"
        return "limits.joules_per_token" if self.limits.joules_per_token is not None else None


@dataclass(frozen=True)
class TrialPlan:
    engine: EngineSpec
    objective: Objective
    vocab_size: int
    log_path: Path
    gpu_indices: tuple[int, ...] = ()  # the slot's GPUs (NVML indices); empty: every GPU the server may use
    prior: Prior = NO_PRIOR  # where the load search starts, and whether it screens at the incumbent's level
    warm_kv_blocks: int | None = None  # the estimator's KV blocks for a warm boot: what a compiling boot is given


def configured(model: str, flags: Mapping[str, object]) -> tuple[str, dict[str, object]]:
    """(model path, flags) as a trial boots them and the estimator judges them: the model's own defaults (a tiny
    model's) under the given flags. `autotune trial`, `autotune estimate --model` and the loop all start here."""
    path, defaults = resolve_model(model)
    return path, {**defaults, **flags}


def plan_trial(model_path: str, flags: Mapping[str, object], objective: Objective, log_path: Path, *,
               env: Mapping[str, str], boot_timeout_s: float, gpu_indices: tuple[int, ...] = (),
               memory_cap: memcap.MemoryCap | None = None, real_gpu: GpuProfile | None = None,
               prior: Prior = NO_PRIOR, warm_kv_blocks: int | None = None) -> TrialPlan:
    """The one assembly of a trial from a configured model and flags: under a memory cap the flags are translated
    for the card present (`real_gpu`), so that the server behaves as on the capped card."""
    if memory_cap is not None:
        assert real_gpu is not None, "a memory cap is translated for the card present"
        flags = memcap.engine_flags(flags, memory_cap, real_gpu)
    engine = EngineSpec(model=model_path, flags=flags, env=env, boot_timeout_s=boot_timeout_s,
                        cuda_visible_devices=",".join(map(str, gpu_indices)) if gpu_indices else None)
    return TrialPlan(engine, objective, model_vocab_size(model_path), log_path, gpu_indices, prior, warm_kv_blocks)



def _compile_key(plan: TrialPlan) -> tuple[Path, str]:
    """The compile cache's folder the server will use, and the trial's key in it (compile_cache.compile_key)."""
    env = server_env(plan.engine, os.environ)
    return Path(env["VLLM_CACHE_ROOT"]), compile_key(plan.engine.model, plan.engine.flags, env)


@dataclass(frozen=True)
class FirstBoot:
    """How a configuration's first server boots (plan_first_boot): its engine, given the estimate's KV blocks where
    it will compile (`blocks`; None: sized by vLLM), and its compile key in the cache, noted once a boot has compiled
    or loaded it. Shared by run_trial and benchmarks/record_surface.py."""

    engine: EngineSpec
    blocks: int | None
    cache_root: Path
    key: str

    def note(self, lines: list[str]) -> None:
        """After a boot: one that compiled or loaded the key leaves its artifacts in the cache, so the key's next
        boot is warm (and sized by vLLM)."""
        if compile_cache_state(lines) is not None:
            remember_key(self.cache_root, self.key)


def plan_first_boot(plan: TrialPlan, build: Build) -> FirstBoot:
    """The first boot of `plan`: given plan.warm_kv_blocks where its compile key is new (blocks_for_first_boot)."""
    cache_root, key = _compile_key(plan)
    blocks = blocks_for_first_boot(plan, build, key_is_new(cache_root, key))
    return FirstBoot(given_blocks(plan.engine, blocks), blocks, cache_root, key)


def warm_kv_blocks(estimate: Estimate, cuda: bool) -> int | None:
    """The KV blocks the estimator predicts for a warm boot, which a boot that compiles is given (TrialPlan's
    warm_kv_blocks): on a GPU, where the central prediction fits, or where only a boot peak is in doubt (inside the
    band, not refused), which the blocks given do not move: vLLM sizing a boot that compiles leaves it 1-2 GiB short
    (h100-as-rtx3090-awq-marlin: the recipe, held down to a 3090's total, was left 36 Mamba blocks for 48 sequences
    and failed, then served warm with one block more than predicted). A KV cache that fits only at the band's optimistic
    end is left to vLLM."""
    usable = estimate.kv_fits and not estimate.refused  # an estimate that fits does both
    return estimate.num_blocks if cuda and usable and estimate.num_blocks > 0 else None


def blocks_for_first_boot(plan: TrialPlan, build: Build, compiles: bool) -> int | None:
    """The KV blocks a trial's first boot is given: the estimate's for a warm boot, where the boot will compile on
    the CUDA build (the CPU build's KV cache is VLLM_CPU_KVCACHE_SPACE either way) and the configuration does not
    size its KV cache itself."""
    if build is not Build.CUDA or not compiles or any(plan.engine.flags.get(f) for f in _OWN_KV_SIZE):
        return None
    return plan.warm_kv_blocks


_OWN_KV_SIZE = ("num_gpu_blocks_override", "kv_cache_memory_bytes")  # a configuration that sizes its KV cache itself


def given_blocks(engine: EngineSpec, blocks: int | None) -> EngineSpec:
    """The engine with its KV cache set to `blocks`: vLLM still profiles (and compiles), then logs the figure it
    overrides ("Overriding num_gpu_blocks=X with num_gpu_blocks_override=Y"); the flag is in no compile key
    (config/cache.py, 0.25.0 and 0.32.0), so the next boot finds the artifacts this one compiled."""
    if blocks is None:
        return engine
    return dataclasses.replace(engine, flags={**engine.flags, "num_gpu_blocks_override": blocks})


def kv_may_bind(plan: TrialPlan, boot: BootInfo) -> bool:
    """Whether a server's KV cache might not hold the search's first level at once (at most max_num_seqs of its
    requests run together). vLLM prints how many requests of max_model_len tokens it holds ("Maximum concurrency
    for N tokens per request"); shorter ones never need more. Its token count says less for a hybrid model, whose
    blocks hold 800-1568 tokens: 22,755 tokens held only 6 chat requests of ~700
    (benchmarks/data/h200-as-rtx3090-chat-cold-then-warm, trial 2). Not printed, or rate mode: it might."""
    search = plan.objective.load
    if search.mode != "concurrency" or not boot.max_concurrency:
        return True
    seqs = plan.engine.flags.get("max_num_seqs")
    running = first_level(search, plan.prior)
    if isinstance(seqs, int | float) and seqs > 0:
        running = min(running, float(seqs))
    return boot.max_concurrency < running

