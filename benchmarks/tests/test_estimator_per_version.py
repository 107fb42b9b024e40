"""The estimator per vLLM version on recorded boots: tests/data/gpu-boots (vLLM 0.25.0 on an H200 capped as a
24 GiB card), read as benchmarks/estimator_accuracy.py reads them. Each boot is predicted for its own version, and
for a version next to it that is not modelled (fit/vllm_version.py: the nearest modelled one's terms, a wider band).
"""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.estimator_accuracy import gpu_boots, predict

BOOTS = {b.name: b for b in gpu_boots()}
WARM = [n for n, b in BOOTS.items() if b.cache == "warm" and b.printed_tokens]


def test_every_estimate_names_the_version_it_modelled():
    boot = BOOTS["b-s32-b2048-l65536-fp8-m16-warm"]
    assert predict(boot).vllm_version == "vLLM 0.25.0" and not predict(boot).version_note
    other = predict(dataclasses.replace(boot, vllm="0.26.0"))
    assert other.vllm_version == "vLLM 0.26.0 as 0.25.0"
    assert other.version_note.startswith("vLLM 0.26.0 is not modelled (modelled: 0.25.0, 0.32.0)")


@pytest.mark.parametrize("name", WARM)
def test_a_version_not_modelled_widens_the_range_around_the_same_centre(name):
    """0.25.1 is predicted with 0.25.0's terms: the same central figure, a wider range that still holds what 0.25.0
    printed; and never a refusal where 0.25.0 would boot to learn."""
    boot = BOOTS[name]
    exact = predict(boot)
    near = predict(dataclasses.replace(boot, vllm="0.25.1"))
    assert near.kv_tokens == exact.kv_tokens and near.uncertainty_bytes > exact.uncertainty_bytes
    assert near.kv_tokens_low <= exact.kv_tokens_low <= boot.printed_tokens
    assert boot.printed_tokens <= exact.kv_tokens_high <= near.kv_tokens_high
    assert near.refused <= exact.refused


def test_the_recorded_boots_are_inside_the_range_of_their_own_version():
    warm = [b for b in BOOTS.values() if b.cache == "warm" and b.printed_tokens]
    assert len(warm) >= 10 and {b.vllm for b in warm} == {"0.25.0"}
    for b in warm:
        e = predict(b)
        assert e.kv_tokens_low <= b.printed_tokens <= e.kv_tokens_high, b.name


@pytest.mark.parametrize(("nvml_total_mib", "card"), [(143771, "h200"), (81559, "h100-80gb")])
def test_a_boot_matrix_folder_is_read_as_vllm_ran_it(tmp_path, nvml_total_mib, card):
    """benchmarks/h200/boot_matrix.py's boots.json: dashed flags, the plan's utilization of a 24 GiB card as vLLM was
    given it on the device's card (which that translation tells), the version its logs print, and whether the
    full-length request was served."""
    import json

    folder = tmp_path / "gpu-boots-0.32"
    (folder / "logs").mkdir(parents=True)
    (folder / "plan.json").write_text(json.dumps({"card_mib": 24576, "boots": []}))
    (folder / "logs" / "l64k-mtp2.log").write_text("INFO Initializing a V1 LLM engine (v0.32.0) with config: ...\n")
    flags = {"max-model-len": 65536, "max-num-seqs": 2, "speculative-config": '{"method": "mtp", '
                                                                            '"num_speculative_tokens": 2}'}
    boot = {"name": "l64k-mtp2", "util": 0.95, "vllm_util": round(0.95 * 24576 / nvml_total_mib, 6), "flags": flags,
            "outcome": "ready", "cache": "warm", "figures": {"kv_cache_tokens": 90000},
            "full_length_request": {"ok": False, "error": "RemoteDisconnected"}}
    (folder / "boots.json").write_text(json.dumps({"boots": [boot]}))
    [read] = gpu_boots(folder)
    assert (read.vllm, read.profile.name, read.cache, read.ready, read.served) == ("0.32.0", card, "warm", True, False)
    assert read.flags["max_model_len"] == 65536 and read.flags["gpu_memory_utilization"] == boot["vllm_util"]
    e = predict(read)
    assert e.vllm_version == "vLLM 0.32.0" and e.max_model_len == 65536
    assert abs(e.reserved_bytes / 2**20 - 0.95 * 24576) < 0.01 * 24576  # vLLM's budget: the 24 GiB card's share
