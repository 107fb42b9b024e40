"""Table of the real CUDA vLLM boots kept in tests/data/gpu-boots/ (the memory estimator's ground truth).

    python -m benchmarks.gpu_boots_table              # table from tests/data/gpu-boots/boots.json
    python -m benchmarks.gpu_boots_table DIR          # the same for another folder
    python -m benchmarks.gpu_boots_table --parse LOG  # the figures one vLLM server log printed, as JSON

The figures are parsed from the logs (parse_log); boots.json holds them beside each boot's flags and outcome.
Standard library only.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

DEFAULT_DIR = Path(__file__).resolve().parents[1] / "tests" / "data" / "gpu-boots"
NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"

# name -> (regex, converter); the first match in the log wins unless the name is listed in ALL
PATTERNS: dict[str, tuple[str, type]] = {
    "weights_gib": (r"Model loading took " + NUM + r" GiB", float),
    "weights_load_s": (r"Model loading took [0-9.]+ GiB(?: memory)? and " + NUM + r" seconds", float),
    "torch_compile_s": (r"torch\.compile took " + NUM + r" s in total", float),
    "profiling_run_s": (r"Initial profiling/warmup run took " + NUM + r" s", float),
    "kv_cache_gib": (r"Available KV cache memory: " + NUM + r" GiB", float),
    "kv_cache_tokens": (r"GPU KV cache size: " + NUM + r" tokens", int),
    "max_concurrency": (r"Maximum concurrency for [0-9,]+ tokens per request: " + NUM + r"x", float),
    "cudagraph_estimate_gib": (r"Estimated CUDA graph memory: " + NUM + r" GiB total", float),
    "cudagraph_capture_s": (r"Graph capturing finished in " + NUM + r" secs", float),
    "cudagraph_captured_gib": (r"Graph capturing finished in [0-9]+ secs, took " + NUM + r" GiB", float),
    "cudagraph_pool_actual_gib": (r"CUDA graph pool memory: " + NUM + r" GiB \(actual\)", float),
    "cudagraph_pool_estimated_gib": (r"CUDA graph pool memory: [0-9.]+ GiB \(actual\), " + NUM + r" GiB \(estimated\)",
                                     float),
    "non_kv_cache_gib": (r"Total non KV cache memory: " + NUM + r" ?GiB", float),
    "torch_peak_increase_gib": (r"torch peak memory increase: " + NUM + r" ?GiB", float),
    "non_torch_increase_gib": (r"non-torch forward increase memory: " + NUM + r" ?GiB", float),
    # vLLM 0.27+: the non-KV memory from cudaMemGetInfo (utils/mem_utils.py MemoryProfilingResult.__repr__)
    "total_consumed_gib": (r"total consumed \(from mem_get_info\): " + NUM + r" ?GiB", float),
    "memory_profiling_s": (r"Memory profiling takes " + NUM + r" seconds", float),
    "requested_gib": (r"Requested memory: [0-9.]+ \(util\), " + NUM + r" ?GiB", float),
    "initial_free_gib": (r"Initial free memory: " + NUM + r" ?GiB", float),
    "attention_block_size": (r"Setting attention block size to " + NUM + r" tokens", int),
    "init_engine_s": (r"init engine \(profile, create kv cache, warmup model\) took " + NUM + r" s", float),
    "num_gpu_blocks": (r"num_gpu_blocks is: " + NUM, int),
    "kv_cache_memory_fit_requested_bytes": (r"--kv-cache-memory=" + NUM + r"` \([0-9.]+ GiB\) to fit into requested",
                                            int),
    "worker_init_cuda_memory_gib": (r"worker init memory snapshot: .*?cuda_memory=" + NUM + r"GiB", float),
}
TEXT_PATTERNS: dict[str, str] = {
    "compiled_range": r"((?:Compiling a graph for|Directly load the compiled graph\(s\) for) compile range .*)",
    "cudagraph_profiled": r"Profiling CUDA graph memory: (.*)",
    "cudagraph_estimate_lines": r"(Estimated (?:FULL|PIECEWISE) CUDA graph memory: .*)",
    "compile_cache_dir": r"Using cache directory: (\S+) for vLLM's torch\.compile",
    "mamba_blocks": r"(max_num_seqs \([0-9]+\) exceeds available Mamba cache blocks \([0-9]+\))",
    "kv_cache_memory_suggestion": r"(Actual usage is .* GiB for CUDAGraph memory\.)",
}
ALL = {"compiled_range", "cudagraph_estimate_lines"}
FAILURE = re.compile(r"((?:ValueError|RuntimeError|AssertionError|torch\.OutOfMemoryError|OutOfMemoryError): "
                     r"(?!Tokenizer not available).*|.*CUDA out of memory.*)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_log(text: str) -> dict[str, object]:
    """The memory and timing figures a vLLM 0.25 server log printed during its boot (missing ones left out)."""
    text = ANSI.sub("", text)
    out: dict[str, object] = {}
    for name, (rx, conv) in PATTERNS.items():
        m = re.search(rx, text)
        if m:
            out[name] = conv(m.group(1).replace(",", ""))
    for name, rx in TEXT_PATTERNS.items():
        found = [m.group(1).strip() for m in re.finditer(rx, text)]
        if found:
            out[name] = sorted(set(found), key=found.index) if name in ALL else found[0]
    if "compile_cache_dir" in out:
        parts = Path(str(out["compile_cache_dir"])).parts
        if "torch_compile_cache" in parts[:-1]:
            out["compile_cache_hash"] = parts[parts.index("torch_compile_cache") + 1]
    m = re.search(r"Mamba cache blocks \(([0-9]+)\)", text)
    if m:
        out["mamba_cache_blocks"] = int(m.group(1))
    fails = [m.group(1) for m in FAILURE.finditer(text)]
    if fails:
        out["failure_lines"] = sorted(set(fails), key=fails.index)[:6]
    return out


def _fmt(v: object, nd: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def table(boots: list[dict]) -> str:
    cols = [("name", 34), ("cache", 5), ("outcome", 7), ("boot s", 6), ("weights", 7), ("compile", 7),
            ("profile", 7), ("act", 4), ("cg est", 6), ("cg took", 7), ("KV GiB", 6), ("KV tokens", 9), ("conc", 5),
            ("blocks", 6), ("smi MiB", 7)]
    lines = ["  ".join(f"{c:>{w}}" if i else f"{c:<{w}}" for i, (c, w) in enumerate(cols))]
    for b in boots:
        f = b.get("figures", {})
        row = [b["name"], b.get("cache", {}).get("state", "-"), b.get("outcome", "-"), _fmt(b.get("boot_s"), 0),
               _fmt(f.get("weights_gib")), _fmt(f.get("torch_compile_s"), 1), _fmt(f.get("profiling_run_s"), 1),
               _fmt(f.get("torch_peak_increase_gib")), _fmt(f.get("cudagraph_estimate_gib")),
               _fmt(f.get("cudagraph_captured_gib")),
               _fmt(f.get("kv_cache_gib")), _fmt(f.get("kv_cache_tokens")), _fmt(f.get("max_concurrency")),
               _fmt(f.get("num_gpu_blocks", f.get("mamba_cache_blocks"))), _fmt(b.get("nvidia_smi_used_mib_at_ready"))]
        cells = enumerate(zip(row, cols, strict=True))  # one cell per column
        lines.append("  ".join(f"{v:>{w}}" if i else f"{v:<{w}}" for i, (v, (_, w)) in cells))
        if b.get("outcome") not in ("ready", None) and b.get("failure"):
            lines.append(f"    {b['failure'][:150]}")
    lines.append("act: torch peak increase of the profiling run (GiB); cg: CUDA-graph memory (GiB); blocks: KV/Mamba "
                 "cache blocks (the Mamba figure of the failure line where the boot failed); smi MiB: nvidia-smi "
                 "memory.used once /health answered")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--parse"]:
        for p in argv[1:]:
            print(json.dumps({"log": p, **parse_log(Path(p).read_text(errors="replace"))}, indent=1))
        return 0
    folder = Path(argv[0]) if argv else DEFAULT_DIR
    data = json.loads((folder / "boots.json").read_text())
    print(table(data["boots"]))
    prov = data.get("device", {})
    if prov:
        print(f"\n{prov.get('name')}, {prov.get('total_mib')} MiB, driver {prov.get('driver')}; "
              f"vLLM {data.get('vllm')}, torch {data.get('torch')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
