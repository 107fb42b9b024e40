"""Why studies/tiny-cpu.toml serves the tiny model in float32: on a CPU without AVX512-BF16, vLLM's CPU build
fails to create its oneDNN bf16 linear ("fallback to torch linear") and torch's bf16 matmul is emulated.

Times the tiny dense model's own matmuls (autotune/engine/models.py: hidden 256, MLP 512, vocab 4096) in both dtypes,
one thread as vLLM's CPU worker uses, side by side in one run, and prints medians and the ratio.

    python -m benchmarks.cpu_dtype
"""

from __future__ import annotations

import statistics
import time

import torch

from autotune.fit.hardware import host_has_avx512_bf16

# (rows, inner, cols): a 256-token prefill through the MLP's up projection, its down projection and the lm_head;
# one 16-sequence decode step through the up projection.
SHAPES = {"prefill up 256x256x1024": (256, 256, 1024), "prefill down 256x512x256": (256, 512, 256),
          "prefill lm_head 256x256x4096": (256, 256, 4096), "decode up 16x256x1024": (16, 256, 1024)}
REPEATS = 7


def median_ms(rows: int, inner: int, cols: int, dtype: torch.dtype) -> float:
    a, b = torch.randn(rows, inner, dtype=dtype), torch.randn(inner, cols, dtype=dtype)
    a @ b  # first call: kernel selection
    times = []
    for _ in range(REPEATS):
        n, start = 0, time.perf_counter()
        while n < 5 or time.perf_counter() - start < 0.2:
            a @ b
            n += 1
        times.append((time.perf_counter() - start) / n * 1e3)
    return statistics.median(times)


def main() -> None:
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"AVX512-BF16: {'yes' if host_has_avx512_bf16() else 'no'}; medians of {REPEATS} runs, one thread")
    print(f"{'matmul':32} {'float32 ms':>11} {'bfloat16 ms':>12} {'bf16 / fp32':>12}")
    ratios = []
    for name, (rows, inner, cols) in SHAPES.items():
        fp32, bf16 = median_ms(rows, inner, cols, torch.float32), median_ms(rows, inner, cols, torch.bfloat16)
        ratios.append(bf16 / fp32)
        print(f"{name:32} {fp32:11.3f} {bf16:12.3f} {bf16 / fp32:11.1f}x")
    print(f"median ratio bf16 / fp32: {statistics.median(ratios):.1f}x")


if __name__ == "__main__":
    main()
