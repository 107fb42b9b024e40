"""The pre-boot memory model: does a vLLM configuration fit, and how many KV-cache tokens will it have?

It mirrors what vLLM does at startup, per version (0.25.0 and 0.27.0-0.32.0 read), without importing torch:

GPU, a warm boot (compile cache hit; fit/vllm_memory.py has each term with its vLLM source per version):
    reserved  = ceil(total x gpu_memory_utilization), total being CUDA's (cudaMemGetInfo), which is the
                driver's (NVML) total less what the driver reserves (GpuProfile.driver_reserved_bytes)
    kv_bytes  = reserved - weights (per module, fit/quantization.py) - non-torch memory - the warm profile run's
                torch peak (forward of max_num_batched_tokens, or the sampler over max_num_seqs rows) - the
                CUDA-graph estimate profile_cudagraph_memory makes (first capture + per-graph x capture sizes)
    (--kv-cache-memory-bytes replaces all of that with its value.) Outside that budget the boot peaks for a moment
    while the CUDA-graph profiling holds a minimal KV cache, and with MTP while the drafter holds its own embedding
    and lm_head beside the weights: over the card's total either fails. A cold boot compiles inside the profile run and
    prints 1-2 GiB less; it is not predicted. Each term carries an uncertainty: kv_tokens_low/high are the KV at
    both ends, and a configuration is refused only when it misses at the optimistic end (else it is booted to
    learn). Corrections from this card's warm boots move the overhead both ways and narrow the band.
CPU build (vllm/v1/worker/cpu_worker.py):
    kv_bytes  = VLLM_CPU_KVCACHE_SPACE GiB (or --kv-cache-memory-bytes) when set, else
                ceil(node MemTotal x gpu_memory_utilization) - RSS of the worker process after warm-up,
    and RSS = the Python/torch/vLLM runtime + weights (+ the warm-up's activation peak and torch.compile's
    memory unless --enforce-eager). The runtime figures below are estimates to be fitted (Corrections).
Blocks (vllm/v1/core/kv_cache_utils.py, vllm/platforms/interface.py _align_hybrid_block_size):
    attention page per layer = block_size x 2 x kv_heads x head_dim x kv-dtype bytes. Hybrid models raise
    block_size to align x ceil(mamba_page / (align x page_per_token)) (align = 16 on CUDA, 128 on the CPU
    build) and pad the mamba page to the attention page; layers are grouped (group size = the smaller layer
    count, or the larger one when it is < 1.5x the smaller), a block holds one page of every layer of a group,
    num_blocks = kv_bytes // bytes_per_block. A request at max_model_len takes ceil(max_model_len /
    block_size) blocks per attention group plus (1, or 2 with prefix caching, + speculative tokens) per mamba
    group. vLLM prints "KV cache size: int(num_blocks / blocks_per_request x max_model_len) tokens" and
    "Maximum concurrency: num_blocks / blocks_per_request", and needs num_blocks >= blocks_per_request + 1
    (one block is the pool's null block).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from autotune.engine.defaults import (
    DEFAULT_UTILIZATION,
    align_block_within_batch,
    profiling_kv_per_sequence,
    unset_flag_value,
)
from autotune.fit.hardware import GpuProfile
from autotune.fit.model_shape import (
    _QUANT_ALIASES,
    DTYPE_BYTES,
    ModelShape,
)
from autotune.fit.quantization import Quantization, online_fp8
from autotune.fit.settings import Settings, settings
from autotune.fit.vllm_memory import ACTIVATION_UNCERTAINTY, cuda_terms, forward_peak, sampler_peak
from autotune.units import GiB, MiB, format_gib

# Runtime figures that are not derivable from the config; Corrections fitted from real boots adjust them. The CUDA
# terms (profile-run peak, CUDA-graph estimate, non-torch memory) are in fit/vllm_memory.py.
CUDA_CONTEXT_BYTES = 512 * MiB  # held before vLLM's budget is measured; only limits gpu_memory_utilization


CPU_RUNTIME_RSS_BYTES = 1 * GiB  # worker RSS without weights (python + torch + vLLM imports: 0.65 GiB here)


CPU_COMPILE_RSS_BYTES = 512 * MiB  # torch.compile / inductor in the worker when not --enforce-eager


ACTIVATION_FUDGE = 1.3  # CPU build: allocator slack over the sum of live intermediates


# Uncertainty of what is not measured by a term above: the weights vLLM loads (fitted kernels' extra storage,
# e.g. Machete's; gpu-boots: 17.21 predicted, 17.21 and 17.24 GiB printed) and the CPU build's RSS terms.
WEIGHTS_UNCERTAINTY = 0.02
CPU_RSS_UNCERTAINTY_BYTES = 256 * MiB


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


@dataclass(frozen=True)
class Corrections:
    """Fitted from this study's warm boots: bytes vLLM used beyond the model (negative when it printed more KV than
    predicted), a safety margin (a fraction of the reserved memory withheld from the KV cache), and, once boots
    calibrate it, the residual spread that replaces the model's own uncertainty."""

    overhead_bytes: int = 0
    margin: float = 0.0
    calibrated_by: int = 0  # warm boots this was fitted on (0: uncalibrated)
    uncertainty_bytes: int | None = None  # the calibrated band; None: the model's


