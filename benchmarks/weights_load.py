"""What the weights' fitted "extra bytes a group" are: vLLM's load replayed through PyTorch's caching allocator.

The estimator charges a 4-bit group beside its packed weights the kernel's scale and zero point plus an extra
fitted per kernel (fit/estimate.py: Marlin 1.94 bytes, Machete 2.4). No tensor holds that extra. This replays
vLLM 0.25.0's load_model for the Qwen3.5-27B checkpoints, allocation by allocation, through a model of the
allocator (benchmarks/cuda_allocator.py) and prints its figure beside every "Model loading took X GiB" the kept
server logs printed and beside the estimator's:

    python -m benchmarks.weights_load

Read in vLLM 0.25.0 (the device's):
  - created: embed_tokens, then per layer its projections, fused as vLLM loads them (qwen3_next.py 259-307,
    qwen_gdn_linear_attn.py 466-545), lm_head last; AWQ's qweight, qzeros, scales (auto_awq.py create_weights
    476-515), GPTQ's qweight, g_idx, qzeros, scales (auto_gptq.py create_weights 390-440); the rotary cache with the
    first attention layer, computed in float32 and cast (rotary_embedding/base.py 58-63, 94-103; mrope.py 238 gives
    M-RoPE 4 x max_position_embeddings positions: 128 MiB here);
  - converted: AWQ to the standard layout first (auto_awq.py _convert_awq_to_standard_format 93-168: int32
    temporaries of every weight), then Marlin (kernels/linear/mixed_precision/marlin.py 87-240: zero points
    repacked, weights repacked, scales permuted; GPTQ's g_idx and qzeros replaced by empty tensors) or Machete
    (machete.py 69-131: weights prepacked through a transposed copy; AWQ's zero points unpacked into a 16-bit
    -scale x zero; GPTQ's left in place);
  - MTP's layer is the drafter's model, created and converted after the target's.
Found by reading the source; not yet checked on a card.
"""

from __future__ import annotations

import ast
import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from autotune.engine.logs import parse_boot_info
from autotune.fit.estimate import estimate
from autotune.fit.hardware import PROFILES
from autotune.fit.model_shape import DTYPE_BYTES, ModelShape, WeightModule
from autotune.fit.quantization import Quantization
from autotune.units import GiB
from benchmarks.catalogue import read_log
from benchmarks.cuda_allocator import Block, CachingAllocator
from benchmarks.estimator_accuracy import ARGS

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "autotune" / "engine" / "known_models"
LOGS = [ROOT / "benchmarks" / "data", ROOT / "tests" / "data" / "gpu-boots"]
# vLLM loads these checkpoint matrices of one layer as one tensor (its models' packed_modules_mapping)
FUSED_INTO = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
              "up_proj": "gate_up_proj", "in_proj_qkv": "in_proj_qkvz", "in_proj_z": "in_proj_qkvz",
              "in_proj_b": "in_proj_ba", "in_proj_a": "in_proj_ba"}


@dataclass
class Loaded:
    """One tensor vLLM makes: `plain` bytes, or a 4-bit grouped matrix (k inputs, n outputs, `groups` scale rows)."""

    plain: int = 0
    k: int = 0
    n: int = 0
    groups: int = 0
    rope_after: bool = False  # the rotary cache is made right after it
    blocks: dict[str, Block | None] = field(default_factory=dict)


def plain_bytes(m: WeightModule, quant: Quantization, dtype_b: int) -> int:
    """A module no 4-bit kernel converts, as its checkpoint stores it."""
    scheme = quant.scheme(m.name, m.kind)
    return m.params * dtype_b if scheme is None else int(m.params * scheme.bytes_per_param(m.in_features))


def load_sequence(shape: ModelShape, mtp: bool) -> list[list[Loaded]]:
    """The tensors vLLM makes, in order: the target model (lm_head last), then MTP's drafter."""
    quant, dtype_b = shape.quantization, DTYPE_BYTES.get(shape.dtype, 2)
    parts = ("text", "mtp") if mtp else ("text",)
    fused: dict[tuple[str, str], Loaded] = {}
    for m in sorted((m for m in shape.modules if m.part in parts), key=lambda m: (m.part, m.kind == "lm_head")):
        prefix, _, leaf = m.name.rpartition(".")
        scheme = quant.scheme(m.name, m.kind)
        t = fused.setdefault((m.part, f"{prefix}.{FUSED_INTO.get(leaf, leaf)}"), Loaded(k=m.in_features))
        if scheme is not None and scheme.bits == 4 and scheme.group_size > 0:
            t.n += m.params // m.in_features
            t.groups = m.in_features // scheme.group_size
        else:
            t.plain += plain_bytes(m, quant, dtype_b)
    first_attention = next(key for key in fused if key[0] == "text" and key[1].endswith("self_attn.o_proj"))
    fused[first_attention].rope_after = True
    return [[t for (part, _), t in fused.items() if part == p] for p in parts]


