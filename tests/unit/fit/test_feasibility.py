"""The estimator corrected by a study's own boots (autotune/feasibility.py), without the engine.

Trials are real Optuna FrozenTrials (optuna.trial.create_trial) stored in a real SQLite study and read back, with
their user attributes written by the same functions the run loop uses (outcome.config_attrs, outcome.result_attrs,
feasibility.prediction_attrs), so a change of an attribute's name on either side breaks these tests.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.engine.logs import BootInfo, Failure, FailureKind
from autotune.engine.models import write_tiny_model
from autotune.fit.estimate import Corrections, estimate
from autotune.fit.feasibility import (
    Observation,
    corrections,
    dominated_by_failure,
    judge,
    observations,
    prediction_attrs,
    slow_dtype_warning,
)
from autotune.fit.hardware import get_profile, host_has_avx512_bf16
from autotune.fit.model_shape import ModelShape
from autotune.measure.trial import TrialResult
from autotune.search import record
from autotune.units import GiB, MiB

CPU = get_profile("cpu")
RTX3090 = get_profile("rtx3090")


@pytest.fixture()
def dense(tmp_path: Path) -> str:
    """The tiny dense model directory (config + tokenizer only: nothing boots here)."""
    return str(write_tiny_model("dense", tmp_path / "dense"))


@pytest.fixture()
def study(tmp_path: Path) -> optuna.Study:
    return optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}", study_name="feasibility")


def add(study: optuna.Study, attrs: dict[str, object], state: TrialState = TrialState.COMPLETE) -> None:
    value = 0.0 if state == TrialState.COMPLETE else None
    study.add_trial(optuna.trial.create_trial(state=state, value=value, user_attrs=attrs))


def booted(model: str, flags: dict[str, object], result: TrialResult, env: dict[str, str] | None = None) -> dict:
    """A booted trial's attributes as search/one_trial.py and tell_result write them: config, prediction, result."""
    verdict = judge(model, CPU, flags, env or {})
    return {**record.config_attrs(model, flags), **prediction_attrs(verdict.estimate), **record.result_attrs(result)}


def obs(trial: int, flags: dict, *, predicted: int | None = None, observed: int | None = None,
        per_token: float | None = None, failed: bool = False, on: str | None = None) -> Observation:
    return Observation(trial, flags, predicted, observed, per_token, failed, on)


def test_bfloat16_on_a_cpu_without_avx512_bf16_is_warned_before_any_boot(dense) -> None:
    # The tiny model is bfloat16: on this machine's CPU (read from /proc/cpuinfo, not assumed) the warning is due
    # exactly when the CPU lacks AVX512-BF16; float32, or the CUDA build, never warrants it.
    warning = slow_dtype_warning(dense, {}, cpu_build=True)
    if host_has_avx512_bf16():
        assert warning is None
    else:
        assert warning is not None and "AVX512-BF16" in warning and 'dtype = "float32"' in warning
    assert slow_dtype_warning(dense, {"dtype": "bfloat16"}, cpu_build=True) == warning
    assert slow_dtype_warning(dense, {"dtype": "float32"}, cpu_build=True) is None
    assert slow_dtype_warning(dense, {}, cpu_build=False) is None


def test_a_hybrid_model_on_the_cpu_build_is_bfloat16_or_refused(tmp_path) -> None:
    # float32 booted (the 32-wide-head tiny:hybrid of 2026-12-04: 441,505 KV tokens, as predicted) and died at the
    # first request: "CPU GDN attention requires BF16." So it is refused before boot, and the warning does not
    # advise float32 for it.
    hybrid = str(write_tiny_model("hybrid", tmp_path / "hybrid"))
    flags = {"max_model_len": 4096, "kv_cache_memory_bytes": 512 * MiB, "enforce_eager": True}
    refused = judge(hybrid, CPU, {**flags, "dtype": "float32"}, {})
    assert refused.estimate.refused and "Gated DeltaNet layers in bfloat16 only" in refused.reason
    assert judge(hybrid, CPU, flags, {}).fits
    assert judge(hybrid, RTX3090, {**flags, "dtype": "float32"}, {}).fits  # the CUDA kernels take float32
    warning = slow_dtype_warning(hybrid, flags, cpu_build=True)
    assert (warning is None) == host_has_avx512_bf16()
    assert warning is None or "float32:" not in warning


