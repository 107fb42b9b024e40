"""What a CUDA vLLM worker takes beside weights and KV cache before it sizes the pool, term by term, per version.

Read in the wheels of vLLM 0.25.0 (tests/data/gpu-boots/VLLM-MEMORY-0.25.md) and 0.27.0-0.31.0 (`pip download
--no-deps vllm==X`) and in the installed 0.32.0 (tests/data/gpu-boots/VLLM-MEMORY-0.32.md: term by term against 0.25,
with 0.32's default Model Runner V2). The constants are kept per modelled version (VERSION_TERMS).
The KV pool is the requested memory less what the profile run
leaves and peaks at, less the CUDA-graph estimate; how the first part is measured changed in 0.27:

- 0.25 (v1/worker/gpu_worker.py determine_available_memory 430-560, utils/mem_utils.py memory_profiling 295-315):
  profile_cudagraph_memory runs inside the memory_profiling window but the torch peak is read before it ("Use the
  pre-cudagraph torch peak to avoid double-counting"), and
      available_kv = requested - (weights + torch_peak_increase + non_torch_increase) - cudagraph_estimate
- 0.27 (gpu_worker.py determine_available_memory 460-600, mem_utils.py memory_profiling 290-326), the same in 0.28
  to 0.32 (0.32: gpu_worker.py 634-740, mem_utils.py 286-321): profile_cudagraph_memory runs after the window, and
  the non-KV memory is measured by cudaMemGetInfo, not summed from torch's counters:
      total_consumed = free at worker init - free after the profile run (weights, non-torch, and whatever the
                       allocator keeps cached after empty_cache())
      available_kv = requested - (total_consumed + torch peak - torch allocated after the run) - cudagraph_estimate
  For a warm boot the two agree up to allocator fragmentation, which 0.25 never charges and 0.27+ does; no boot of
  0.27+ is kept here, so that difference is inside the activation term's uncertainty, not modelled. 0.28+ wrap the
  profile run in _scoped_allocator_max_split(20 MiB) to keep that fragmentation releasable.
- profile_run (0.25 v1/worker/gpu_model_runner.py 6290, 0.27 6433, 0.32 6133): one _dummy_run of
  max_num_batched_tokens and a _dummy_sampler_run over min(max_num_seqs, tokens) rows; peak = the larger.
- A cold compile cache runs torch.compile and the first Triton JIT inside that profile run: its peak is 1-2 GiB
  higher (gpu-boots cold vs warm). That is not the configuration's need; the warm boot is what is predicted.
- profile_cudagraph_memory (0.25 gpu_model_runner.py 6498-6645, 0.27 6645, 0.32 6333; the same on CUDA in all
  three, 0.27+ only adds a ROCm capture stream): per runtime mode it captures the two largest graphs, first + (n - 1)
  x per-graph, the largest FULL one with min(max_model_len, max_num_tokens // size) as sequence lengths; modes share
  one pool, so the total is the largest first capture plus every mode's per-graph terms. It is subtracted while
  VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS is on (default "1": 0.25 envs.py 280, 0.32 envs.py 328).
- The boot's transient peak (profiling_blocks below): to capture its graphs, profile_cudagraph_memory first allocates a
  minimal KV cache (_init_minimal_kv_cache_for_profiling, 0.25 gpu_model_runner.py 6365) beside the weights and what the
  profile run left in the allocator, outside gpu_memory_utilization's budget: 0.25 takes max_cudagraph_capture_size
  blocks, 0.26+ min(max_num_seqs, that) (engine/defaults.py profiling_kv_per_sequence). Seen
  (h100-as-rtx3090-awq-capture-pinned, an H100 held down to a 3090's 23.62 GiB CUDA total): four warm boots of the
  Qwen3.5-27B shape with --max-cudagraph-capture-size 512 failed there asking for the fourth of 16 tensors of 1.53 GiB;
  on the capped H200 the same boots peaked at 43.5-43.8 GiB (NVML) and served.
- MTP's drafter at boot (drafter_peak below): it builds its own embedding and lm_head beside the loaded target before it
  shares the target's, and its first compile takes one more such tensor; outside the budget too, and before the profile
  run, so an explicit KV size does not avoid it (h100-as-rtx3090-awq-machete, the same held-down card: five boots).
- Capture sizes (capture_sizes below): VllmConfig._set_cudagraph_sizes is identical in 0.25 and 0.27 (max 512,
  max_num_batched_tokens appended within the cap); 0.28 adds the 1024 default on data-centre Blackwell, 0.29 the
  speculative decode sizes, 0.31 max_num_seqs. Speculative decoding rounds sizes to multiples of the query length
  (CompilationConfig.adjust_cudagraph_sizes_for_spec_decode, all versions with the V1 model runner).
- Prefix caching for hybrid models (engine/defaults.py hybrid_prefix_caching_default, which sizes the Mamba blocks
  per request): off in 0.25 (config/model.py ModelConfig.is_prefix_caching_supported: "Hybrid models do not
  support prefix caching"); supported from 0.27 ("Generative hybrid models support prefix caching", config/model.py
  1952) but opt-in there (0.27.1 engine/arg_utils.py: "keep it opt-in for now"), on by default from 0.28.0.

Constants below are fitted where vLLM measures at boot; each names its logs and its uncertainty (one sigma-ish,
added in quadrature by the caller).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from autotune.engine.defaults import major_minor, profiling_kv_per_sequence
from autotune.fit.model_shape import DTYPE_BYTES, ModelShape
from autotune.fit.settings import Settings
from autotune.fit.vllm_version import MODELLED_VERSIONS, ModelledVersion, modelled_version
from autotune.units import MiB

# "non-torch forward increase memory" (cuBLAS/NCCL workspaces): 0.25-0.26 GiB in all twenty gpu-boots logs.
CUDA_NON_TORCH_BYTES = 256 * MiB
NON_TORCH_UNCERTAINTY_BYTES = 64 * MiB

# Warm torch peak of the profile run = FORWARD_FUDGE x (sum of the widest live intermediates per token x tokens)
# + FORWARD_BASE_BYTES. Fitted on gpu-boots warm logs: 1.50 GiB at 8192 tokens (8, 16, 48, 128 seqs), 0.40 GiB at
# 2048 (8, 32, 64 seqs); the two points fix both constants. Uncertainty: the per-token sum is a formula of the
# shape, fitted on one model: 15 %.
FORWARD_FUDGE = 1.235
FORWARD_BASE_BYTES = 34 * MiB
ACTIVATION_UNCERTAINTY = 0.15

# Sampler warm-up (_dummy_sampler_run): fp32 logits, probs, sorted values and int64 indices per logit.
# gpu-boots b-s128: 0.59 GiB = 128 rows x 248,320 vocab x 19.9 B, no allocator slack over it.
SAMPLER_BYTES_PER_LOGIT = 20

# CUDA-graph estimate ("Estimated PIECEWISE|FULL CUDA graph memory: X MiB first-capture + (n-1) x Y MiB per-graph",
# all gpu-boots logs, 64 decoder layers): per-graph 12 MiB (PIECEWISE) and 4 MiB (FULL) whatever the size;
# PIECEWISE first capture 88 MiB at 96 tokens, 104 at 128 (124 once, b-s128) = 40 MiB + 8 KiB x layers x tokens.
# The estimate itself matched the printed "Estimated CUDA graph memory" within 20 MiB; per layer for other models is
# a guess: 25 %.
# Out of sample (the second batch of gpu-boots, fitted before it): 64 tokens printed 70 MiB first capture (the line
# gives 72), but 192 tokens (MTP) 114 MiB where the line gives 136; and with MTP's query length 2 the FULL per-graph
# cost was 8-10 MiB, not 4 (cause not found in the source; not modelled). The two nearly cancel: the MTP boots' total
# estimate 0.45-0.48 GiB against 0.46-0.53 printed, inside the 25 %.
PIECEWISE_GRAPH_BYTES_PER_LAYER = 12 * MiB // 64
FULL_GRAPH_BYTES_PER_LAYER = 4 * MiB // 64
FIRST_CAPTURE_BASE_BYTES = 40 * MiB
FIRST_CAPTURE_BYTES_PER_LAYER_TOKEN = 8 * 1024
CUDAGRAPH_UNCERTAINTY = 0.25

# The MTP drafter's boot, outside the budget (h100-as-rtx3090-awq-machete: the H100 held down to the 3090's 23.625 GiB
# CUDA total, vLLM 0.25; the same __init__ in the installed 0.32): Qwen3_5MTP.__init__ (models/qwen3_5_mtp.py) builds
# its own embed_tokens and, untied, lm_head (vocab x hidden in the model dtype: 2.37 GiB each for Qwen3.5-27B) beside
# the loaded target before the proposer shares the target's (spec_decode/llm_base_proposer.py: "Sharing target model
# embedding|lm_head weights") and frees its own. Five boots failed asking for one such 2.37 GiB tensor, whatever
# gpu_memory_utilization: three loading the lm_head (the process held 21.28 GiB at 4,096 batched tokens, 21.60 and 21.63
# at 16,384: peaks of 23.65-24.00), two compiling the drafter on its first boot (inductor's example input of that shape,
# one freed copy still cached: 21.26 + 2.37 = 23.63 at both 1,024 and 2,048 tokens). Beside the two copies the load
# holds the runner's per-token buffers (4,096 -> 16,384 tokens added 0.32 GiB: 3 model-dtype rows of hidden a token give
# 0.35), the compile a constant (fitted: 23.63 less weights, copies, context and non-torch).
DRAFTER_ROWS_PER_BATCHED_TOKEN = 3
DRAFTER_COMPILE_BYTES = 108 * MiB


# What the non-KV measurement of 0.27 and later charges that 0.25's does not (the allocator's cached segments that
# empty_cache() cannot release, counted by cudaMemGetInfo: VLLM-MEMORY-0.32.md), not sized by any boot of 0.32 kept
# here: a band of its own until boots of that version calibrate it, never a shift of the centre.
UNSIZED_MEM_GET_INFO_BYTES = 256 * MiB

# A version that is not modelled is predicted with the nearest modelled one, its band widened by this much: the
# largest change between two modelled versions' terms on the recorded boots is the non-KV measurement above.
UNMODELLED_VERSION_BYTES = 256 * MiB


# A configuration outside what a version's warm boots measured (more batched tokens than its widest profile run,
# more drafted tokens than it sized a KV cache with) takes this much more band per such term: its terms are
# extrapolated there, so it is booted to learn rather than refused on them.
OUTSIDE_MEASURED_BYTES = 256 * MiB


@dataclass(frozen=True)
class VersionTerms:
    """One modelled version's fitted constants, the boots they were fitted on and the range those boots span, and
    what its accounting adds that no boot of it has sized yet (an uncertainty, in bytes)."""

    fitted_on: str  # the dataset whose warm boots fix the constants; "" when none of this version is kept
    forward_fudge: float
    forward_base_bytes: int
    non_torch_bytes: int
    unsized_bytes: int
    batched_measured: tuple[int, int] = (0, 0)  # max_num_batched_tokens of its warm boots that sized a KV cache
    spec_measured: int = 0  # the most speculative tokens among them


VERSION_TERMS = {
    # VLLM-MEMORY-0.25.md; the constants above. Measured: tests/data/gpu-boots (2,048-16,384 batched tokens, MTP 1)
    # and the held-down H100's warm boots (h100-as-rtx3090-awq-marlin: 1,024-16,384 tokens, no MTP)
    "0.25.0": VersionTerms("tests/data/gpu-boots", FORWARD_FUDGE, FORWARD_BASE_BYTES, CUDA_NON_TORCH_BYTES, 0,
                           batched_measured=(1024, 16384), spec_measured=1),
    # VLLM-MEMORY-0.32.md: the same profile run, sampler and CUDA-graph estimate as 0.25; the non-KV memory read
    # from cudaMemGetInfo instead of torch's counters; no boot of it measured (the unsized band stands for all)
    "0.32.0": VersionTerms("", FORWARD_FUDGE, FORWARD_BASE_BYTES, CUDA_NON_TORCH_BYTES, UNSIZED_MEM_GET_INFO_BYTES),
}
assert tuple(VERSION_TERMS) == MODELLED_VERSIONS


def outside_measured(terms: VersionTerms, s: Settings) -> tuple[str, ...]:
    """What of this configuration lies outside the range the version's warm boots measured (none for a version
    without boots: its unsized band covers every term)."""
    if not terms.fitted_on:
        return ()
    low, high = terms.batched_measured
    out = []
    if not low <= s.batched <= high:
        out.append(f"max_num_batched_tokens {s.batched:,} (measured {low:,}-{high:,})")
    if s.num_spec > terms.spec_measured:
        out.append(f"{s.num_spec} speculative tokens (measured up to {terms.spec_measured})")
    return tuple(out)


def version_terms(version: ModelledVersion, s: Settings) -> tuple[VersionTerms, int, tuple[str, ...]]:
    """The modelled version's constants, the extra band it takes (its unsized part; UNMODELLED_VERSION_BYTES for a
    version that is not modelled; OUTSIDE_MEASURED_BYTES per term outside what it measured; in quadrature), and
    what lies outside what it measured."""
    terms = VERSION_TERMS[version.modelled]
    outside = outside_measured(terms, s)
    extra = math.hypot(terms.unsized_bytes, 0 if version.exact else UNMODELLED_VERSION_BYTES,
                       *(OUTSIDE_MEASURED_BYTES for _ in outside))
    return terms, int(extra), outside


@dataclass(frozen=True)
class CudaTerms:
    """The non-KV terms determine_available_memory subtracts, with their uncertainties."""

    activation_bytes: int
    cudagraph_bytes: int
    non_torch_bytes: int
    uncertainty_bytes: int  # of the three together (quadrature)
    profiling_blocks: int = 0  # KV blocks the CUDA-graph profiling allocates at boot (0: no graphs)
    drafter_bytes: int = 0  # MTP's drafter beyond the weights for a moment at boot (drafter_peak; 0: no MTP)
    outside_measured: tuple[str, ...] = ()  # what lies outside the range the version's boots measured (widened)


def _grid(top: int) -> list[int]:
    """_set_cudagraph_sizes' default grid: 1, 2, 4, then every 8 below 256, then every 16 up to top."""
    return [n for n in (1, 2, 4) if n <= top] + list(range(8, min(top + 1, 256), 8)) + list(range(256, top + 1, 16))


