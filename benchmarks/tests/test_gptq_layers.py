"""Which layers vLLM quantizes for a GPTQ checkpoint: those its safetensors headers store packed, unless the config
lists them (auto_gptq.py maybe_update_config, vLLM 0.25 and 0.32). An H100 served the Qwen3.5-27B GPTQ-Int4 config
from a folder with random weights and no safetensors: vLLM built every layer in bfloat16, and all four boots
failed loading the model (benchmarks/data/h100-as-rtx3090-gptq-marlin-config-only/surface.json)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from autotune.engine.models import KNOWN, KNOWN_MODELS
from autotune.fit import feasibility
from autotune.units import GiB, MiB
from benchmarks import estimator_accuracy as acc
from benchmarks.catalogue import read_log
from benchmarks.h200.run_h200 import model_folder

GPTQ = "Qwen/Qwen3.5-27B-GPTQ-Int4"
CONFIG_ONLY = acc.surface_boots("h100-as-rtx3090-gptq-marlin-config-only/surface.json")
SERVED = acc.surface_boots("h100-as-rtx3090-gptq-marlin/surface.json")  # the folder lists the quantized layers


@pytest.fixture(scope="module")
def config_only(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A folder as the H100 served it in that recording: the checkpoint's config.json and nothing else."""
    folder = tmp_path_factory.mktemp("gptq-config-only")
    (folder / "config.json").write_bytes((KNOWN_MODELS / KNOWN[GPTQ]).read_bytes())
    return str(folder)


@pytest.mark.parametrize("entry", CONFIG_ONLY, ids=[f"plan{c['plan_index']}" for c in CONFIG_ONLY])
def test_a_gptq_config_without_safetensors_is_served_unquantized_as_vllm_did(entry: dict, config_only: str) -> None:
    """Each boot asked, while building the model 23.3-23.6 GiB in, for one layer's MLP tensor in bfloat16
    (UnquantizedLinearMethod): gate_up_proj's 2 x 17,408 x 5,120 x 2 bytes (340 MiB) or down_proj's half. The
    estimator, told what was served, refuses each for the weights alone."""
    shape = feasibility.model_shape(config_only)
    mlp = shape.intermediate_size * shape.hidden_size * 2 / MiB
    assert (2 * mlp, mlp) == (340.0, 170.0)
    for log in acc.boot_logs(entry):
        text = read_log(log)
        asked = re.search(r"Tried to allocate ([\d.]+) MiB", text)
        assert "Failed to load model" in text and asked and float(asked.group(1)) in (2 * mlp, mlp), log
        assert "quantization=auto_gptq" in text and 'linear.py", line 201, in create_weights' in text, log
    e = acc.predicted_boot({**entry, "_model": config_only}, "h100-80gb")
    assert e.refused and e.weights_bytes > 24 * GiB
    assert any(r.startswith(f"weights {e.weights_bytes / GiB:.1f} GiB exceed") for r in e.reasons), e.reasons
    # as a user serves the checkpoint, its headers naming the packed layers: the weights fit
    assert acc.predicted_boot(entry, "h100-80gb").weights_bytes < 18 * GiB


def test_the_recorder_names_the_quantized_layers_so_random_weights_are_served_as_the_checkpoint(
        tmp_path: Path) -> None:
    """The device's folder now lists modules_in_block_to_quantize, as the checkpoint's headers would: every text
    linear layer but the ones the config's `dynamic` leaves in bfloat16 (in_proj_a/b), and the estimate for the
    folder is the estimate for the checkpoint."""
    folder = model_folder(GPTQ, tmp_path)
    listed = json.loads((folder / "config.json").read_text())["quantization_config"]["modules_in_block_to_quantize"]
    assert "model.language_model.layers.0.mlp.gate_proj" in listed
    assert "model.language_model.layers.0.linear_attn.in_proj_qkv" in listed
    assert not any(re.search(r"in_proj_[ab]$|^mtp\.|visual", m) for m in listed)
    assert feasibility.model_shape(str(folder)).quantization.scope
    entry = CONFIG_ONLY[0]
    assert (acc.predicted_boot({**entry, "_model": str(folder)}, "h100-80gb").weights_bytes
            == acc.predicted_boot(entry, "h100-80gb").weights_bytes)


def printed_weights(entry: dict) -> list[float]:
    """"Model loading took X GiB" of every boot of a configuration (vLLM's allocated bytes after loading)."""
    return [float(x) for log in acc.boot_logs(entry)
            for x in re.findall(r"Model loading took ([\d.]+) GiB", read_log(log))]


@pytest.mark.parametrize("entry", SERVED, ids=[f"plan{c['plan_index']}" for c in SERVED])
def test_gptq_through_marlin_loads_what_the_kernel_model_fitted_on_awq_predicts(entry: dict) -> None:
    """The held-down H100 with Machete disabled: GPTQ-Int4's weights through Marlin printed 16.83-16.86 GiB
    (17.65 with MTP's layer). Marlin drops symmetric GPTQ's zero points and holds the extra it holds for AWQ
    (MARLIN_EXTRA_BYTES_PER_GROUP, fitted on AWQ): predicted 16.81 (17.60), 0.02-0.05 GiB under. The
    checkpoint's own layout, as the estimator counted GPTQ before, was 0.27-0.30 GiB under."""
    seen = printed_weights(entry)
    assert seen, entry["plan_index"]
    predicted = acc.predicted_boot(entry, "h100-80gb").weights_bytes / GiB
    stored = acc.predicted_boot(entry, "h100-80gb", {"VLLM_DISABLED_KERNELS": "MacheteLinearKernel,MarlinLinearKernel"})
    for gib in seen:
        assert 0 <= gib - predicted <= 0.06, (gib, predicted)
        assert gib - stored.weights_bytes / GiB > 0.25


def test_the_gptq_boots_the_estimator_accepts_served_and_sized_no_more_kv_than_the_card_held() -> None:
    """All four served. #2, accepted, failed its first boot (cold, given the 106 blocks predicted then), 30 MiB
    short once vLLM had allocated them, so the card held at most 105; vLLM's own warm sizing took 99. The
    estimate now lies between."""
    estimates = {c["plan_index"]: acc.predicted_boot(c, "h100-80gb") for c in SERVED}
    assert all(c["status"] == "measured" for c in SERVED)
    assert sum(e.fits for e in estimates.values()) == 3 and not any(e.refused for e in estimates.values())
    [cold] = [c for c in SERVED if c.get("cold_boot")]
    failed = cold["cold_boot"]
    assert failed["status"] == "boot_failed" and "Tried to allocate 30.00 MiB" in failed["reason"]
    e = estimates[cold["plan_index"]]
    own = round(cold["kv_cache_tokens"] / (e.kv_tokens / e.num_blocks))
    assert own == 99 and failed["kv_blocks_given"] == 106
    assert own <= e.num_blocks < failed["kv_blocks_given"]
