"""What pruning an out-of-memory configuration before boot saves, measured on the vLLM CPU build.

1. Time per estimate: the median of many calls of estimate() (the memory model alone) and of judge() (the
   pruning decision: the estimate corrected by a study's observations and checked against its out-of-memory
   trials), for the tiny models on the CPU build and Qwen3.5-27B on an RTX 3090 (shapes from
   autotune/engine/known_models).
2. The cost of one infeasible configuration: without pruning, booted for real until autotune has classified the
   failure (and until the server is stopped); with pruning, the decision (judge) and the decision recorded in a
   SQLite study (ask, judge, tell_rejected), side by side with the ratio.
3. Predicted against observed KV-cache tokens for every configuration booted here.

    .venv/bin/python -m benchmarks.oom_pruning [--calls 2000] [--no-boot]

Takes /tmp/autotune-engine.lock around each boot, so only one vLLM server runs on this machine at a time.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import optuna

from autotune.engine.defaults import installed_vllm_version
from autotune.engine.logs import Failure
from autotune.engine.models import resolve_model
from autotune.engine.server import BootFailed, EngineSpec, Server
from autotune.fit.estimate import estimate
from autotune.fit.feasibility import Observation, judge, model_shape, prediction_attrs
from autotune.fit.hardware import GpuProfile, cpu_profile, get_profile
from autotune.search import record as search_record
from autotune.search import tell
from autotune.units import GiB, MiB
from benchmarks.engine_lock import engine_lock

REPO = Path(__file__).resolve().parents[1]

EAGER = {"load_format": "dummy", "enforce_eager": True}


@dataclass(frozen=True)
class Case:
    label: str
    model: str  # tiny:dense / tiny:hybrid or a hub id with a shipped config
    profile: str  # "cpu" or a GPU profile name
    flags: Mapping[str, object]
    env: Mapping[str, str]

    def resolved(self) -> tuple[str, dict[str, object], GpuProfile]:
        model, defaults = resolve_model(self.model)
        extra = EAGER if self.profile == "cpu" else {}
        profile = cpu_profile() if self.profile == "cpu" else get_profile(self.profile)
        return model, {**defaults, **extra, **self.flags}, profile


ESTIMATE_CASES = [
    Case("tiny dense, CPU, 1 GiB KV", "tiny:dense", "cpu", {"max_model_len": 2048}, {"VLLM_CPU_KVCACHE_SPACE": "1"}),
    Case("tiny hybrid, CPU, 512 MiB KV", "tiny:hybrid", "cpu",
         {"max_model_len": 4096, "kv_cache_memory_bytes": 512 * MiB}, {}),
    Case("Qwen3.5-27B GPTQ-Int4, RTX 3090", "Qwen/Qwen3.5-27B-GPTQ-Int4", "rtx3090",
         {"max_model_len": 4096, "max_num_seqs": 16, "max_num_batched_tokens": 8192}, {}),
    Case("Qwen3.5-27B GPTQ-Int4, RTX 3090, 32 seqs (no fit)", "Qwen/Qwen3.5-27B-GPTQ-Int4", "rtx3090",
         {"max_model_len": 8192, "max_num_seqs": 32, "max_num_batched_tokens": 8192}, {}),
    Case("Qwen3.5-27B bf16, RTX 3090 (no fit)", "Qwen/Qwen3.5-27B", "rtx3090",
         {"max_model_len": 8192, "max_num_seqs": 32, "max_num_batched_tokens": 8192}, {}),
]
# Booted for real. The first two cannot hold one request of max_model_len: the cost pruning saves.
BOOT_CASES = [
    Case("dense: 1 MiB KV, max_model_len 4096", "tiny:dense", "cpu",
         {"max_model_len": 4096, "kv_cache_memory_bytes": MiB}, {}),
    Case("hybrid: 4 MiB KV, max_model_len 8192", "tiny:hybrid", "cpu",
         {"max_model_len": 8192, "kv_cache_memory_bytes": 4 * MiB}, {}),
    Case("dense: 256 MiB KV, max_model_len 1000", "tiny:dense", "cpu",
         {"max_model_len": 1000, "kv_cache_memory_bytes": 256 * MiB}, {}),
    Case("hybrid: VLLM_CPU_KVCACHE_SPACE=1, max_model_len 8192", "tiny:hybrid", "cpu",
         {"max_model_len": 8192, "max_num_seqs": 32}, {"VLLM_CPU_KVCACHE_SPACE": "1"}),
    Case("dense: no KV size, gpu_memory_utilization 0.4", "tiny:dense", "cpu",
         {"max_model_len": 2048, "max_num_seqs": 16, "gpu_memory_utilization": 0.4}, {}),
]


def median_s(fn: Callable[[], object], calls: int) -> float:
    fn()  # warm (parses and caches the model's config)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def study_observations(flags: Mapping[str, object], n: int = 20) -> list[Observation]:
    """A study's worth of booted trials: some with KV figures, some memory failures of other configurations."""
    out = []
    for i in range(n):
        varied = {**flags, "max_num_seqs": 8 + i}
        if i % 4 == 3:
            out.append(Observation(i, {**varied, "max_model_len": 1 << 20}, None, None, None, True))
        else:
            out.append(Observation(i, varied, 500_000, 490_000 + i, 2048.0, False))
    return out


