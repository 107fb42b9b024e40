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
