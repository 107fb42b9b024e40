"""autotune's load client against vLLM's own (`vllm bench serve`) on one real vLLM CPU server.

Both clients drive the same server with the same shape of work, in pairs (each pair on its own seed, the order
alternating from pair to pair), so that a machine busy with other work slows both members of a pair alike: the table
gives each client's median over the pairs and the median and spread (min-max) of the per-pair ratios. Workloads:

- `short`: 256-token prompts, 128 out, 16 in flight (throughput and client CPU per request);
- `long`: 1,536-token prompts, 64 out, 8 in flight (TTFT is mostly prefill and the queue behind it);
- `variable`: 64-512-token prompts (uniform), 64 out, 8 in flight.

autotune sends text prompts (what the shipped objectives send; `--ids` adds its token-id prompts as a third
client, to see what text costs the server). The request count is vllm bench's `--num-prompts`; autotune sends the
same count with one warm-up request before it, as vllm bench sends its single-prompt test run first.

    .venv/bin/python -m benchmarks.client_vs_vllm_bench [--workloads long variable] [--pairs 5] [--ids]
        [--modes in-turn at-once]

Results: benchmarks/data/cpu-client-vs-vllm-bench. With in-turn runs it takes /tmp/autotune-engine.lock for the whole
run, so that no other vLLM server moves one client's run and not the other's; at once alone it does not: both
clients share whatever the machine does, which is that mode's point.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from autotune.measure.client import LoadLevel, measure_level
from autotune.measure.stats import Limits, level_stats
from autotune.measure.workload import LengthDist, Workload, prompt_decoder
from benchmarks.engine_lock import engine_lock

REPO = Path(__file__).resolve().parents[1]

SERVED_NAME = "tiny"

# One client's run: its figures (ROWS) and "ttfts_ms", every request's TTFT, for the pooled percentiles.
Run = dict[str, Any]


@dataclass(frozen=True)
class Shape:
    """One workload, as both clients are told it: vllm bench's random dataset draws input lengths uniformly from
    input_len * [1 - range_ratio, 1 + range_ratio] (output lengths fixed); autotune's LengthDist spans the same."""

    input_len: int
    range_ratio: float
    output_len: int
    concurrency: int
    prompts: int

    def input_dist(self) -> LengthDist:
        if self.range_ratio == 0:
            return LengthDist(mean=self.input_len)
        low, high = round(self.input_len * (1 - self.range_ratio)), round(self.input_len * (1 + self.range_ratio))
        return LengthDist("uniform", self.input_len, (high - low) / 12**0.5, low, high)


SHAPES = {
    "short": Shape(256, 0.0, 128, 16, 128),
    "long": Shape(1536, 0.0, 64, 8, 64),
    "variable": Shape(288, 0.778, 64, 8, 96),  # 64-512 tokens
}


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
        # counted as client CPU. float32: bfloat16 is many times slower on a CPU without AVX512-BF16.
        # No prefix caching: a client must not find the prompts of the run before it cached (each run draws its own,
        # but an --ids run re-sends the text run's prompts as ids).
        flags={"load_format": "dummy", "enforce_eager": True, "disable_uvicorn_access_log": True, "dtype": "float32",
               "enable_prefix_caching": False},
        env={"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")},
        served_model_name=SERVED_NAME,
        boot_timeout_s=900,
    )
    with launch(spec, log) as (server, info):
        print(f"vLLM ready in {info.boot_s:.0f} s at {server.base_url} (log: {log})", flush=True)
        yield server.base_url


TTFT_FAMILY = "vllm:time_to_first_token_seconds"


def server_ttft(url: str) -> tuple[float, float]:
    """The server's own TTFT histogram (vLLM's /metrics): its sum of seconds and its count, over its labels."""
    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    samples = [s for family in text_string_to_metric_families(text) if family.name == TTFT_FAMILY
               for s in family.samples]
    return (sum(s.value for s in samples if s.name == TTFT_FAMILY + "_sum"),
            sum(s.value for s in samples if s.name == TTFT_FAMILY + "_count"))


def server_side(url: str, before: tuple[float, float]) -> dict[str, float]:
    """The mean TTFT the server saw for the requests it counted since `before` (ms), and how many: one client's
    run when the clients take turns (at once, both clients' requests)."""
    (s0, c0), (s1, c1) = before, server_ttft(url)
    return {"server_ttft_mean_ms": (s1 - s0) * 1000 / max(c1 - c0, 1), "server_requests": c1 - c0}


