"""`autotune estimate STUDY`: the study's baselines and sampled configurations judged by the memory estimate as a
run here would judge them, without a boot and without writing anything."""

from __future__ import annotations

from pathlib import Path

import optuna

from autotune.config.study_file import StudySpec
from autotune.engine.flags import Build, detect_build, value_text
from autotune.errors import StorageError
from autotune.fit import feasibility
from autotune.fit.hardware import GpuProfile
from autotune.fit.memcap import MemoryCap
from autotune.measure.plan import configured
from autotune.search.slots import present_gpus
from autotune.search.space import EngineConfig, engine_config, suggest
from autotune.search.storage import default_storage, load_existing_study


def preview_configs(spec: StudySpec, n: int, seed: int = 0) -> list[tuple[str, EngineConfig]]:
    """The baselines and n configurations sampled from the space (uniformly), as a study would boot them."""
    out = [(f"baseline: {b.name}", engine_config(spec, {}, baseline=b.flags)) for b in spec.baselines]
    scratch = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    for _ in range(n):
        params = suggest(scratch.ask(), spec.space)
        out.append((", ".join(f"{k}={value_text(v)}" for k, v in params.items()), engine_config(spec, params)))
    return out


def preview_estimates(spec: StudySpec, hardware: str | None, samples: int, storage_url: str | None = None,
                      vllm_version: str | None = None) -> tuple[GpuProfile, list[tuple]]:
    """The card the study plans with (capped when it has a memory cap) and, for the baselines and `samples`
    sampled configurations, (label, model, flags, memory verdict), calibrated by the study's stored warm boots
    when its storage exists, for vllm_version (None: the study's vllm_version, else the installed one)."""
    profile = estimate_profile(hardware, spec.hardware, spec.memory_cap)
    seen = stored_observations(spec, storage_url)
    rows = []
    for label, config in preview_configs(spec, samples):
        path, flags = configured(config.model, config.flags)
        rows.append((label, config.model, flags, feasibility.judge(path, profile, flags, spec.env, seen,
                                                                   vllm_version or spec.vllm_version)))
    return profile, rows


def estimate_profile(named: str | None, hardware: str, cap: MemoryCap | None) -> GpuProfile:
    """The card `autotune estimate` plans on: --gpu's card as named (`named`), else `hardware` as a run here would
    plan it (the card present, with what other processes hold on it)."""
    return feasibility.planned_profiles(named or hardware, cap, detect_build() is Build.CPU,
                                        [] if named else present_gpus())[0]


def stored_observations(spec: StudySpec, storage_url: str | None) -> list[feasibility.Observation]:
    """The booted trials of the study's storage, read-only; none when it has not run yet (nothing is created)."""
    url = storage_url or spec.storage or default_storage(spec)
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        return []
    try:
        return feasibility.observations(load_existing_study(spec.name, url).trials)
    except StorageError:
        return []