# ---- observations() from stored trials -----------------------------------------------------------------------


def test_observations_read_what_the_run_loop_records(study, dense, tmp_path) -> None:
    ok_flags = {"load_format": "dummy", "max_model_len": 2048, "max_num_seqs": 8}
    kv_env = {"VLLM_CPU_KVCACHE_SPACE": "1"}
    # 0: booted, vLLM said 500,000 tokens where 524,288 were predicted (1 GiB / 2 KiB per token)
    add(study, booted(dense, ok_flags, TrialResult("ok", 100.0, boot=BootInfo(38.0, 500_000)), kv_env))
    # 1: failed for memory during the boot (no KV figure)
    oom_flags = {**ok_flags, "max_model_len": 8192, "kv_cache_memory_bytes": MiB}
    kv_fail = Failure(FailureKind.KV_CACHE_TOO_SMALL, "KV cache too small for max_model_len", "ValueError: ...")
    add(study, booted(dense, oom_flags, TrialResult("infeasible", failure=kv_fail)))
    # 2: rejected before boot (tell_rejected's attributes): teaches the estimator nothing it did not say itself
    add(study, {**record.config_attrs(dense, oom_flags), "status": "infeasible", "booted": False,
                "reason": "predicted not to fit"})
    # 3: crashed for another reason, without a KV figure: not a memory fact
    crash = Failure(FailureKind.CRASH, "engine died", "")
    add(study, booted(dense, ok_flags, TrialResult("failed", failure=crash)))
    # 4: a FAIL trial (port taken, stopped by the user) even with a KV figure
    add(study, booted(dense, ok_flags, TrialResult("ok", boot=BootInfo(1.0, 7))), TrialState.FAIL)
    # 5: booted and then died of out-of-memory under load: both a KV figure and a memory failure
    died = Failure(FailureKind.OUT_OF_MEMORY, "out of memory", "")
    add(study, booted(dense, ok_flags, TrialResult("infeasible", boot=BootInfo(40.0, 524_288), failure=died), kv_env))
    # 6: a compiling boot given the estimate's KV blocks (trial.py): its figure is the estimate's own
    add(study, booted(dense, ok_flags, TrialResult("ok", 90.0, boot=BootInfo(40.0, 524_288, profiled_blocks=3000),
                                                   kv_blocks_set=4096), kv_env))

    stored = optuna.load_study(study_name="feasibility", storage=f"sqlite:///{tmp_path / 'study.db'}")
    seen = observations(stored.trials)
    assert [o.trial for o in seen] == [0, 1, 5]
    first, oom, under_load = seen
    assert first.flags == ok_flags  # the JSON of config_attrs, decoded
    assert (first.predicted_kv_tokens, first.observed_kv_tokens, first.memory_failed) == (524_288, 500_000, False)
    assert first.kv_bytes_per_token == 2048  # CPU block: 4 layers x 128 tokens x 512 B = 256 KiB per 128 tokens
    assert oom.memory_failed and oom.observed_kv_tokens is None and oom.flags["kv_cache_memory_bytes"] == MiB
    assert under_load.memory_failed and under_load.observed_kv_tokens == 524_288


# ---- corrections() ---------------------------------------------------------------------------------------------