def fmt_s(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.1f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.0f} µs"


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def estimate_times(calls: int) -> str:
    """estimate() alone, and judge() as the study calls it (20 observations; it also looks up the installed
    vLLM's version, timed apart in the last column)."""
    t_version = median_s(installed_vllm_version, calls)
    rows = []
    for case in ESTIMATE_CASES:
        model, flags, profile = case.resolved()
        shape = model_shape(model)
        kv = float(case.env["VLLM_CPU_KVCACHE_SPACE"]) * GiB if "VLLM_CPU_KVCACHE_SPACE" in case.env else None
        obs = study_observations(flags)
        t_est = median_s(functools.partial(estimate, shape, profile, flags, cpu_kvcache_bytes=kv), calls)
        t_judge = median_s(functools.partial(judge, model, profile, flags, case.env, obs), calls)
        v = judge(model, profile, flags, case.env, obs)
        rows.append([case.label, fmt_s(t_est), fmt_s(t_judge), fmt_s(t_version), "yes" if v.fits else "no",
                     f"{v.estimate.kv_tokens:,}"])
    return table(["configuration", "estimate()", "judge(), 20 obs", "of which version lookup", "fits", "KV tokens"],
                 rows)


def record_time(model: str, profile: GpuProfile, flags: Mapping[str, object], env: Mapping[str, str],
                calls: int) -> float:
    """Median of the whole pruned trial as one_trial.py runs it: ask, judge, attributes, tell_rejected (SQLite)."""
    with tempfile.TemporaryDirectory() as tmp:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(storage=f"sqlite:///{tmp}/prune.db")
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            trial = study.ask()
            for key, value in search_record.config_attrs(model, flags).items():
                trial.set_user_attr(key, value)
            verdict = judge(model, profile, flags, env)
            for key, value in prediction_attrs(verdict.estimate).items():
                trial.set_user_attr(key, value)
            tell.tell_rejected(study, trial, f"predicted not to fit: {verdict.reason}",
                                  memory_excess=verdict.excess_gib)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)




@dataclass(frozen=True)
class Booted:
    case: Case
    predicted_fits: bool
    predicted_tokens: int
    observed_tokens: int | None
    failure: Failure | None
    classified_s: float  # start -> ready, or start -> failure classified
    stopped_s: float  # start -> process group gone


def boot(case: Case, log: Path) -> Booted:
    model, flags, profile = case.resolved()
    verdict = judge(model, profile, flags, case.env)
    server = Server(EngineSpec(model, flags, env=dict(case.env), boot_timeout_s=600), log)
    with engine_lock():
        t0 = time.monotonic()
        server.start()
        try:
            info = server.wait_ready()
            observed, failure = info.kv_cache_tokens, None
        except BootFailed as e:
            observed, failure = None, e.failure
        classified = time.monotonic() - t0
        server.stop()
        stopped = time.monotonic() - t0
    return Booted(case, verdict.fits, verdict.estimate.kv_tokens, observed, failure, classified, stopped)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per timing median")
    parser.add_argument("--no-boot", action="store_true", help="only the estimate timings")
    args = parser.parse_args()

    print(f"Time per estimate (median of {args.calls} calls)\n")
    print(estimate_times(args.calls), flush=True)
    if args.no_boot:
        return

    print(f"\nBooting {len(BOOT_CASES)} configurations for real (vLLM CPU build, --enforce-eager)", flush=True)
    booted = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, case in enumerate(BOOT_CASES):
            print(f"  {case.label}", flush=True)
            booted.append(boot(case, Path(tmp) / f"boot-{i}.log"))

    rows = []
    for b in booted:
        if b.failure is None:
            continue
        model, flags, profile = b.case.resolved()
        decide = median_s(functools.partial(judge, model, profile, flags, b.case.env), args.calls)
        record = record_time(model, profile, flags, b.case.env, min(args.calls, 50))
        rows.append([b.case.label, b.failure.kind.value, fmt_s(b.classified_s), fmt_s(b.stopped_s), fmt_s(decide),
                     fmt_s(record), f"{b.classified_s / decide:,.0f}x", f"{b.classified_s / record:,.0f}x"])
    print("\nAn infeasible configuration: booted until classified (without pruning) against pruned before boot\n")
    print(table(["configuration", "failure", "boot->classified", "->stopped", "judge()", "judge+record",
                 "ratio judge", "ratio record"], rows))

    rows = []
    for b in booted:
        observed = f"{b.observed_tokens:,}" if b.observed_tokens is not None else f"failed: {b.failure.kind.value}"
        gap = (f"{(b.predicted_tokens - b.observed_tokens) / b.observed_tokens:+.2%}"
               if b.observed_tokens else "-")
        verdict_ok = b.predicted_fits == (b.failure is None)
        rows.append([b.case.label, "fits" if b.predicted_fits else "does not fit", f"{b.predicted_tokens:,}", observed,
                     gap, "agrees" if verdict_ok else "DISAGREES", fmt_s(b.classified_s)])
    print("\nPredicted against observed KV-cache tokens\n")
    print(table(["configuration", "predicted", "pred. tokens", "observed", "gap", "verdict", "boot"], rows))


if __name__ == "__main__":
    main()
