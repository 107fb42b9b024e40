"""A model's shape and quantization, read from its Hugging Face config.json: what the memory estimate needs."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from autotune.errors import SpecError
from autotune.fit.quantization import ModuleKind, Quantization, parse_quantization

DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1,
               "fp8_e5m2": 1, "fp8_ds_mla": 1, "int8": 1}
# vLLM's --dtype choices (config/model.py _STR_DTYPE_TO_TORCH_DTYPE) by the dtype each names; "auto" keeps the config's.
SERVE_DTYPES = {"half": "float16", "float16": "float16", "bfloat16": "bfloat16", "float": "float32",
                "float32": "float32"}


@dataclass(frozen=True)
class WeightModule:
    """One weight matrix (or one stack of like matrices) as the checkpoint names it: what a quantization_config
    rule is matched against. part: "text", "mtp" or "vision", which decide whether vLLM loads it."""

    name: str
    params: int
    in_features: int
    part: str = "text"
    kind: ModuleKind = "linear"


@dataclass(frozen=True)
class ModelShape:
    """What memory depends on, read from a Hugging Face config.json. Parameter counts are per layer where
    they differ between layer kinds; the GDN (linear attention) state bytes use the checkpoint's dtypes."""

    architecture: str
    model_type: str
    dtype: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    max_position_embeddings: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    num_full_attention_layers: int
    num_linear_attention_layers: int
    embedding_params: int
    lm_head_params: int  # 0 when tied to the embedding
    tied_embeddings: bool
    attention_params_per_layer: int  # full attention projections (quantizable)
    linear_attention_params_per_layer: int  # GDN projections (quantizable)
    linear_attention_small_params_per_layer: int  # conv1d, A_log, dt_bias, gated norm (never quantized)
    mlp_params_per_layer: int  # dense MLP
    num_dense_mlp_layers: int
    moe_params_per_layer: int  # experts + shared expert (quantizable)
    moe_router_params_per_layer: int
    num_moe_layers: int
    norm_params: int
    vision_params: int
    num_mtp_layers: int
    mtp_params: int  # attention + MLP of the MTP stack (quantizable unless excluded)
    mtp_small_params: int  # fc (2h -> h) and norms
    intermediate_size: int = 0
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    mamba_ssm_dtype: str | None = None  # the recurrent-state dtype the checkpoint asks for (Qwen3.5: float32)
    conv_state_bytes_per_seq: int = 0  # over all GDN layers, model dtype
    recurrent_state_bytes_per_seq: int = 0  # over all GDN layers, mamba_ssm_dtype (else model dtype)
    quantization: Quantization = Quantization()
    vision_hidden_size: int = 0
    vision_intermediate_size: int = 0
    vision_merge: int = 1
    modules: tuple[WeightModule, ...] = ()  # every quantizable matrix by its checkpoint name (embedding, lm_head too)

    @property
    def is_hybrid(self) -> bool:
        return self.num_linear_attention_layers > 0

    @property
    def total_params(self) -> int:
        return (self.embedding_params + self.lm_head_params + self.norm_params + self.vision_params
                + self.num_full_attention_layers * self.attention_params_per_layer
                + self.num_linear_attention_layers
                * (self.linear_attention_params_per_layer + self.linear_attention_small_params_per_layer)
                + self.num_dense_mlp_layers * self.mlp_params_per_layer
                + self.num_moe_layers * (self.moe_params_per_layer + self.moe_router_params_per_layer))

    def gdn_state_elems(self, num_spec: int = 0) -> tuple[int, int]:
        """(conv, recurrent) state elements of one GDN layer for one sequence, as
        MambaStateShapeCalculator.gated_delta_net_state_shape gives them (TP 1)."""
        kd = self.linear_num_key_heads * self.linear_key_head_dim
        vd = self.linear_num_value_heads * self.linear_value_head_dim
        conv = (2 * kd + vd) * (self.linear_conv_kernel_dim - 1 + num_spec)
        return conv, self.linear_num_value_heads * self.linear_value_head_dim * self.linear_key_head_dim

    def served_as(self, dtype_flag: object) -> ModelShape:
        """The shape as `--dtype` serves it: vLLM casts the weights, and KV and conv state of dtype "auto" follow the
        served dtype (the CPU build without AVX512-BF16 is served float32: studies/tiny-cpu.toml)."""
        flag = str(dtype_flag or "auto")
        if flag == "auto":
            return self
        if flag not in SERVE_DTYPES:
            raise SpecError("config", "dtype", f"unknown dtype {flag!r} (vLLM accepts auto, "
                            f"{', '.join(SERVE_DTYPES)})")
        dtype = SERVE_DTYPES[flag]
        old, new = DTYPE_BYTES.get(self.dtype, 2), DTYPE_BYTES[dtype]
        recurrent = self.recurrent_state_bytes_per_seq
        if not self.mamba_ssm_dtype:  # the recurrent state follows the model dtype unless the checkpoint names one
            recurrent = recurrent * new // old
        return replace(self, dtype=dtype, conv_state_bytes_per_seq=self.conv_state_bytes_per_seq * new // old,
                       recurrent_state_bytes_per_seq=recurrent)

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelShape:
        file = Path(path) / "config.json"
        try:
            config = json.loads(file.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise SpecError(str(file), None, f"cannot read model config: {e}") from e
        return cls.from_config(config)

    @classmethod
    def from_config(cls, config: Mapping) -> ModelShape:
        text = dict(config.get("text_config") or config)
        arch = (config.get("architectures") or text.get("architectures") or ["?"])[0]
        model_type = str(text.get("model_type", config.get("model_type", "")))
        h, n_layers, heads, vocab = _required(text)
        kv_heads = int(text.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or h // heads)
        dtype = str(text.get("torch_dtype", config.get("torch_dtype")) or text.get("dtype", config.get("dtype"))
                    or "bfloat16").replace("torch.", "")
        qwen_next = model_type.startswith(("qwen3_next", "qwen3_5"))

        layer_types = _layer_types(text, n_layers, qwen_next)
        n_linear = sum(t == "linear_attention" for t in layer_types)
        n_full = n_layers - n_linear

        gate = qwen_next and bool(text.get("attn_output_gate", True))
        attn = _attention_params(text, model_type, h, heads * head_dim, kv_heads * head_dim, gate)
        qk_norm = 2 * head_dim if model_type.startswith(("qwen3", "qwen3_5")) else 0

        g = _Gdn.of(text)

        inter = int(text.get("intermediate_size") or 0)
        experts, moe_inter, shared_inter = _moe_sizes(text)
        moe_layers = _moe_layers(text, n_layers, experts)
        moe = experts * 3 * h * moe_inter + 3 * h * shared_inter
        router = h * experts + (h if shared_inter else 0)

        tied = bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
        n_mtp = int(text.get("mtp_num_hidden_layers") or text.get("num_nextn_predict_layers") or 0)
        mtp_mlp = moe if moe_layers else 3 * h * inter
        vision, vh, vi, merge = _vision_params(config.get("vision_config"), h)

        ssm_dtype = text.get("mamba_ssm_dtype") if model_type.startswith("qwen3_5") else None
        return cls(
            architecture=str(arch), model_type=model_type, dtype=dtype, hidden_size=h, num_layers=n_layers,
            vocab_size=vocab, max_position_embeddings=int(text.get("max_position_embeddings") or 4096),
            num_attention_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
            num_full_attention_layers=n_full, num_linear_attention_layers=n_linear,
            embedding_params=vocab * h, lm_head_params=0 if tied else vocab * h, tied_embeddings=tied,
            attention_params_per_layer=attn, linear_attention_params_per_layer=g.params(h) if n_linear else 0,
            linear_attention_small_params_per_layer=g.small_params if n_linear else 0,
            mlp_params_per_layer=3 * h * inter, num_dense_mlp_layers=n_layers - len(moe_layers),
            moe_params_per_layer=moe if moe_layers else 0, moe_router_params_per_layer=router if moe_layers else 0,
            num_moe_layers=len(moe_layers),
            norm_params=n_layers * 2 * h + n_full * qk_norm + h, vision_params=vision,
            num_mtp_layers=n_mtp, mtp_params=n_mtp * (attn + mtp_mlp),
            mtp_small_params=(2 * h * h + 3 * h + n_mtp * (2 * h + qk_norm)) if n_mtp else 0,
            intermediate_size=inter, num_experts=experts,
            num_experts_per_tok=int(text.get("num_experts_per_tok") or 0), moe_intermediate_size=moe_inter,
            shared_expert_intermediate_size=shared_inter, linear_num_key_heads=g.nk, linear_num_value_heads=g.nv,
            linear_key_head_dim=g.dk, linear_value_head_dim=g.dv, linear_conv_kernel_dim=g.kernel,
            mamba_ssm_dtype=ssm_dtype,
            conv_state_bytes_per_seq=n_linear * g.conv_elems * DTYPE_BYTES.get(dtype, 2),
            recurrent_state_bytes_per_seq=n_linear * g.rec_elems * DTYPE_BYTES.get(ssm_dtype or dtype, 2),
            quantization=parse_quantization(config.get("quantization_config") or text.get("quantization_config")),
            vision_hidden_size=vh, vision_intermediate_size=vi, vision_merge=merge,
            modules=_modules(config, text, layer_types, n_mtp, moe_layers, qwen_next and gate),
        )


def _required(text: Mapping) -> tuple[int, int, int, int]:
    """hidden_size, num_hidden_layers, num_attention_heads and vocab_size, which every shape needs."""
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if not isinstance(text.get(key), int):
            raise SpecError("config.json", key, "missing or not an integer")
    return text["hidden_size"], text["num_hidden_layers"], text["num_attention_heads"], text["vocab_size"]


@dataclass(frozen=True)
class _Gdn:
    """A Gated DeltaNet layer's heads and conv kernel, as config.json names them (zeros: no such layers)."""

    nk: int
    nv: int
    dk: int
    dv: int
    kernel: int

    @classmethod
    def of(cls, text: Mapping) -> _Gdn:
        return cls(int(text.get("linear_num_key_heads", 0)), int(text.get("linear_num_value_heads", 0)),
                   int(text.get("linear_key_head_dim", 0)), int(text.get("linear_value_head_dim", 0)),
                   int(text.get("linear_conv_kernel_dim", 0)))

    def params(self, h: int) -> int:
        """The layer's projections: in_proj_qkv, in_proj_z, in_proj_b and in_proj_a, out_proj."""
        kd, vd = self.nk * self.dk, self.nv * self.dv
        return h * (2 * kd + vd) + h * vd + 2 * h * self.nv + vd * h

    @property
    def small_params(self) -> int:
        """conv1d, A_log and dt_bias, the norm: kept in the model dtype."""
        return (2 * self.nk * self.dk + self.nv * self.dv) * self.kernel + 2 * self.nv + self.dv

    @property
    def conv_elems(self) -> int:
        return (2 * self.nk * self.dk + self.nv * self.dv) * (self.kernel - 1)

    @property
    def rec_elems(self) -> int:
        return self.nv * self.dv * self.dk


def _layer_types(text: Mapping, n_layers: int, qwen_next: bool) -> list[str]:
    """Each layer's kind; Qwen3-Next / Qwen3.5 without `layer_types` put full attention every
    full_attention_interval-th layer and Gated DeltaNet between."""
    layer_types = text.get("layer_types")
    if layer_types is None and qwen_next:
        interval = int(text.get("full_attention_interval", 4))
        layer_types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)]
    return list(layer_types or ["full_attention"] * n_layers)


