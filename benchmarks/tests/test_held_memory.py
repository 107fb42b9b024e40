"""Memory other processes hold on the card (a desktop's display server on a home 3090) is planned around, not
mistaken for a leftover server: NVML's figures as GpuInfo, the 3090 study as shipped."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from autotune.config.study_file import load_study
from autotune.fit import feasibility
from autotune.fit.estimate import estimate
from autotune.fit.hardware import PROFILES, GpuInfo, held_by_others
from autotune.search.gpu_wait import taken_since_start
from autotune.search.slots import Slot, slot_gpus
from autotune.units import GiB, MiB
from benchmarks import estimator_accuracy as acc

ROOT = Path(__file__).resolve().parents[2]
RTX3090 = load_study(ROOT / "studies" / "qwen3.5-27b-rtx3090.toml")
AS_3090 = load_study(ROOT / "studies" / "qwen3.5-27b-h200-as-3090.toml")


def desktop(index: int = 0, used_mib: int = 1_200, reserved_mib: int | None = None) -> GpuInfo:
    """A 3090 that drives a display: NVML's v1 used counts the driver's reserve (None: a driver without v2)."""
    total = 24_576 * MiB
    return GpuInfo(index, "NVIDIA GeForce RTX 3090", total, used_mib * MiB, total - used_mib * MiB, "GPU-d",
                   (8, 6), 936.0, None if reserved_mib is None else reserved_mib * MiB)


def test_what_others_hold_is_nvmls_used_less_the_drivers_reserve() -> None:
    profile = PROFILES["rtx3090"]
    assert held_by_others([desktop()], profile) == (1_200 - 384) * MiB  # the profile's reserve: no v2 figure
    assert held_by_others([desktop(reserved_mib=400)], profile) == 800 * MiB
    assert held_by_others([desktop(used_mib=384)], profile) == 0  # an idle headless card
    assert held_by_others([desktop(0, 500), desktop(1, 2_000)], profile) == (2_000 - 384) * MiB  # the busiest
    assert held_by_others([], profile) == 0


def test_the_study_plans_on_what_the_display_leaves() -> None:
    profile, real = feasibility.planned_profiles(RTX3090.hardware, None, cpu_build=False, gpus=[desktop()])
    assert profile == real and profile.held_bytes == 816 * MiB
    assert profile.usable_bytes == PROFILES["rtx3090"].cuda_total_bytes - 816 * MiB
    assert profile.label == "rtx3090 (0.80 GiB held by other processes)"
    assert profile.name == "rtx3090"  # calibration is keyed by the card's name: a desktop's boots still count
    assert feasibility.planned_profiles(RTX3090.hardware, None, cpu_build=True, gpus=[])[0].held_bytes == 0


def test_a_memory_cap_plans_on_the_capped_card_whatever_the_big_one_holds() -> None:
    h200 = GpuInfo(0, "NVIDIA H200", 143_771 * MiB, 5 * GiB, 0, "u", (9, 0), 4_800.0, 615 * MiB)
    profile, real = feasibility.planned_profiles(AS_3090.hardware, AS_3090.memory_cap, cpu_build=False, gpus=[h200])
    assert profile.held_bytes == 0 and profile.cuda_total_bytes == (24_576 - 384) * MiB
    assert real.name == "h200" and real.cuda_total_bytes == (143_771 - 615) * MiB  # the GPU given, not one looked up


def test_the_servers_gpus_are_those_the_slots_name() -> None:
    gpus = [desktop(0), desktop(1, 3_000), desktop(2)]
    assert slot_gpus(gpus, (Slot(),)) == gpus[:1]
    assert slot_gpus(gpus, (Slot("1", (1,)), Slot("2", (2,)))) == gpus[1:]


def test_only_memory_taken_since_the_run_began_stops_a_boot() -> None:
    """A leftover server (or anything started since) is waited for and then stops the run; the display's memory,
    in use when the run began, is not."""
    start = {0: 1_200 * MiB}
    assert taken_since_start([desktop(0, 1_300)], start) == []
    assert taken_since_start([desktop(0, 1_600)], start) != []
    assert taken_since_start([desktop(0, 900)], {}) == []  # an idle card (the reserve, a context): as before
    assert taken_since_start([desktop(0, 1_100)], {}) != []


def test_the_display_takes_mtp_off_a_3090() -> None:
    """MTP on a 3090 through Marlin peaked at 23.19 GiB booting (h100-as-rtx3090-awq-machete's Marlin probe, predicted
    23.28) against the card's 23.62: headless it fits; beside a display holding 0.8 GiB its drafter's peak passes what
    is left, and a utilization of 0.97 asks vLLM for more than is free at startup (vLLM refuses to start)."""
    [entry] = [c for c in acc.surface_boots("h100-as-rtx3090-awq-machete/surface.json") if c["plan_index"] == 11]
    shape = acc._shape(str(acc.CONFIG))
    flags = {"language_model_only": True, **{k: v for k, v in entry["params"].items() if k != "speculative_method"},
             "speculative_config": entry["flags"]["speculative_config"]}
    headless = estimate(shape, PROFILES["rtx3090"], flags, vllm_version="0.25.0")
    beside = estimate(shape, dataclasses.replace(PROFILES["rtx3090"], held_bytes=816 * MiB), flags,
                      vllm_version="0.25.0")
    assert headless.fits and headless.boot_peak_bytes < 23.4 * GiB
    assert not beside.fits and beside.boot_peak_bytes == headless.boot_peak_bytes
    assert any("that other processes leave on rtx3090 (0.80 GiB held)" in r for r in beside.reasons), beside.reasons
    greedy = estimate(shape, dataclasses.replace(PROFILES["rtx3090"], held_bytes=816 * MiB),
                      {**flags, "gpu_memory_utilization": 0.97}, vllm_version="0.25.0")
    assert greedy.refused and any("and the 0.80 GiB other processes hold" in r for r in greedy.reasons)
    headless_greedy = estimate(shape, PROFILES["rtx3090"], {**flags, "gpu_memory_utilization": 0.97},
                               vllm_version="0.25.0")
    assert not any("asks for more than is free" in r for r in headless_greedy.reasons)  # headless, 0.97 may start
    assert feasibility.where(PROFILES["rtx3090"], "0.25.0") == feasibility.where(
        dataclasses.replace(PROFILES["rtx3090"], held_bytes=816 * MiB), "0.25.0")


def test_beside_a_display_vllm_starts_below_about_0_945() -> None:
    """vLLM starts only if the card's free memory covers utilization x its CUDA total (gpu_worker's startup check):
    beside 0.80 GiB held and a CUDA context, 0.95 of a 3090 is more than is free, 0.94 is not."""
    shape, card = acc._shape(str(acc.CONFIG)), dataclasses.replace(PROFILES["rtx3090"], held_bytes=816 * MiB)
    flags = {"language_model_only": True, "max_num_seqs": 8, "max_model_len": 4096}

    def starts(util: float) -> bool:
        e = estimate(shape, card, {**flags, "gpu_memory_utilization": util}, vllm_version="0.25.0")
        return not any("asks for more than is free" in r for r in e.reasons)
    assert starts(0.94) and not starts(0.95)