def test_corrections_move_both_ways_by_the_median_residual() -> None:
    seen = [
        obs(0, {}, predicted=524_288, observed=500_000, per_token=2048),  # 24,288 tokens x 2 KiB = 49,741,824 B
        obs(1, {}, predicted=100_000, observed=90_000, per_token=8192),  # 10,000 x 8 KiB = 81,920,000 B
        obs(2, {}, predicted=10_000, observed=12_000, per_token=2048),  # under-predicted: -4,096,000 B
        obs(3, {}, failed=True),  # a failure carries no figure
        obs(4, {}, predicted=10_000, observed=1, per_token=None),  # no per-token size recorded: unusable
    ]
    fitted = corrections(seen)
    assert (fitted.overhead_bytes, fitted.calibrated_by) == (49_741_824, 3)  # the median, not the largest
    # the spread around it (81.9 MB - 49.7 MB + 4.1 MB; no block size known), but never under the calibrated floor
    assert fitted.uncertainty_bytes == max(81_920_000 - 49_741_824 + 4_096_000, 128 * MiB)
    wide = corrections([*seen, obs(5, {}, predicted=100_000, observed=10_000, per_token=8192)])
    assert wide.uncertainty_bytes == 90_000 * 8192 - (49_741_824 + 81_920_000) // 2  # median of four: the middle two
    # more KV printed than predicted lowers the overhead: the estimate becomes more optimistic
    under = corrections([obs(0, {}, predicted=1000, observed=5000, per_token=2048)])
    assert under.overhead_bytes == -4000 * 2048 and under.calibrated_by == 1
    assert under.uncertainty_bytes == 128 * MiB  # one boot: the calibrated floor
    assert corrections([]) == Corrections()


def test_corrections_only_from_boots_on_this_card_and_version() -> None:
    here, there = "RTX 3090, vLLM 0.25.0", "H100, vLLM 0.25.0"
    seen = [obs(0, {}, predicted=2000, observed=1000, per_token=2048, on=there),
            obs(1, {}, predicted=1500, observed=1000, per_token=2048, on=here),
            obs(2, {}, predicted=1200, observed=1000, per_token=2048)]  # an old trial: where is unknown, usable
    assert corrections(seen, here=here).overhead_bytes == 350 * 2048  # median of 500 and 200 tokens


def test_judge_corrections_move_both_ways(dense) -> None:
    flags = {"max_model_len": 4096, "max_num_seqs": 16}
    plain = judge(dense, RTX3090, flags, {})
    assert plain.calibrated_by == 0 and plain.predicted_on == f"{RTX3090.name}, vLLM 0.32.0"
    per_block = plain.estimate.bytes_per_block
    for blocks, sign in ((-40, 1), (40, -1)):  # vLLM printed 40 blocks fewer, then 40 more, than predicted
        tokens = int((plain.estimate.num_blocks + blocks) / plain.estimate.blocks_per_request * 4096)
        fitted = judge(dense, RTX3090, flags, {}, [obs(0, flags, observed=tokens)])
        moved = fitted.estimate.kv_cache_bytes - plain.estimate.kv_cache_bytes
        assert fitted.calibrated_by == 1 and fitted.fits
        assert abs(moved + sign * 40 * per_block) <= per_block  # the correction follows the residual's sign
        assert fitted.estimate.uncertainty_bytes <= plain.estimate.uncertainty_bytes  # never a wider band


def test_the_servers_environment_decides_the_awq_kernel_and_so_the_weights(monkeypatch, tmp_path: Path) -> None:
    """vLLM reads VLLM_DISABLED_KERNELS from the server's environment: the tuner's, with the study's [engine.env]
    over it. On an H100 with Machete disabled, 4-bit AWQ is held as Marlin holds it on an RTX 3090, 0.34 GiB lighter
    for Qwen3.5-27B (h100-as-rtx3090-awq-machete, benchmarks/tests/test_boot_peak.py)."""
    known = Path(__file__).parents[3] / "autotune" / "engine" / "known_models" / "qwen3.5-27b-awq.json"
    (tmp_path / "config.json").write_text(known.read_text())
    model = str(tmp_path)
    h100, flags = get_profile("h100-80gb"), {"max_model_len": 4096, "max_num_seqs": 16, "language_model_only": True}
    monkeypatch.delenv("VLLM_DISABLED_KERNELS", raising=False)
    machete = judge(model, h100, flags, {}).estimate.weights_bytes
    from_study = judge(model, h100, flags, {"VLLM_DISABLED_KERNELS": "MacheteLinearKernel"}).estimate.weights_bytes
    monkeypatch.setenv("VLLM_DISABLED_KERNELS", "MacheteLinearKernel")
    from_shell = judge(model, h100, flags, {}).estimate.weights_bytes
    assert from_study == from_shell == judge(model, RTX3090, flags, {}).estimate.weights_bytes
    assert 0.3 * GiB < machete - from_shell < 0.4 * GiB


