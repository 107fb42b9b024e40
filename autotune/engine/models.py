"""Tiny model directories (config.json + a locally built tokenizer) for serving random weights.

vLLM's `--load-format dummy` fills the weights with random values, so a config and a tokenizer are all a server
needs: nothing is downloaded. The dense model is a Qwen3; the hybrid one is a Qwen3-Next (Gated DeltaNet plus
full attention every 4th layer), which has the same memory behaviour as Qwen3.5-27B: a KV cache per token for the
attention layers and a fixed recurrent state per sequence for the linear-attention ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from autotune.engine.flags import CACHE_DIR
from autotune.errors import ModelError, ModelUnavailable, SpecError

HUB_TIMEOUT_S = 10  # one request for a hub model's config.json, no retries

KNOWN_MODELS = Path(__file__).parent / "known_models"


KNOWN = {  # hub id -> shipped config.json: estimates for the reference models work offline
    "Qwen/Qwen3.5-27B": "qwen3.5-27b.json",
    "Qwen/Qwen3.5-27B-FP8": "qwen3.5-27b-fp8.json",
    "Qwen/Qwen3.5-27B-GPTQ-Int4": "qwen3.5-27b-gptq-int4.json",
    "QuantTrio/Qwen3.5-27B-AWQ": "qwen3.5-27b-awq.json",
}


def _hub_config(model: str) -> Path:
    """A hub model's config.json (hub_file)."""
    return hub_file(model, "config.json")


def hub_file(model: str, filename: str) -> Path:
    """A small file of a hub model (config.json, tokenizer.json): from the user's cache, else after one request
    without retries, so that an unreachable hub or a wrong id is said in a line within seconds (huggingface_hub
    alone retries for about 30 s, then raises through a long traceback)."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(hf_hub_download(model, filename, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    except Exception as e:  # an id the hub can never hold (HFValidationError), a cache that cannot be read
        raise ModelUnavailable(first_line(e)) from e
    try:
        get_hf_file_metadata(hf_hub_url(model, filename), timeout=HUB_TIMEOUT_S)
        return Path(hf_hub_download(model, filename))
    except Exception as e:  # no network, no such repository, gated, offline mode: all one thing to a user
        raise ModelUnavailable("not in the local Hugging Face cache, and the hub could not give it: "
                               f"{first_line(e)}") from e


def first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


Kind = Literal["dense", "hybrid"]


KINDS: tuple[Kind, ...] = ("dense", "hybrid")


VOCAB_SIZE = 4096


SPECIAL_TOKENS = ("<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>")


_COMMON = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "hidden_act": "silu",
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 1,
    "attention_bias": False,
}


CONFIGS: dict[Kind, dict] = {
    "dense": {
        **_COMMON,
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "num_hidden_layers": 4,
    },
    "hybrid": {
        **_COMMON,
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "num_hidden_layers": 4,
        "full_attention_interval": 4,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        "linear_conv_kernel_dim": 4,
        # 128 as in Qwen3-Next and Qwen3.5: vLLM 0.32's CPU GDN kernel (chunk_gated_delta_rule_cpu) fails at the first
        # request with 32 ("Unexpected head dim size, 32"); 128 serves.
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 4,
        "linear_num_value_heads": 8,
        "partial_rotary_factor": 0.25,
        # Qwen3-Next is a MoE model; vLLM needs these fields (an all-dense mlp_only_layers fails to boot).
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 128,
        "shared_expert_intermediate_size": 128,
        "norm_topk_prob": True,
    },
}


def write_tiny_model(kind: Kind, path: Path) -> Path:
    """Write (or refresh) a tiny model directory; idempotent, so callers can do it before every boot."""
    if kind not in CONFIGS:
        raise ModelError(f"unknown tiny model {kind!r}; known: {', '.join(KINDS)}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    _write_if_changed(path / "config.json", json.dumps(CONFIGS[kind], indent=2))
    if not (path / "tokenizer.json").exists():
        _tokenizer().save(str(path / "tokenizer.json"))
    _write_if_changed(
        path / "tokenizer_config.json",
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "unk_token": "<unk>",
                "eos_token": "<|endoftext|>",
                "pad_token": "<|endoftext|>",
                "bos_token": None,
                "model_max_length": CONFIGS[kind]["max_position_embeddings"],
                "chat_template": "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}",
            },
            indent=2,
        ),
    )
    return path


def tiny_model_dir(kind: Kind, cache_root: Path | None = None) -> Path:
    """Where a tiny model lives by default: a per-user cache, shared by studies, tests and benchmarks."""
    root = cache_root or CACHE_DIR / "tiny-models"
    return write_tiny_model(kind, root / kind)


def _tokenizer():
    # A word-level vocabulary of exactly VOCAB_SIZE entries: every id the load generator sends decodes.
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"w{i}": i for i in range(len(SPECIAL_TOKENS), VOCAB_SIZE)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def resolve_model(name: str) -> tuple[str, dict[str, object]]:
    """`tiny:dense` / `tiny:hybrid` -> a generated directory served with random weights; anything else as is."""
    if not name.startswith("tiny:"):
        return name, {}
    kind = name.removeprefix("tiny:")
    if kind not in CONFIGS:
        raise ModelError(f"unknown tiny model {name!r}; known: {', '.join('tiny:' + k for k in KINDS)}")
    return str(tiny_model_dir(kind)), {"load_format": "dummy"}


def model_config(model: str) -> dict:
    """A resolved model's config.json, the one place it is read: a directory's, the shipped copy for a known hub
    id (so estimates for the reference models work offline), else the hub's (the user's cache when it can)."""
    path = Path(model)
    if path.is_dir():
        file = path / "config.json"
        try:
            return json.loads(file.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise SpecError(str(file), None, f"cannot read model config: {e}") from e
    if model in KNOWN:
        return json.loads((KNOWN_MODELS / KNOWN[model]).read_text())
    return json.loads(_hub_config(model).read_text())


def model_vocab_size(model: str) -> int:
    """The vocabulary the random prompts draw from, read from the model's config.json."""
    config = model_config(model)
    return int(config.get("vocab_size") or config.get("text_config", {})["vocab_size"])
