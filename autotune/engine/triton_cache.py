"""Triton's kernel cache shared by every compile key of a machine: the class vLLM's servers load through
TRITON_CACHE_MANAGER (compile_cache.cache_env names it). autotune itself never imports this module; Triton does,
inside the server.

Why: vLLM 0.25 points TRITON_CACHE_DIR (and TORCHINDUCTOR_CACHE_DIR) at a folder of the boot's compile key
(`vllm/compilation/compiler_interface.py:InductorAdaptor.initialize_cache` sets os.environ), so a boot with a new
key, which every new max_num_batched_tokens, max_model_len or cache dtype is, JIT-compiles every Triton kernel again:
the Gated DeltaNet (FLA) kernels of the first profiling run and Inductor's. tests/data/gpu-boots: that run took
97-104 s on a cold key against 5-7.5 s on a warm one. Triton keys a compiled kernel by its source, its options,
its target and Triton's own version (`triton/compiler/compiler.py:compile`), never by vLLM's key, so one folder is
right for all of them. Triton reads TRITON_CACHE_MANAGER at every lookup (`triton/knobs.py`), after vLLM has
changed TRITON_CACHE_DIR, and this manager answers from the folder in AUTOTUNE_TRITON_CACHE_DIR instead.
"""

from __future__ import annotations

import os

from triton.runtime.cache import FileCacheManager  # type: ignore[import-untyped]

SHARED_DIR = "AUTOTUNE_TRITON_CACHE_DIR"


class SharedTritonCache(FileCacheManager):
    """Triton's file cache, in the folder named by AUTOTUNE_TRITON_CACHE_DIR whatever TRITON_CACHE_DIR says now.
    Without that variable, and for Triton's override and dump folders (debugging aids), exactly Triton's own."""

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        shared = os.environ.get(SHARED_DIR)
        if override or dump or not shared:
            super().__init__(key, override=override, dump=dump)
            return
        self.key = key
        self.cache_dir = os.path.join(shared, key)
        self.lock_path = os.path.join(self.cache_dir, "lock")
        os.makedirs(self.cache_dir, exist_ok=True)
