"""The pre-boot memory model: does a vLLM configuration fit, and how many KV-cache tokens will it have?

It mirrors what vLLM does at startup, per version (0.25.0 and 0.27.0-0.32.0 read), without importing torch:

GPU, a warm boot (compile cache hit; fit/vllm_memory.py has each term with its vLLM source per version):
    reserved  = ceil(total x gpu_memory_utilization), total being CUDA's (cudaMemGetInfo), which is the
                driver's (NVML) total less what the driver reserves (GpuProfile.driver_reserved_bytes)
    kv_bytes  = reserved - weights (per module, fit/weight_bytes.py) - non-torch memory - the warm profile run's
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
Blocks: fit/kv_layout.py.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from autotune.engine.defaults import (
    DEFAULT_UTILIZATION,
    profiling_kv_per_sequence,
    unset_flag_value,
)
from autotune.fit.hardware import GpuProfile
from autotune.fit.kv_layout import KvLayout, kv_layout
from autotune.fit.model_shape import (
    DTYPE_BYTES,
    ModelShape,
)
from autotune.fit.quantization import Quantization
from autotune.fit.settings import Settings, settings
from autotune.fit.startup_rules import batch_rules, model_rules
from autotune.fit.vllm_memory import ACTIVATION_UNCERTAINTY, CudaTerms, cuda_terms, forward_peak, sampler_peak
from autotune.fit.vllm_version import ModelledVersion, modelled_version
from autotune.fit.weight_bytes import (
    kernel_bytes_per_group,
    quantization_not_modelled,
    resolve_quantization,
    weights_bytes,
)
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
    # The vLLM version whose terms this is ("vLLM 0.32.0", or "vLLM 0.29.0 as 0.32.0" for one not modelled) and,
    # for one not modelled, the line that says so.
    vllm_version: str = ""
    version_note: str = ""
    # The vision encoder's weights counted (0: text-only, language_model_only): a text-only server frees them for KV
    vision_bytes: int = 0


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
    for the CPU build; disabled_kernels is VLLM_DISABLED_KERNELS (disabled_kernels_in reads it). The KV cache is
    what vLLM's budget leaves after the terms beside it (_Terms: weights, activation, CUDA graphs, overhead; the
    drafter and the graph profiling peak outside it); every rule vLLM enforces at startup that fails is a reason."""
    shape = shape.served_as(config.get("dtype"))
    prefix_default = bool(unset_flag_value("enable_prefix_caching", vllm_version, shape.is_hybrid))
    s = settings(shape, profile, config, default_gpu_memory_utilization, cpu_kvcache_bytes, prefix_default)
    quant, rules = resolve_quantization(shape, profile, str(config.get("quantization") or "").lower())
    lay = kv_layout(shape, s, profile, str(config.get("mamba_ssm_cache_dtype") or "auto"))
    rules += model_rules(shape, s, profile, lay, vllm_version)
    terms = _terms(shape, s, config, profile, quant, corrections, vllm_version, disabled_kernels)
    card = _Card.of(profile)
    budget = _kv_budget(s, card, terms, corrections)
    rules += budget.rules
    pool = _Pool(lay, lay.g_attn * math.ceil(s.max_len / lay.block) + lay.g_mamba * lay.per_state,
                 graphs_need_blocks=shape.is_hybrid and profile.kind != "cpu" and not s.eager)
    memory, excess = _memory_misses(s, budget, pool, budget.kv_bytes, budget.room)
    kv_misses = tuple(memory)  # before the boot's peaks join them
    # an explicit KV size is exact; only what is left beside it is uncertain
    optimistic, _ = _memory_misses(s, budget, pool, budget.kv_bytes + (0 if s.explicit_kv is not None
                                                                       else terms.uncertainty),
                                   budget.room + terms.uncertainty)
    peaks = _boot_peaks(s, terms, card, lay.bytes_per_block, vllm_version)
    for peak, low, why in peaks:
        if peak > card.usable:
            memory.append(why)
            excess = max(excess, peak - card.usable)
        if low - terms.uncertainty > card.usable:
            optimistic.append(why)
    rules += batch_rules(shape, s)
    return _estimate_of(shape, s, terms, budget, pool, rules, memory, excess, kv_misses, optimistic,
                        boot_peak=max((peak for peak, _, _ in peaks), default=0),
                        not_modelled=(*quantization_not_modelled(quant), *s.not_modelled),
                        version=modelled_version(vllm_version),
                        vision=_vision_bytes(shape, s, quant, profile, disabled_kernels))