@dataclass(frozen=True)
class Estimate:
    weights_bytes: int
    kv_bytes_per_token: int  # attention KV of one token over all attention layers (the MTP one included)
    state_bytes_per_seq: int  # GDN conv + recurrent state of one sequence over all layers, unpadded
    block_size: int
    activation_peak_bytes: int
    cudagraph_bytes: int
    overhead_bytes: int
    reserved_bytes: int  # what vLLM budgets: total x gpu_memory_utilization (0 with an explicit KV size)
    kv_cache_bytes: int  # may be negative: how far the rest is over the budget
    kv_tokens: int  # as vLLM prints "KV cache size: N tokens"
    max_concurrency_at_max_len: float  # as vLLM prints "Maximum concurrency for max_model_len"
    # The most sequences the pool can run at once, at the optimistic end of the band: vLLM admits a request only
    # when it holds a block of every group (one per attention group, 1 + speculative tokens per mamba group). An
    # upper bound (0: no pool), for the queue wait before boot (measure/queueing.py).
    max_running_seqs: int
    fits: bool  # the central prediction fits and every startup rule holds
    reasons: tuple[str, ...]
    excess_bytes: int  # memory short of fitting; 0 when the memory fits
    num_blocks: int = 0
    bytes_per_block: int = 0
    blocks_per_request: int = 0
    max_model_len: int = 0
    max_model_len_fit: int = 0  # the longest max_model_len whose one request fits (vLLM's own estimate)
    # What this configuration asks for that the model does not cover (a checkpoint format, a cache dtype): such a
    # configuration is booted to learn, never refused on a guess.
    not_modelled: tuple[str, ...] = ()
    # What the boot's process holds at its peak, CUDA context included, outside the budget: while it profiles its CUDA
    # graphs (not with the CPU build, eager, or an explicit KV size), or while MTP's drafter loads and compiles (0:
    # neither); over the card's total it fails however small the KV budget.
    boot_peak_bytes: int = 0
    # The range: the non-KV memory is known to +-uncertainty_bytes; kv_tokens_low/high are the KV tokens at its
    # pessimistic and optimistic ends.
    uncertainty_bytes: int = 0
    kv_tokens_low: int = 0
    kv_tokens_high: int = 0
    # Refused before boot: a startup rule fails, or the memory misses even at the optimistic end. A configuration
    # that misses only inside the band is booted to learn.
    refused: bool = False
    # The central KV cache holds one max_model_len request and a Mamba block per sequence, and every startup rule
    # holds: what may still miss is a boot peak, which the KV cache's size does not move.
    kv_fits: bool = False
    # The same count for the central pool (num_blocks, less vLLM's null block): what the configuration runs at once
    # as booted (a compiling boot is given num_blocks; a warm one sizes them within a block of it; vLLM's log showed
    # #35 of the Marlin surface running 13 of 16, where the optimistic end said 15). The start's pick (search/start.py)
    # and the screen before boot (measure/queueing.py holds_too_few) judge on it.
    running_seqs: int = 0


