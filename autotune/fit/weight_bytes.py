"""The weights term of the memory estimate: every weight matrix at the width vLLM loads it (fit/quantization.py:
the scheme vLLM resolves for the checkpoint), with what a 4-bit kernel holds beside each group on CUDA, and the
quantization a configuration asks for checked against the checkpoint's."""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping

from autotune.fit.hardware import GpuProfile
from autotune.fit.model_shape import QUANT_ALIASES, ModelShape
from autotune.fit.quantization import Quantization, online_fp8

# A 4-bit checkpoint with groups of weights runs on CUDA through the first mixed-precision kernel that can implement
# it (kernels/linear/mixed_precision): Machete on compute capability 9.x unless VLLM_DISABLED_KERNELS names
# MacheteLinearKernel, else Marlin from 8.0 (an RTX 3090's 8.6). Each kernel holds a group beside its packed weights
# as: the 16-bit scale; the zero point as the kernel keeps it, where the checkpoint has one (AWQ's: Marlin packs it in
# 4 bits, Machete stores it 16-bit, pre-multiplied by the scale; GPTQ's AutoGPTQ config is symmetric only and asks
# for no zero points, auto_gptq.py zero_points=False, so its stored qzeros are dropped); and more that no tensor
# holds, fitted per kernel on the Qwen3.5-27B AWQ shape (linear_attn.in_proj_a/b, left in bf16, counted so). That
# extra is the caching allocator's rounding (vLLM loads weights with max_split_size_mb 20, so a tensor of 20 MiB or
# more holds its whole 2 MiB-rounded segment) and the 128 MiB rotary cache: benchmarks/weights_load.py replays the
# load and matches the 81 kept logs without an fp8 KV cache within 0.005 GiB (the 53 with one printed 32 MiB more,
# which it does not explain). The fitted figures stay here because the KV and peak terms were fitted beside them:
# with the replay's weights, five recorded boots, each within one KV block or 0.05 GiB of its boundary, went the
# other way (h100-as-rtx3090-awq-marlin).
#   Machete (H200, vLLM 0.25, gpu-boots): 17.21 and 17.24 GiB printed; 2.4 bytes a group beyond scale and zero give
#     17.25 (the 0.03 GiB more keeps the eager boots' predicted KV blocks at or under the printed ones).
#   Marlin (an H100 held down to the 3090's total with Machete disabled, h100-as-rtx3090-awq-machete's Marlin probe):
#     17.69 GiB printed with the MTP layer, 1.94 bytes a group beyond scale and packed zero. Out of sample: the AWQ
#     recipe without MTP's layer printed 16.9, 16.90 predicted (h100-as-rtx3090-awq-marlin); GPTQ-Int4, which has no
#     zero points, printed 16.83-16.86 (17.65 with MTP's layer), 16.81 (17.60) predicted (h100-as-rtx3090-gptq-marlin).
# GPTQ through Machete is not measured: its extra is taken as AWQ's (16.89 GiB; the replay says 16.92, as Machete
# leaves GPTQ's unused qzeros and g_idx in place).
MACHETE_EXTRA_BYTES_PER_GROUP = 2.4
MARLIN_EXTRA_BYTES_PER_GROUP = 1.94


def disabled_kernels_in(env: Mapping[str, str]) -> tuple[str, ...]:
    """The kernels vLLM will not pick (VLLM_DISABLED_KERNELS: comma-separated class names) in the server's
    environment."""
    return tuple(k.strip() for k in env.get("VLLM_DISABLED_KERNELS", "").split(",") if k.strip())


def kernel_bytes_per_group(profile: GpuProfile, quant: Quantization, disabled: Collection[str] = ()) -> float:
    """What the CUDA kernel holds beside a 4-bit group's packed weights (scale, zero point and its unexplained
    extra: see MARLIN_EXTRA_BYTES_PER_GROUP), or 0 where the checkpoint's own layout is kept."""
    if profile.kind == "cpu" or not (quant.method in ("awq", "gptq") and quant.bits == 4 and quant.group_size > 0):
        return 0.0
    zeros = quant.method == "awq"
    if (9, 0) <= profile.compute_capability < (10, 0) and "MacheteLinearKernel" not in disabled:
        return 2 + (2 if zeros else 0) + MACHETE_EXTRA_BYTES_PER_GROUP
    if profile.compute_capability >= (8, 0) and "MarlinLinearKernel" not in disabled:
        return 2 + (0.5 if zeros else 0) + MARLIN_EXTRA_BYTES_PER_GROUP
    return 0.0