@dataclass(frozen=True)
class _Terms:
    """What a warm boot holds beside its KV cache, term by term, with the spread of their sum; and what it holds
    for a moment at boot, outside the budget (the CUDA-graph profiling's KV blocks, MTP's drafter)."""

    weights: int
    activation: int
    cudagraph: int
    overhead: int
    uncertainty: int
    profiling_blocks: int = 0
    drafter: int = 0
    outside_measured: tuple[str, ...] = ()  # what the version's boots did not measure (vllm_memory.outside_measured)

    @property
    def beside_kv(self) -> int:
        return self.weights + self.activation + self.cudagraph + self.overhead


def _terms(shape: ModelShape, s: Settings, config: Mapping[str, object], profile: GpuProfile, quant: Quantization,
           corrections: Corrections, vllm_version: str | None, disabled_kernels: Collection[str]) -> _Terms:
    cpu = profile.kind == "cpu"
    cuda = None if cpu else cuda_terms(shape, s, config, vllm_version, blackwell=profile.compute_capability[0] == 10)
    weights = weights_bytes(shape, quant, DTYPE_BYTES.get(shape.dtype, 2), s.mtp and shape.num_mtp_layers > 0, s.vision,
                       kernel_bytes_per_group(profile, quant, disabled_kernels))
    activation = _activation(shape, s, cuda)
    spread = (math.hypot(CPU_RSS_UNCERTAINTY_BYTES, ACTIVATION_UNCERTAINTY * activation) if cuda is None
              else cuda.uncertainty_bytes)
    uncertainty = int(math.hypot(spread, WEIGHTS_UNCERTAINTY * weights))
    if corrections.uncertainty_bytes is not None:  # calibrated: the boots' spread, never wider than the model's
        uncertainty = min(uncertainty, corrections.uncertainty_bytes)
    return _Terms(weights, activation, _cudagraphs(cuda), _overhead(s, cuda) + corrections.overhead_bytes,
                  uncertainty, 0 if cuda is None else cuda.profiling_blocks, _drafter(cuda),
                  () if cuda is None else cuda.outside_measured)


def _activation(shape: ModelShape, s: Settings, cuda: CudaTerms | None) -> int:
    """The profile run's peak: on CUDA its torch peak (v1/worker/gpu_worker.py determine_available_memory, the
    forward over max_num_batched_tokens or the sampler over max_num_seqs rows: fit/vllm_memory.py); on the CPU
    build the warm-up's peak left in the worker's RSS (v1/worker/cpu_worker.py), none when eager."""
    if cuda is not None:
        return cuda.activation_bytes
    return 0 if s.eager else _cpu_activation(shape, s)


def _cudagraphs(cuda: CudaTerms | None) -> int:
    """The CUDA-graph memory vLLM subtracts from the KV budget (v1/worker/gpu_model_runner.py
    profile_cudagraph_memory: fit/vllm_memory.py cudagraph_estimate); none on the CPU build."""
    return 0 if cuda is None else cuda.cudagraph_bytes


def _overhead(s: Settings, cuda: CudaTerms | None) -> int:
    """Non-torch memory on CUDA (utils/mem_utils.py memory_profiling's non_torch_increase); on the CPU build the
    worker's runtime RSS, and torch.compile's unless eager (v1/worker/cpu_worker.py)."""
    if cuda is not None:
        return cuda.non_torch_bytes
    return CPU_RUNTIME_RSS_BYTES + (0 if s.eager else CPU_COMPILE_RSS_BYTES)


