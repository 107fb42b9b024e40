"""Engine tests: the real vLLM CPU build serving the tiny models. Slow (a boot is 30-60 s on 2 cores)."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from processes import vllm_processes

from autotune.engine import BootFailed, EngineSpec, FailureKind, Server, launch
from autotune.load import LoadLevel, measure_level
from autotune.metrics import Limits, level_stats
from autotune.spec import load_objective
from autotune.tinymodel import resolve_model
from autotune.trial import LevelOutcome, TrialPlan, model_vocab_size, run_trial
from autotune.workload import LengthDist, Workload

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parents[1]
EAGER = {"enforce_eager": True, "load_format": "dummy"}
SMALL_KV = {"VLLM_CPU_KVCACHE_SPACE": "1"}



def test_trial_boots_measures_two_levels_and_leaves_no_process(tmp_path: Path) -> None:
    model, defaults = resolve_model("tiny:dense")
    shipped = load_objective(ROOT / "objectives" / "tiny-cpu.toml")
    # Limits no level can miss, so the search is certain to measure two levels (the verdict logic is unit-tested).
    objective = replace(shipped, limits=Limits(ttft_p95_ms=60_000),
                        load=replace(shipped.load, max=4, min_requests=12, warmup_requests=2))
    spec = EngineSpec(model, {**defaults, **EAGER, "max_num_seqs": 8}, env=SMALL_KV, boot_timeout_s=300)
    seen_levels: list[float] = []

    def stop_after_two(step: int, value: float, outcome: LevelOutcome) -> str | None:
        seen_levels.append(value)
        return "two levels are enough" if step == 1 else None

    result = run_trial(TrialPlan(spec, objective, model_vocab_size(model), tmp_path / "server.log"),
                       on_level=stop_after_two)
    assert result.boot is not None and result.boot.kv_cache_tokens == 524_288  # 1 GiB / 2 KiB per token
    assert seen_levels == [1, 2]
    assert result.status == "stopped" and result.stop_reason == "two levels are enough"
    for _, level in result.levels:
        assert level.stats.completed >= objective.load.min_requests and level.stats.failed == 0
        assert level.stats.output_tok_s > 0 and level.stats.ttft.p95_ms > 0
    assert result.memory is not None and result.memory.source == "rss" and result.memory.peak_bytes > 2**28
    assert (tmp_path / "server.log").read_text().count("KV cache size") == 1
    time.sleep(1)
    assert vllm_processes() == []


def test_kv_cache_too_small_is_a_memory_failure_seen_at_once(tmp_path: Path) -> None:
    model, defaults = resolve_model("tiny:dense")
    # 1 MiB of KV cache holds 512 tokens; max_model_len 4096 cannot be served. vLLM says so during the boot.
    spec = EngineSpec(model, {**defaults, **EAGER, "kv_cache_memory_bytes": 2**20, "max_model_len": 4096},
                      boot_timeout_s=600)
    server = Server(spec, tmp_path / "server.log")
    try:
        server.start()
        with pytest.raises(BootFailed) as info:
            server.wait_ready()
        detected = time.monotonic()
    finally:
        server.stop()
    failure = info.value.failure
    assert failure.kind is FailureKind.KV_CACHE_TOO_SMALL and failure.kind.is_memory
    assert "max seq len (4096)" in failure.reason
    # The boot ends within a second of the error line appearing, not at the 600 s boot timeout.
    assert server.failure_seen_at is not None and detected - server.failure_seen_at < 1.0
    assert info.value.boot_s < 180
    assert vllm_processes() == []


def test_a_request_error_during_load_is_counted_not_lost(tmp_path: Path) -> None:
    model, defaults = resolve_model("tiny:dense")
    spec = EngineSpec(model, {**defaults, **EAGER, "max_model_len": 512}, env=SMALL_KV, boot_timeout_s=300)
    ok = Workload(LengthDist(mean=64), LengthDist(mean=16)).requests(10, model_vocab_size(model))
    too_long = Workload(LengthDist(mean=600), LengthDist(mean=16)).requests(2, model_vocab_size(model), seed_offset=1)
    with launch(spec, tmp_path / "server.log") as (server, _info):
        run = measure_level(server.base_url, server.model, ok + too_long, LoadLevel("concurrency", 4))
    stats = level_stats(run, load_objective(ROOT / "objectives" / "tiny-cpu.toml").limits)
    assert stats.completed == 10
    assert stats.failed == 2
    assert sum(stats.errors.values()) == 2
    assert any("400" in msg or "maximum context length" in msg.lower() for msg in stats.errors)


def test_stop_kills_the_whole_process_group_when_the_caller_raises(tmp_path: Path) -> None:
    model, defaults = resolve_model("tiny:dense")
    spec = EngineSpec(model, {**defaults, **EAGER}, env=SMALL_KV, boot_timeout_s=300)
    pids: list[int] = []
    with pytest.raises(RuntimeError, match="caller failed"):
        with launch(spec, tmp_path / "server.log") as (server, _info):
            root = psutil.Process(server.pid)
            pids = [root.pid] + [c.pid for c in root.children(recursive=True)]
            assert len(pids) >= 2  # API server plus engine core (and its worker)
            raise RuntimeError("caller failed")
    time.sleep(0.5)
    assert [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE] == []
    assert os.path.exists(tmp_path / "server.log")