def weights_bytes(shape: ModelShape, quant: Quantization, dtype_b: int, mtp: bool, vision: bool,
             kernel_group_bytes: float = 0.0) -> int:
    """Every weight matrix at its own width (quantization.py: the scheme vLLM resolves for its checkpoint name,
    with its scales and zero points), the rest (norms, conv1d, routers, biases, the vision patch embedding) in
    the model dtype. The MTP layer's embedding and lm_head are the target model's (vLLM shares them)."""
    text, mtp_b, vision_b = _weights_by_part(shape, quant, dtype_b, kernel_group_bytes)
    return int(text + (mtp_b if mtp else 0) + (vision_b if vision else 0))


@functools.lru_cache(maxsize=256)
def _weights_by_part(shape: ModelShape, quant: Quantization, dtype_b: int,
                     kernel_group_bytes: float) -> tuple[float, ...]:
    parts = {"text": 0.0, "mtp": 0.0, "vision": 0.0}
    listed = dict.fromkeys(parts, 0)
    for m in shape.modules:
        scheme = quant.scheme(m.name, m.kind)
        if scheme is None:
            per = float(dtype_b)
        elif kernel_group_bytes and scheme.bits == 4 and scheme.group_size > 0:
            per = 0.5 + kernel_group_bytes / scheme.group_size
        else:
            per = scheme.bytes_per_param(m.in_features)
        parts[m.part] += m.params * per
        listed[m.part] += m.params
    if shape.modules:  # what no module lists stays in the model dtype
        parts["text"] += (shape.total_params - shape.vision_params - listed["text"]) * dtype_b
        parts["mtp"] += (shape.mtp_params + shape.mtp_small_params - listed["mtp"]) * dtype_b
        parts["vision"] += (shape.vision_params - listed["vision"]) * dtype_b
    else:
        parts["text"] = (shape.total_params - shape.vision_params) * dtype_b
    return parts["text"], parts["mtp"], parts["vision"]


def resolve_quantization(shape: ModelShape, profile: GpuProfile, asked: str) -> tuple[Quantization, list[str]]:
    """The checkpoint's quantization, an online one (FP8 of an unquantized checkpoint), or why vLLM refuses.
    A checkpoint format this model does not know is counted at the bits its config names and said in
    quant.name (estimate reports it as not modelled), never refused."""
    quant, reasons = shape.quantization, []
    if asked and asked != "auto":
        want = QUANT_ALIASES.get(asked)
        have = {"gptq": "gptq", "awq": "awq", "fp8": "fp8", "auto-round": "auto-round", "none": None,
                "compressed-tensors": "ct"}.get(quant.method, quant.name)
        if want is None:
            reasons.append(f"quantization {asked!r} is not modelled (vLLM 0.33 no longer ships GGUF or bitsandbytes)")
        elif have is None and want == "fp8":
            quant = online_fp8()
        elif have != want:
            reasons.append(f"quantization {asked!r} does not match the checkpoint's ({quant.name or quant.method})")
    if quant.method == "fp8" and profile.kind == "cuda" and profile.compute_capability < (8, 0):
        reasons.append(f"FP8 weights need compute capability >= 8.0 (Marlin); {profile.name} has "
                       f"{profile.compute_capability[0]}.{profile.compute_capability[1]}")
    return quant, reasons


def quantization_not_modelled(quant: Quantization) -> tuple[str, ...]:
    if quant.method != "unknown":
        return ()
    width = f"{quant.bits}-bit weights as its config names" if quant.bits < 16 else "weights in the model dtype"
    return (f"not modelled: booted to learn: how quant_method {quant.name!r} stores its weights (counted as {width})",)