def _drafter(cuda: CudaTerms | None) -> int:
    """MTP's drafter building its own embedding and lm_head beside the weights before it shares the target's
    (v1/spec_decode/eagle.py load_model: fit/vllm_memory.py drafter_peak)."""
    return 0 if cuda is None else cuda.drafter_bytes


@dataclass(frozen=True)
class _Card:
    """The memory a boot plans in: the card's total (CUDA's, or the host's on the CPU build), what other processes
    hold on it, what every peak must fit in (usable), and what is free beside the CUDA context."""

    name: str
    total: int
    held: int
    usable: int
    free: int

    @classmethod
    def of(cls, profile: GpuProfile) -> _Card:
        cpu = profile.kind == "cpu"
        total = profile.memory_bytes if cpu else profile.cuda_total_bytes
        held = 0 if cpu else profile.held_bytes  # other processes': vLLM still budgets a share of the whole card
        return cls(profile.name, total, held, total - held, total - held - (0 if cpu else CUDA_CONTEXT_BYTES))

    def text(self, digits: int = 1) -> str:
        """The memory a peak must fit in, as a reason names it."""
        if not self.held:
            return f"the {format_gib(self.total, digits=digits)} of {self.name}"
        return (f"the {format_gib(self.usable, digits=digits)} that other processes leave on {self.name} "
                f"({format_gib(self.held, digits=2)} held)")


@dataclass(frozen=True)
class _Budget:
    """The KV cache's bytes, what is left beside an explicit size (`room`; negative: it does not fit), vLLM's
    reserve (0 with an explicit size), why no KV cache is left, and the rule the reserve breaks, if any."""

    kv_bytes: int
    room: int
    reserved: int
    reason: str
    rules: tuple[str, ...] = ()


def _kv_budget(s: Settings, card: _Card, t: _Terms, corrections: Corrections) -> _Budget:
    """The KV term: vLLM's reserve, total x gpu_memory_utilization less the fitted margin, less every term beside
    it (v1/worker/gpu_worker.py determine_available_memory; v1/worker/cpu_worker.py); or the size asked for
    (--kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE), with what is left beside it."""
    gib = functools.partial(format_gib, digits=1)
    if s.explicit_kv is not None:
        kv = s.explicit_kv
        return _Budget(kv, card.free - t.beside_kv - kv, 0,
                       f"weights {gib(t.weights)} + activations, graphs and overhead {gib(t.beside_kv - t.weights)} + "
                       f"KV cache {gib(kv)} exceed the {gib(card.free)} free on {card.name}")
    reserved = math.ceil(card.total * s.util)
    kv = int(reserved * (1 - corrections.margin)) - t.beside_kv
    budget = f"the {gib(reserved)} vLLM reserves ({gib(card.total)} x {s.util:g})"
    rules: tuple[str, ...] = ()
    if reserved > card.free:
        rules = (f"gpu_memory_utilization {s.util:g} asks for more than is free beside the CUDA context"
                 + (f" and the {format_gib(card.held, digits=2)} other processes hold" if card.held else ""),)
    reason = (f"weights {gib(t.weights)} exceed {budget}" if t.weights > reserved else
              f"weights {gib(t.weights)} + activations {gib(t.activation)} + CUDA graphs {gib(t.cudagraph)}"
              f" + overhead {gib(t.overhead)} leave no KV cache in {budget}")
    return _Budget(kv, kv, reserved, reason, rules)


@dataclass(frozen=True)
class _Pool:
    """The KV pool's shape: its layout, the blocks one max_model_len request takes, and whether CUDA graphs need a
    Mamba block per decoding sequence (config/compilation.py)."""

    lay: KvLayout
    blocks_req: int
    graphs_need_blocks: bool


