"""Engine tests: the real vLLM CPU build serving the tiny models. Slow (a boot is 30-60 s on 2 cores)."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from processes import vllm_processes

from autotune.config.objective import load_objective
from autotune.engine.models import model_vocab_size, resolve_model
from autotune.engine.server import EngineSpec, launch
from autotune.fit.feasibility import judge
from autotune.fit.hardware import cpu_profile
from autotune.measure.client import LoadLevel, measure_level
from autotune.measure.plan import TrialPlan
from autotune.measure.stats import Limits, level_stats
from autotune.measure.trial import LevelOutcome, run_trial
from autotune.measure.workload import LengthDist, Workload, prompt_decoder

ROOT = Path(__file__).resolve().parents[2]
# float32 as studies/tiny-cpu.toml serves it: bf16 on a CPU without AVX512-BF16 is 25x slower (benchmarks/cpu_dtype.py)
EAGER = {"enforce_eager": True, "load_format": "dummy", "dtype": "float32"}
SMALL_KV = {"VLLM_CPU_KVCACHE_SPACE": "1"}



def test_trial_boots_measures_two_levels_and_leaves_no_process(tmp_path: Path) -> None:
    model, defaults = resolve_model("tiny:dense")
    shipped = load_objective(ROOT / "objectives" / "tiny-cpu.toml")
    # Limits no level can miss, so the search is certain to measure two levels (the verdict logic is unit-tested).
    objective = replace(shipped, limits=Limits(p95_ttft_ms=60_000),
                        load=replace(shipped.load, max=4, min_requests=12, warmup_requests=2))
    spec = EngineSpec(model, {**defaults, **EAGER, "max_num_seqs": 8}, env=SMALL_KV, boot_timeout_s=300)
    seen_levels: list[float] = []

    def stop_after_two(step: int, value: float, outcome: LevelOutcome) -> str | None:
        seen_levels.append(value)
        return "two levels are enough" if step == 1 else None

    result = run_trial(TrialPlan(spec, objective, model_vocab_size(model), tmp_path / "server.log"),
                       on_level=stop_after_two)
    # 1 GiB / 4 KiB per token: float32 KV (the cache's "auto" follows --dtype; bfloat16 printed 524,288)
    assert result.boot is not None and result.boot.kv_cache_tokens == 262_144
    predicted = judge(model, cpu_profile(), spec.flags, SMALL_KV).estimate.kv_tokens  # the estimator agrees
    assert abs(predicted - 262_144) / 262_144 <= 0.10, predicted
    assert seen_levels == [2, 4]  # no prior: the geometric middle of [1, 4], then one factor up
    assert result.status == "stopped" and result.stop_reason == "two levels are enough"
    for _, level in result.levels:
        assert level.stats.completed >= objective.load.min_requests and level.stats.failed == 0
        assert level.stats.output_throughput > 0 and level.stats.ttft.p95_ms > 0
    assert result.memory is not None and result.memory.source == "rss" and result.memory.peak_bytes > 2**28
    assert (tmp_path / "server.log").read_text().count("KV cache size") == 1
    time.sleep(1)
    assert vllm_processes() == []


def test_a_request_error_is_counted_not_lost_and_stop_kills_the_group_when_the_caller_raises(tmp_path: Path) -> None:
    """One boot for three things: requests too long for max_model_len fail alone (HTTP 400) while the others
    complete; text prompts (`prompt = "text"`) are served and counted by the server's tokenizer; then the caller
    raises inside `launch` and nothing of the server's process group survives."""
    model, defaults = resolve_model("tiny:dense")
    spec = EngineSpec(model, {**defaults, **EAGER, "max_model_len": 512}, env=SMALL_KV, boot_timeout_s=300)
    ok = Workload(LengthDist(mean=64), LengthDist(mean=16)).requests(10, model_vocab_size(model))
    text = Workload(LengthDist(mean=64), LengthDist(mean=16), prompt="text").requests(
        4, model_vocab_size(model), seed_offset=2, decode=prompt_decoder(model))
    too_long = Workload(LengthDist(mean=600), LengthDist(mean=16)).requests(2, model_vocab_size(model), seed_offset=1)
    pids: list[int] = []
    with pytest.raises(RuntimeError, match="caller failed"):
        with launch(spec, tmp_path / "server.log") as (server, _info):
            run = measure_level(server.base_url, server.model, ok + text + too_long, LoadLevel("concurrency", 4))
            root = psutil.Process(server.pid)
            pids = [root.pid] + [c.pid for c in root.children(recursive=True)]
            raise RuntimeError("caller failed")
    time.sleep(0.5)
    assert len(pids) >= 2  # API server plus engine core (and its worker)
    assert [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE] == []
    assert os.path.exists(tmp_path / "server.log")
    stats = level_stats(run, load_objective(ROOT / "objectives" / "tiny-cpu.toml").limits)
    assert stats.completed == 14
    assert stats.failed == 2
    sent_as_text = run.records[10:14]  # records keep the order of the requests given
    assert [(r.error, r.prompt_tokens) for r in sent_as_text] == [(None, 64)] * 4  # the server's own count
    assert sum(stats.errors.values()) == 2
    assert any("400" in msg or "maximum context length" in msg.lower() for msg in stats.errors)