# ---- dominated_by_failure() ------------------------------------------------------------------------------------

FAILED = {"load_format": "dummy", "max_model_len": 4096, "max_num_seqs": 32, "max_num_batched_tokens": 2048,
          "gpu_memory_utilization": 0.8, "kv_cache_dtype": "auto"}


@pytest.mark.parametrize("change,dominated", [
    ({}, True),  # the same configuration again
    ({"max_num_seqs": 64}, True),  # more sequences
    ({"max_model_len": 8192, "max_num_batched_tokens": 4096}, True),  # longer and wider
    ({"gpu_memory_utilization": 0.7}, True),  # less memory given
    ({"max_num_seqs": 16}, False),  # fewer sequences: may fit
    ({"max_model_len": 2048}, False),  # shorter
    ({"gpu_memory_utilization": 0.9}, False),  # more memory given
    ({"max_num_seqs": 64, "max_model_len": 2048}, False),  # heavier on one axis, lighter on another
    ({"kv_cache_dtype": "fp8"}, False),  # another class of configuration
    ({"enable_prefix_caching": False}, False),  # a flag the failure did not have
])
def test_dominated_by_failure(change: dict, dominated: bool) -> None:
    failure = obs(7, FAILED, failed=True)
    found = dominated_by_failure({**FAILED, **change}, [failure])
    assert (found is failure) if dominated else (found is None)


def test_only_memory_failures_dominate() -> None:
    assert dominated_by_failure(FAILED, [obs(3, FAILED, predicted=1, observed=1, per_token=2048)]) is None
    assert dominated_by_failure(FAILED, []) is None
    # a demand the failure fixed but the candidate leaves to vLLM's default is not known to be heavier
    assert dominated_by_failure({k: v for k, v in FAILED.items() if k != "max_num_seqs"},
                                [obs(3, FAILED, failed=True)]) is None
    # the first failure that dominates is the one reported
    lighter = obs(1, {**FAILED, "max_num_seqs": 8}, failed=True)
    assert dominated_by_failure(FAILED, [obs(0, {**FAILED, "max_num_seqs": 64}, failed=True), lighter]) is lighter


# ---- judge() ---------------------------------------------------------------------------------------------------


def test_judge_refuses_what_is_at_least_as_demanding_as_an_out_of_memory(dense) -> None:
    flags = {"load_format": "dummy", "max_model_len": 2048, "max_num_seqs": 8, "kv_cache_memory_bytes": 256 * MiB}
    assert judge(dense, CPU, flags, {}).fits  # the estimator alone would boot it
    seen = [obs(4, flags, failed=True)]
    again = judge(dense, CPU, flags, {}, seen)
    assert not again.fits and again.reason == "at least as demanding as trial 4, which ran out of memory"
    assert again.excess_gib == 1.0  # a violated memory constraint the sampler learns from
    heavier = judge(dense, CPU, {**flags, "max_num_seqs": 16, "max_model_len": 4096}, {}, seen)
    assert not heavier.fits and "trial 4" in heavier.reason
    lighter = judge(dense, CPU, {**flags, "max_num_seqs": 4}, {}, seen)
    assert lighter.fits and lighter.reason == "" and lighter.excess_gib == 0.0


def test_judge_rejects_what_the_estimator_says_cannot_fit(dense) -> None:
    # 1 MiB of KV cache = 4 CPU blocks of 256 KiB; max_model_len 4096 needs 32 + the null block.
    flags = {"max_model_len": 4096, "kv_cache_memory_bytes": MiB}
    verdict = judge(dense, CPU, flags, {})
    assert not verdict.fits and "one request of max_model_len 4,096" in verdict.reason
    assert verdict.excess_gib == pytest.approx((33 * 256 * 1024 - MiB) / GiB)
    # the boundary: 33 blocks fit exactly, one byte fewer does not
    assert judge(dense, CPU, {**flags, "kv_cache_memory_bytes": 33 * 256 * 1024}, {}).fits
    assert not judge(dense, CPU, {**flags, "kv_cache_memory_bytes": 33 * 256 * 1024 - 1}, {}).fits


