"""The GPU surface's recorder (benchmarks/record_surface.py --plan) without booting anything: the plan file read
into the configurations it boots on the device (with the estimator's warm KV blocks), the surface file resumed, the
boots decided on the device's own server logs (benchmarks/data/h200-as-rtx3090-chat-cold-then-warm and
h200-as-rtx3090-chat-kv-blocks-given), the walk over load
levels and when a level ends, and what a configuration is expected to cost."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from autotune.engine.defaults import DEFAULT_UTILIZATION
from autotune.engine.flags import Build, installed_vllm
from autotune.engine.logs import BootInfo, Failure, FailureKind, classify_log, parse_boot_info
from autotune.engine.server import BootFailed, EngineSpec
from autotune.fit import memcap
from autotune.fit.hardware import get_profile
from autotune.measure.client import Abandon, RequestRecord
from autotune.measure.stats import Limits
from benchmarks import record_surface as rs
from benchmarks.catalogue import log_lines
from benchmarks.h200.run_h200 import DEVICE_FLAGS

REPO = Path(__file__).parents[2]
PLAN = REPO / "benchmarks" / "data" / "rtx3090-surface-plan/awq.json"
CHAT_RUN = REPO / "benchmarks" / "data" / "h200-as-rtx3090-chat-cold-then-warm"
# the first boots given the estimate's KV blocks
S20 = REPO / "benchmarks" / "data" / "h200-as-rtx3090-chat-kv-blocks-given"
GPU_BOOTS = REPO / "tests" / "data" / "gpu-boots"
VERSION_NOTE = re.compile(r" \(modelled for vLLM [^)]*\)$")  # what a refusal adds since it is per version
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


def test_only_records_the_indices_given_in_the_order_given(planned) -> None:
    _, _, configs = planned
    last = len(configs) - 1
    assert [c.index for c in rs.chosen(configs, [last, 3, 0])] == [last, 3, 0]  # the start picks first
    with pytest.raises(SystemExit, match=f"--only: the plan has no configuration #{last + 7}"):
        rs.chosen(configs, [5, last + 7])
    assert rs.chosen(configs, []) == configs


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


def test_again_measures_recorded_configurations_once_more_each_and_a_resumed_run_skips_what_it_repeated(
        planned, tmp_path: Path) -> None:
    plan, spec, configs = planned
    doc = rs.surface_doc(tmp_path / "surface.json", PLAN, plan, spec, H200)
    for i in (1, 43):
        doc["configs"].append({"params": configs[i].params, "wall_s": 200.0})
    assert [c.index for c in rs.to_repeat(configs, [43, 1, 43], doc)] == [43, 1, 43]
    doc["repeats"] = [{"params": dict(reversed(configs[43].params.items()))}]  # one repeat of #43 held already
    assert [c.index for c in rs.to_repeat(configs, [43, 1, 43], doc)] == [1, 43]
    with pytest.raises(SystemExit, match=r"--again: #2 is not recorded yet"):
        rs.to_repeat(configs, [1, 2], doc)
    assert [c.index for c in rs.to_record(rs.chosen(configs, [5, 1, 5]), doc)] == [5]  # recorded or listed twice
    assert rs.to_repeat(configs, [], doc) == []  # no --again: nothing repeated (it once read as all of the plan)


def test_a_surface_of_another_plan_is_not_resumed(planned, tmp_path: Path) -> None:
    plan, spec, _ = planned
    out = tmp_path / "surface.json"
    out.write_text(json.dumps({"format": 2, "provenance": {"how": "another plan"}, "configs": []}))
    with pytest.raises(SystemExit, match="another plan"):
        rs.surface_doc(out, PLAN, plan, spec, H200)


def test_a_surface_is_resumed_only_on_the_card_it_was_recorded_on(planned, tmp_path: Path) -> None:
    """The same capped study on an H100 serves at another speed: its figures never join the H200's file."""
    plan, spec, _ = planned
    out = tmp_path / "surface.json"
    rs.save(rs.surface_doc(out, PLAN, plan, spec, H200), out)
    assert rs.surface_doc(out, PLAN, plan, spec, H200)["provenance"]["device"] == "h200"
    with pytest.raises(SystemExit, match="recorded on h200, not on this h100-80gb"):
        rs.surface_doc(out, PLAN, plan, spec, get_profile("h100-80gb"))


