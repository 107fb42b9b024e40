"""autotune's load client against vLLM's own (`vllm bench serve`) on one real vLLM CPU server.

Both clients drive the same server with the same shape of work (256-token prompts, 128 output tokens, 16 in
flight, 128 requests), alternately, 3 runs each. The table shows whether the two clients measure the same
throughput and TTFT, and what each costs in client CPU per request: on a small machine the client shares cores
with the engine, so a costly client lowers the throughput it reports.

    .venv/bin/python -m benchmarks.client_vs_vllm_bench [--runs 3]

Takes /tmp/autotune-engine.lock for the whole run, so only one vLLM server runs on this machine at a time.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from autotune.measure.client import LoadLevel, measure_level
from autotune.measure.stats import Limits, level_stats
from autotune.measure.workload import LengthDist, Workload
from benchmarks.engine_lock import engine_lock

REPO = Path(__file__).resolve().parents[1]

INPUT_LEN, OUTPUT_LEN, CONCURRENCY, PROMPTS = 256, 128, 16, 128
SERVED_NAME = "tiny"


def tiny_model(path: Path) -> tuple[Path, int]:
    """The project's tiny dense model (random weights), and how many ids its tokenizer knows."""
    from autotune.engine.models import VOCAB_SIZE, write_tiny_model

    return write_tiny_model("dense", path), VOCAB_SIZE




@contextlib.contextmanager
def vllm_server(model: Path, log: Path) -> Iterator[str]:
    """One vLLM server through autotune's engine (own process group, stopped however the block ends)."""
    from autotune.engine.server import EngineSpec, launch

    spec = EngineSpec(
        str(model),
        # No per-request access log: the engine's log reader is a thread of this process, and its CPU would be
        # counted as client CPU.
        flags={"load_format": "dummy", "enforce_eager": True, "disable_uvicorn_access_log": True},
        env={"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")},
        served_model_name=SERVED_NAME,
    )
    with launch(spec, log) as (server, info):
        print(f"vLLM ready in {info.boot_s:.0f} s at {server.base_url} (log: {log})", flush=True)
        yield server.base_url


def run_ours(url: str, vocab: int, seed: int, n: int = PROMPTS) -> dict[str, float]:
    wl = Workload(LengthDist(mean=INPUT_LEN), LengthDist(mean=OUTPUT_LEN), seed=seed)
    cpu0 = time.process_time()
    reqs = wl.requests(n + 1, vocab)
    cpu1 = time.process_time()
    run = measure_level(url, SERVED_NAME, reqs[1:], LoadLevel("concurrency", CONCURRENCY), warmup=reqs[:1])
    cpu2 = time.process_time()
    s = level_stats(run, Limits())
    return {
        "output_tok_s": s.output_tok_s,
        "ttft_p95_ms": s.ttft.p95_ms,
        "tpot_p95_ms": s.tpot.p95_ms,
        "cpu_ms_per_req": (cpu2 - cpu0) * 1000 / n,
        "send_cpu_ms_per_req": (cpu2 - cpu1) * 1000 / n,
        "failed": s.failed,
        "input_tokens": s.input_tokens,
        "output_tokens": s.output_tokens,
    }


def run_vllm(url: str, model: Path, seed: int, n: int = PROMPTS) -> dict[str, float]:
    """`vllm bench serve` in this process (the CPU build has no `vllm` script)."""
    from vllm.benchmarks import serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    serve.add_cli_args(parser)
    args = parser.parse_args([
        "--backend", "vllm", "--base-url", url, "--model", SERVED_NAME, "--tokenizer", str(model),
        "--dataset-name", "random", "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN),
        "--num-prompts", str(n), "--max-concurrency", str(CONCURRENCY), "--ignore-eos",
        "--temperature", "0", "--seed", str(seed), "--disable-tqdm",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,95,99",
    ])  # fmt: skip
    # CPU spent inside the request phase alone (vLLM's `benchmark` coroutine), apart from tokenizer loading and
    # prompt generation, which the whole-run figure includes.
    original = serve.benchmark
    phase: list[float] = []

    async def timed(*a, **kw):
        t = time.process_time()
        try:
            return await original(*a, **kw)
        finally:
            phase.append(time.process_time() - t)

    serve.benchmark = timed
    try:
        cpu0 = time.process_time()
        with contextlib.redirect_stdout(io.StringIO()):
            result = serve.main(args)
        cpu = time.process_time() - cpu0
    finally:
        serve.benchmark = original
    return {
        "output_tok_s": result["output_throughput"],
        "ttft_p95_ms": result["p95_ttft_ms"],
        "tpot_p95_ms": result["p95_tpot_ms"],
        "cpu_ms_per_req": cpu * 1000 / n,
        "send_cpu_ms_per_req": phase[0] * 1000 / n,
        "failed": result["failed"],
        "input_tokens": result["total_input_tokens"],
        "output_tokens": result["total_output_tokens"],
    }


ROWS = [
    ("output tok/s", "output_tok_s", "{:,.0f}"),
    ("p95 TTFT (ms)", "ttft_p95_ms", "{:,.1f}"),
    ("p95 TPOT (ms)", "tpot_p95_ms", "{:,.2f}"),
    ("client CPU / request, whole run (ms)", "cpu_ms_per_req", "{:,.2f}"),
    ("client CPU / request, request phase (ms)", "send_cpu_ms_per_req", "{:,.2f}"),
    ("failed requests", "failed", "{:,.0f}"),
    ("input tokens", "input_tokens", "{:,.0f}"),
    ("output tokens", "output_tokens", "{:,.0f}"),
]


def table(ours: list[dict[str, float]], theirs: list[dict[str, float]]) -> str:
    lines = [f"{'median of ' + str(len(ours)) + ' runs':<42}{'autotune':>12}{'vllm bench':>12}{'ratio':>8}"]
    for label, key, fmt in ROWS:
        a = statistics.median(r[key] for r in ours)
        b = statistics.median(r[key] for r in theirs)
        ratio = f"{a / b:.2f}" if b else "-"
        lines.append(f"{label:<42}{fmt.format(a):>12}{fmt.format(b):>12}{ratio:>8}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    opts = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="client-bench-"))
    model, vocab = tiny_model(work / "tiny-dense")
    with engine_lock(), vllm_server(model, work / "vllm.log") as url:
        # Not counted: the server's first requests and each client's lazy imports pay one-off costs.
        run_ours(url, vocab, seed=99, n=16)
        run_vllm(url, model, seed=99, n=16)
        ours, theirs = [], []
        for i in range(opts.runs):
            ours.append(run_ours(url, vocab, seed=i))
            print(f"autotune run {i + 1}: " + ", ".join(f"{k}={v:.4g}" for k, v in ours[-1].items()), flush=True)
            theirs.append(run_vllm(url, model, seed=i))
            print(f"vllm bench run {i + 1}: " + ", ".join(f"{k}={v:.4g}" for k, v in theirs[-1].items()), flush=True)
    print(f"\n{PROMPTS} requests, {INPUT_LEN} in / {OUTPUT_LEN} out tokens, concurrency {CONCURRENCY}, "
          "tiny dense model")
    print(table(ours, theirs))


if __name__ == "__main__":
    main()