def estimate(
    shape: ModelShape,
    profile: GpuProfile,
    config: Mapping[str, object],
    *,
    corrections: Corrections = Corrections(),
    cpu_kvcache_bytes: int | None = None,
    default_gpu_memory_utilization: float = DEFAULT_UTILIZATION,
    vllm_version: str | None = None,
    disabled_kernels: Collection[str] = (),
) -> Estimate:
    """Predict vLLM's startup memory for one configuration, as a warm boot (compile cache hit) takes it (keys are
    vLLM flag dest names; absent ones take vLLM's defaults). cpu_kvcache_bytes is VLLM_CPU_KVCACHE_SPACE in bytes,
    for the CPU build; disabled_kernels is VLLM_DISABLED_KERNELS (disabled_kernels_in reads it). The formulas are in
    the module docstring and fit/vllm_memory.py; every rule vLLM enforces at startup that fails becomes a reason."""
    cpu = profile.kind == "cpu"
    shape = shape.served_as(config.get("dtype"))
    prefix_default = bool(unset_flag_value("enable_prefix_caching", vllm_version, shape.is_hybrid))
    s = settings(shape, profile, config, default_gpu_memory_utilization, cpu_kvcache_bytes, prefix_default)
    quant, rules = _quantization(shape, profile, str(config.get("quantization") or "").lower())
    # what the model does not cover: booted to learn, never refused for memory
    not_modelled = [*_quantization_not_modelled(quant), *s.not_modelled]
    if s.mtp and shape.num_mtp_layers == 0:
        rules.append("speculative_config asks for MTP but the model has no MTP layers")
    weights = _weights(shape, quant, DTYPE_BYTES.get(shape.dtype, 2), s.mtp and shape.num_mtp_layers > 0, s.vision,
                       kernel_bytes_per_group(profile, quant, disabled_kernels))
    lay = _layout(shape, s, profile, str(config.get("mamba_ssm_cache_dtype") or "auto"))
    if cpu and shape.is_hybrid and shape.dtype != "bfloat16":
        # model_executor/layers/mamba/ops/cpu/gdn_attention.py asserts it at the first request (vLLM 0.32): the
        # server boots, then dies serving (seen with --dtype float32 on tiny:hybrid)
        rules.append(f"vLLM's CPU build runs Gated DeltaNet layers in bfloat16 only, not {shape.dtype}")
    if shape.is_hybrid and s.prefix:  # mamba cache mode 'align'
        if not s.chunked:
            rules.append("hybrid models need chunked prefill when prefix caching is on (mamba cache mode 'align')")
        elif lay.block > s.batched and align_block_within_batch(vllm_version):
            rules.append(f"vLLM {vllm_version} needs max_num_batched_tokens {s.batched} >= the hybrid block size "
                         f"{lay.block} with prefix caching (mamba cache mode 'align'; 0.27 lifts it)")
    blocks_req = lay.g_attn * math.ceil(s.max_len / lay.block) + lay.g_mamba * lay.per_state
    profiling = drafter = 0  # KV blocks the CUDA-graph profiling allocates at boot; MTP's drafter's bytes
    if cpu:
        activation, cudagraph = (0 if s.eager else _cpu_activation(shape, s)), 0  # eager: no warm-up pass lingers
        overhead = CPU_RUNTIME_RSS_BYTES + (0 if s.eager else CPU_COMPILE_RSS_BYTES)
        spread = math.hypot(CPU_RSS_UNCERTAINTY_BYTES, ACTIVATION_UNCERTAINTY * activation)
    else:
        terms = cuda_terms(shape, s, config, vllm_version, blackwell=profile.compute_capability[0] == 10)
        activation, cudagraph, overhead, spread = (terms.activation_bytes, terms.cudagraph_bytes,
                                                   terms.non_torch_bytes, terms.uncertainty_bytes)
        profiling, drafter = terms.profiling_blocks, terms.drafter_bytes
    overhead += corrections.overhead_bytes
    non_kv = weights + activation + cudagraph + overhead
    uncertainty = int(math.hypot(spread, WEIGHTS_UNCERTAINTY * weights))
    if corrections.uncertainty_bytes is not None:  # calibrated: the boots' spread, never wider than the model's
        uncertainty = min(uncertainty, corrections.uncertainty_bytes)

    gib = functools.partial(format_gib, digits=1)
    total = profile.memory_bytes if cpu else profile.cuda_total_bytes
    held = 0 if cpu else profile.held_bytes  # other processes': vLLM still budgets a share of the whole card
    usable = total - held  # what every peak must fit in
    free = usable - (0 if cpu else CUDA_CONTEXT_BYTES)

    def card(digits: int = 1) -> str:
        """The memory a peak must fit in, as a reason names it."""
        if not held:
            return f"the {format_gib(total, digits=digits)} of {profile.name}"
        return (f"the {format_gib(usable, digits=digits)} that other processes leave on {profile.name} "
                f"({format_gib(held, digits=2)} held)")
    reserved = 0
    if s.explicit_kv is not None:
        kv_bytes = s.explicit_kv
        room = free - non_kv - kv_bytes  # what is left over; negative: it does not fit
        if room < 0:
            budget_reason = (f"weights {gib(weights)} + activations, graphs and overhead {gib(non_kv - weights)} + "
                             f"KV cache {gib(kv_bytes)} exceed the {gib(free)} free on {profile.name}")
    else:
        reserved = math.ceil(total * s.util)
        kv_bytes = int(reserved * (1 - corrections.margin)) - non_kv
        room = kv_bytes
        budget = f"the {gib(reserved)} vLLM reserves ({gib(total)} x {s.util:g})"
        if reserved > free:
            rules.append(f"gpu_memory_utilization {s.util:g} asks for more than is free beside the CUDA context"
                         + (f" and the {format_gib(held, digits=2)} other processes hold" if held else ""))
        budget_reason = (f"weights {gib(weights)} exceed {budget}" if weights > reserved else
                         f"weights {gib(weights)} + activations {gib(activation)} + CUDA graphs {gib(cudagraph)}"
                         f" + overhead {gib(overhead)} leave no KV cache in {budget}")
    bpb = lay.bytes_per_block
    graphs_need_blocks = shape.is_hybrid and not cpu and not s.eager  # config/compilation.py: a Mamba block each

    def memory_misses(kv: int, spare: int) -> tuple[list[str], int]:
        """Why KV memory `kv` (and `spare` left beside an explicit size) is too little, and by how many bytes."""
        if spare < 0 or (s.explicit_kv is None and kv <= 0):
            return [budget_reason], max(-spare, (blocks_req + 1) * bpb - kv)
        out, blocks = [], max(kv, 0) // bpb
        if blocks < blocks_req + 1:  # one block is the pool's null block
            out.append(f"one request of max_model_len {s.max_len:,} needs {gib(blocks_req * bpb)} of KV cache; "
                       f"{gib(max(kv - bpb, 0))} is available")
        excess = max(0, (blocks_req + 1) * bpb - kv)
        if graphs_need_blocks and s.seqs > blocks > 0:
            out.append(f"max_num_seqs {s.seqs} exceeds the {blocks} Mamba cache blocks (CUDA graphs need one "
                       f"per decoding sequence)")
            excess = max(excess, (s.seqs - blocks) * bpb)
        return out, excess

    memory, excess = memory_misses(kv_bytes, room)
    kv_misses = tuple(memory)  # before the boot's peaks join them
    # an explicit KV size is exact; only what is left beside it is uncertain
    optimistic, _ = memory_misses(kv_bytes + (0 if s.explicit_kv is not None else uncertainty), room + uncertainty)
    # The boot's peaks, outside the budget: the CUDA-graph profiling's minimal KV cache beside the weights and what the
    # profile run left (vllm_memory.py; an explicit KV size skips that profiling, determine_available_memory), and MTP's
    # drafter with its own embedding and lm_head beside the weights (vllm_memory.py drafter_peak: at load, before the
    # profile run, so an explicit KV size does not avoid it). Over the card's total either fails. A peak's low end: the
    # profile run's activations are freed into PyTorch's cache before the profiling KV cache is allocated, which reuses
    # them where a cached segment holds one layer's tensor: none of them on the H200 pinned to 512 blocks (1.53 GiB
    # tensors; seen within 0.25 GiB of the sum at the median), some at 88-96 blocks (the held-down card: 0.5 GiB under
    # the sum at 8,192 batched tokens; at 16,384 a boot whose sum was 25.1 GiB went through on 23.6,
    # h100-as-rtx3090-awq-marlin). So the sum is the central peak and the larger term alone its optimistic end.
    peaks: list[tuple[int, int, str]] = []
    if profiling and s.explicit_kv is None:
        peak = CUDA_CONTEXT_BYTES + non_kv + profiling * bpb
        peaks.append((peak, peak - min(activation, profiling * bpb),
                      f"the boot peaks at {gib(peak)}, over {card()}: to profile its "
                      f"CUDA graphs vLLM allocates {profiling} KV blocks ({gib(profiling * bpb)}) beside the weights"
                      + ("" if profiling_kv_per_sequence(vllm_version) else
                         " (vLLM 0.25 takes max_cudagraph_capture_size blocks; 0.26+ one per max_num_seqs)")))
    if drafter:
        peak = CUDA_CONTEXT_BYTES + overhead + weights + drafter
        peaks.append((peak, peak, f"the boot peaks at {format_gib(peak, digits=2)}, over {card(2)}: the MTP drafter "
                      f"builds its own embedding and lm_head ({gib(drafter)} with "
                      "its buffers) beside the weights before it shares the target's"))
    for peak, low, why in peaks:
        if peak > usable:
            memory.append(why)
            excess = max(excess, peak - usable)
        if low - uncertainty > usable:
            optimistic.append(why)
    boot_peak = max((peak for peak, _, _ in peaks), default=0)
    if s.batched < s.seqs:
        rules.append(f"max_num_batched_tokens {s.batched} must be >= max_num_seqs {s.seqs}")
    if not s.chunked and s.batched < s.max_len:
        rules.append(f"without chunked prefill max_num_batched_tokens {s.batched} must be >= max_model_len "
                     f"{s.max_len}")
    if s.max_len > shape.max_position_embeddings:
        rules.append(f"max_model_len {s.max_len:,} exceeds the model's {shape.max_position_embeddings:,} positions")

    def tokens(kv: int) -> int:
        if s.explicit_kv is not None:  # the pool is the size asked for; only what is left beside it is uncertain
            kv = kv_bytes
        return int(max(kv, 0) // bpb / blocks_req * s.max_len) if blocks_req else 0

    num_blocks = max(kv_bytes, 0) // bpb
    usable = max(num_blocks - 1, 0)
    most_blocks = max((kv_bytes if s.explicit_kv is not None else kv_bytes + uncertainty) // bpb - 1, 0)
    per_running = lay.g_attn + lay.g_mamba * (1 + s.num_spec)  # blocks a running request holds at least
    len_fit = max(0, (usable - lay.g_mamba * lay.per_state) // lay.g_attn * lay.block) if lay.n_attn else 0
    concurrency = num_blocks / blocks_req if blocks_req else 0.0
    reasons = rules + memory
    return Estimate(
        weights_bytes=weights, kv_bytes_per_token=lay.n_attn * lay.attn_1tok, state_bytes_per_seq=lay.state_seq,
        block_size=lay.block, activation_peak_bytes=activation, cudagraph_bytes=cudagraph, overhead_bytes=overhead,
        reserved_bytes=reserved, kv_cache_bytes=kv_bytes, kv_tokens=int(concurrency * s.max_len),
        max_concurrency_at_max_len=concurrency,
        max_running_seqs=most_blocks // per_running if per_running else 0,
        fits=not reasons, reasons=tuple(reasons), excess_bytes=int(excess), num_blocks=num_blocks,
        bytes_per_block=bpb, blocks_per_request=blocks_req, max_model_len=s.max_len,
        max_model_len_fit=min(len_fit, shape.max_position_embeddings),
        boot_peak_bytes=boot_peak,
        uncertainty_bytes=uncertainty, kv_tokens_low=tokens(kv_bytes - uncertainty),
        kv_tokens_high=tokens(kv_bytes + uncertainty),
        not_modelled=tuple(not_modelled),
        refused=bool(rules) or (bool(optimistic) and not not_modelled),
        kv_fits=not rules and not kv_misses,
        running_seqs=usable // per_running if per_running else 0,
    )


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


def _weights(shape: ModelShape, quant: Quantization, dtype_b: int, mtp: bool, vision: bool,
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


def _quantization(shape: ModelShape, profile: GpuProfile, asked: str) -> tuple[Quantization, list[str]]:
    """The checkpoint's quantization, an online one (FP8 of an unquantized checkpoint), or why vLLM refuses.
    A checkpoint format this model does not know is counted at the bits its config names and said in
    quant.name (estimate reports it as not modelled), never refused."""
    quant, reasons = shape.quantization, []
    if asked and asked != "auto":
        want = _QUANT_ALIASES.get(asked)
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


def _quantization_not_modelled(quant: Quantization) -> tuple[str, ...]:
    if quant.method != "unknown":
        return ()
    width = f"{quant.bits}-bit weights as its config names" if quant.bits < 16 else "weights in the model dtype"
    return (f"not modelled: booted to learn: how quant_method {quant.name!r} stores its weights (counted as {width})",)


@dataclass(frozen=True)
class _Layout:
    block: int
    bytes_per_block: int
    g_attn: int  # attention groups: each takes ceil(len / block) blocks per request
    g_mamba: int  # mamba groups: each takes per_state blocks per request
    per_state: int
    n_attn: int
    attn_1tok: int  # bytes per token per attention layer
    state_seq: int  # unpadded GDN state of one sequence


def _layout(shape: ModelShape, s: Settings, profile: GpuProfile, ssm_asked: str) -> _Layout:
    """Block size, block bytes and groups as _align_hybrid_block_size and get_kv_cache_groups derive them."""
    cpu = profile.kind == "cpu"
    n_attn = shape.num_full_attention_layers + (shape.num_mtp_layers if s.mtp else 0)
    attn_1tok = s.kv_token_bytes  # settings.kv_bytes_per_token: the KV dtype's layout, scales included
    block = s.user_block if s.user_block is not None else (128 if cpu else 16)
    n_mamba, state_seq, per_state = shape.num_linear_attention_layers, 0, 0
    if shape.is_hybrid:
        # mamba_utils.py _mamba_state_dtype: the conv state takes --mamba-cache-dtype (auto: the model dtype), the
        # recurrent state --mamba-ssm-cache-dtype, whose "auto" is the checkpoint's mamba_ssm_dtype for Qwen3.5
        # (models/config.py) and the conv state's dtype otherwise.
        conv = shape.dtype if s.mamba_dtype == "auto" else s.mamba_dtype
        ssm = shape.mamba_ssm_dtype if ssm_asked == "auto" and shape.mamba_ssm_dtype else ssm_asked
        if cpu and profile.avx512_bf16 and ssm not in ("float16", "bfloat16", "float32"):
            ssm = "float32"  # platforms/cpu.py: the accelerated GDN path resets "auto" to float32
        conv_e, rec_e = shape.gdn_state_elems(s.num_spec)
        mamba_page = conv_e * DTYPE_BYTES.get(conv, 2) + rec_e * DTYPE_BYTES.get(ssm if ssm != "auto" else conv, 2)
        state_seq = n_mamba * mamba_page
        align = max(32 if cpu else 16, block)  # the attention backend's smallest kernel block, or the user's
        block = max(block, align * math.ceil(mamba_page / (align * attn_1tok)))
        per_state = (2 if s.prefix else 1) + s.num_spec  # prefix caching = mamba cache mode "align"
    page = block * attn_1tok
    if shape.is_hybrid and n_attn:
        small, large = min(n_attn, n_mamba), max(n_attn, n_mamba)
        size = large if large < 1.5 * small else small
        g_attn, g_mamba = math.ceil(n_attn / size), math.ceil(n_mamba / size)
        bytes_per_block = max(math.ceil(n_attn / g_attn), math.ceil(n_mamba / g_mamba)) * page
    else:
        # a packed KV dtype's full-width boundary layers have pages of their own size in the same block
        # (kv_cache_utils.py UniformTypeKVCacheSpecs)
        wide = s.kv_full_width_layers
        full_page = block * 2 * shape.num_kv_heads * shape.head_dim * DTYPE_BYTES.get(shape.dtype, 2)
        g_attn, g_mamba, bytes_per_block = 1, 0, max(n_attn - wide, 1) * page + wide * full_page
    return _Layout(block, bytes_per_block, g_attn, g_mamba, per_state, n_attn, attn_1tok, state_seq)


def _cpu_activation(shape: ModelShape, s: Settings) -> int:
    """The CPU build's warm-up peak left in the worker's RSS: the forward pass over max_num_batched_tokens or the
    sampler's top-k/p warm-up over max_num_seqs rows, with allocator slack."""
    return int(ACTIVATION_FUDGE * max(forward_peak(shape, s), sampler_peak(shape, s)))


__all__ = ["Corrections", "Estimate", "disabled_kernels_in", "estimate"]