def _attention_params(text: Mapping, model_type: str, h: int, q_out: int, kv_out: int, gate: bool) -> int:
    """One attention layer's q/k/v/o projections (q doubled by an output gate), with their biases if any."""
    attn = h * q_out * (2 if gate else 1) + 2 * h * kv_out + q_out * h
    if text.get("attention_bias") or model_type == "qwen2":
        attn += q_out * (2 if gate else 1) + 2 * kv_out
    return attn


def _moe_sizes(text: Mapping) -> tuple[int, int, int]:
    """(experts, an expert's intermediate size, the shared expert's): zeros for a dense model."""
    return (int(text.get("num_experts") or text.get("num_local_experts") or 0),
            int(text.get("moe_intermediate_size") or 0), int(text.get("shared_expert_intermediate_size") or 0))


def _moe_layers(text: Mapping, n_layers: int, experts: int) -> list[int]:
    """The layers whose MLP is a mixture of experts (every decoder_sparse_step-th, less mlp_only_layers)."""
    sparse_step = int(text.get("decoder_sparse_step") or 1)
    mlp_only = set(text.get("mlp_only_layers") or [])
    return [i for i in range(n_layers) if experts and i not in mlp_only and (i + 1) % sparse_step == 0]


def _vision_params(vc: Mapping | None, text_hidden: int) -> tuple[int, int, int, int]:
    """Qwen3-VL / Qwen3.5 vision tower: patch embed, position table, blocks, patch merger(s)."""
    if not vc:
        return 0, 0, 0, 1
    vh, vi, depth = int(vc.get("hidden_size", 1152)), int(vc.get("intermediate_size", 4304)), int(vc.get("depth", 27))
    patch, tpatch = int(vc.get("patch_size", 16)), int(vc.get("temporal_patch_size", 2))
    merge, out = int(vc.get("spatial_merge_size", 2)), int(vc.get("out_hidden_size", text_hidden))
    embed = int(vc.get("in_channels", 3)) * vh * tpatch * patch * patch + vh  # Conv3d patch embedding
    embed += int(vc.get("num_position_embeddings", 0)) * vh
    block = 4 * vh + (3 * vh * vh + 3 * vh) + (vh * vh + vh) + (vh * vi + vi) + (vi * vh + vh)
    hs = vh * merge * merge
    merger = 2 * vh + hs * hs + hs + hs * out + out
    deepstack = len(vc.get("deepstack_visual_indexes") or []) * (2 * hs + hs * hs + hs + hs * out + out)
    return embed + depth * block + merger + deepstack, vh, vi, merge


