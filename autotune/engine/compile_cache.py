"""vLLM's compile cache across a study's trials: where it lives, whether a boot found it warm, and the flags that
keep its key still while the search varies max_num_seqs.

Why one cache: vLLM keys its torch.compile, Inductor and Triton artifacts by a hash of the configuration and keeps
them under `$VLLM_CACHE_ROOT/torch_compile_cache/<hash>`. A boot that finds its hash there loads the compiled
graphs (66-84 s to ready on an H200, tests/data/gpu-boots); one that does not compiles them inside vLLM's
memory-profiling window (224-275 s, and 1-2 GiB less KV cache, enough to fail for memory where the same flags fit
warm). A per-trial or temporary cache would make every boot cold, so every server of this machine gets the one
autotune-owned cache below (a user's own VLLM_CACHE_ROOT / TRITON_CACHE_DIR in the shell or [engine.env] wins).

What moves the key (the hash of `vllm/compilation/backends.py:VllmBackend.__call__`: sha256 over the env hash,
`VllmConfig.compute_hash`, the traced source files and the compiler's hash; the AOT artifact of
`vllm/compilation/decorators.py` is keyed on the same env and config hashes):

- env: every VLLM_* variable except an ignore list that holds VLLM_CACHE_ROOT and the logging variables
  (`vllm/envs.py:compile_factors`). TRITON_CACHE_DIR is not a VLLM_ variable: not in it.
- model config: every field but an ignore list (`config/model.py:ModelConfig.compute_hash`): max_model_len, dtype,
  quantization are in it; enforce_eager is not.
- cache config: cache_dtype and mamba_ssm_cache_dtype are in it; gpu_memory_utilization, enable_prefix_caching and
  block counts are not (`config/cache.py:CacheConfig.compute_hash`).
- scheduler config (`config/scheduler.py:SchedulerConfig.compute_hash`): max_num_batched_tokens in 0.25.0; from
  some release up to 0.32.0 (read there) max_num_seqs too ("PLE and other model components allocate static
  per-request buffers").
- compilation config: every field but paths and timings (`config/compilation.py:CompilationConfig.compute_hash`),
  so cudagraph_capture_sizes and max_cudagraph_capture_size are in it, and by default they follow max_num_seqs:
  max_cudagraph_capture_size = min(max_num_seqs x (1 + num_speculative_tokens) x 2, 512), capped at
  max_num_batched_tokens (`config/vllm.py:VllmConfig._set_cudagraph_sizes`).
- speculative config (num_speculative_tokens, method), LoRA, parallel and the other sub-configs' hashes.

So where max_num_seqs is not itself a key factor (0.25.0), it moves the key only through the capture sizes, and a
study that pins max_cudagraph_capture_size keeps one key across max_num_seqs (seen: hash 27b48a8301 for 8, 16, 48
and 128 sequences with --max-cudagraph-capture-size 96). Pinning is sound there: with the default
FULL_AND_PIECEWISE mode the FULL decode graphs are still only captured up to max_num_seqs x (1 +
num_speculative_tokens) (`vllm/v1/cudagraph_dispatcher.py:CudagraphDispatcher.initialize_cudagraph_keys`); only
the PIECEWISE (mixed-batch) graphs go up to the pinned size. Not on 0.25.x, whose CUDA-graph profiling holds a KV
block per capture size at boot (pin_costs_boot_memory): there nothing is pinned.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from autotune.engine.defaults import profiling_kv_per_sequence
from autotune.engine.flags import CACHE_DIR, Build, installed_vllm
from autotune.engine.logs import Failure, kv_shortfall_gib
from autotune.errors import EngineError

COMPILE_CACHE_DIR = CACHE_DIR / "vllm"


def cache_env(root: Path = COMPILE_CACHE_DIR) -> dict[str, str]:
    """The server environment that points vLLM's caches into one folder. TRITON_CACHE_DIR too: vLLM 0.32 keeps a
    caller's Triton cache (`compiler_interface.py:InductorAdaptor.initialize_cache`), so the Triton JIT kernels
    (Gated DeltaNet's, ...) are shared across compile keys. 0.25 overrides it with a folder per key, so Triton is
    also given a cache manager (triton_cache.SharedTritonCache) that keeps to the shared folder whatever vLLM sets."""
    return {"VLLM_CACHE_ROOT": str(root), "TRITON_CACHE_DIR": str(root / "triton"),
            "TRITON_CACHE_MANAGER": TRITON_CACHE_MANAGER}


def keep_triton_cache(env: dict[str, str]) -> dict[str, str]:
    """The environment with the Triton folder it names (autotune's, or the user's own) kept for the manager, which
    reads it from AUTOTUNE_TRITON_CACHE_DIR after vLLM has moved TRITON_CACHE_DIR."""
    if "TRITON_CACHE_DIR" in env:
        env["AUTOTUNE_TRITON_CACHE_DIR"] = env["TRITON_CACHE_DIR"]
    return env


# Named, not imported: Triton imports it in the server; autotune's own process need not have Triton.
TRITON_CACHE_MANAGER = "autotune.engine.triton_cache:SharedTritonCache"


CompileCache = Literal["cold", "warm"]


_COMPILED = re.compile(r"Compiling a graph for compile range")
_LOADED = re.compile(r"Directly load the compiled graph\(s\) for compile range .* from the cache"
                     r"|Directly load AOT compilation from path")


def compile_cache_state(lines: list[str]) -> CompileCache | None:
    """"cold" when the boot compiled a graph (`backends.py` "Compiling a graph for compile range (1, N) takes X
    s"), "warm" when it loaded them ("Directly load the compiled graph(s) for compile range (1, N) from the cache",
    or the AOT artifact), None when neither (eager: nothing compiled)."""
    state: CompileCache | None = None
    for line in lines:
        if _COMPILED.search(line):
            return "cold"
        if state is None and _LOADED.search(line):
            state = "warm"
    return state


# The most KV cache memory a warm boot has had over the cold boot of the same flags: 2.07 GiB (64 sequences at 32k,
# 1.42 cold against 3.49 warm, benchmarks/data/h200-as-rtx3090-chat-cold-then-warm); the five cold failures of the GPU
# surface's first recorded boots gained 0.06-1.74 GiB warm (benchmarks/data/h200-as-rtx3090-awq/logs/2026-12-04T0954,
# "Available KV cache memory").
WARM_GAIN_GIB = 2.1


def boot_again_warm(failure: Failure, lines: list[str]) -> bool:
    """A memory failure of a boot that compiled cold is no verdict on the configuration: the cold profiling run
    holds 1-2 GiB more (tests/data/gpu-boots: the recipe failed cold with 34 Mamba blocks, booted warm with 57), and
    the compile it paid is in the cache now. Boot it once more, unless it lacked more KV cache memory than a warm
    boot has ever gained (vLLM's defaults on a 3090: 16.17 GiB needed for one 262,144-token request, 0.88 had;
    booted again warm, it failed about 100 s later with 2.35)."""
    if not failure.kind.is_memory or compile_cache_state(lines) != "cold":
        return False
    shortfall = kv_shortfall_gib(lines)
    return shortfall is None or shortfall <= WARM_GAIN_GIB


def boot_again_before_measuring(build: Build, lines: list[str]) -> bool:
    """A CUDA boot that compiled cold and came up has 1-2 GiB less KV cache than the configuration gets every
    later time, since vLLM profiles memory while it compiles: on the H200 capped as a 3090, the recipe printed
    1.41 GiB cold against 2.49 warm, 64 sequences at 32k 1.42 against 3.49
    (benchmarks/data/h200-as-rtx3090-chat-cold-then-warm), and
    a cold 1.2 GiB server was screened out at a level its KV cache could not hold (GPU KV cache usage 100%, 31
    requests waiting). Measuring it would measure another configuration; a warm boot costs about 80 s. The CPU
    build sizes its KV cache from VLLM_CPU_KVCACHE_SPACE: a cold boot there is only slower."""
    return build is Build.CUDA and compile_cache_state(lines) == "cold"


CAPTURE_SIZE = "max_cudagraph_capture_size"


# Flags read by no compile-key factor (the hashes listed above, vLLM 0.25.0-0.32.0): a change of them boots warm.
# Anything not listed counts as a factor: a flag wrongly counted only makes a warm boot look new (key_is_new).
_NOT_IN_KEY = frozenset({
    "gpu_memory_utilization", "kv_cache_memory_bytes", "num_gpu_blocks_override", "enable_prefix_caching",
    "enable_chunked_prefill", "scheduling_policy", "async_scheduling", "max_num_partial_prefills",
    "long_prefill_token_threshold", "disable_log_stats", "max_num_seqs",
})


def compile_key(model: str, flags: Mapping[str, object], env: Mapping[str, str]) -> str:
    """autotune's stand-in for vLLM's compile hash, which cannot be computed without importing vLLM: the model, the
    vLLM version, the VLLM_* environment and every flag that may be a factor. max_num_seqs is one where the
    installed vLLM hashes it or the capture sizes follow it (no pin)."""
    seqs_matter = CAPTURE_SIZE not in flags or max_num_seqs_in_compile_key()
    factors = {k: v for k, v in flags.items() if k not in _NOT_IN_KEY or (k == "max_num_seqs" and seqs_matter)}
    vllm_env = {k: v for k, v in env.items() if k.startswith("VLLM_") and k != "VLLM_CACHE_ROOT"}
    try:
        version = installed_vllm()[1]
    except EngineError:
        version = None
    text = json.dumps([model, version, vllm_env, factors], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


KEYS_FILE = "autotune-compiled-keys.txt"  # in the compile cache's root: cleared with it


def key_is_new(root: Path, key: str) -> bool:
    """Whether no boot with this compile cache has compiled `key` yet: its next boot compiles (cold)."""
    try:
        return key not in (root / KEYS_FILE).read_text(encoding="utf-8").split()
    except OSError:
        return True


def remember_key(root: Path, key: str) -> None:
    """Note that a boot compiled (or loaded) `key`, so its artifacts are in the cache now."""
    if key_is_new(root, key):
        root.mkdir(parents=True, exist_ok=True)
        with (root / KEYS_FILE).open("a", encoding="utf-8") as f:
            f.write(key + "\n")


# Flags with which the user decides the CUDA graphs (or that there are none): a pin would overrule them.
_GRAPH_FLAGS = (CAPTURE_SIZE, "cudagraph_capture_sizes", "compilation_config", "enforce_eager")


_DEFAULT_MAX_GRAPH_SIZE = 512  # config/vllm.py:_set_cudagraph_sizes (1024 only on data-centre Blackwell, 0.32)


def pinned_capture_size(max_num_seqs: int, num_speculative_tokens: int = 0) -> int:
    """vLLM's own default for the largest max_num_seqs of a study, so that every smaller one captures the same
    sizes (and keeps one compile key) while the largest boots exactly as by default."""
    return min(max_num_seqs * (1 + num_speculative_tokens) * 2, _DEFAULT_MAX_GRAPH_SIZE)


def capture_pin(flags: Mapping[str, object], max_num_seqs_searched: int | None,
                num_speculative_tokens: int = 0) -> dict[str, object]:
    """`flags` with max_cudagraph_capture_size pinned for a study whose space varies max_num_seqs (its largest
    value given), where that keeps the compile key (pin_keeps_compile_key). Otherwise the flags unchanged."""
    if max_num_seqs_searched is None or not pin_keeps_compile_key() or pin_costs_boot_memory():
        return dict(flags)
    return with_capture_size(flags, pinned_capture_size(max_num_seqs_searched, num_speculative_tokens))


def with_capture_size(flags: Mapping[str, object], size: int) -> dict[str, object]:
    """The flags with `size` as max_cudagraph_capture_size, unless they already decide the CUDA graphs (or that
    there are none): the user's choice is what boots."""
    if any(flags.get(f) not in (None, False) for f in _GRAPH_FLAGS):
        return dict(flags)
    return {**flags, CAPTURE_SIZE: size}


def pin_keeps_compile_key() -> bool:
    """The CUDA build (the CPU build runs eager in autotune's tiny models and captures no graphs) whose scheduler
    hash leaves max_num_seqs out."""
    try:
        build, _ = installed_vllm()
    except EngineError:  # no vLLM: nothing boots, nothing to pin
        return False
    return build is Build.CUDA and not max_num_seqs_in_compile_key()


def pin_costs_boot_memory() -> bool:
    """Whether the installed vLLM's CUDA-graph profiling allocates a KV block per capture size, not per sequence
    (0.25.x: engine/defaults.py profiling_kv_per_sequence): there a pin of 512 makes every boot of a hybrid model hold
    512 of its large blocks beside the weights (Qwen3.5-27B: 24.5 GiB; seen failing on an H100 held to 24 GiB,
    h100-as-rtx3090-awq-capture-pinned), where vLLM's own size for max_num_seqs 15 holds 30. A warm cache is not worth a
    boot that cannot fit."""
    try:
        return not profiling_kv_per_sequence(installed_vllm()[1])
    except EngineError:
        return False


@functools.cache
def max_num_seqs_in_compile_key() -> bool:
    """Whether the installed vLLM's SchedulerConfig.compute_hash hashes max_num_seqs, read from its source without
    importing vLLM (0.25.0: no; 0.32.0: yes). Unreadable: assume it does (then nothing is pinned)."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            source = Path(str(importlib.metadata.distribution(dist).locate_file("vllm/config/scheduler.py")))
            return scheduler_hash_has_max_num_seqs(source.read_text(encoding="utf-8"))
        except (importlib.metadata.PackageNotFoundError, OSError):
            continue
    return True


def scheduler_hash_has_max_num_seqs(source: str) -> bool:
    """From the text of vllm/config/scheduler.py: does compute_hash append max_num_seqs to its factors?"""
    start = source.find("def compute_hash")
    if start < 0:
        return True
    end = source.find("\n    def ", start + 1)
    body = source[start: end if end > 0 else None]
    return re.search(r"factors\.append\(self\.max_num_seqs\)|[\"']max_num_seqs[\"']", body) is not None
