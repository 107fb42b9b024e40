"""Every checkpoint and cache dtype a 3090 user runs: weights counted per module as vLLM resolves each
quantization_config (quantization.py), every KV dtype vLLM 0.32 accepts at its packed size, and the Gated DeltaNet
state dtypes. Shapes: Qwen3.5-27B (autotune/engine/known_models/qwen3.5-27b.json), whose module counts by hand are

    text linear layers   24,350,556,160 params, of which linear_attn.in_proj_a/b 23,592,960 (48 layers x 2 x 5120 x 48)
    the rest of the text  2,545,442,304 params (embedding and lm_head 248,320 x 5120 each, norms, conv1d, A_log ...)
    vision tower            460,730,096 params; MTP stack 372,244,480 + fc and norms 52,454,912
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from autotune.errors import SpecError
from autotune.fit.estimate import estimate
from autotune.fit.hardware import get_profile
from autotune.fit.model_shape import ModelShape
from autotune.fit.settings import KV_CACHE_DTYPES
from autotune.fit.weight_bytes import MARLIN_EXTRA_BYTES_PER_GROUP

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "autotune" / "engine" / "known_models"
CHECKPOINTS = ROOT / "tests" / "data" / "checkpoints"
RTX3090 = get_profile("rtx3090")
TEXT_ONLY = {"max_model_len": 4096, "max_num_seqs": 16, "language_model_only": True}
QUANTIZED = 24_350_556_160 - 23_592_960  # text linear layers less in_proj_a/b
BF16_REST = 23_592_960 + 2_545_442_304  # in_proj_a/b, embedding, lm_head, norms ...
W4G128 = 0.5 + (2 + 0.5) / 128  # packed 4-bit weight + an fp16 scale and a 4-bit zero per group of 128
# as Marlin holds them on an RTX 3090: AWQ's zero points packed beside the scales, symmetric GPTQ's dropped, and
# Marlin's unexplained extra (fitted on AWQ, h100-as-rtx3090-awq-machete)
W4G128_MARLIN_AWQ = 0.5 + (2 + 0.5 + MARLIN_EXTRA_BYTES_PER_GROUP) / 128
W4G128_MARLIN_GPTQ = 0.5 + (2 + MARLIN_EXTRA_BYTES_PER_GROUP) / 128


def qwen35(quantization_config: dict | None = None) -> dict:
    config = json.loads((CONFIGS / "qwen3.5-27b.json").read_text())
    if quantization_config is not None:
        config["quantization_config"] = copy.deepcopy(quantization_config)
    return config


def weights(config: dict, **flags) -> int:
    return estimate(ModelShape.from_config(config), RTX3090, {**TEXT_ONLY, **flags}).weights_bytes


CT_W4A16 = {  # llm-compressor's W4A16 scheme with the ignore list Qwen3.5 builds use
    "quant_method": "compressed-tensors", "format": "pack-quantized",
    "ignore": ["lm_head", "re:.*visual.*", "re:.*mtp.*", "re:.*linear_attn\\.in_proj_[ab]$"],
    "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "weights": {
        "num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True}}},
}


def test_modules_cover_the_model():
    shape = ModelShape.from_config(qwen35())
    text = sum(m.params for m in shape.modules if m.part == "text")
    assert text == 24_350_556_160 + 2 * 1_271_398_400  # the linears and the embedding + lm_head
    assert shape.total_params - shape.vision_params - text == 2_645_504  # norms, conv1d, A_log, dt_bias
    assert sum(m.params for m in shape.modules if m.part == "mtp") <= shape.mtp_params + shape.mtp_small_params
    assert sum(m.params for m in shape.modules if m.part == "vision") <= shape.vision_params


def test_compressed_tensors_w4a16_by_hand():
    # every Linear but the ignored at W4A16 (scales in the model dtype, no zero points: symmetric)
    assert weights(qwen35(CT_W4A16)) == int(QUANTIZED * (0.5 + 2 / 128) + BF16_REST * 2)


def test_an_int8_lm_head_is_counted_at_its_own_width():
    """A second config group quantizing lm_head to int8 per channel (W8A16: 1 byte + an fp16 scale per output row):
    reading only the first group counted it at bf16, 1.2 GiB too much."""
    int8_head = copy.deepcopy(CT_W4A16)
    int8_head["ignore"].remove("lm_head")
    int8_head["config_groups"]["group_1"] = {"targets": ["lm_head"], "weights": {
        "num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True}}
    lm_head = 248_320 * 5120
    assert weights(qwen35(CT_W4A16)) - weights(qwen35(int8_head)) == lm_head * 2 - (lm_head + 248_320 * 2)


def test_a_quantized_embedding_is_counted_at_its_own_width():
    quantized = copy.deepcopy(CT_W4A16)
    quantized["config_groups"]["group_0"]["targets"] = ["Linear", "Embedding"]
    embedding = 248_320 * 5120
    assert weights(qwen35(CT_W4A16)) - weights(qwen35(quantized)) == int(embedding * 2 - embedding * (0.5 + 2 / 128))


def test_gptq_dynamic_overrides_per_module():
    """4-bit layers as Marlin holds them on the 3090; the 8-bit override in the checkpoint's layout (a scale and
    an 8-bit zero per group: no 4-bit kernel repacks it)."""
    gptq = json.loads((CONFIGS / "qwen3.5-27b-gptq-int4.json").read_text())["quantization_config"]
    # the official Qwen3.5-27B-GPTQ-Int4 (float sums: a few bytes)
    assert weights(qwen35(gptq)) == pytest.approx(QUANTIZED * W4G128_MARLIN_GPTQ + BF16_REST * 2, abs=4)
    eight = copy.deepcopy(gptq)
    eight["dynamic"] = {**gptq["dynamic"], r"+:.*layers\.0\.mlp\..*": {"bits": 8}}
    layer0_mlp = 3 * 5120 * 17408
    assert weights(qwen35(eight)) - weights(qwen35(gptq)) == pytest.approx(
        layer0_mlp * ((1 + (2 + 1) / 128) - W4G128_MARLIN_GPTQ), abs=4)
    head = {**gptq, "lm_head": True}  # GPTQ's "lm_head": true quantizes the output layer too
    assert weights(qwen35(gptq)) - weights(qwen35(head)) == pytest.approx(
        248_320 * 5120 * (2 - W4G128_MARLIN_GPTQ), abs=4)
    scoped = {**gptq, "modules_in_block_to_quantize": [["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]]}
    attention = weights(qwen35(scoped)) - weights(qwen35(gptq))  # only the MLPs quantized now
    assert attention == pytest.approx((QUANTIZED - 64 * 3 * 5120 * 17408) * (2 - W4G128_MARLIN_GPTQ), abs=4)
    # in the checkpoint's own layout (Marlin disabled): the stored scale and 4-bit zero of every group
    stored = estimate(ModelShape.from_config(qwen35(gptq)), RTX3090, TEXT_ONLY,
                      disabled_kernels=("MarlinLinearKernel",))
    assert stored.weights_bytes == int(QUANTIZED * W4G128 + BF16_REST * 2)


def test_awq_modules_to_not_convert():
    awq = json.loads((CONFIGS / "qwen3.5-27b-awq.json").read_text())["quantization_config"]
    assert abs(weights(qwen35(awq)) - (QUANTIZED * W4G128_MARLIN_AWQ + BF16_REST * 2)) < 4  # float sums: a few bytes


def test_auto_round_is_predicted_not_refused():
    """Lorbus/Qwen3.6-27B-int4-AutoRound as its card describes it (tests/data/checkpoints/README.md): the card's
    checkpoint size is "18 GB" with the bf16 vision tower and MTP head; predicted 19.55e9 bytes = 18.2 GiB (the
    card does not say which unit; in GB the prediction is 8% over it)."""
    config = qwen35(json.loads((CHECKPOINTS / "qwen3.6-27b-int4-autoround.quantization_config.json").read_text()))
    text_only = weights(config)
    assert text_only == int(QUANTIZED * W4G128 + BF16_REST * 2)
    est = estimate(ModelShape.from_config(config), RTX3090, {"max_model_len": 4096, "max_num_seqs": 16,
                                                            "speculative_config": {"method": "mtp",
                                                                                   "num_speculative_tokens": 1}})
    assert est.not_modelled == ()
    everything = text_only + (460_730_096 + 372_244_480 + 52_454_912) * 2  # + vision tower + MTP stack, bf16
    assert est.weights_bytes == everything
    assert round(everything / 2**30, 1) == 18.2  # the card's "18 GB"
    assert ModelShape.from_config(qwen35({"quant_method": "intel/auto-round", "bits": 4, "group_size": 128})) \
        .quantization.method == "auto-round"


@pytest.mark.parametrize("bits,card_gb", [(4, 21), (8, 32)])
def test_gptq_group_32_checkpoints_against_their_cards(bits, card_gb):
    """btbtyler09/Qwen3.6-27B-GPTQ-{4,8}bit (tests/data/checkpoints/README.md): group 32, so a scale and a packed
    zero per 32 weights; with the bf16 vision tower and MTP module the whole checkpoint is predicted at 20.97 GB
    (card: 21 GB) and 33.52 GB = 31.2 GiB (card: 32 GB, the unit not said: 5% over in GB, 2.5% under in GiB)."""
    qc = json.loads((CHECKPOINTS / f"qwen3.6-27b-gptq-{bits}bit-g32.quantization_config.json").read_text())
    per_weight = bits / 8 + (2 + bits / 8) / 32
    flags = {"max_model_len": 4096, "max_num_seqs": 16,
             "speculative_config": {"method": "mtp", "num_speculative_tokens": 1}}
    # the checkpoint's own layout (Marlin disabled), as its files store it
    est = estimate(ModelShape.from_config(qwen35(qc)), RTX3090, flags, disabled_kernels=("MarlinLinearKernel",))
    everything = QUANTIZED * per_weight + (BF16_REST + 460_730_096 + 372_244_480 + 52_454_912) * 2
    assert est.weights_bytes == int(everything)
    assert round(everything / 1e9, 2) == {4: 20.97, 8: 33.52}[bits]


def test_auto_round_extra_config_exact_names_and_lm_head():
    ar = json.loads((CHECKPOINTS / "qwen3.6-27b-int4-autoround.quantization_config.json").read_text())
    base = weights(qwen35(ar))
    ar["extra_config"]["lm_head"] = {"bits": 8, "group_size": 128}  # a suffix match, as INCConfigParser does
    ar["extra_config"]["model.language_model.layers.5.mlp.down_proj"] = {"bits": 16}
    down = 17408 * 5120
    lm_head = 248_320 * 5120
    assert base - weights(qwen35(ar)) == int(lm_head * (2 - (1 + 3 / 128)) - down * (2 - W4G128))


def test_an_unknown_quantization_is_not_modelled_not_refused():
    config = qwen35({"quant_method": "hqq", "bits": 4, "group_size": 64})
    est = estimate(ModelShape.from_config(config), RTX3090, TEXT_ONLY)
    assert est.fits, est.reasons
    assert est.not_modelled and "not modelled: booted to learn" in est.not_modelled[0] and "hqq" in est.not_modelled[0]


# ---- KV cache and state dtypes ---------------------------------------------------------------------------------

# K + V of one token in one Qwen3.5 attention layer (4 KV heads of 256), from each layout's source (settings.py):
KV_PER_LAYER = {
    "auto": 4 * 512 * 2, "bfloat16": 4 * 512 * 2, "float16": 4 * 512 * 2,
    "fp8": 4 * 512, "fp8_e4m3": 4 * 512, "fp8_e5m2": 4 * 512, "fp8_inc": 4 * 512,
    "int8_per_token_head": 4 * (512 + 8), "fp8_per_token_head": 4 * (512 + 8),  # + an fp32 scale for K and V
    "int4_per_token_head": 4 * (256 + 8),
    "nvfp4": 2 * 4 * (128 + 16), "nvfp4_4over6": 2 * 4 * (128 + 16),  # fp4 data + an fp8 scale per 16
    "turboquant_k8v4": 4 * (256 + 128 + 4),  # fp8 keys; 4-bit values + fp16 scale and zero
    "turboquant_4bit_nc": 4 * ((128 + 2) + (128 + 4)),  # 4-bit keys + fp16 norm
    "turboquant_k3v4_nc": 4 * ((96 + 2) + (128 + 4)),
    "turboquant_3bit_nc": 4 * ((96 + 2) + (96 + 4)),
    "ultraquant_4bit": 4 * (256 + 16),  # 4-bit K and V + an E8M0 scale per 32
}


@pytest.mark.parametrize("kv_dtype", KV_CACHE_DTYPES)
def test_every_kv_dtype_vllm_accepts_is_predicted(kv_dtype):
    gptq = ModelShape.from_config(json.loads((CONFIGS / "qwen3.5-27b-gptq-int4.json").read_text()))
    est = estimate(gptq, RTX3090, {**TEXT_ONLY, "kv_cache_dtype": kv_dtype})
    assert not any("kv_cache_dtype" in r for r in est.reasons)
    if kv_dtype in ("fp8_ds_mla", "nvfp4_ds_mla"):  # MLA page layouts: a Qwen3.5 has no MLA layer
        assert est.not_modelled and kv_dtype in est.not_modelled[0]
    else:
        assert est.not_modelled == ()
        assert est.kv_bytes_per_token == 16 * KV_PER_LAYER[kv_dtype]
        # hybrid block: 16 x ceil(mamba page / (16 x attention bytes per token))
        assert est.block_size == 16 * -(-3_207_168 // (16 * KV_PER_LAYER[kv_dtype]))


def test_turboquant_keeps_a_dense_models_boundary_layers_full_width():
    dense = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 4096, "hidden_size": 256,
             "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
             "num_hidden_layers": 8, "max_position_embeddings": 8192, "tie_word_embeddings": True}
    est = estimate(ModelShape.from_config(dense), RTX3090,
                   {"kv_cache_memory_bytes": 2**26, "max_model_len": 1024, "kv_cache_dtype": "turboquant_4bit_nc"})
    # layers 0, 1, 6, 7 at bf16 (2 x 2 heads x 64 x 2 B = 512 B a token), 2-5 packed: 2 heads x
    # (4-bit keys 32 B + norm 2 + 4-bit values 32 + scale and zero 4) = 140 B
    assert est.bytes_per_block == 16 * (4 * 512 + 4 * 140)


def test_mamba_ssm_cache_dtype_halves_the_recurrent_state():
    gptq = ModelShape.from_config(json.loads((CONFIGS / "qwen3.5-27b-gptq-int4.json").read_text()))
    fp32 = estimate(gptq, RTX3090, TEXT_ONLY)
    fp16 = estimate(gptq, RTX3090, {**TEXT_ONLY, "mamba_ssm_cache_dtype": "float16"})
    conv = 10_240 * 3 * 2  # (2 x 16 x 128 + 48 x 128) channels x 3 rows, bf16
    assert fp32.state_bytes_per_seq == 48 * (conv + 48 * 128 * 128 * 4)
    assert fp16.state_bytes_per_seq == 48 * (conv + 48 * 128 * 128 * 2)
    assert fp16.block_size == 16 * -(-(conv + 48 * 128 * 128 * 2) // (16 * 65_536 // 16))  # 400 tokens
    assert fp16.kv_tokens > fp32.kv_tokens
    conv32 = estimate(gptq, RTX3090, {**TEXT_ONLY, "mamba_cache_dtype": "float32"})  # the conv state's own flag
    assert conv32.state_bytes_per_seq == 48 * (10_240 * 3 * 4 + 48 * 128 * 128 * 4)


@pytest.mark.parametrize("key", ["mamba_ssm_cache_dtype", "mamba_cache_dtype", "kv_cache_dtype"])
def test_dtypes_vllm_rejects_are_bad_input(key):
    gptq = ModelShape.from_config(json.loads((CONFIGS / "qwen3.5-27b-gptq-int4.json").read_text()))
    with pytest.raises(SpecError, match=key):
        estimate(gptq, RTX3090, {**TEXT_ONLY, key: "fp4"})