def _modules(config: Mapping, text: Mapping, layer_types: list[str], n_mtp: int, moe_layers: list[int],
             gate: bool) -> tuple[WeightModule, ...]:
    """The weight matrices a quantization_config can name, under the checkpoint's names: Qwen3.5/3.6 VL
    checkpoints nest the language model under model.language_model, put the MTP stack under mtp. and the vision
    tower under model.visual."""
    h, heads = text["hidden_size"], text["num_attention_heads"]
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or h // heads)
    vl = bool(config.get("vision_config")) or "text_config" in config
    root = "model.language_model" if vl else "model"
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    nk, nv = int(text.get("linear_num_key_heads", 0)), int(text.get("linear_num_value_heads", 0))
    kd, vd = nk * int(text.get("linear_key_head_dim", 0)), nv * int(text.get("linear_value_head_dim", 0))
    inter = int(text.get("intermediate_size") or 0)
    experts, moe_inter, shared_inter = _moe_sizes(text)

    def attention(prefix: str) -> list[WeightModule]:
        return [WeightModule(f"{prefix}.self_attn.q_proj", h * q_out * (2 if gate else 1), h),
                WeightModule(f"{prefix}.self_attn.k_proj", h * kv_out, h),
                WeightModule(f"{prefix}.self_attn.v_proj", h * kv_out, h),
                WeightModule(f"{prefix}.self_attn.o_proj", q_out * h, q_out)]

    def mlp(prefix: str, moe: bool) -> list[WeightModule]:
        if not moe:
            return [WeightModule(f"{prefix}.mlp.{p}", h * inter, inter if p == "down_proj" else h)
                    for p in ("gate_proj", "up_proj", "down_proj")]
        out = [WeightModule(f"{prefix}.mlp.experts.0.{p}", experts * h * moe_inter,  # all experts: one scheme
                            moe_inter if p == "down_proj" else h) for p in ("gate_proj", "up_proj", "down_proj")]
        if shared_inter:
            out += [WeightModule(f"{prefix}.mlp.shared_expert.{p}", h * shared_inter,
                                 shared_inter if p == "down_proj" else h)
                    for p in ("gate_proj", "up_proj", "down_proj")]
        return out

    mods = [WeightModule(f"{root}.embed_tokens", text["vocab_size"] * h, h, kind="embedding")]
    if not bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))):
        mods.append(WeightModule("lm_head", text["vocab_size"] * h, h, kind="lm_head"))
    for i, layer_type in enumerate(layer_types):
        prefix = f"{root}.layers.{i}"
        if layer_type == "linear_attention":
            mods += _gdn_modules(prefix, h, kd, vd, nv)
        else:
            mods += attention(prefix)
        mods += mlp(prefix, i in moe_layers)
    for j in range(n_mtp):
        mods += [WeightModule(m.name, m.params, m.in_features, "mtp")
                 for m in attention(f"mtp.layers.{j}") + mlp(f"mtp.layers.{j}", bool(moe_layers))]
    if n_mtp:
        mods.append(WeightModule("mtp.fc", 2 * h * h, 2 * h, "mtp"))
    mods += _vision_modules(config.get("vision_config"), h)
    return tuple(mods)