def test_judge_reads_vllm_cpu_kvcache_space_from_the_env(dense) -> None:
    flags = {"max_model_len": 2048, "kv_cache_memory_bytes": MiB}  # the env var overrides the flag on the CPU build
    verdict = judge(dense, CPU, flags, {"VLLM_CPU_KVCACHE_SPACE": "0.5"})
    assert verdict.fits and verdict.estimate.kv_cache_bytes == GiB // 2
    assert verdict.estimate.kv_tokens == 2048 // 16 * 2048 == 262_144  # 2048 blocks of 128 tokens, 16 per request


# ---- prediction_attrs() ----------------------------------------------------------------------------------------


def test_prediction_attrs_keys_and_values(dense) -> None:
    est = estimate(ModelShape.from_dir(dense), CPU, {"max_model_len": 2048}, cpu_kvcache_bytes=GiB)
    attrs = prediction_attrs(est)
    assert attrs == {
        "predicted_fits": True,
        "predicted_kv_tokens": 524_288,
        "predicted_weights_gib": round(3_410_688 * 2 / GiB, 3),  # 3,410,688 bf16 parameters (test_estimate.py)
        "predicted_kv_cache_gib": 1.0,
        "predicted_kv_bytes_per_token": 2048.0,
        "predicted_kv_tokens_low": 524_288,  # an explicit KV size is exact: no band on the pool
        "predicted_kv_tokens_high": 524_288,
    }
    json.dumps(attrs)  # storable as Optuna user attributes
    miss = prediction_attrs(estimate(ModelShape.from_dir(dense), CPU, {"max_model_len": 4096,
                                                                       "kv_cache_memory_bytes": MiB}))
    assert miss["predicted_fits"] is False and miss["predicted_kv_tokens"] == int(4 / 32 * 4096) == 512
    assert math.isclose(miss["predicted_kv_cache_gib"], round(MiB / GiB, 3))


def test_a_models_config_is_read_in_one_place_for_its_shape_and_its_vocabulary(tmp_path):
    """engine/models.model_config: a directory's config.json, or the shipped copy of a known hub id (offline)."""
    from autotune.engine.models import KNOWN, model_config, model_vocab_size
    from autotune.errors import SpecError
    from autotune.fit.feasibility import model_shape

    hub_id = next(iter(KNOWN))
    vocab = model_config(hub_id)["text_config"]["vocab_size"]
    assert model_vocab_size(hub_id) == model_shape(hub_id).vocab_size == vocab
    with pytest.raises(SpecError, match="cannot read model config"):
        model_config(str(tmp_path))


def test_a_cold_boot_teaches_nothing(study, dense, tmp_path) -> None:
    """compile_cache "cold": torch.compile ran inside vLLM's memory profiling (1-2 GiB more peak); neither its KV
    figure nor its memory failure is the configuration's. Absent (old trials, eager boots) is usable."""
    flags = {"load_format": "dummy", "max_model_len": 2048, "max_num_seqs": 8}
    kv_fail = Failure(FailureKind.TOO_MANY_SEQS_FOR_STATE, "max_num_seqs exceeds the Mamba cache blocks", "")
    add(study, {**booted(dense, flags, TrialResult("infeasible", failure=kv_fail)), "compile_cache": "cold"})
    add(study, {**booted(dense, flags, TrialResult("ok", 1.0, boot=BootInfo(9.0, 1000))), "compile_cache": "cold"})
    add(study, {**booted(dense, flags, TrialResult("ok", 1.0, boot=BootInfo(9.0, 2000))), "compile_cache": "warm"})
    add(study, booted(dense, flags, TrialResult("ok", 1.0, boot=BootInfo(9.0, 3000))))
    stored = optuna.load_study(study_name="feasibility", storage=f"sqlite:///{tmp_path / 'study.db'}")
    seen = observations(stored.trials)
    assert [(o.trial, o.observed_kv_tokens) for o in seen] == [(2, 2000), (3, 3000)]
    assert dominated_by_failure(flags, seen) is None  # the cold failure is no 'does not fit' fact
