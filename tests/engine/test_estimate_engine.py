"""The memory model against the real vLLM CPU build: predicted KV-cache tokens against what vLLM prints, and
verdicts at the boundary (predicted to just fit boots, predicted to just miss fails), so the estimator is shown to
be neither optimistic nor merely pessimistic. Four boots in all (about 3-5 minutes on 2 cores), each holding the
machine's engine lock.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from processes import vllm_processes

from autotune.engine.logs import BootInfo, Failure, FailureKind
from autotune.engine.models import resolve_model
from autotune.engine.server import BootFailed, EngineSpec, Server
from autotune.fit.feasibility import Verdict, judge
from autotune.fit.hardware import cpu_profile, host_has_avx512_bf16
from autotune.units import GiB, MiB
from benchmarks.engine_lock import engine_lock as machine_engine_lock

EAGER = {"load_format": "dummy", "enforce_eager": True}
TOLERANCE = 0.10
_AUTO_KV = re.compile(r"Auto set \(([\d.]+)/[\d.]+\) GiB for KV cache on node \d+, with ([\d.]+) GiB requested"
                      r" memory for the worker\. ([\d.]+) GiB memory was consumed")


@pytest.fixture()
def engine_lock() -> Iterator[None]:
    """Only one vLLM server runs at a time on this machine: hold its lock around each boot."""
    with machine_engine_lock():
        yield


def predict(name: str, flags: Mapping[str, object], env: Mapping[str, str]) -> tuple[str, dict, Verdict]:
    model, defaults = resolve_model(name)
    full = {**defaults, **EAGER, **flags}
    return model, full, judge(model, cpu_profile(), full, env)


def boot(model: str, flags: Mapping[str, object], env: Mapping[str, str],
         log: Path) -> tuple[BootInfo | Failure, list[str]]:
    """Boot for real and stop at once: what vLLM computed at startup, or why it refused. A refusal must be
    seen the moment its line appears: the boot ends within a second of it, not at the 600 s boot timeout."""
    server = Server(EngineSpec(model, flags, env=dict(env), boot_timeout_s=600), log)
    try:
        server.start()
        try:
            return server.wait_ready(), list(server.lines)
        except BootFailed as e:
            detected = time.monotonic()
            assert server.failure_seen_at is not None and detected - server.failure_seen_at < 1.0
            assert e.boot_s < 180
            return e.failure, list(server.lines)
    finally:
        server.stop()
        assert vllm_processes() == []


def assert_close(predicted: int, observed: int | None, lines: list[str]) -> None:
    assert observed is not None, "vLLM printed no KV cache size:\n" + "\n".join(lines[-20:])
    gap = (predicted - observed) / observed
    assert abs(gap) <= TOLERANCE, f"predicted {predicted:,} KV tokens, vLLM printed {observed:,} ({gap:+.1%})"


# The dense model under VLLM_CPU_KVCACHE_SPACE=1 served float32 (262,144 tokens) is checked in test_engine's trial test.
@pytest.mark.parametrize("name,flags,env", [
    # On AVX2: 640-token blocks of 320 KiB (the GDN state page, 274,432 B a layer, rounded up to 128-token attention
    # pages of 512 B a token); 512 MiB / 320 KiB = 1638; a request of 4096 takes 7 attention + 3 x 2 state blocks:
    # 126 x 4096. With AVX512-BF16 the recurrent state is float32 (the boundary test below): 1152-token blocks.
    ("tiny:hybrid", {"max_model_len": 4096, "kv_cache_memory_bytes": 512 * MiB}, {}),
], ids=["hybrid-flag-512MiB"])
def test_predicted_kv_tokens_match_what_vllm_prints(name, flags, env, tmp_path, engine_lock) -> None:
    model, full, verdict = predict(name, flags, env)
    assert verdict.fits, verdict.reason
    result, lines = boot(model, full, env, tmp_path / "server.log")
    assert isinstance(result, BootInfo), f"predicted to fit, but: {result}"
    assert_close(verdict.estimate.kv_tokens, result.kv_cache_tokens, lines)


def test_boundary_just_fits_boots_and_just_misses_fails(tmp_path, engine_lock) -> None:
    """The hybrid model at the estimator's own boundary: (blocks per request + the null block) x block bytes."""
    flags = {"max_model_len": 2048, "max_num_seqs": 4}
    _, _, probe = predict("tiny:hybrid", {**flags, "kv_cache_memory_bytes": GiB}, {})
    edge = (probe.estimate.blocks_per_request + 1) * probe.estimate.bytes_per_block
    # One GDN layer's state page: the conv state in bf16 and the recurrent state, which vLLM's CPU build keeps in
    # float32 where its accelerated GDN path runs (AVX512-BF16: platforms/cpu.py), else in bf16; rounded up to
    # 128-token attention pages of 512 B a token (AVX2: 640-token blocks; AVX512-BF16: 1152).
    page = 3 * 2048 * 2 + 8 * 128 * 128 * (4 if host_has_avx512_bf16() else 2)
    block_tokens = math.ceil(page / (128 * 512)) * 128
    # 2048 tokens of attention blocks + 2 state blocks x 3 GDN groups + the null block
    assert edge == (math.ceil(2048 / block_tokens) + 3 * 2 + 1) * block_tokens * 512

    model, fit_flags, fits = predict("tiny:hybrid", {**flags, "kv_cache_memory_bytes": edge}, {})
    _, miss_flags, misses = predict("tiny:hybrid", {**flags, "kv_cache_memory_bytes": edge - 1}, {})
    assert fits.fits and not misses.fits and "one request of max_model_len 2,048" in misses.reason

    result, lines = boot(model, miss_flags, {}, tmp_path / "miss.log")
    assert isinstance(result, Failure), "predicted not to fit (one byte short), but vLLM booted it"
    assert result.kind is FailureKind.KV_CACHE_TOO_SMALL and result.kind.is_memory, result.reason
    assert "max seq len (2048)" in result.reason

    result, lines = boot(model, fit_flags, {}, tmp_path / "fit.log")
    assert isinstance(result, BootInfo), f"predicted to just fit, but: {result}"
    assert_close(fits.estimate.kv_tokens, result.kv_cache_tokens, lines)