def capture_sizes(s: Settings, config: Mapping[str, object], vllm_version: str | None,
                  blackwell: bool = False) -> tuple[list[int], list[int]]:
    """(PIECEWISE sizes, FULL decode sizes) as vLLM picks them, per version (None: the newest):
    VllmConfig._set_cudagraph_sizes (0.25 config/vllm.py 1669, 0.27 1778, 0.32 2292): cap = max_cudagraph_capture_size
    or min(max_num_seqs x query length x 2, 512), then min(cap, max_num_batched_tokens); the grid up to the cap, plus
    max_num_batched_tokens when it is within the cap (all versions). 0.28 raises the default 512 to 1024 on
    data-centre Blackwell; 0.29 appends the decode sizes n x query length (n: the grid's request counts up to
    max_num_seqs, and max_num_seqs) with speculative decoding; 0.31 appends max_num_seqs without it (both only when
    the cap is the default). With a query length q > 1, CompilationConfig.adjust_cudagraph_sizes_for_spec_decode
    (0.25 config/compilation.py 1469, 0.32 1530) rounds every size up to a multiple of q within the cap. FULL decode
    graphs: the sizes in [q, max_num_seqs x q] (0.25 v1/cudagraph_dispatcher.py initialize_cudagraph_keys 205-222).
    0.32's default Model Runner V2 rounds only its uniform-decode descriptors (v1/worker/gpu/cudagraph_utils.py
    _init_candidates 251-): the PIECEWISE sizes stay the grid's."""
    query = 1 + s.num_spec

    def newer(v: tuple[int, int]) -> bool:
        return vllm_version is None or major_minor(vllm_version) >= v

    asked = config.get("max_cudagraph_capture_size")
    default_max = 1024 if blackwell and newer((0, 28)) else 512
    cap = int(str(asked)) if asked is not None else min(s.seqs * query * 2, default_max)
    decode: list[int] = []
    if asked is None and query > 1 and newer((0, 29)):
        reqs = min(s.seqs, default_max)
        decode = [n * query for n in {*_grid(reqs), reqs} if n * query <= cap]
    elif asked is None and query == 1 and newer((0, 31)) and s.seqs <= cap:
        decode = [s.seqs]
    top = min(cap, s.batched)
    explicit = config.get("cudagraph_capture_sizes")
    if isinstance(explicit, (list, tuple)):
        sizes = sorted({int(x) for x in explicit if int(x) <= s.batched})
    else:
        sizes = _grid(top) + ([s.batched] if s.batched <= top else []) + [n for n in decode if n <= s.batched]
        sizes = sorted(set(sizes))
    if query > 1 and not s.eager and sizes:
        top = max(sizes) if isinstance(explicit, (list, tuple)) else top
        rounded = sorted({-(-n // query) * query for n in sizes if -(-n // query) * query <= top})
        if newer((0, 32)):  # Model Runner V2: only the uniform-decode (FULL) graphs are rounded (VLLM-MEMORY-0.32.md)
            return sizes, [n for n in rounded if query <= n <= s.seqs * query]
        sizes = rounded or ([query] if query <= top else sizes)
    return sizes, [n for n in sizes if query <= n <= s.seqs * query]


def profiling_blocks(s: Settings, piecewise: list[int], vllm_version: str | None) -> int:
    """The minimal KV cache's blocks (_init_minimal_kv_cache_for_profiling): max_cudagraph_capture_size (the largest
    capture size) in 0.25, min(max_num_seqs, it) from 0.26; at least 1. 0 without graphs."""
    if not piecewise:
        return 0
    top = max(piecewise)
    return max(min(s.seqs, top) if profiling_kv_per_sequence(vllm_version) else top, 1)


def cudagraph_estimate(layers: int, piecewise: list[int], full: list[int]) -> int:
    """profile_cudagraph_memory's total: the largest first capture + (n - 1) per-graph costs of each mode."""
    if not piecewise:
        return 0
    first = FIRST_CAPTURE_BASE_BYTES + FIRST_CAPTURE_BYTES_PER_LAYER_TOKEN * layers * max(piecewise)
    rest = ((len(piecewise) - 1) * PIECEWISE_GRAPH_BYTES_PER_LAYER * layers
            + max(len(full) - 1, 0) * FULL_GRAPH_BYTES_PER_LAYER * layers)
    return int(first + rest)


def forward_bytes_per_token(shape: ModelShape) -> int:
    """The widest live intermediates of one token's forward pass (MLP, attention or GDN) plus the residual
    stream: what the profile run's _dummy_run holds per token at its peak, before allocator slack."""
    b, h = DTYPE_BYTES.get(shape.dtype, 2), shape.hidden_size
    kd = shape.linear_num_key_heads * shape.linear_key_head_dim
    vd = shape.linear_num_value_heads * shape.linear_value_head_dim
    gdn = (2 * (2 * kd + vd) * b + vd * (2 * b + shape.linear_key_head_dim * 4 / 64)) if shape.is_hybrid else 0
    dense = shape.intermediate_size if shape.num_dense_mlp_layers else 0
    moe = (shape.moe_intermediate_size * max(shape.num_experts_per_tok, 1) + shape.shared_expert_intermediate_size
           if shape.num_moe_layers else 0)
    attn = (shape.num_attention_heads * shape.head_dim * 3 + 2 * shape.num_kv_heads * shape.head_dim) * b
    return int(4 * h * b + max(3 * max(dense, moe) * b, attn, gdn))


def forward_peak(shape: ModelShape, s: Settings) -> int:
    """The forward part of the profile run over max_num_batched_tokens (and the vision encoder's, if profiled)."""
    b, h = DTYPE_BYTES.get(shape.dtype, 2), shape.hidden_size
    forward = s.batched * forward_bytes_per_token(shape)
    if s.vision:  # the encoder profile: max_num_batched_tokens of image tokens, merge^2 patches each
        patches = s.batched * shape.vision_merge ** 2
        forward = max(forward + s.batched * h * b,
                      patches * (6 * shape.vision_hidden_size + 2 * shape.vision_intermediate_size) * b)
    return forward


def sampler_peak(shape: ModelShape, s: Settings) -> int:
    return min(s.seqs, s.batched) * shape.vocab_size * SAMPLER_BYTES_PER_LOGIT


def drafter_peak(shape: ModelShape, s: Settings) -> int:
    """What an MTP boot holds for a moment beyond the weights, context and non-torch memory (0 without MTP): the
    drafter's own embedding and lm_head before they are shared, with the runner's buffers as it loads, or with the
    compile's extra as it compiles (not with --enforce-eager)."""
    if not (s.mtp and shape.num_mtp_layers):
        return 0
    b = DTYPE_BYTES.get(shape.dtype, 2)
    copies = (1 if shape.tied_embeddings else 2) * shape.vocab_size * shape.hidden_size * b
    load = copies + DRAFTER_ROWS_PER_BATCHED_TOKEN * shape.hidden_size * b * s.batched
    return max(load, 0 if s.eager else copies + DRAFTER_COMPILE_BYTES)


def cuda_terms(shape: ModelShape, s: Settings, config: Mapping[str, object], vllm_version: str | None,
               blackwell: bool = False) -> CudaTerms:
    """A warm boot's (compile cache hit) non-KV terms on a CUDA card, with the constants of the modelled version
    nearest to vllm_version (None: the newest) and the version rules of vllm_version itself."""
    fitted, extra, outside = version_terms(modelled_version(vllm_version), s)
    activation = max(int(fitted.forward_fudge * forward_peak(shape, s) + fitted.forward_base_bytes),
                     sampler_peak(shape, s))
    graphs = blocks = 0
    if not s.eager:
        piecewise, full = capture_sizes(s, config, vllm_version, blackwell)
        graphs = cudagraph_estimate(shape.num_layers, piecewise, full)
        blocks = profiling_blocks(s, piecewise, vllm_version)
    spread = math.hypot(ACTIVATION_UNCERTAINTY * activation, CUDAGRAPH_UNCERTAINTY * graphs,
                        NON_TORCH_UNCERTAINTY_BYTES, extra)
    return CudaTerms(activation, graphs, fitted.non_torch_bytes, int(spread), blocks, drafter_peak(shape, s), outside)