def replayed_bytes(config: dict, kernel: str, mtp: bool) -> tuple[int, int]:
    """(what torch counts as allocated, what the device holds: CachingAllocator.held) after the load, with the
    small tensors no module lists."""
    shape = ModelShape.from_config(config)
    alloc, method = CachingAllocator(), shape.quantization.method
    for model in load_sequence(shape, mtp):
        for t in model:
            if t.plain:
                alloc.malloc(t.plain)
            if t.groups:
                t.blocks = {"qweight": alloc.malloc(t.k * t.n // 2)}
                if method == "gptq":
                    t.blocks["g_idx"] = alloc.malloc(t.k * 4)
                t.blocks["qzeros"] = alloc.malloc(t.groups * t.n // 2)
                t.blocks["scales"] = alloc.malloc(t.groups * t.n * 2)
            if t.rope_after:
                _rope_cache(alloc, shape, config)
        for t in model:
            if t.groups:
                _convert(alloc, t, method, kernel)
    dtype_b = DTYPE_BYTES.get(shape.dtype, 2)
    listed = sum(m.params for m in shape.modules if m.part == "text" or (mtp and m.part == "mtp"))
    rest = (shape.total_params - shape.vision_params + (shape.mtp_params + shape.mtp_small_params if mtp else 0)
            - listed) * dtype_b
    return alloc.allocated + rest, alloc.held + rest


def _rope_cache(alloc: CachingAllocator, shape: ModelShape, config: dict) -> None:
    rope = (config.get("text_config") or config).get("rope_parameters") or {}
    positions = shape.max_position_embeddings * (4 if rope.get("mrope_section") else 1)
    dim = int(shape.head_dim * float(rope.get("partial_rotary_factor") or 1))
    position = alloc.malloc(positions * 4)
    freqs, cos, sin = (alloc.malloc(positions * dim // 2 * 4) for _ in range(3))
    cat = alloc.malloc(positions * dim * 4)
    for b in (position, freqs, cos, sin):
        alloc.free(b)
    alloc.malloc(positions * dim * DTYPE_BYTES.get(shape.dtype, 2))  # the cache, kept
    alloc.free(cat)


def _replace(alloc: CachingAllocator, t: Loaded, name: str, new: Block | None) -> None:
    old, t.blocks[name] = t.blocks.get(name), new
    if old is not None:
        alloc.free(old)


def _convert(alloc: CachingAllocator, t: Loaded, method: str, kernel: str) -> None:
    k, n, g = t.k, t.n, t.groups
    if method == "awq":  # shift, reorder and pack back; the old tensors are held till the function returns
        old: list[Block | None] = []
        for name, rows in (("qweight", k), ("qzeros", g)):
            shifted, unpacked = alloc.malloc(rows * n * 4), alloc.malloc(rows * n * 4)
            alloc.free(shifted)
            reordered = alloc.malloc(rows * n * 4)
            alloc.free(unpacked)
            summed = alloc.malloc(rows * n * 4)
            packed = alloc.malloc(rows * n // 2)
            alloc.free(summed)
            old += [t.blocks[name], reordered]
            t.blocks[name] = packed
        for b in old:
            if b is not None:
                alloc.free(b)
    if kernel == "machete":
        transposed = alloc.malloc(k * n // 2)
        prepacked = alloc.malloc(k * n // 2)
        alloc.free(transposed)
        _replace(alloc, t, "qweight", prepacked)
        if method == "awq":
            unpacked = alloc.malloc(g * n * 4)
            for _ in range(8):
                for b in [alloc.malloc(g * n // 2), alloc.malloc(g * n // 2)]:
                    alloc.free(b)
            scaled, as_bf16, zeros = (alloc.malloc(g * n * 2) for _ in range(3))
            alloc.free(scaled)
            alloc.free(as_bf16)
            _replace(alloc, t, "qzeros", zeros)
            alloc.free(unpacked)
        return
    t.blocks["workspace"] = alloc.malloc(132 * 4)
    if method == "gptq":
        _replace(alloc, t, "g_idx", None)
        _replace(alloc, t, "qzeros", None)
    else:
        unpacked, permuted, interleaved = (alloc.malloc(g * n * 4) for _ in range(3))
        alloc.free(permuted)
        packed = alloc.malloc(g * n // 2)
        alloc.free(interleaved)
        alloc.free(unpacked)
        _replace(alloc, t, "qzeros", packed)
    _replace(alloc, t, "qweight", alloc.malloc(k * n // 2))
    _replace(alloc, t, "scales", alloc.malloc(g * n * 2))


@dataclass(frozen=True)
class PrintedLoad:
    log: str
    method: str  # awq | gptq
    kernel: str  # marlin | machete
    mtp: bool
    fp8_kv: bool
    printed_gib: float


def printed_loads() -> list[PrintedLoad]:
    """Every kept vLLM 0.25 server log that printed its weights, with what decides them."""
    out = []
    for log in sorted(p for root in LOGS for p in root.rglob("*.log*")):
        text = read_log(log)
        took = parse_boot_info(text.splitlines(), 0.0).weights_gib
        kernel = re.search(r"Using (Marlin|Machete)LinearKernel", text)
        args = ARGS.search(text)
        if not (took and kernel and args):
            continue
        flags = ast.literal_eval(args.group(1))
        spec = flags.get("speculative_config") or {}
        out.append(PrintedLoad(str(log.relative_to(ROOT)), "gptq" if "gptq" in str(flags.get("model")) else "awq",
                               kernel.group(1).lower(), (spec.get("method") if isinstance(spec, dict) else None)
                               == "mtp", str(flags.get("kv_cache_dtype", "auto")).startswith("fp8"), took))
    return out


def config_of(method: str) -> dict:
    name = "qwen3.5-27b-gptq-int4.json" if method == "gptq" else "qwen3.5-27b-awq.json"
    return json.loads((MODELS / name).read_text())


def estimator_gib(method: str, kernel: str, mtp: bool) -> float:
    flags: dict[str, object] = {"language_model_only": True}
    if mtp:
        flags["speculative_config"] = {"method": "mtp", "num_speculative_tokens": 1}
    disabled = ("MacheteLinearKernel",) if kernel == "marlin" else ()
    shape = ModelShape.from_config(config_of(method))
    return estimate(shape, PROFILES["h100-80gb"], flags, disabled_kernels=disabled).weights_bytes / GiB


def main() -> None:
    loads = printed_loads()
    groups: dict[tuple[str, str, bool, bool], list[float]] = {}
    for p in loads:
        groups.setdefault((p.method, p.kernel, p.mtp, p.fp8_kv), []).append(p.printed_gib)
    print(f"{len(loads)} server logs printed their weights (vLLM 0.25.0, Qwen3.5-27B, language model only)")
    head = (f"{'checkpoint':<10} {'kernel':<8} {'MTP':<4} {'KV':<5} {'logs':>4} {'printed GiB':>12} {'replayed':>9} "
            f"{'held':>6} {'estimator':>10}")
    print(head + "\n" + "-" * len(head))
    errors: dict[bool, list[float]] = {False: [], True: []}
    fitted: list[float] = []
    for (method, kernel, mtp, fp8), seen in sorted(groups.items()):
        allocated, held = replayed_bytes(config_of(method), kernel, mtp)
        est = estimator_gib(method, kernel, mtp)
        printed = f"{min(seen):.2f}" + (f"-{max(seen):.2f}" if max(seen) > min(seen) else "")
        print(f"{method:<10} {kernel:<8} {'yes' if mtp else 'no':<4} {'fp8' if fp8 else 'auto':<5} {len(seen):>4} "
              f"{printed:>12} {allocated / GiB:>9.3f} {held / GiB:>6.2f} {est:>10.3f}")
        errors[fp8] += [allocated / GiB - s for s in seen]
        fitted += [est - s for s in seen]
    for fp8, errs in errors.items():
        print(f"replayed minus printed, {len(errs)} logs {'with' if fp8 else 'without'} an fp8 KV cache: median "
              f"{statistics.median(errs):+.3f} GiB, range {min(errs):+.3f} to {max(errs):+.3f}")
    print(f"the estimator's fitted extras minus printed, all {len(fitted)}: median {statistics.median(fitted):+.3f} "
          f"GiB, range {min(fitted):+.3f} to {max(fitted):+.3f}")
    print("'held': what the device holds once wholly free segments are released (the allocated blocks and the free "
          "blocks sharing a segment with one)")


if __name__ == "__main__":
    main()
