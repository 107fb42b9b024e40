"""How a checkpoint's quantization_config stores each module, as vLLM 0.32 resolves it per layer: which modules
are quantized, at what width, and the scale / zero-point bytes vLLM's layers keep beside the packed weights.

Module names are the checkpoint's (model.language_model.layers.3.self_attn.q_proj, lm_head, model.visual...,
mtp...): the configs are written against them, and vLLM maps both the names and the config to its own
(apply_vllm_mapper), so matching the checkpoint names gives vLLM's verdicts.

Bytes per module (vllm/model_executor/layers/quantization/...):
  gptq / gptq_marlin (gptq_marlin.py create_weights), auto-round "auto_round:auto_gptq" (inc/ -> the same
    Marlin layer): qweight bits/8 per weight, scales fp16 per group and output, qzeros bits/8 per group and
    output (allocated also for symmetric checkpoints); desc_act adds g_idx int32 per input row (< 0.01%, ignored).
  awq / awq_marlin (awq_marlin.py create_weights): the same three tensors.
  compressed-tensors W4A16/W8A16 (compressed_tensors/schemes/compressed_tensors_wNa16.py): weight_packed bits/8,
    weight_scale in the model dtype per group (channel strategy: per output row), weight_zero_point bits/8 per
    group only when not symmetric; W8A8 int8 (compressed_tensors_w8a8_int8.py) and FP8 (compressed_tensors_w8a8_fp8.py):
    1 byte per weight and an fp32 scale per channel / block / tensor; NVFP4 (compressed_tensors_w4a4_nvfp4.py):
    4 bits and an fp8 scale per 16 weights.
  fp8 (fp8.py): 1 byte per weight, fp32 scale per weight_block_size block (or per tensor).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

QuantMethod = Literal["none", "gptq", "awq", "fp8", "int8", "int4", "auto-round", "compressed-tensors", "unknown"]
ModuleKind = Literal["linear", "embedding", "lm_head"]


@dataclass(frozen=True)
class Scheme:
    """How one quantized module is stored."""

    bits: int
    group_size: int = 0  # weights per scale along the input; -1: one per output channel; 0: one per tensor
    zero_point: bool = False  # a packed zero point per group beside the scale
    scale_bytes: int = 2

    def bytes_per_param(self, in_features: int) -> float:
        group = in_features if self.group_size < 0 else self.group_size
        per_group = self.scale_bytes + (self.bits / 8 if self.zero_point else 0)
        return self.bits / 8 + (per_group / group if group > 0 else 0)


# A rule: (how it matches, the pattern, the scheme it gives: None = not quantized, "skip" semantics).
#   "re_match": re.match (GPTQ dynamic, compressed-tensors "re:" entries)
#   "re_search": re.search (auto-round extra_config keys with regex characters)
#   "substr": pattern in name (AWQ/fp8 modules_to_not_convert, GPTQ modules_in_block_to_quantize)
#   "exact": name == pattern or name ends with "." + pattern (compressed-tensors and auto-round names)
#   "class": the module's vLLM class contains the pattern, case-insensitive (compressed-tensors "Linear")
#   "prefix": name starts with the pattern (auto-round block_name_to_quantize)
Rule = tuple[str, str, Scheme | None]
_CLASS_OF = {"linear": "columnparallellinear rowparallellinear qkvparallellinear mergedcolumnparallellinear",
             "embedding": "vocabparallelembedding", "lm_head": "parallellmhead"}


def _matches(how: str, pattern: str, name: str, kind: ModuleKind) -> bool:
    if how == "re_match":
        return re.match(pattern, name) is not None
    if how == "re_search":
        return re.search(pattern, name) is not None
    if how == "substr":
        return pattern in name
    if how == "exact":
        return name == pattern or name.endswith("." + pattern)
    if how == "prefix":
        return name.startswith(pattern)
    return pattern.lower() in _CLASS_OF[kind]  # "class"


@dataclass(frozen=True)
class Quantization:
    """A checkpoint's quantization: a default scheme and the rules that change it per module. bits/group_size
    are the default's (what most of the weights use), for the kernel choices estimate.py makes."""

    method: QuantMethod = "none"
    bits: int = 16
    group_size: int = 0  # -1: per channel; 0: not grouped
    default: Scheme | None = None  # the scheme of a linear layer no rule names
    skip: tuple[Rule, ...] = ()  # first match: the module stays in the model dtype
    overrides: tuple[Rule, ...] = ()  # first match: this scheme (None: not quantized)
    scope: tuple[Rule, ...] = ()  # when set, a linear layer is quantized only if one matches
    lm_head: Scheme | None = None  # the output layer's scheme when the config quantizes it
    embedding: Scheme | None = None
    name: str = ""  # the quant_method as the config spells it (for what is not modelled)

    def scheme(self, module: str, kind: ModuleKind = "linear") -> Scheme | None:
        """How vLLM stores `module` (a checkpoint name): None when it is left in the model dtype."""
        if self.method == "none":
            return None
        if any(_matches(how, p, module, kind) for how, p, _ in self.skip):
            return None
        for how, pattern, scheme in self.overrides:
            if _matches(how, pattern, module, kind):
                return scheme
        if kind == "lm_head":
            return self.lm_head
        if kind == "embedding":
            return self.embedding
        if self.scope and not any(_matches(how, p, module, kind) for how, p, _ in self.scope):
            return None
        return self.default

    def excludes(self, module: str) -> bool:
        return self.scheme(module) is None

    @property
    def bytes_per_param(self) -> float:
        """The default scheme's bytes per weight (a 5120-wide input for per-channel scales)."""
        return self.default.bytes_per_param(5120) if self.default else self.bits / 8