def test_a_surface_recorded_with_a_ballast_is_resumed_only_with_one_and_says_so(planned, tmp_path: Path) -> None:
    """Memory figures with the card held down to the capped card's total (benchmarks/h200/ballast.py) are not
    those of the surface recorded without: the two never mix in one file."""
    plan, spec, _ = planned
    held = "ballast: holding 115.000 GiB on GPU 0; CUDA free 23.620 of 139.800 GiB"
    with_ballast, without = tmp_path / "ballast.json", tmp_path / "surface.json"
    rs.save(rs.surface_doc(with_ballast, PLAN, plan, spec, H200, held), with_ballast)
    rs.save(rs.surface_doc(without, PLAN, plan, spec, H200), without)
    assert rs.surface_doc(with_ballast, PLAN, plan, spec, H200, held)["provenance"]["ballast"].startswith(held)
    assert "ballast" not in rs.surface_doc(without, PLAN, plan, spec, H200)["provenance"]
    with pytest.raises(SystemExit, match="recorded with a ballast"):
        rs.surface_doc(with_ballast, PLAN, plan, spec, H200)
    with pytest.raises(SystemExit, match="recorded without a ballast"):
        rs.surface_doc(without, PLAN, plan, spec, H200, held)


def test_flags_as_planned_and_autotunes_own_never_mix_in_one_file(planned, tmp_path: Path) -> None:
    """The surface's flags as planned (the capture size pinned) against autotune's own since the ballast run: the
    first ballast file holds the planned ones, so a ballast run of autotune's own flags needs another file."""
    plan, spec, _ = planned
    out = tmp_path / "surface.json"
    rs.save(rs.surface_doc(out, PLAN, plan, spec, H200, flags_kind=rs.AUTOTUNES_OWN), out)
    assert rs.surface_doc(out, PLAN, plan, spec, H200, flags_kind=rs.AUTOTUNES_OWN)["provenance"]["flags"] == \
        rs.AUTOTUNES_OWN
    with pytest.raises(SystemExit, match="recorded with the flags autotune's own .*, not as planned"):
        rs.surface_doc(out, PLAN, plan, spec, H200)
    first_ballast = REPO / "benchmarks" / "data" / "h100-as-rtx3090-awq-capture-pinned/surface.json"
    held = json.loads(first_ballast.read_text())["provenance"]["ballast"]
    copy = tmp_path / "ballast.json"
    copy.write_text(first_ballast.read_text())
    with pytest.raises(SystemExit, match="recorded with the flags as planned"):
        rs.surface_doc(copy, PLAN, plan, spec, get_profile("h100-80gb"), held, rs.AUTOTUNES_OWN)


def test_a_surface_records_the_kernels_vllm_may_not_pick_and_is_judged_and_resumed_with_them(
        planned, tmp_path: Path, monkeypatch) -> None:
    """Held down with Machete disabled, an H100 holds 4-bit AWQ as a 3090 does (h100-as-rtx3090-awq-machete): that
    recording never mixes with one that had Machete, and its estimates, here or in the replay, are made with Marlin's
    weights whatever this shell exports."""
    plan, spec, _ = planned
    h100 = get_profile("h100-80gb")
    marlin, machete = tmp_path / "marlin.json", tmp_path / "machete.json"
    monkeypatch.delenv("VLLM_DISABLED_KERNELS", raising=False)
    rs.save(rs.surface_doc(machete, PLAN, plan, spec, h100), machete)
    monkeypatch.setenv("VLLM_DISABLED_KERNELS", "MacheteLinearKernel")
    rs.save(rs.surface_doc(marlin, PLAN, plan, spec, h100), marlin)
    assert json.loads(marlin.read_text())["provenance"]["env"]["VLLM_DISABLED_KERNELS"] == "MacheteLinearKernel"
    with pytest.raises(SystemExit, match="machete.json: recorded with the environment .*export the same"):
        rs.surface_doc(machete, PLAN, plan, spec, h100)
    monkeypatch.delenv("VLLM_DISABLED_KERNELS")
    with pytest.raises(SystemExit, match="marlin.json: recorded with the environment"):
        rs.surface_doc(marlin, PLAN, plan, spec, h100)

    def judged(path: Path) -> rs.EstimateNow:
        with rs.device_vllm(as_planned=False, env=json.loads(path.read_text())["provenance"]["env"]):
            return next(c for c in rs.planned_configs(plan, spec, MODEL, h100) if c.index == 42).now

    assert 6 <= judged(marlin).num_blocks - judged(machete).num_blocks <= 8  # 0.34 GiB of 49 MiB blocks
    assert "VLLM_DISABLED_KERNELS" not in os.environ  # put back as it was