def _memory_misses(s: Settings, budget: _Budget, pool: _Pool, kv: int, spare: int) -> tuple[list[str], int]:
    """Why KV memory `kv` (and `spare` left beside an explicit size) is too little, and by how many bytes."""
    bpb, need = pool.lay.bytes_per_block, pool.blocks_req + 1  # one block is the pool's null block
    if spare < 0 or (s.explicit_kv is None and kv <= 0):
        return [budget.reason], max(-spare, need * bpb - kv)
    gib = functools.partial(format_gib, digits=1)
    out, blocks = [], max(kv, 0) // bpb
    if blocks < need:
        out.append(f"one request of max_model_len {s.max_len:,} needs {gib(pool.blocks_req * bpb)} of KV cache; "
                   f"{gib(max(kv - bpb, 0))} is available")
    excess = max(0, need * bpb - kv)
    if pool.graphs_need_blocks and s.seqs > blocks > 0:
        out.append(f"max_num_seqs {s.seqs} exceeds the {blocks} Mamba cache blocks (CUDA graphs need one "
                   f"per decoding sequence)")
        excess = max(excess, (s.seqs - blocks) * bpb)
    return out, excess


def _boot_peaks(s: Settings, t: _Terms, card: _Card, bpb: int, vllm_version: str | None) -> list[tuple[int, int, str]]:
    """The boot's peaks outside the budget, each (central, optimistic end, reason): the CUDA-graph profiling's
    minimal KV cache beside the weights and what the profile run left (vllm_memory.py; an explicit KV size skips
    that profiling, determine_available_memory), and MTP's drafter with its own embedding and lm_head beside the
    weights (vllm_memory.py drafter_peak: at load, before the profile run, so an explicit KV size does not avoid
    it). Over the card's total either fails. A peak's low end: the profile run's activations are freed into
    PyTorch's cache before the profiling KV cache is allocated, which reuses them where a cached segment holds one
    layer's tensor: none of them on the H200 pinned to 512 blocks (1.53 GiB tensors; seen within 0.25 GiB of the
    sum at the median), some at 88-96 blocks (the held-down card: 0.5 GiB under the sum at 8,192 batched tokens;
    at 16,384 a boot whose sum was 25.1 GiB went through on 23.6, h100-as-rtx3090-awq-marlin). So the sum is
    the central peak and the larger term alone its optimistic end."""
    gib = functools.partial(format_gib, digits=1)
    peaks: list[tuple[int, int, str]] = []
    if t.profiling_blocks and s.explicit_kv is None:
        blocks = t.profiling_blocks
        peak = CUDA_CONTEXT_BYTES + t.beside_kv + blocks * bpb
        peaks.append((peak, peak - min(t.activation, blocks * bpb),
                      f"the boot peaks at {gib(peak)}, over {card.text()}: to profile its "
                      f"CUDA graphs vLLM allocates {blocks} KV blocks ({gib(blocks * bpb)}) beside the weights"
                      + ("" if profiling_kv_per_sequence(vllm_version) else
                         " (vLLM 0.25 takes max_cudagraph_capture_size blocks; 0.26+ one per max_num_seqs)")))
    if t.drafter:
        peak = CUDA_CONTEXT_BYTES + t.overhead + t.weights + t.drafter
        peaks.append((peak, peak, f"the boot peaks at {format_gib(peak, digits=2)}, over {card.text(2)}: the MTP "
                      f"drafter builds its own embedding and lm_head ({gib(t.drafter)} with "
                      "its buffers) beside the weights before it shares the target's"))
    return peaks