def _bits(value: object, default: int) -> int:
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return default


def _gptq(q: Mapping) -> Quantization:
    """vllm/model_executor/layers/quantization/utils/gptq_utils.py: dynamic patterns (re.match, in order; "-:"
    leaves the module unquantized, others override bits/group_size), modules_in_block_to_quantize (substrings),
    lm_head quantized only with "lm_head": true."""
    bits, group = _bits(q.get("bits"), 4), _bits(q.get("group_size"), 128)
    base = Scheme(bits, group, zero_point=True)
    skip: list[Rule] = []
    overrides: list[Rule] = []
    for pattern, over in (q.get("dynamic") or {}).items():
        pattern = str(pattern)
        if pattern.startswith("-:"):
            skip.append(("re_match", pattern[2:], None))
        else:
            over = over or {}
            overrides.append(("re_match", pattern.removeprefix("+:"),
                              Scheme(_bits(over.get("bits"), bits), _bits(over.get("group_size"), group), True)))
    inner = q.get("modules_in_block_to_quantize") or []
    flat = [str(m) for group_ in inner for m in (group_ if isinstance(group_, list) else [group_])]
    scope = tuple(("substr", m, base) for m in flat)
    return Quantization("gptq", bits, group, base, tuple(skip), tuple(overrides), scope,
                        lm_head=base if q.get("lm_head") else None, name="gptq")


def _awq(q: Mapping) -> Quantization:
    """awq_marlin.py: is_layer_skipped_awq (a substring of modules_to_not_convert); lm_head never quantized."""
    bits = _bits(q.get("bits", q.get("w_bit")), 4)
    group = _bits(q.get("group_size", q.get("q_group_size")), 128)
    skip = tuple(("substr", str(m), None) for m in q.get("modules_to_not_convert") or [])
    return Quantization("awq", bits, group, Scheme(bits, group, zero_point=True), skip, name="awq")


def _auto_round(q: Mapping) -> Quantization:
    """inc/config_parser.py INCConfigParser._resolve_raw: an extra_config entry for the module (exact, a suffix, or
    a regex key) decides (bits >= 16: unquantized); otherwise the module is quantized at the default when it lies
    under block_name_to_quantize (lm_head only through extra_config). Packing "auto_round:auto_gptq" /
    "auto_round:auto_awq" load through the GPTQ / AWQ Marlin layers (scales + packed zeros per group); fp8 and
    mx_fp data types keep a 1-byte weight and one scale per group."""
    bits, group = _bits(q.get("bits"), 4), _bits(q.get("group_size"), 128)
    data_type = str(q.get("data_type") or "int").lower()
    zero = data_type.startswith("int")
    scale = 1 if "mx_fp" in data_type else (4 if data_type.startswith("fp") else 2)

    def scheme(b: int, g: int) -> Scheme | None:
        return None if b >= 16 else Scheme(b, g, zero_point=zero, scale_bytes=scale)

    regex = set(r"*+?^$()[]{}|\\")
    exact: list[Rule] = []
    patterns: list[Rule] = []
    for key, cfg in (q.get("extra_config") or {}).items():
        cfg = cfg or {}
        rule = scheme(_bits(cfg.get("bits"), bits), _bits(cfg.get("group_size"), group))
        if any(c in regex for c in str(key)):
            patterns.append(("re_search", str(key), rule))
        else:
            exact.append(("exact", str(key), rule))
    blocks = q.get("block_name_to_quantize") or q.get("to_quant_block_names")
    if isinstance(blocks, str):
        blocks = blocks.split(",")
    base = scheme(bits, group)
    scope = tuple(("prefix", str(b), base) for b in blocks or [])
    return Quantization("auto-round", bits, group, base, (), tuple(exact + patterns), scope, name="auto-round")