def test_autotunes_own_flags_boot_the_best_unpinned_and_the_estimator_lets_it() -> None:
    """#42 (the surface's best) as planned boots --max-cudagraph-capture-size 512; as autotune gives it now, with vLLM's
    own size (30 for 15 sequences), which the estimator, modelling the boot's peak, lets boot (19.7 GiB, where 512
    blocks were 43.8)."""
    plan, spec = rs.read_plan(PLAN)
    by_kind = {}
    for as_planned in (True, False):
        with rs.device_vllm(as_planned=as_planned):
            by_kind[as_planned] = next(c for c in rs.planned_configs(plan, spec, MODEL, H200) if c.index == 42)
    assert by_kind[True].flags["max_cudagraph_capture_size"] == 512
    own = by_kind[False]
    assert "max_cudagraph_capture_size" not in own.flags and own.now.fits
    assert own.flags["gpu_memory_utilization"] == by_kind[True].flags["gpu_memory_utilization"]


@pytest.mark.parametrize(("recorded", "reserve"), [
    ([], 200.0),  # nothing recorded yet: as expected
    ([(50.0, 100.0), (300.0, 250.0), (90.0, 100.0)], 180.0),  # 0.9 x as long (the median): scaled down
    ([(130.0, 100.0), (300.0, 200.0), (260.0, 200.0)], 260.0),  # 1.3 x longer (the median): scaled up
])
def test_a_new_configuration_starts_only_with_its_expected_time_left(recorded: list[tuple[float, float]],
                                                                     reserve: float) -> None:
    doc = {"configs": [{"wall_s": w, "expected_s": e} for w, e in recorded] + [{"wall_s": 999.0}]}  # an old entry
    assert rs.reserve_s(doc, 200.0) == pytest.approx(reserve)


def lines(path: Path) -> list[str]:
    return log_lines(path)  # the catalogue's logs are kept compressed


def test_a_cold_cuda_boot_that_came_up_is_booted_again_warm() -> None:
    cold = lines(CHAT_RUN / "trial-0002.log.gz")  # came up cold with 22,755 tokens (warm: ~57,000 predicted)
    booted = parse_boot_info(cold, 118.0)
    assert rs.warm_boot_due(Build.CUDA, booted, cold)
    assert not rs.warm_boot_due(Build.CPU, booted, cold)  # the CPU build's KV cache does not depend on it
    assert rs.boot_fields(booted, cold) == {"status": "booted", "boot_s": 118.0, "kv_cache_tokens": 22_755,
                                            "compile_cache": "cold", "kv_blocks_given": None,
                                            "kv_blocks_profiled": None}


def test_a_cold_boot_that_failed_for_memory_is_booted_again_and_both_boots_are_kept() -> None:
    cold = lines(CHAT_RUN / "trial-0000.cold.log.gz")  # the recipe: 48 seqs against 29 Mamba blocks, cold
    failed = BootFailed(classify_log(cold), 200.04)
    assert rs.warm_boot_due(Build.CUDA, failed, cold)
    first = rs.boot_fields(failed, cold)
    assert first["status"] == "boot_failed" and first["failure_kind"] == "too_many_seqs_for_state"
    assert "(29)" in str(first["reason"])
    assert (first["boot_s"], first["kv_cache_tokens"], first["compile_cache"]) == (200.0, 16_969, "cold")
    warm = lines(CHAT_RUN / "trial-0000.log.gz")  # the same flags warm: up, with 30,427 tokens
    booted = parse_boot_info(warm, 77.0)
    assert not rs.warm_boot_due(Build.CUDA, booted, warm)
    assert rs.boot_fields(booted, warm) == {"status": "booted", "boot_s": 77.0, "kv_cache_tokens": 30_427,
                                            "compile_cache": "warm", "kv_blocks_given": None,
                                            "kv_blocks_profiled": None}


def test_a_warm_memory_failure_stands() -> None:
    warm = lines(GPU_BOOTS / "a-s48-b8192-l8192-util090.log")
    failure = classify_log(warm)
    assert failure.kind.is_memory
    assert not rs.warm_boot_due(Build.CUDA, BootFailed(failure, 90.0), warm)


def test_an_eager_boot_is_not_booted_again() -> None:
    eager = lines(REPO / "tests" / "data" / "gpu" / "cuda-0.25-boot-eager.log")
    assert not rs.warm_boot_due(Build.CUDA, BootInfo(60.0), eager)


