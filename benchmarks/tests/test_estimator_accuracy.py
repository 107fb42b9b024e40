"""The estimator's verdicts pinned on every captured real boot (tests/data/gpu-boots/boots.json, every entry, so
boots added there are covered; the earlier CUDA logs and the CPU-build logs), read by benchmarks/estimator_accuracy.py.

Warm is the target: a warm boot's printed KV tokens lie inside the predicted range and within 10 % of its centre;
a boot that became ready is never refused before boot; a cold boot (torch.compile inside vLLM's profiling) is no
verdict: its flags are predicted as their warm boot and booted.
"""

from __future__ import annotations

import pytest

from autotune.fit import memcap
from autotune.fit.estimate import Estimate, estimate
from autotune.fit.hardware import PROFILES
from benchmarks import estimator_accuracy as acc

ROWS = acc.rows(with_old=False)


def _ids(rows: list[acc.Row]) -> list[str]:
    return [r.boot.name for r in rows]


WARM = [r for r in ROWS if r.boot.cache == "warm" and r.boot.source != "cpu"]
READY = [r for r in ROWS if r.boot.ready]


def test_every_boot_of_boots_json_is_read() -> None:
    import json

    boots = json.loads((acc.DATA / "gpu-boots" / "boots.json").read_text())["boots"]
    names = {b["name"] for b in boots}
    assert names and names <= {r.boot.name for r in ROWS}
    assert len(boots) >= 20  # both recorded batches (tests/data/gpu-boots/README.md)
    warm_gpu_boots = {b["name"] for b in boots if b["cache"]["state"] == "warm"}
    assert warm_gpu_boots <= {r.boot.name for r in WARM} and len(warm_gpu_boots) >= 15


@pytest.mark.parametrize("row", WARM, ids=_ids(WARM))
def test_warm_boot_printed_tokens_inside_the_predicted_range(row: acc.Row) -> None:
    est, printed = row.new, row.boot.printed_tokens
    assert printed is not None
    assert est.kv_tokens_low <= printed <= est.kv_tokens_high, (est.kv_tokens_low, printed, est.kv_tokens_high)
    assert abs(est.kv_tokens - printed) <= 0.10 * printed


@pytest.mark.parametrize("row", READY, ids=_ids(READY))
def test_a_boot_that_became_ready_is_not_refused(row: acc.Row) -> None:
    assert not row.new.refused, row.new.reasons


COLD = [r for r in ROWS if r.boot.cache == "cold" and r.boot.source == "gpu-boots"]


@pytest.mark.parametrize("row", COLD, ids=_ids(COLD))
def test_a_cold_boot_is_predicted_as_its_warm_boot(row: acc.Row) -> None:
    """A cold boot's flags are predicted as their warm boot (the same estimate); where that warm boot became ready
    they are not refused, and the cold boot's printed KV (1-2 GiB short: torch.compile inside the profiling) is no
    more than the prediction."""
    twin = next(r for r in ROWS if r.boot.cache == "warm" and r.boot.flags == row.boot.flags)
    assert row.new == twin.new
    if twin.boot.ready:
        assert not row.new.refused, row.new.reasons
    if row.boot.printed_tokens is not None:
        assert row.new.kv_tokens >= row.boot.printed_tokens


@pytest.mark.parametrize("row", [r for r in ROWS if r.boot.cache == "cold" and r.boot.source == "gpu"],
                         ids=_ids([r for r in ROWS if r.boot.cache == "cold" and r.boot.source == "gpu"]))
def test_an_earlier_cold_log_is_booted(row: acc.Row) -> None:
    assert not row.new.refused
    assert row.boot.printed_tokens is not None and row.new.kv_tokens > row.boot.printed_tokens


WARM_FAILED = [r for r in WARM if not r.boot.ready]


@pytest.mark.parametrize("row", WARM_FAILED, ids=_ids(WARM_FAILED))
def test_a_warm_boot_that_did_not_fit_is_not_predicted_to_fit(row: acc.Row) -> None:
    """A true non-fit (warm: nothing of torch.compile in the profiling) is refused or inside the band (booted to
    learn), never predicted as surely fitting."""
    assert not row.new.fits, (row.new.kv_tokens, row.new.max_running_seqs, row.new.num_blocks)


