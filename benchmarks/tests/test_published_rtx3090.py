"""The estimator on boots published by others on real RTX 3090s (tests/data/rtx3090-boots/, read by
benchmarks/estimator_accuracy.py rtx3090_boots): a configuration that booted there is never refused before boot.
Their printed KV tokens are not yet inside the predicted range (+12% and +28% over: patched vLLM builds, a
reconstructed checkpoint config); the benchmark prints those misses and the comment below says why, so nothing here
passes on them."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import estimator_accuracy as acc

RECORDS = json.loads((acc.RTX3090 / "records.json").read_text())["records"]
ROWS = {r.boot.name: r for r in acc.rows(acc.rtx3090_boots(), with_old=False)}
READY = [r["name"] for r in RECORDS if r["outcome"] == "ready"]


def test_every_record_has_its_excerpt_config_and_readme_line() -> None:
    readme = (acc.RTX3090 / "README.md").read_text()
    assert len(RECORDS) >= 3 and set(ROWS) == {r["name"] for r in RECORDS}
    for r in RECORDS:
        assert (acc.RTX3090 / r["excerpt"]).is_file() and (acc.RTX3090 / r["quantization_config"]).is_file()
        assert r["name"] in readme, r["name"]
        if r.get("printed_tokens"):  # the figure is in the excerpt as published
            assert f"{r['printed_tokens']:,}" in (acc.RTX3090 / r["excerpt"]).read_text()


@pytest.mark.parametrize("name", READY)
def test_a_configuration_that_booted_on_a_3090_is_not_refused(name: str) -> None:
    est = ROWS[name].new
    assert not est.refused and est.fits, est.reasons


def test_prefix_caching_is_opt_in_for_hybrid_models_in_0_27_1() -> None:
    """0.27.1 engine/arg_utils.py keeps prefix caching opt-in for hybrid models, so without the flag the Mamba
    groups take one block per request (mamba_cache_mode 'none'), not two ('align'): ceil(150000 / 800) + 3."""
    from autotune.engine.defaults import hybrid_prefix_caching_default

    assert hybrid_prefix_caching_default("0.27.1") is False and hybrid_prefix_caching_default("0.28.0") is True
    est = ROWS["syv-ai-batch-fp8-s64-b2048-l150k"].new
    assert est.block_size == 800 and est.blocks_per_request == math.ceil(150000 / 800) + 3
    assert ROWS["syv-ai-batch-fp8-s64-b2048-l150k-prefix"].new.blocks_per_request == math.ceil(150000 / 800) + 6


# The misses, kept out of the asserts (the benchmark prints them):
# - syv-ai-batch-fp8-s64-b2048-l150k: predicted +12% over the printed 223,821: a patched vLLM 0.27.1 (24 patches,
#   int8-activation Marlin GEMMs) and a reconstructed checkpoint config (Qwen3.5-27B shape, int8 lm_head and
#   embedding); the record gives no 'Available KV cache memory' or weights figure to split the 0.76 GiB.
# - syv-ai-batch-fp8-s64-b2048-l150k-prefix: prefix caching (align) printed 14% fewer tokens than without; vLLM
#   0.27.1 charges align one more state block per Mamba group (kv_cache_interface.py
#   MambaSpec.max_memory_usage_bytes), +1.6% here: the rest is not found in the unpatched 0.27.1 source.


def test_the_old_estimator_refused_the_64_sequence_fp8_boot() -> None:
    """The issue's claim, on the published record: the pre-issue-13 estimator refused 64 sequences at 2048
    batched tokens with fp8 KV that booted on a real 3090, predicting about half the printed pool."""
    old = acc.old_estimator()
    assert old is not None
    row = ROWS["syv-ai-batch-fp8-s64-b2048-l150k"]
    est = acc.predict(row.boot, old.estimate)
    assert not est.fits and row.boot.printed_tokens is not None
    assert est.kv_tokens < 0.6 * row.boot.printed_tokens