def test_a_boot_given_the_estimates_blocks_is_measured_cold_and_keeps_both_figures() -> None:
    given = lines(S20 / "trial-0001.log.gz")  # s64-fp8-32k's first boot: compiled, given 142 blocks, vLLM sized 58
    booted = parse_boot_info(given, 129.0)
    assert not rs.warm_boot_due(Build.CUDA, booted, given, given=142)
    assert rs.warm_boot_due(Build.CUDA, booted, given)  # the same boot, sized by vLLM: booted again warm
    assert rs.boot_fields(booted, given, 142) == {"status": "booted", "boot_s": 129.0, "kv_cache_tokens": 105_751,
                                                  "compile_cache": "cold", "kv_blocks_given": 142,
                                                  "kv_blocks_profiled": 58}


def test_a_boot_given_blocks_that_ran_out_of_memory_is_booted_again_sized_by_vllm() -> None:
    cold = lines(CHAT_RUN / "trial-0000.cold.log.gz")  # a memory failure of a compiling boot
    assert rs.warm_boot_due(Build.CUDA, BootFailed(classify_log(cold), 200.0), cold, given=51)
    crash = BootFailed(Failure(FailureKind.CRASH, "an error"), 30.0)
    assert not rs.warm_boot_due(Build.CUDA, crash, [], given=51)


def test_the_configurations_the_estimator_expects_to_fit_are_given_its_warm_kv_blocks(planned) -> None:
    _, _, configs = planned
    by_index = {c.index: c for c in configs}
    recipe = next(c for c in configs if c.baseline == "recipe")
    # the recipe's flags were given 51 blocks on the device too (S20, trial 0: vLLM sized 29 while compiling)
    assert (recipe.boots, recipe.warm_kv_blocks, recipe.now.fits) == ("given", 51, True)
    in_band = {"given": 0, "sized": 0}
    for c in configs:
        assert c.warm_kv_blocks is None or c.warm_kv_blocks == c.now.num_blocks
        if c.now.fits or c.now.refused:
            assert (c.warm_kv_blocks is not None) == (c.now.fits and c.now.num_blocks > 0)
            continue
        # inside the band: given its blocks where only a boot peak is in doubt, which they do not move
        kv_miss = any(m in c.now.reason for m in ("one request of max_model_len", "Mamba cache blocks"))
        assert (c.warm_kv_blocks is None) == kv_miss, c.now.reason
        in_band[c.boots] += 1
    assert in_band["given"] >= 5 and in_band["sized"] >= 1, in_band
    assert by_index[0].boots == "refused"  # vLLM's defaults: 262k context, out of memory
    assert by_index[14].boots == "sized"  # inside the estimate's band: vLLM sizes it, cold then warm
    assert sum(c.boots == "given" for c in configs) >= 14
    # flags vLLM refuses at startup are not planned: autotune refuses them before booting, so no search pays a boot
    assert all(c.boots != "rejected" for c in configs)


@pytest.mark.parametrize(("seqs", "kv_tokens", "start"), [
    (48, 29_842, 16),  # the recipe as given its blocks: 42 chat requests of ~704 tokens -> 21 -> 16 (answered 15)
    (64, 105_751, 32),  # s64-fp8-32k: 64 sequences -> 32 (answered 37)
    (1, 3_640, 1),
    (256, None, 64),  # nothing known but the batch
])
def test_the_walk_starts_where_autotunes_load_search_would(seqs: int, kv_tokens: int | None, start: int) -> None:
    spec = rs.read_plan(PLAN)[1]
    assert rs.gpu_ladder(spec.objective).start(seqs, kv_tokens, spec.objective.workload) == start
    assert rs.CPU_LADDER.start(seqs, kv_tokens, spec.objective.workload) == 4  # the CPU grid: from its bottom


LADDER = (1, 2, 4, 8, 16, 32, 64, 128)


def walked(start: int, loose: int, tight: int) -> tuple[list[int], list[int]]:
    """The levels a walk measures, and in which order, on a server that meets the recorded limits up to `loose`
    and the tightest up to `tight`."""
    seen: list[int] = []

    def measure(c: int) -> tuple[bool, bool]:
        seen.append(c)
        return c <= loose, c <= tight
    return rs.walk(LADDER, start, measure), seen