def run_ours(url: str, model: Path, vocab: int, shape: Shape, seed: int, prompt: str = "text",
             wait: Callable[[], None] | None = None) -> Run:
    """autotune's client: one warm-up request, then the measured ones (after `wait` returns, when given)."""
    wl = Workload(shape.input_dist(), LengthDist(mean=shape.output_len), seed=seed, prompt=prompt)  # type: ignore[arg-type]
    cpu0 = time.process_time()
    reqs = wl.requests(shape.prompts + 1, vocab, decode=prompt_decoder(str(model)))
    level = LoadLevel("concurrency", shape.concurrency)
    cpu1 = time.process_time()
    measure_level(url, SERVED_NAME, reqs[:1], level)
    if wait is not None:
        wait()
    cpu_wait = time.process_time()
    before = server_ttft(url)
    run = measure_level(url, SERVED_NAME, reqs[1:], level)
    cpu2 = time.process_time() - (cpu_wait - cpu1)  # the warm-up's CPU counts, the wait's does not
    s = level_stats(run, Limits())
    return {
        "output_tok_s": s.span_output_tok_s,
        "ttft_p50_ms": s.ttft.p50_ms,
        "ttft_p95_ms": s.ttft.p95_ms,
        "ttft_mean_ms": s.ttft.mean_ms,
        "tpot_p95_ms": s.tpot.p95_ms,
        "cpu_ms_per_req": (cpu2 - cpu0) * 1000 / shape.prompts,
        "send_cpu_ms_per_req": (cpu2 - cpu1) * 1000 / shape.prompts,
        "failed": s.failed,
        "input_tokens": s.input_tokens,
        "output_tokens": s.output_tokens,
        "ttfts_ms": [r.ttft * 1000 for r in run.records if r.error is None and r.ttft is not None],
        **server_side(url, before),
    }


def random_dataset_args(url: str, model: Path, shape: Shape, seed: int) -> list[str]:
    """vllm bench's arguments for `shape`: its random dataset (text prompts), a closed loop of `concurrency`."""
    return [
        "--backend", "vllm", "--base-url", url, "--model", SERVED_NAME, "--tokenizer", str(model),
        "--dataset-name", "random", "--random-input-len", str(shape.input_len),
        "--random-range-ratio", json.dumps({"input": shape.range_ratio, "output": 0.0}),
        "--random-output-len", str(shape.output_len),
        "--num-prompts", str(shape.prompts), "--max-concurrency", str(shape.concurrency), "--ignore-eos",
        "--temperature", "0", "--seed", str(seed), "--disable-tqdm",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,95,99",
        "--save-detailed",  # keeps every request's TTFT in the result (nothing is saved without --save-result)
    ]  # fmt: skip


def run_vllm(url: str, model: Path, shape: Shape, seed: int,
             on_main: Callable[[], None] | None = None, cli: Sequence[str] | None = None) -> Run:
    """`vllm bench serve` in this process (the CPU build has no `vllm` script); `on_main` is called as its measured
    requests begin (after its tokenizer loaded, its prompts were drawn and its single test request came back).
    `cli`: its arguments (default: random_dataset_args)."""
    from vllm.benchmarks import serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    serve.add_cli_args(parser)
    args = parser.parse_args(list(cli) if cli is not None else random_dataset_args(url, model, shape, seed))
    # CPU spent inside the request phase alone (vLLM's `benchmark` coroutine), apart from tokenizer loading and
    # prompt generation, which the whole-run figure includes.
    original, original_schedule = serve.benchmark, serve.get_request
    phase: list[float] = []

    async def timed(*a, **kw):
        t = time.process_time()
        try:
            return await original(*a, **kw)
        finally:
            phase.append(time.process_time() - t)

    before: list[tuple[float, float]] = []

    def schedule(*a, **kw):  # vllm bench's arrival schedule, asked for once, as its measured requests begin
        before.append(server_ttft(url))
        if on_main is not None:
            on_main()
        return original_schedule(*a, **kw)

    serve.benchmark, serve.get_request = timed, schedule
    try:
        cpu0 = time.process_time()
        with contextlib.redirect_stdout(io.StringIO()):
            result = serve.main(args)
        cpu = time.process_time() - cpu0
    finally:
        serve.benchmark, serve.get_request = original, original_schedule
    ok = [not e for e in result["errors"]]
    return {
        "output_tok_s": result["output_throughput"],
        "ttft_p50_ms": result["median_ttft_ms"],
        "ttft_p95_ms": result["p95_ttft_ms"],
        "ttft_mean_ms": result["mean_ttft_ms"],
        "tpot_p95_ms": result["p95_tpot_ms"],
        "cpu_ms_per_req": cpu * 1000 / shape.prompts,
        "send_cpu_ms_per_req": phase[0] * 1000 / shape.prompts,
        "failed": result["failed"],
        "input_tokens": result["total_input_tokens"],
        "output_tokens": result["total_output_tokens"],
        "ttfts_ms": [t * 1000 for t, good in zip(result["ttfts"], ok, strict=True) if good],
        **server_side(url, before[0]),
    }