def test_warm_non_fits_of_the_second_session() -> None:
    """16,384 batched tokens at 48 sequences (26 Mamba blocks printed) and MTP at 48 sequences (32 blocks): both
    missed by far more than the band, so refused; with 24 sequences both booted and fit."""
    by_name = {r.boot.name: r for r in ROWS}
    for name, blocks in (("a-s48-b16384-l8192-warm", 26), ("a-s48-b8192-l8192-mtp1-warm", 32)):
        row = by_name[name]
        assert not row.boot.ready and row.new.refused and not row.new.fits, name
        assert abs(row.new.num_blocks - blocks) <= 1, (name, row.new.num_blocks)
    for name in ("a-s24-b16384-l8192-cg96", "a-s24-b8192-l8192-mtp1-cg192"):
        assert by_name[name].boot.ready and by_name[name].new.fits, name


def test_surely_too_many_sequences_is_refused_and_a_near_miss_is_booted() -> None:
    by_name = {r.boot.name: r.new for r in ROWS}
    assert by_name["a-s128-b8192-l8192-cg96"].refused  # 128 seqs, 56 blocks: far outside the band
    near = by_name["a-s48-b8192-l8192-util090"]  # 48 seqs, 47 blocks printed: inside the band, booted to learn
    assert not near.fits and not near.refused


def test_the_old_estimator_refused_what_booted() -> None:
    """The benchmark's baseline still is the pre-issue-13 estimator (commit 02e0249), which refused the recipe."""
    old = acc.old_estimator()
    assert old is not None
    warm = next(r for r in ROWS if r.boot.name == "a-s48-b8192-l8192-warm")
    assert not acc.predict(warm.boot, old.estimate).fits


RTX3090_BOOT = {"max_num_seqs": 48, "max_num_batched_tokens": 8192, "max_model_len": 8192}
FP8_64 = {"max_num_seqs": 64, "max_num_batched_tokens": 2048, "max_model_len": 32768, "kv_cache_dtype": "fp8",
          "mamba_ssm_cache_dtype": "float16"}


def _on_a_3090(flags: dict, card: str, version: str) -> Estimate:
    profile = PROFILES["rtx3090"]
    if card == "h200-as-3090":
        profile = memcap.capped_profile(acc.h200(), memcap.parse_cap("rtx3090"))
    shape = acc._shape(str(acc.CONFIG))
    return estimate(shape, profile, {"language_model_only": True, "gpu_memory_utilization": 0.92, **flags},
                    vllm_version=version)


@pytest.mark.parametrize("flags", [RTX3090_BOOT, FP8_64], ids=["recipe-48", "64-seqs-fp8"])
@pytest.mark.parametrize("card", ["rtx3090", "h200-as-3090"])
def test_recipe_and_64_sequences_fit_on_a_3090(flags: dict, card: str) -> None:
    """From vLLM 0.26 the CUDA-graph profiling holds one KV block per sequence at boot (48 and 64 here)."""
    est = _on_a_3090(flags, card, "0.26.0")
    assert est.fits and not est.refused, est.reasons
    assert 0 < est.boot_peak_bytes <= est.reserved_bytes / 0.92


@pytest.mark.parametrize("card", ["rtx3090", "h200-as-3090"])
def test_on_vllm_025_the_recipes_boot_peaks_over_a_3090(card: str) -> None:
    """0.25 holds max_cudagraph_capture_size blocks instead: vLLM's own 96 for 48 sequences, 4.6 GiB of the
    model's 49 MiB blocks beside 16.6-17.3 GiB of weights. 64 sequences of fp8 KV and a 16-bit recurrent state
    (2048 batched tokens, 128 blocks) still fit."""
    recipe = _on_a_3090(RTX3090_BOOT, card, "0.25.0")
    assert not recipe.fits and recipe.boot_peak_bytes > recipe.reserved_bytes / 0.92
    assert any("to profile its CUDA graphs vLLM allocates 96 KV blocks" in r for r in recipe.reasons), recipe.reasons
    fp8 = _on_a_3090(FP8_64, card, "0.25.0")
    assert fp8.fits, fp8.reasons


CPU_READY = [r for r in READY if r.boot.source == "cpu" and "num_gpu_blocks_override" not in r.boot.flags]


@pytest.mark.parametrize("row", CPU_READY, ids=_ids(CPU_READY))
def test_a_cpu_boot_printed_the_tokens_predicted(row: acc.Row) -> None:
    """The CPU build sizes its KV cache from VLLM_CPU_KVCACHE_SPACE or --kv-cache-memory-bytes alone, so the
    estimate is exact there. A log recorded with an earlier tiny model's shape fails here (as the two hybrid logs did
    when tiny:hybrid got 128-wide heads): boot the flags again and keep the new log."""
    assert row.new.kv_tokens == row.boot.printed_tokens