@pytest.mark.parametrize(("start", "loose", "tight", "order"), [
    (16, 37, 20, [16, 32, 64]),  # climbs to the first miss; the start meets the tightest: nothing below
    (32, 37, 20, [32, 64, 16]),  # the start misses the tightest: down until a level meets it
    (16, 15, 10, [16, 8]),  # the start misses: down to a level that meets the tightest
    (16, 15, 3, [16, 8, 4, 2]),  # ... which may be below the recorded limits' answer
    (4, 0, 0, [4, 2, 1]),  # nothing passes: down to 1
    (64, 200, 200, [64, 128]),  # the ladder's top passes: nothing above it
])
def test_the_walk_measures_every_level_a_search_from_its_start_needs(start: int, loose: int, tight: int,
                                                                     order: list[int]) -> None:
    done, seen = walked(start, loose, tight)
    assert done == seen == order
    # for any limits between the two, the levels a search from `start` measures were measured
    for answer in range(tight, loose + 1):
        need = [start] if start <= answer else []
        c = start
        while c <= answer and c < LADDER[-1]:
            c *= 2
            need.append(c)
        c = start
        while c > answer and c > 1:
            c //= 2
            need.append(c)
        assert set(need) <= set(done), answer


def record(start: float, ttft: float, e2e: float = 2.2, tokens: int = 192) -> RequestRecord:
    return RequestRecord(start, ttft, [], start + e2e, 512, tokens, None)


LIMITS = Limits(p95_ttft_ms=2000, p95_tpot_ms=100)
TIGHT = Limits(p95_ttft_ms=1000, p95_tpot_ms=50)


def test_a_level_far_inside_the_tightest_limits_ends_after_wald_has_seen_enough() -> None:
    end = rs.level_end(4, 72, LIMITS, TIGHT, 0.05)
    fast = [record(i * 0.5, 0.1) for i in range(40)]
    # the first round (4) is not judged; Wald's test needs 21 requests inside after it (called as each finishes)
    assert end(fast[:24], [], fast[23].end) is None
    assert end(fast[:25], [], fast[24].end) == rs.INSIDE
    near = [record(i * 0.5, 0.1 if i % 10 else 1.2) for i in range(40)]  # one in ten over the tightest TTFT
    assert all(end(near[:n], [], near[n - 1].end) is None for n in range(1, 40))


def test_a_level_that_clearly_misses_the_recorded_limits_is_abandoned() -> None:
    end = rs.level_end(8, 72, LIMITS, TIGHT, 0.05)
    done = [record(i * 0.3, 0.2) for i in range(8)]  # the first round
    waiting = [record(3.0 + i * 0.1, None) for i in range(8)]  # started after it, no first token 2.5 s on
    assert isinstance(end(done, waiting, 6.0), Abandon)
    assert end(done, waiting, 4.0) is None  # not waited 2 s yet: nothing known


def test_a_level_ends_at_its_count() -> None:
    end = rs.level_end(2, 72, LIMITS, TIGHT, 0.05)
    slow = [record(i * 1.0, 1.5) for i in range(72)]  # meets the recorded limits, misses the tightest
    assert end(slow[:71], [], 71.0) is None
    assert end(slow, [], 72.0) == "count"


def test_a_configuration_given_its_blocks_is_expected_to_take_a_quarter_of_what_it_took_before(planned) -> None:
    _, spec, configs = planned
    recipe = next(c for c in configs if c.baseline == "recipe")
    ladder, workload = rs.gpu_ladder(spec.objective), spec.objective.workload
    now = rs.expected(recipe, ladder, workload)
    before = rs.expected(recipe, ladder, workload, before=True)
    assert now.levels == ((16, "full"), (32, "abandoned"), (8, "full"))  # one boot, three levels
    assert now.boots_s == rs.COST.boot_new_s and before.boots_s == rs.COST.boot_new_s + rs.COST.boot_warm_s
    assert [c for c, _ in before.levels] == [1, 2, 4, 8, 16, 32]  # from 1 up to the first miss, all in full
    # 72 requests at 16 at 4.1 s each, and 4 warm-up requests at once
    assert rs.COST.level_s(ladder, 16, "full") == pytest.approx(72 * rs.COST.e2e(16) / 16 + rs.COST.e2e(4))
    assert 120 < now.seconds < 160 < 400 < before.seconds  # ~2.2 min against ~8.4 (the device: 145 s)
    off = dataclasses.replace(recipe, flags={**recipe.flags, "enable_chunked_prefill": False,
                                             "max_num_batched_tokens": 2048})  # < max_model_len 8192
    assert off.boots == "rejected" and rs.expected(off, ladder, workload).levels == ()