ROWS = [
    ("output tok/s (whole span)", "output_tok_s", "{:,.0f}"),
    ("p50 TTFT (ms)", "ttft_p50_ms", "{:,.1f}"),
    ("p95 TTFT (ms)", "ttft_p95_ms", "{:,.1f}"),
    ("p95 TPOT (ms)", "tpot_p95_ms", "{:,.2f}"),
    ("client CPU / request, whole run (ms)", "cpu_ms_per_req", "{:,.2f}"),
    ("client CPU / request, request phase (ms)", "send_cpu_ms_per_req", "{:,.2f}"),
    ("failed requests", "failed", "{:,.0f}"),
    ("input tokens", "input_tokens", "{:,.0f}"),
    ("output tokens", "output_tokens", "{:,.0f}"),
]
# In turn only (at once the server's count holds both clients' requests): the mean TTFT each client timed against
# the one the server measured for the same requests. Equal ratios say the server served the clients' requests
# differently; a ratio on the client's mean alone says the clients time differently.
SERVER_ROWS = [
    ("mean TTFT, client (ms)", "ttft_mean_ms", "{:,.1f}"),
    ("mean TTFT, server's /metrics (ms)", "server_ttft_mean_ms", "{:,.1f}"),
    ("requests the server counted", "server_requests", "{:,.0f}"),
]