def _gdn_modules(prefix: str, h: int, kd: int, vd: int, nv: int) -> list[WeightModule]:
    """A Gated DeltaNet layer's projections (Qwen3-Next / Qwen3.5 linear attention)."""
    return [WeightModule(f"{prefix}.linear_attn.in_proj_qkv", h * (2 * kd + vd), h),
            WeightModule(f"{prefix}.linear_attn.in_proj_z", h * vd, h),
            WeightModule(f"{prefix}.linear_attn.in_proj_b", h * nv, h),
            WeightModule(f"{prefix}.linear_attn.in_proj_a", h * nv, h),
            WeightModule(f"{prefix}.linear_attn.out_proj", vd * h, vd)]


def _vision_modules(vc: Mapping | None, h: int) -> list[WeightModule]:
    """The vision tower's blocks and patch merger(s), under model.visual."""
    if not vc:
        return []
    mods: list[WeightModule] = []
    vh, vi = int(vc.get("hidden_size", 1152)), int(vc.get("intermediate_size", 4304))
    depth = int(vc.get("depth", 27))
    merge, out_h = int(vc.get("spatial_merge_size", 2)), int(vc.get("out_hidden_size", h))
    hs = vh * merge * merge
    for k in range(depth):
        b = f"model.visual.blocks.{k}"
        mods += [WeightModule(f"{b}.attn.qkv", 3 * vh * vh, vh, "vision"),
                 WeightModule(f"{b}.attn.proj", vh * vh, vh, "vision"),
                 WeightModule(f"{b}.mlp.linear_fc1", vh * vi, vh, "vision"),
                 WeightModule(f"{b}.mlp.linear_fc2", vi * vh, vi, "vision")]
    mergers = ["model.visual.merger"] + [f"model.visual.deepstack_merger_list.{d}"
                                        for d in range(len(vc.get("deepstack_visual_indexes") or []))]
    for m in mergers:
        mods += [WeightModule(f"{m}.linear_fc1", hs * hs, hs, "vision"),
                 WeightModule(f"{m}.linear_fc2", hs * out_h, hs, "vision")]
    return mods


QUANT_ALIASES = {"gptq": "gptq", "gptq_marlin": "gptq", "awq": "awq", "awq_marlin": "awq", "fp8": "fp8",
                  "compressed-tensors": "ct", "compressed_tensors": "ct", "inc": "auto-round",
                  "auto-round": "auto-round", "auto_round": "auto-round"}