def test_the_end_to_end_model_runs_through_the_devices_figures() -> None:
    for c, seconds in rs.COST.e2e_points:
        assert rs.COST.e2e(c) == pytest.approx(seconds)
    last, e2e = rs.COST.e2e_points[-1]
    assert rs.COST.e2e(64) == pytest.approx(e2e * 64 / last)  # saturated: as many requests per second
    assert rs.COST.e2e(2) == pytest.approx(2.2 + math.log(2) / math.log(10) * 1.1)


def test_a_session_records_what_fits_after_the_machines_first_compile() -> None:
    first = rs.SESSION_S - rs.COST.first_key_extra_s
    per = int(first // 200)  # each started only with its time left; each session compiles Triton once
    assert rs.sessions([200.0] * 20) == [per, per, per, 20 - 3 * per]
    assert rs.sessions([first, 1.0]) == [1, 1]


def test_a_new_surface_names_the_limits_it_is_recorded_for_and_an_entry_what_its_first_boot_was_given(
        planned, tmp_path: Path) -> None:
    plan, spec, configs = planned
    prov = rs.surface_doc(tmp_path / "surface.json", PLAN, plan, spec, H200)["provenance"]
    assert prov["limits"] == {"p95_ttft_ms": 2000, "p95_tpot_ms": 100}  # the climb's: the loosest replayed
    assert prov["tightest_limits"] == {"p95_ttft_ms": 1000, "p95_tpot_ms": 50}  # the descent's: the tightest
    assert prov["ladder"] == [1, 2, 4, 8, 16, 32, 64, 128]
    recipe = next(c for c in configs if c.baseline == "recipe")
    entry = rs.plan_entry(recipe, H200, {"status": "measured", "kv_blocks_given": 51, "kv_blocks_profiled": 29}, 206.0)
    assert (entry["warm_kv_blocks"], entry["estimate_now"]["num_blocks"], entry["expected_s"]) == (51, 51, 206.0)
    assert entry["estimate"] == recipe.estimate  # the plan's verdict, kept beside today's


def test_judged_as_on_the_device_the_plan_gets_the_devices_own_verdicts_flags_and_blocks() -> None:
    # What the device's recorder computed (vLLM 0.25.0's CUDA build) for every configuration it recorded, from this
    # machine's vLLM made to look like the device's: the capture-size pin and the hybrid prefix-caching default.
    plan, spec = rs.read_plan(PLAN)
    with rs.device_vllm():
        configs = {json.dumps(c.params, sort_keys=True): c for c in rs.planned_configs(plan, spec, MODEL, H200)}
    surface = json.loads((REPO / "benchmarks" / "data" / "h200-as-rtx3090-awq/surface.json").read_text())
    assert surface["provenance"]["how"] == plan["how"] and len(surface["configs"]) >= 9
    for entry in surface["configs"]:
        c = configs[json.dumps(entry["params"], sort_keys=True)]
        assert c.flags == entry["flags"]
        if c.now.refused and not entry["refused"]:
            # learnt since from a boot that failed (#12: vLLM 0.25's hybrid block against the batched tokens)
            assert entry["status"] == "boot_failed" and "mamba cache mode 'align'" in c.now.reason
            continue
        now = dataclasses.asdict(c.now)  # the reason now names the version it modelled; the device's did not
        now["reason"] = VERSION_NOTE.sub("", now["reason"])
        assert now == entry["estimate_now"]
        assert c.warm_kv_blocks == entry["warm_kv_blocks"]
    # outside it, this machine's own vLLM is back (no capture size is pinned on the CPU build)
    pinned = any("max_cudagraph_capture_size" in c.flags for c in rs.planned_configs(plan, spec, MODEL, H200))
    assert pinned == (installed_vllm() == (Build.CUDA, rs.DEVICE_VLLM))


def test_the_least_sure_configurations_are_inside_the_devices_band() -> None:
    plan, spec = rs.read_plan(PLAN)
    with rs.device_vllm():
        unsure = [c for c in rs.planned_configs(plan, spec, MODEL, H200) if c.origin == "unsure"]
    assert len(unsure) == 8 and all(c.boots == "sized" for c in unsure)


def test_each_server_of_a_configuration_has_its_memory_sampled_while_booting_and_serving(tmp_path: Path) -> None:
    # A real process in the server's place: 300 MiB held from its start (the CPU build's source: the tree's RSS).
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", "import pathlib, time, sys; x = bytearray(300 << 20); "
                             "pathlib.Path(sys.argv[1]).touch(); time.sleep(60)", str(ready)])
    try:
        memory = rs.Memory(EngineSpec("m"), Build.CPU)
        assert memory.watch.source == "rss" and memory.fields() == {}  # nothing sampled yet
        memory.start(SimpleNamespace(pid=proc.pid))  # type: ignore[arg-type]
        while not ready.exists() or psutil.Process(proc.pid).memory_info().rss < 300 << 20:
            time.sleep(0.05)
        time.sleep(0.5)  # a few samples while "booting"
        memory.serving()
        time.sleep(0.5)
        fields = memory.fields()
    finally:
        proc.kill()
        proc.wait()
    assert fields["memory_source"] == "rss"
    assert 0.29 < fields["boot_peak_memory_gib"] < 1.0 and 0.29 < fields["peak_memory_gib"] < 1.0
    assert memory.fields() == {}  # the sampler has stopped


