"""The GPU surface's recorder (benchmarks/record_surface.py --plan) without booting anything: the plan file read
into the configurations it boots on the device, the surface file resumed, and the second (warm) boot after a cold
one, decided on the device's own server logs (benchmarks/data/h200-chat-as-3090)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.engine.defaults import DEFAULT_UTILIZATION
from autotune.engine.flags import Build
from autotune.engine.logs import BootInfo, classify_log, parse_boot_info
from autotune.engine.server import BootFailed
from autotune.fit import memcap
from autotune.fit.hardware import get_profile
from benchmarks import record_surface as rs
from benchmarks.h200.run_h200 import DEVICE_FLAGS

REPO = Path(__file__).parents[3]
PLAN = REPO / "benchmarks" / "data" / "surface-plan-rtx3090.json"
CHAT_RUN = REPO / "benchmarks" / "data" / "h200-chat-as-3090"
GPU_BOOTS = REPO / "tests" / "data" / "gpu-boots"
MODEL = "/tmp/gpurun/qwen3.5-27b-awq-dummy"  # the device's model folder; nothing here reads it
H200 = get_profile("h200")


@pytest.fixture(scope="module")
def planned() -> tuple[dict, object, list[rs.PlannedConfig]]:
    plan, spec = rs.read_plan(PLAN)
    return plan, spec, rs.planned_configs(plan, spec, MODEL, H200)


def test_every_planned_configuration_boots_the_device_model_with_the_study_and_device_flags(planned) -> None:
    plan, _, configs = planned
    assert [c.index for c in configs] == list(range(len(plan["configs"]))) and len(configs) >= 30
    for c in configs:
        assert c.model == MODEL
        assert c.flags["language_model_only"] is True  # the study's [engine]
        assert DEVICE_FLAGS.items() <= c.flags.items()


def test_a_sampled_configuration_boots_its_params(planned) -> None:
    _, _, configs = planned
    c = next(c for c in configs if c.origin == "sobol" and c.params["speculative_method"] == "mtp")
    for name in ("kv_cache_dtype", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
        assert c.flags[name] == c.params[name]
    assert c.flags["speculative_config"] == {"method": "mtp",
                                             "num_speculative_tokens": c.params["num_speculative_tokens"]}


def test_the_baselines_boot_their_own_flags_and_vllms_defaults_those_of_the_capped_card(planned) -> None:
    _, _, configs = planned
    by_name = {c.baseline: c for c in configs if c.baseline is not None}
    recipe = by_name["recipe"].flags
    assert {k: recipe[k] for k in ("max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill",
                                   "max_model_len")} == {"max_num_seqs": 48, "max_num_batched_tokens": 8192,
                                                         "enable_chunked_prefill": True, "max_model_len": 8192}
    assert "enable_prefix_caching" not in recipe  # the space's values are not the baseline's
    defaults = by_name["vllm-defaults"].flags
    # vLLM's defaults for a card under 70 GB (the 3090), not the H200's: what the capped card would boot
    assert (defaults["max_num_seqs"], defaults["max_num_batched_tokens"]) == (256, 2048)
    assert by_name["vllm-defaults"].model == MODEL


def test_the_memory_cap_is_translated_for_the_real_card(planned) -> None:
    _, spec, configs = planned
    cap = spec.memory_cap
    for c in configs:
        asked = DEFAULT_UTILIZATION if c.baseline else c.params["gpu_memory_utilization"]
        booted = c.flags["gpu_memory_utilization"]
        assert booted < 0.2  # a 24 GiB card's share of the H200's 141 GiB
        assert memcap.reserved_bytes(H200.cuda_total_bytes, booted) == \
            memcap.reserved_bytes(cap.cuda_total_bytes, asked)


def test_a_new_surface_starts_empty_and_a_resumed_one_skips_what_it_holds(planned, tmp_path: Path) -> None:
    plan, spec, configs = planned
    out = tmp_path / "surface.json"
    doc = rs.surface_doc(out, PLAN, plan, spec, H200)
    assert doc["configs"] == [] and rs.to_record(configs, doc) == configs
    assert [b["name"] for b in doc["provenance"]["baselines"]] == ["vllm-defaults", "recipe"]
    for i in (0, 5):  # as recorded: the params in another key order
        doc["configs"].append({"params": dict(reversed(configs[i].params.items())), "wall_s": 400.0})
    rs.save(doc, out)
    resumed = rs.surface_doc(out, PLAN, plan, spec, H200)
    left = rs.to_record(configs, resumed)
    assert [c.index for c in left] == [i for i in range(len(configs)) if i not in (0, 5)]


def test_a_surface_of_another_plan_is_not_resumed(planned, tmp_path: Path) -> None:
    plan, spec, _ = planned
    out = tmp_path / "surface.json"
    out.write_text(json.dumps({"format": 2, "provenance": {"how": "another plan"}, "configs": []}))
    with pytest.raises(SystemExit, match="another plan"):
        rs.surface_doc(out, PLAN, plan, spec, H200)


@pytest.mark.parametrize(("walls", "reserve"), [
    ([], rs.BOOT_RESERVE_S),  # nothing recorded yet
    ([120.0, 200.0], rs.BOOT_RESERVE_S),  # two quick boot failures
    ([120.0, 650.0, 700.0], 650.0),  # configurations booted cold, then warm, and measured
])
def test_a_new_configuration_starts_only_with_the_median_recorded_time_left(walls: list[float],
                                                                             reserve: float) -> None:
    assert rs.reserve_s({"configs": [{"wall_s": w} for w in walls]}) == reserve


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_a_cold_cuda_boot_that_came_up_is_booted_again_warm() -> None:
    cold = lines(CHAT_RUN / "trial-0002.log")  # came up cold with 22,755 tokens (warm: ~57,000 predicted)
    booted = parse_boot_info(cold, 118.0)
    assert rs.warm_boot_due(Build.CUDA, booted, cold)
    assert not rs.warm_boot_due(Build.CPU, booted, cold)  # the CPU build's KV cache does not depend on it
    assert rs.boot_fields(booted, cold) == {"status": "booted", "boot_s": 118.0, "kv_cache_tokens": 22_755,
                                            "compile_cache": "cold"}


def test_a_cold_boot_that_failed_for_memory_is_booted_again_and_both_boots_are_kept() -> None:
    cold = lines(CHAT_RUN / "trial-0000.cold.log")  # the recipe: 48 seqs against 29 Mamba blocks, cold
    failed = BootFailed(classify_log(cold), 200.04)
    assert rs.warm_boot_due(Build.CUDA, failed, cold)
    first = rs.boot_fields(failed, cold)
    assert first["status"] == "boot_failed" and first["failure_kind"] == "too_many_seqs_for_state"
    assert "(29)" in str(first["reason"])
    assert (first["boot_s"], first["kv_cache_tokens"], first["compile_cache"]) == (200.0, 16_969, "cold")
    warm = lines(CHAT_RUN / "trial-0000.log")  # the same flags warm: up, with 30,427 tokens
    booted = parse_boot_info(warm, 77.0)
    assert not rs.warm_boot_due(Build.CUDA, booted, warm)
    assert rs.boot_fields(booted, warm) == {"status": "booted", "boot_s": 77.0, "kv_cache_tokens": 30_427,
                                            "compile_cache": "warm"}


def test_a_warm_memory_failure_stands() -> None:
    warm = lines(GPU_BOOTS / "a-s48-b8192-l8192-util090.log")
    failure = classify_log(warm)
    assert failure.kind.is_memory
    assert not rs.warm_boot_due(Build.CUDA, BootFailed(failure, 90.0), warm)


def test_an_eager_boot_is_not_booted_again() -> None:
    eager = lines(REPO / "tests" / "data" / "gpu" / "cuda-0.25-boot-eager.log")
    assert not rs.warm_boot_due(Build.CUDA, BootInfo(60.0), eager)