def test_default_cpu_budget_node_memory_times_utilization_minus_worker_rss(tmp_path, engine_lock) -> None:
    """No explicit KV size: vLLM gives ceil(node-0 MemTotal x utilization) less the worker's RSS after warm-up.
    The RSS is a runtime figure (CPU_RUNTIME_RSS_BYTES); the failure message says how far it was off."""
    flags = {"max_model_len": 2048, "max_num_seqs": 16, "gpu_memory_utilization": 0.4}
    model, full, verdict = predict("tiny:dense", flags, {})
    assert verdict.fits, verdict.reason
    result, lines = boot(model, full, {}, tmp_path / "server.log")
    if isinstance(result, Failure) and result.kind is FailureKind.MEMORY_HELD:
        pytest.skip(f"other processes hold node 0's memory: {result.reason}")
    assert isinstance(result, BootInfo), f"predicted to fit, but: {result}"
    auto = next((m for line in lines if (m := _AUTO_KV.search(line))), None)
    assert auto is not None, "vLLM did not log its automatic KV size"
    kv_gib, requested_gib, rss_gib = (float(g) for g in auto.groups())
    est = verdict.estimate
    assert abs(requested_gib - est.reserved_bytes / GiB) <= 0.01  # the same node total x utilization
    predicted_rss = (est.weights_bytes + est.activation_peak_bytes + est.overhead_bytes) / GiB
    detail = f"worker RSS {rss_gib:.2f} GiB against {predicted_rss:.2f} GiB predicted; KV {kv_gib:.2f} GiB"
    assert result.kv_cache_tokens is not None
    gap = (est.kv_tokens - result.kv_cache_tokens) / result.kv_cache_tokens
    assert abs(gap) <= TOLERANCE, f"predicted {est.kv_tokens:,}, vLLM {result.kv_cache_tokens:,} ({gap:+.1%}): {detail}"