def test_a_server_that_never_served_has_only_a_boot_peak(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        memory = rs.Memory(EngineSpec("m"), Build.CPU)
        memory.start(SimpleNamespace(pid=proc.pid))  # type: ignore[arg-type]
        time.sleep(0.5)
        fields = memory.fields()
    finally:
        proc.kill()
        proc.wait()
    assert fields["peak_memory_gib"] is None and fields["boot_peak_memory_gib"] > 0


def test_the_plans_start_picks_are_what_the_replays_first_seeds_boot_first(tmp_path: Path) -> None:
    """surface_plan source 4: the configurations search/start.py picks first for the replay's seeds 0-2, judged
    with the device's vLLM, appended after the 42 so that the recorded ones keep their indices and the surface
    recorded so far stays resumable from the plan."""
    import optuna

    from autotune.search import start
    from benchmarks import replay as rp
    from benchmarks import surface_plan
    from benchmarks.surface import load_surface
    plan_path, surface_path = tmp_path / "plan.json", tmp_path / "surface.json"
    shutil.copy(PLAN, plan_path)
    shutil.copy(REPO / "benchmarks" / "data" / "h200-as-rtx3090-awq/surface.json", surface_path)
    before = json.loads(plan_path.read_text())
    assert before["how"].endswith(surface_plan.PICKS_HOW)  # the shipped plan has them: take them off to add again
    picks = [c for c in before["configs"] if c["origin"] == "pick"]
    before["configs"] = [c for c in before["configs"] if c["origin"] != "pick"]
    before["how"] = before["how"].removesuffix(surface_plan.PICKS_HOW)
    plan_path.write_text(json.dumps(before))
    surface = json.loads(surface_path.read_text())
    surface["provenance"]["how"] = before["how"]
    surface_path.write_text(json.dumps(surface))
    new = surface_plan.append_picks(plan_path, surface_path)
    # deterministic: the shipped plan's three, chosen when the pick ranked on the KV cache's optimistic end (stop
    # 25); on its central one (estimate.running_seqs) the same three win, each now at the count it records
    assert [c["params"] for c in new] == [c["params"] for c in picks]
    assert [c["runs_at_once"] for c in new] != [c["runs_at_once"] for c in picks]
    after = json.loads(plan_path.read_text())
    assert after["configs"][:len(before["configs"])] == before["configs"] and after["configs"][-3:] == new
    assert [c["seed"] for c in new] == [0, 1, 2] and all(c["origin"] == "pick" for c in new)
    # what the replay boots first: the same draw, the same estimator, the same build
    surface = load_surface(surface_path)
    capacity = rp.start_capacity(surface)
    for c in new:
        queued = start.queue_pick(optuna.create_study(), surface.space, capacity, c["seed"])
        assert queued == c["params"] and capacity(c["params"]) == c["runs_at_once"]
    # the recorder resumes the surface from the plan so revised, and a second append is refused
    plan, spec = rs.read_plan(plan_path)
    assert rs.surface_doc(surface_path, plan_path, plan, spec, H200)["configs"]
    with pytest.raises(SystemExit, match="already planned"):
        surface_plan.append_picks(plan_path, surface_path)


def _estimate(out: Path, capsys: pytest.CaptureFixture[str], ballast: bool = False) -> str:
    rs.estimate_plan(PLAN, out, ballast)
    return capsys.readouterr().out


def test_the_estimate_judges_with_the_flags_the_surface_file_records(tmp_path: Path, capsys) -> None:
    """--estimate on a held-down card's file (autotune's own flags) judges the recipe as on that card: inside the band
    since a boot through Marlin (its boot's profiling peak; it failed through Machete and served through Marlin), so
    given the blocks its KV cache fits; on the H200 surface (as planned) it expects it to boot. A new file is judged by
    --ballast."""
    data = REPO / "benchmarks" / "data"
    recipe = [line for line in _estimate(data / "h100-as-rtx3090-awq-machete/surface.json", capsys).splitlines()
              if line.split()[:1] == ["1"]]
    assert recipe and recipe[0].split()[1] == "given" and recipe[0].endswith("(recorded)")
    planned_recipe = [line for line in _estimate(data / "h200-as-rtx3090-awq/surface.json", capsys).splitlines()
                      if line.split()[:1] == ["1"]]
    assert planned_recipe and planned_recipe[0].split()[1] != "refused"
    new = [line for line in _estimate(tmp_path / "new.json", capsys, ballast=True).splitlines()
           if line.split()[:1] == ["1"]]
    assert new[0].split()[1] == "given" and not new[0].endswith("(recorded)")


def test_the_estimate_scales_the_sessions_as_the_files_recordings_ran(tmp_path: Path, capsys) -> None:
    """What --stop-after plans with (reserve_s), the estimate prints too: recordings that took twice their
    expected time double the minutes still to go."""
    out = tmp_path / "s.json"
    doc = json.loads((REPO / "benchmarks" / "data" / "h200-as-rtx3090-awq/surface.json").read_text())
    doc["configs"] = doc["configs"][:3]
    for c in doc["configs"]:
        c["wall_s"] = 2 * c["expected_s"]
    out.write_text(json.dumps(doc))
    text = _estimate(out, capsys)
    [now] = [line for line in text.splitlines() if line.startswith("now:")]
    [scaled] = [line for line in text.splitlines() if line.startswith("scaled as")]
    assert "x2.00" in scaled and "this file's 3 recordings" in scaled
    minutes = [int(line.split(" to go: ")[1].split(" min")[0]) for line in (now, scaled)]
    assert abs(minutes[1] - 2 * minutes[0]) <= 1
    doc["configs"] = []
    out.write_text(json.dumps(doc))
    assert "scaled as" not in _estimate(out, capsys)


GPTQ = "Qwen/Qwen3.5-27B-GPTQ-Int4"
GPTQ_PLAN = REPO / "benchmarks" / "data" / "rtx3090-surface-plan/gptq.json"


def configurations(plan: dict) -> dict:
    """A plan without what the estimator said of each configuration when the plan was written."""
    return {**plan, "configs": [{k: v for k, v in c.items() if k != "estimate"} for c in plan["configs"]]}


def test_a_plan_for_another_checkpoint_boots_the_same_flags_from_its_folder_with_its_weights(planned,
                                                                                            tmp_path: Path) -> None:
    """surface_plan.py --checkpoint: four of the plan (the recipe, an MTP one, 52 sequences, a 32,768 context)
    served from the GPTQ-Int4 checkpoint the 3090 study starts from (run_h200.sh with
    PLAN=rtx3090-surface-plan/gptq.json). The shipped file is what the function writes. The
    recorder serves them from that checkpoint's folder (its shipped config as config.json) with the flags the
    plan's own configurations boot, and judges them with its weights: lighter than AWQ's, so each is expected to
    leave more KV cache."""
    from benchmarks import surface_plan
    from benchmarks.h200.run_h200 import model_folder, served_model

    doc = json.loads(GPTQ_PLAN.read_text())
    taken = [c["from_plan_index"] for c in doc["configs"]]
    with rs.device_vllm():  # its configurations; the estimates in the file are those of the commit that wrote it
        assert configurations(surface_plan.checkpoint_plan(GPTQ, taken)) == configurations(doc)
    folder = model_folder(GPTQ, tmp_path)
    assert folder == served_model(GPTQ, tmp_path) and folder.name == "qwen3.5-27b-gptq-int4-dummy"
    assert json.loads((folder / "config.json").read_text())["quantization_config"]["quant_method"] == "gptq"
    _, spec, awq = planned
    configs = rs.planned_configs(doc, spec, str(folder), H200)
    assert doc["model"] == GPTQ and [c.index for c in configs] == list(range(len(taken)))
    for c, i in zip(configs, taken, strict=True):
        assert (c.params, c.baseline, c.flags) == (awq[i].params, awq[i].baseline, awq[i].flags)
        assert c.model == str(folder)
        assert c.now.kv_tokens > awq[i].now.kv_tokens
    with pytest.raises(SystemExit, match="has no configuration #99"):
        surface_plan.checkpoint_plan(GPTQ, [1, 99])