def _estimate_of(shape: ModelShape, s: Settings, t: _Terms, budget: _Budget, pool: _Pool, rules: list[str],
                 memory: list[str], excess: int, kv_misses: tuple[str, ...], optimistic: list[str], *,
                 boot_peak: int, not_modelled: tuple[str, ...], version: ModelledVersion,
                 vision: int = 0) -> Estimate:
    """The Estimate, with the pool's counts as vLLM prints them (kv_cache_utils.py) at the band's two ends."""
    lay, kv_bytes, blocks_req = pool.lay, budget.kv_bytes, pool.blocks_req
    bpb = lay.bytes_per_block

    def tokens(kv: int) -> int:
        if s.explicit_kv is not None:  # the pool is the size asked for; only what is left beside it is uncertain
            kv = kv_bytes
        return int(max(kv, 0) // bpb / blocks_req * s.max_len) if blocks_req else 0

    num_blocks = max(kv_bytes, 0) // bpb
    usable = max(num_blocks - 1, 0)
    most_blocks = max((kv_bytes if s.explicit_kv is not None else kv_bytes + t.uncertainty) // bpb - 1, 0)
    per_running = lay.g_attn + lay.g_mamba * (1 + s.num_spec)  # blocks a running request holds at least
    len_fit = max(0, (usable - lay.g_mamba * lay.per_state) // lay.g_attn * lay.block) if lay.n_attn else 0
    concurrency = num_blocks / blocks_req if blocks_req else 0.0
    reasons = rules + memory
    return Estimate(
        weights_bytes=t.weights, kv_bytes_per_token=lay.n_attn * lay.attn_1tok, state_bytes_per_seq=lay.state_seq,
        block_size=lay.block, activation_peak_bytes=t.activation, cudagraph_bytes=t.cudagraph,
        overhead_bytes=t.overhead, reserved_bytes=budget.reserved, kv_cache_bytes=kv_bytes,
        kv_tokens=int(concurrency * s.max_len), max_concurrency_at_max_len=concurrency,
        max_running_seqs=most_blocks // per_running if per_running else 0,
        fits=not reasons, reasons=tuple(reasons), excess_bytes=int(excess), num_blocks=num_blocks,
        bytes_per_block=bpb, blocks_per_request=blocks_req, max_model_len=s.max_len,
        max_model_len_fit=min(len_fit, shape.max_position_embeddings), boot_peak_bytes=boot_peak,
        uncertainty_bytes=t.uncertainty, kv_tokens_low=tokens(kv_bytes - t.uncertainty),
        kv_tokens_high=tokens(kv_bytes + t.uncertainty), not_modelled=not_modelled,
        refused=bool(rules) or (bool(optimistic) and not not_modelled),
        kv_fits=not rules and not kv_misses,
        running_seqs=usable // per_running if per_running else 0,
        vllm_version=version.label, version_note=_version_note(version, t.outside_measured), vision_bytes=vision,
    )


def _vision_bytes(shape: ModelShape, s: Settings, quant: Quantization, profile: GpuProfile,
                  disabled_kernels: Collection[str]) -> int:
    """The vision encoder's weights the estimate counts: a vision-language checkpoint served without
    --language-model-only loads them (an estimate of text-only boots must be told language_model_only)."""
    if not s.vision:
        return 0
    kernel = kernel_bytes_per_group(profile, quant, disabled_kernels)
    b, mtp = DTYPE_BYTES.get(shape.dtype, 2), s.mtp and shape.num_mtp_layers > 0
    return weights_bytes(shape, quant, b, mtp, True, kernel) - weights_bytes(shape, quant, b, mtp, False, kernel)


def _version_note(version: ModelledVersion, outside: tuple[str, ...]) -> str:
    """What the prediction stands on that the version's boots did not measure: another version, or a configuration
    beyond the range its boots span; empty when neither (each widens the range: fit/vllm_memory.py)."""
    beyond = (f"beyond what vLLM {version.modelled}'s boots measured, with a wider range: {', '.join(outside)}"
              if outside else "")
    return "; ".join(n for n in (version.note, beyond) if n)


def _cpu_activation(shape: ModelShape, s: Settings) -> int:
    """The CPU build's warm-up peak left in the worker's RSS: the forward pass over max_num_batched_tokens or the
    sampler's top-k/p warm-up over max_num_seqs rows, with allocator slack."""
    return int(ACTIVATION_FUDGE * max(forward_peak(shape, s), sampler_peak(shape, s)))


__all__ = ["Corrections", "Estimate", "estimate"]
