"""autotune's client and `vllm bench serve` replaying one request log on one vLLM CPU server.

In a closed loop (benchmarks/client_vs_vllm_bench.py) each client decides when its next request goes: the moment it
finished reading the last one. Its own timing then feeds back into the queue every later request meets, and the two
clients are not sent the same load. Here both are told the same requests at the same times: one log (arrival times
drawn once per pair as a Poisson process at `--rate`, the workload's prompt and answer lengths) that autotune
replays as a `[workload] replay` and vllm bench as its `timed_trace` dataset (self-timed), token-id prompts in both
(the timed trace sends ids), one warm-up request before each. What differs is then only how each client sends and
times a request.

Every run also reads the server's own TTFT (vLLM's `vllm:time_to_first_token_seconds` histogram, its sum and count
before and after the run): the mean TTFT the server saw for that client's requests. A client whose TTFT agrees with
the server's, less a constant for the HTTP hop, times what the server did.

    .venv/bin/python -m benchmarks.client_replay_vs_vllm_bench [--workloads long variable] [--pairs 8]
        [--rate 1.2] [--save runs.jsonl]

Pairs run in turn, the order alternating, under /tmp/autotune-engine.lock.
Results: benchmarks/data/cpu-client-vs-vllm-bench.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from autotune.measure.client import LoadLevel, measure_level
from autotune.measure.stats import Limits, level_stats
from autotune.measure.workload import Workload
from benchmarks import client_vs_vllm_bench
from benchmarks.client_vs_vllm_bench import (
    SERVED_NAME,
    SHAPES,
    Run,
    Shape,
    pooled,
    server_side,
    server_ttft,
    tiny_model,
    vllm_server,
)
from benchmarks.engine_lock import engine_lock

HASH_BLOCK = 512  # tokens per hash id in the timed trace (vllm bench's --timed-trace-chunk-hash-size)


@dataclass(frozen=True)
class Trace:
    """One pair's log, written twice: autotune's request-log format and vllm bench's timed trace (the same rows
    plus per-request hash ids, each unique, so no two requests share a prompt block)."""

    log: Path
    timed_trace: Path
    rate: float  # the log's own mean rate: (n - 1) / span, what autotune's replay level is given
    requests: int


def write_trace(shape: Shape, rate: float, seed: int, folder: Path) -> Trace:
    rng = np.random.default_rng(seed)
    n = shape.prompts
    stamps = [0.0, *np.cumsum(rng.exponential(1.0 / rate, n - 1)).tolist()]
    dist = shape.input_dist()
    lens = [dist.mean] * n if dist.kind == "fixed" else rng.integers(dist.min, dist.max + 1, n).tolist()
    rows = [{"timestamp": round(t, 6), "input_len": int(k), "output_len": shape.output_len}
            for t, k in zip(stamps, lens, strict=True)]
    log, trace = folder / f"log-{seed}.jsonl", folder / f"trace-{seed}.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    blocks = [[(seed * n + i) * 1000 + j for j in range(math.ceil(r["input_len"] / HASH_BLOCK))]
              for i, r in enumerate(rows)]
    trace.write_text("".join(json.dumps({**r, "hash_ids": b}) + "\n" for r, b in zip(rows, blocks, strict=True)))
    return Trace(log, trace, (n - 1) / stamps[-1], n)


def figures(ttfts_s: list[float], output_tok_s: float, server: dict[str, float]) -> Run:
    ms = np.array(ttfts_s) * 1000
    return {"output_tok_s": output_tok_s, "ttft_p50_ms": float(np.percentile(ms, 50)),
            "ttft_p95_ms": float(np.percentile(ms, 95)), "ttft_mean_ms": float(ms.mean()), **server,
            "ttfts_ms": ms.tolist()}


def run_ours(url: str, vocab: int, trace: Trace) -> Run:
    """autotune's client replaying the log at its own rate (a `[workload] replay`), after one warm-up request."""
    requests = Workload(replay=trace.log, prompt="token_ids").requests(trace.requests, vocab)
    measure_level(url, SERVED_NAME, requests[:1], LoadLevel("concurrency", 1))
    before = server_ttft(url)
    run = measure_level(url, SERVED_NAME, requests, LoadLevel("rate", trace.rate))
    s = level_stats(run, Limits())
    assert s.failed == 0, f"autotune: {s.failed} request(s) failed"
    return figures([r.ttft for r in run.records if r.ttft is not None], s.span_output_tok_s,
                   server_side(url, before))