def _ct_scheme(weights: Mapping, activations: Mapping | None) -> Scheme | None:
    bits, kind = _bits(weights.get("num_bits"), 8), str(weights.get("type") or "int")
    strategy = str(weights.get("strategy") or "tensor")
    group = {"group": _bits(weights.get("group_size"), 128), "tensor_group": _bits(weights.get("group_size"), 16),
             "channel": -1}.get(strategy, 0)
    if strategy == "block":
        block = weights.get("block_structure") or [128, 128]
        group = _bits(block[0], 128) * _bits(block[-1], 128)
    if bits >= 16:
        return None
    if kind == "float":  # FP8 (fp32 scales) or NVFP4 (fp8 scale per 16)
        return Scheme(bits, group, scale_bytes=1 if bits == 4 else 4)
    if activations:  # W8A8 int8: fp32 scale per channel
        return Scheme(bits, group, scale_bytes=4)
    return Scheme(bits, group, zero_point=not weights.get("symmetric", True))  # WNA16: scale in the model dtype


def _compressed_tensors(q: Mapping) -> Quantization:
    """compressed_tensors.py get_scheme / utils.py find_matched_target: the ignore list first (exact names or
    "re:" + re.match), then every group's targets in order: a layer name or "re:" pattern, then a module class
    contained in vLLM's class name ("Linear" takes every linear layer but not lm_head; "Embedding" the
    embedding)."""
    skip = tuple(_ct_rule(str(e), None) for e in q.get("ignore") or [])
    overrides: list[Rule] = []
    classes: list[Rule] = []
    for group in (q.get("config_groups") or {}).values():
        scheme = _ct_scheme(group.get("weights") or {}, group.get("input_activations"))
        for target in group.get("targets") or []:
            rule = _ct_rule(str(target), scheme)
            (classes if rule[0] == "class" else overrides).append(rule)
    first = next((r[2] for r in classes + overrides if r[2] is not None), None)
    bits, group_size = (first.bits, first.group_size) if first else (16, 0)
    method: QuantMethod = "compressed-tensors"
    return Quantization(method, bits, group_size, None, skip, tuple(overrides + classes), name="compressed-tensors")


def _ct_rule(entry: str, scheme: Scheme | None) -> Rule:
    if entry.startswith("re:"):
        return ("re_match", entry[3:], scheme)
    if "." in entry or entry == "lm_head" or entry.islower():
        return ("exact", entry, scheme)
    return ("class", entry, scheme)


def _fp8(q: Mapping) -> Quantization:
    """fp8.py: 1-byte weights, an fp32 scale per weight_block_size block (per tensor without blocks); modules named
    in modules_to_not_convert / ignored_layers stay in the model dtype."""
    block = q.get("weight_block_size") or []
    group = _bits(block[0], 128) * _bits(block[-1], 128) if block else 0
    skip = tuple(("substr", str(m), None)
                 for m in (q.get("modules_to_not_convert") or []) + (q.get("ignored_layers") or []))
    return Quantization("fp8", 8, group, Scheme(8, group, scale_bytes=4), skip, name="fp8")


def parse_quantization(q: Mapping | None) -> Quantization:
    """config.json's quantization_config as vLLM reads it. A method not modelled keeps its bits (the model dtype
    when it names none) and its name, so the estimate says so instead of refusing."""
    if not q:
        return Quantization()
    method = str(q.get("quant_method", "")).lower()
    if method in ("gptq", "gptq_marlin"):
        return _gptq(q)
    if method in ("awq", "awq_marlin"):
        return _awq(q)
    if method in ("auto-round", "auto_round", "autoround", "intel/auto-round", "inc"):
        return _auto_round(q)
    if method in ("compressed-tensors", "compressed_tensors"):
        return _compressed_tensors(q)
    if method == "fp8":
        return _fp8(q)
    bits, group = _bits(q.get("bits"), 16), _bits(q.get("group_size"), 0)
    return Quantization("unknown", bits, group, Scheme(bits, group) if bits < 16 else None, name=method or "?")


def online_fp8() -> Quantization:
    """--quantization fp8 of an unquantized checkpoint (fp8.py Fp8OnlineLinearMethod): every linear layer of the
    language model to 1-byte weights with one fp32 scale per tensor; vision tower and embedding stay."""
    return Quantization("fp8", 8, 0, Scheme(8, 0, scale_bytes=4), (("substr", "visual", None),), name="fp8")