def median_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free interval for the median: the k-th smallest and k-th largest value, for the largest k
    whose chance of both missing the median is at most 1 - level (sign test). None: too few values for one."""
    n, ordered = len(values), sorted(values)
    below = 0.0  # P(Binomial(n, 1/2) < k)
    k = 0
    while below + math.comb(n, k) / 2**n <= (1 - level) / 2:
        below += math.comb(n, k) / 2**n
        k += 1
    return (ordered[k - 1], ordered[n - k]) if k else None


def table(ours: list[Run], theirs: list[Run], label: str = "autotune",
          rows: Sequence[tuple[str, str, str]] = ROWS, digits: int = 2) -> str:
    """Each client's median, and the median, min-max and 95% interval of the per-pair ratios (ours / theirs), the
    ratios to `digits` decimals."""
    lines = [f"{'median of ' + str(len(ours)) + ' pairs':<42}{label:>14}{'vllm bench':>12}{'ratio':>8}"
             f"{'ratio min-max':>16}{'95% interval':>15}"]
    for name, key, fmt in rows:
        a = statistics.median(r[key] for r in ours)
        b = statistics.median(r[key] for r in theirs)
        ratios = [x[key] / y[key] for x, y in zip(ours, theirs, strict=True) if y[key]]
        spread = f"{min(ratios):.{digits}f}-{max(ratios):.{digits}f}" if ratios else "-"
        ratio = f"{statistics.median(ratios):.{digits}f}" if ratios else "-"
        interval = median_interval(ratios)
        within = f"{interval[0]:.{digits}f}-{interval[1]:.{digits}f}" if interval else "-"
        lines.append(f"{name:<42}{fmt.format(a):>14}{fmt.format(b):>12}{ratio:>8}{spread:>16}{within:>15}")
    return "\n".join(lines)


def pooled(ours: list[Run], theirs: list[Run], label: str = "autotune") -> str:
    """TTFT percentiles over every request of every pair (each pair's p95 rests on its 3-4 slowest requests, most
    of them a closed loop's first burst), with a 95% interval of their ratio from resampling whole pairs."""
    rng = np.random.default_rng(0)
    n = len(ours)
    lines = [f"{'pooled over ' + str(n) + ' pairs (all requests)':<42}{label:>14}{'vllm bench':>12}{'ratio':>8}"
             f"{'95% interval':>31}"]
    for q in (50, 90, 95, 99):
        def ratio(idx: Sequence[int], q: float = q) -> float:
            a = np.concatenate([ours[i]["ttfts_ms"] for i in idx])
            b = np.concatenate([theirs[i]["ttfts_ms"] for i in idx])
            return float(np.percentile(a, q) / np.percentile(b, q))

        a = np.percentile(np.concatenate([r["ttfts_ms"] for r in ours]), q)
        b = np.percentile(np.concatenate([r["ttfts_ms"] for r in theirs]), q)
        boot = [ratio(rng.integers(0, n, n).tolist()) for _ in range(2000)]
        low, high = np.percentile(boot, [2.5, 97.5])
        lines.append(f"{f'p{q} TTFT (ms)':<42}{a:>14,.1f}{b:>12,.1f}{a / b:>8.2f}{f'{low:.2f}-{high:.2f}':>31}")
    return "\n".join(lines)


def describe(shape: Shape) -> str:
    d = shape.input_dist()
    prompts = f"{d.mean:,}" if d.kind == "fixed" else f"{d.min}-{d.max} (uniform)"
    return (f"{shape.prompts} requests, {prompts} tokens in / {shape.output_len} out, concurrency {shape.concurrency},"
            " tiny dense model")


def compare(url: str, model: Path, vocab: int, shape: Shape, pairs: int, ids: bool) -> str:
    """`pairs` pairs, in alternating order (autotune first, then vllm bench first), so a machine growing busier or
    quieter through the run favours neither client."""
    ours: list[Run] = []
    theirs: list[Run] = []
    as_ids: list[Run] = []

    def one(name: str, run: Callable[[], Run], into: list[Run]) -> None:
        into.append(run())
        print(f"  {name} {len(into)}: " + ", ".join(f"{k}={into[-1][k]:.4g}" for _, k, _ in ROWS)
              + f" (load average {os.getloadavg()[0]:.1f})", flush=True)

    for i in range(pairs):
        order = [("autotune (text)", partial(run_ours, url, model, vocab, shape, seed=i), ours),
                 ("vllm bench", partial(run_vllm, url, model, shape, seed=i), theirs)]
        for name, run, into in order if i % 2 == 0 else order[::-1]:
            one(name, run, into)
        if ids:  # fresh prompts: the server must not have seen them
            fresh = partial(run_ours, url, model, vocab, shape, seed=1000 + i, prompt="token_ids")
            one("autotune (ids)", fresh, as_ids)
    save(f"{shape.input_len}-in-turn", ours, theirs)
    out = (f"\n{describe(shape)}\n{table(ours, theirs, 'autotune text', ROWS + SERVER_ROWS)}\n"
           f"{pooled(ours, theirs, 'autotune text')}")
    if ids:
        out += "\n" + table(as_ids, theirs, "autotune ids")
    return out


def say_go() -> None:
    os.write(1, b"go\n")  # the file descriptor: run_vllm captures sys.stdout


def child(spec: str) -> None:
    """The client together() runs in a child process (vllm bench, or autotune when swapped): says "go" on stdout as
    its measured requests begin, then prints its figures (JSON)."""
    d = json.loads(spec)
    shape = Shape(**d["shape"])
    if d["client"] == "vllm bench":
        result = run_vllm(d["url"], Path(d["model"]), shape, d["seed"], say_go)
    else:
        result = run_ours(d["url"], Path(d["model"]), d["vocab"], shape, d["seed"], wait=ready_then_go)
    print(json.dumps(result), flush=True)


def together(url: str, model: Path, vocab: int, shape: Shape, pairs: int, swapped: bool = False) -> str:
    """Both clients at once, each with half the requests in flight, so that both see the same server at the same
    moment however busy the machine is: what differs is then only how each client sends and times.

    Each client's warm-up (vllm bench's single test request, autotune's one) goes first; the measured requests of
    both start together, so that neither client's first burst finds the server busy with the other's warm-up.
    vllm bench runs in a child process and autotune in this one, which waits for the child's "go"; `swapped`:
    autotune in the child, vllm bench here waiting, to tell the clients apart from where each runs."""
    half = dataclasses.replace(shape, concurrency=max(1, shape.concurrency // 2))
    ours: list[Run] = []
    theirs: list[Run] = []
    for i in range(pairs):
        there = "autotune" if swapped else "vllm bench"
        spec = json.dumps({"url": url, "model": str(model), "vocab": vocab, "shape": dataclasses.asdict(half),
                           "seed": 1000 + i if swapped else i, "client": there})
        proc = subprocess.Popen([sys.executable, "-m", "benchmarks.client_vs_vllm_bench", "--child", spec],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                cwd=REPO)
        assert proc.stdout is not None
        if swapped:  # this process waits for the child's "go", as autotune does unswapped
            here = run_vllm(url, model, half, i, partial(tell_ready_and_wait, proc))
        else:
            here = run_ours(url, model, vocab, half, 1000 + i, wait=partial(wait_for_go, proc.stdout))
        out, _ = proc.communicate()
        (theirs if swapped else ours).append(here)
        (ours if swapped else theirs).append(json.loads(out.strip().splitlines()[-1]))
        print(f"  together {i + 1}: autotune p95 TTFT {ours[-1]['ttft_p95_ms']:.0f} ms, vllm bench "
              f"{theirs[-1]['ttft_p95_ms']:.0f} ms (load average {os.getloadavg()[0]:.1f})", flush=True)
    save(f"{shape.input_len}-at-once" + ("-swapped" if swapped else ""), ours, theirs)
    roles = ", autotune in the child process" if swapped else ""
    return (f"\n{describe(half)}, both clients at once{roles}\n{table(ours, theirs, 'autotune text')}\n"
            f"{pooled(ours, theirs, 'autotune text')}")


SAVE: list[Path] = []  # --save: where each comparison's runs go (JSON lines), for the pooled figures


def save(name: str, ours: list[Run], theirs: list[Run]) -> None:
    if SAVE:
        with SAVE[0].open("a") as f:
            f.write(json.dumps({"comparison": name, "autotune": ours, "vllm_bench": theirs}) + "\n")


def wait_for_go(stream: IO[str]) -> None:
    while (line := stream.readline()) and line.strip() != "go":
        pass


def ready_then_go() -> None:
    """Swapped, in the child: once this process's warm-up is done and the parent said it is ready, "go"."""
    while (line := sys.stdin.readline()) and line.strip() != "ready":
        pass
    say_go()


def tell_ready_and_wait(proc: subprocess.Popen[str]) -> None:
    """Swapped, in the parent: ready (vllm bench's test request done), then wait for the child's "go"."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("ready\n")
    proc.stdin.flush()
    wait_for_go(proc.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--workloads", nargs="+", choices=sorted(SHAPES), default=["long", "variable"])
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--ids", action="store_true", help="also run autotune with token-id prompts (in turn)")
    ap.add_argument("--modes", nargs="+", choices=["in-turn", "at-once"], default=["in-turn"],
                    help="in turn: one client after the other; at once: both together, half the load each")
    ap.add_argument("--save", type=Path, help="append every run's figures and TTFTs to this JSON-lines file")
    ap.add_argument("--swapped", action="store_true", help="at once: autotune in the child process, vllm bench here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.save:
        SAVE.append(opts.save)
    if opts.child:
        child(opts.child)
        return
    work = Path(tempfile.mkdtemp(prefix="client-bench-"))
    model, vocab = tiny_model(work / "tiny-dense")
    tables = []
    quiet = engine_lock() if "in-turn" in opts.modes else contextlib.nullcontext()
    with quiet, vllm_server(model, work / "vllm.log") as url:
        # Not counted: the server's first requests and each client's lazy imports pay one-off costs.
        warm = Shape(256, 0.0, 16, 4, 8)
        run_ours(url, model, vocab, warm, seed=99)
        run_vllm(url, model, warm, seed=99)
        for name in opts.workloads:
            print(f"{name}:", flush=True)
            if "in-turn" in opts.modes:
                tables.append(compare(url, model, vocab, SHAPES[name], opts.pairs, opts.ids))
            if "at-once" in opts.modes:
                tables.append(together(url, model, vocab, SHAPES[name], opts.pairs, opts.swapped))
    print("\n".join(tables))


if __name__ == "__main__":
    main()