def run_vllm(url: str, model: Path, shape: Shape, trace: Trace) -> Run:
    """`vllm bench serve --dataset-name timed_trace` on the trace (self-timed: the log's own arrival times)."""
    run = client_vs_vllm_bench.run_vllm(url, model, shape, 0, cli=[
        "--backend", "vllm", "--base-url", url, "--model", SERVED_NAME, "--tokenizer", str(model),
        "--dataset-name", "timed_trace", "--dataset-path", str(trace.timed_trace),
        "--timed-trace-label-input-length", "input_len", "--timed-trace-label-output-length", "output_len",
        "--timed-trace-chunk-hash-size", str(HASH_BLOCK), "--num-prompts", str(trace.requests),
        "--temperature", "0", "--disable-tqdm", "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,95", "--save-detailed",
    ])  # fmt: skip
    assert run["failed"] == 0, f"vllm bench: {run['failed']} request(s) failed"
    server = {k: run[k] for k in ("server_ttft_mean_ms", "server_requests")}
    return figures([t / 1000 for t in run["ttfts_ms"]], run["output_tok_s"], server)


ROWS = [
    ("output tok/s (whole span)", "output_tok_s", "{:,.1f}"),
    ("p50 TTFT (ms)", "ttft_p50_ms", "{:,.1f}"),
    ("p95 TTFT (ms)", "ttft_p95_ms", "{:,.1f}"),
    ("mean TTFT, client (ms)", "ttft_mean_ms", "{:,.1f}"),
    ("mean TTFT, server (ms)", "server_ttft_mean_ms", "{:,.1f}"),
    ("requests the server counted", "server_requests", "{:,.0f}"),
]


def table(ours: list[Run], theirs: list[Run]) -> str:
    """The per-pair table (client_vs_vllm_bench.table, ratios to three decimals: the clients differ by a few
    percent), and how far each client's mean TTFT sits above the server's own."""
    gap = [[r["ttft_mean_ms"] - r["server_ttft_mean_ms"] for r in runs] for runs in (ours, theirs)]
    return (f"{client_vs_vllm_bench.table(ours, theirs, 'autotune', ROWS, digits=3)}\n"
            f"{'client - server mean TTFT (ms)':<42}{np.median(gap[0]):>14.1f}{np.median(gap[1]):>12.1f}"
            f"   (each client's median over its runs)")


def compare(url: str, model: Path, vocab: int, shape: Shape, rate: float, pairs: int, folder: Path,
            save: Path | None) -> str:
    ours: list[Run] = []
    theirs: list[Run] = []
    for i in range(pairs):
        trace = write_trace(shape, rate, i, folder)
        order = [("autotune", lambda t=trace: run_ours(url, vocab, t), ours),
                 ("vllm bench", lambda t=trace: run_vllm(url, model, shape, t), theirs)]
        for name, run, into in order if i % 2 == 0 else order[::-1]:
            into.append(run())
            r = into[-1]
            print(f"  {name} {len(into)}: p50 {r['ttft_p50_ms']:.0f} p95 {r['ttft_p95_ms']:.0f} mean "
                  f"{r['ttft_mean_ms']:.0f} ms (server {r['server_ttft_mean_ms']:.0f}), {r['output_tok_s']:.1f} tok/s "
                  f"(load average {os.getloadavg()[0]:.1f})", flush=True)
    if save:
        with save.open("a") as f:
            f.write(json.dumps({"comparison": f"{shape.input_len}-replay-{rate:g}", "autotune": ours,
                                "vllm_bench": theirs}) + "\n")
    dist = shape.input_dist()
    prompts = f"{dist.mean:,}" if dist.kind == "fixed" else f"{dist.min}-{dist.max} (uniform)"
    return (f"\n{shape.prompts} requests replayed at {rate:g}/s (Poisson, one log per pair), {prompts} tokens in / "
            f"{shape.output_len} out, token ids, tiny dense model\n{table(ours, theirs)}\n{pooled(ours, theirs)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--workloads", nargs="+", choices=sorted(SHAPES), default=["long", "variable"])
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--rate", type=float, default=1.2, help="requests per second the logs are drawn at")
    ap.add_argument("--save", type=Path, help="append every run's figures and TTFTs to this JSON-lines file")
    opts = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="client-replay-"))
    model, vocab = tiny_model(work / "tiny-dense")
    tables = []
    with engine_lock(), vllm_server(model, work / "vllm.log") as url:
        started = time.monotonic()
        warm = write_trace(Shape(256, 0.0, 16, 4, 8), 4.0, 99, work)  # one-off costs of the server and clients
        run_ours(url, vocab, warm)
        run_vllm(url, model, Shape(256, 0.0, 16, 4, 8), warm)
        for name in opts.workloads:
            print(f"{name}:", flush=True)
            tables.append(compare(url, model, vocab, SHAPES[name], opts.rate, opts.pairs, work, opts.save))
        print(f"({time.monotonic() - started:.0f} s)")
    print("\n".join(tables))


if __name__ == "__main__":
    main()
