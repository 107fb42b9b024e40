"""Failure classification against real logs captured from the vLLM CPU build (tests/data/logs)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from autotune.engine.logs import (
    Failure,
    FailureKind,
    classify_line,
    classify_log,
    parse_boot_info,
    watch_line,
    while_serving,
)

LOGS = Path(__file__).parents[2] / "data" / "logs"


def lines(name: str) -> list[str]:
    return (LOGS / name).read_text().splitlines()


@pytest.mark.parametrize(
    ("log", "kind", "fragment"),
    [
        ("cpu-kv-too-small-for-max-model-len.log", FailureKind.KV_CACHE_TOO_SMALL, "max seq len (4096)"),
        ("cpu-mem-util-unavailable.log", FailureKind.MEMORY_HELD, "less than desired CPU memory utilization"),
        ("cpu-batched-tokens-below-seqs.log", FailureKind.INVALID_CONFIG, "max_num_batched_tokens"),
        ("cpu-unknown-flag.log", FailureKind.INVALID_CONFIG, "--max-num-seqz"),
        ("cpu-missing-model.log", FailureKind.MODEL_NOT_FOUND, "does-not-exist"),
        # A hub id whose weights are not cached, with no network (this machine): every trial would fail alike.
        ("cpu-hub-unreachable.log", FailureKind.MODEL_NOT_FOUND, "cannot find the requested files in the local cache"),
    ],
)
def test_real_failure_logs_are_classified(log: str, kind: FailureKind, fragment: str) -> None:
    failure = classify_log(lines(log))
    assert failure is not None
    assert failure.kind is kind
    assert fragment in failure.excerpt or fragment in failure.reason
    assert len(failure.reason) <= 300
    assert "pid=" not in failure.reason  # vLLM's process prefix is stripped from the one-line reason


def test_a_startup_rule_vllm_asserts_after_loading_the_model_is_an_invalid_configuration() -> None:
    """A real CUDA log (vLLM 0.25.0, the held-down H100, #12 of the Marlin plan): prefix caching on a hybrid
    model with 1,024 batched tokens, under the 1,600-token block fp8 gives it. The engine loads the model, then
    asserts and dies; the wrapper's "Engine core initialization failed" is not the cause."""
    log = Path(__file__).parents[3] / "benchmarks/data/h100-as-rtx3090-awq-marlin/logs/2026-12-06T0826/12.log.gz"
    failure = classify_log(gzip.decompress(log.read_bytes()).decode().splitlines())
    assert failure.kind is FailureKind.INVALID_CONFIG
    assert "block_size (1600) must be <= max_num_batched_tokens (1024)" in failure.reason


def test_healthy_boot_logs_have_no_failure_line() -> None:
    for log in ("cpu-dense-ok.log", "cpu-hybrid-ok.log"):
        assert all(classify_line(line) is None for line in lines(log)), log
        assert classify_log(lines(log), exited=False) is None


def test_boot_info_is_parsed_from_a_real_log() -> None:
    info = parse_boot_info(lines("cpu-dense-ok.log"), boot_s=33.0)
    # "CPU KV cache size: 524,288 tokens, Maximum concurrency for 8,192 tokens per request: 64.00x"
    assert info.kv_cache_tokens == 524_288
    assert info.max_concurrency == 64.0
    assert info.max_concurrency_len == 8192
    assert info.profiled_blocks is None


def test_a_boot_given_its_blocks_says_what_vllm_would_have_sized() -> None:
    """vLLM 0.32 (CPU build), --num-gpu-blocks-override 300: "Overriding num_gpu_blocks=23403 with
    num_gpu_blocks_override=300", then the KV cache of the 300 blocks it was given (128 tokens each)."""
    info = parse_boot_info(lines("cpu-blocks-override.log"), boot_s=40.0)
    assert info.profiled_blocks == 23_403
    assert info.kv_cache_tokens == 300 * 128


def test_gpu_wordings_from_vllm_sources_are_classified() -> None:
    # Message fragments as vLLM's CUDA build prints them (read in its sources); the captured CUDA logs test them
    # in full.
    oom = FailureKind.OUT_OF_MEMORY
    assert classify_line("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB") is oom
    assert classify_line("ValueError: No available memory for the cache blocks. Try increasing") is oom
    assert classify_line(
        "ValueError: Free memory on device (3.2/23.6 GiB) on startup is less than desired GPU memory utilization"
    ) is FailureKind.MEMORY_HELD
    assert classify_line(
        "max_num_seqs (256) exceeds available Mamba cache blocks (97)"
    ) is FailureKind.TOO_MANY_SEQS_FOR_STATE
    assert classify_line("INFO 12-02 [gpu_worker.py] Model loading took 14.2 GiB memory") is None


def test_an_exit_without_a_known_cause_is_a_crash_with_the_last_lines() -> None:
    failure = classify_log(["starting", "Segmentation fault (core dumped)"])
    assert failure is not None and failure.kind is FailureKind.CRASH
    assert "Segmentation fault" in failure.excerpt
    assert failure.reason == "server exited"  # no exception line to name


def test_a_crash_names_the_exception_it_died_of() -> None:
    """vLLM's CPU build run by its `vllm` script, captured here: the reason is the traceback's last line, not a bare
    "server exited" (the excerpt keeps the lines around it)."""
    log = ["Triton is installed, but doesn't include CPU backend. Disabling Triton.", "Traceback (most recent call "
           "last):", '  File "importlib/metadata/__init__.py", line 1008, in version', "    return distribution("
           "distribution_name).version", "importlib.metadata.PackageNotFoundError: No package metadata was found for "
           "vllm"]
    failure = classify_log(log)
    assert failure.kind is FailureKind.CRASH
    assert failure.reason == ("server exited: importlib.metadata.PackageNotFoundError: No package metadata was found "
                              "for vllm")


# A vLLM v1 engine that ran out of memory under load, as a 24 GiB card printed it: lines of the log posted in
# https://github.com/noonghunna/club-3090/issues/58 (the API server's EngineDeadError first, then the engine
# core's traceback, whose last line is the title) and the logger.exception line
# "EngineCore encountered a fatal error." that vllm/v1/engine/core.py (0.25.0: line 1233) writes before it.
RUNTIME_OOM = [
    "(APIServer pid=1) INFO 05-05 12:36:41 [loggers.py:259] Engine 000: Avg prompt throughput: 0.0 tokens/s",
    "(EngineCore pid=104) ERROR 05-05 12:36:59 [core.py:1138] EngineCore encountered a fatal error.",
    "(APIServer pid=1) ERROR 05-05 12:36:59 [serving.py:1173] vllm.v1.engine.exceptions.EngineDeadError: "
    "EngineCore encountered an issue. See stack trace (above) for the root cause.",
    "(EngineCore pid=104) Process EngineCore:",
    "(EngineCore pid=104) Traceback (most recent call last):",
    '(EngineCore pid=104)   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 1170, '
    "in run_busy_loop",
    "(EngineCore pid=104)     self._process_engine_step()",
    "(EngineCore pid=104) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB. GPU 0 has a "
    "total capacity of 23.56 GiB of which 56.88 MiB is free.",
]


def test_an_engine_that_dies_of_out_of_memory_under_load_is_a_memory_failure() -> None:
    # As the server's log reader keeps it, line by line: the "engine died" line first, then its cause.
    known = None
    for line in RUNTIME_OOM:
        known = watch_line(known, line) or known
    assert known is FailureKind.OUT_OF_MEMORY and known.is_memory
    assert classify_log(RUNTIME_OOM).kind is FailureKind.OUT_OF_MEMORY


def test_an_engine_death_without_a_known_cause_stays_a_crash_and_the_first_cause_wins() -> None:
    known = None
    for line in RUNTIME_OOM[:-1]:
        known = watch_line(known, line) or known
    assert known is FailureKind.CRASH
    assert watch_line(FailureKind.KV_CACHE_TOO_SMALL, RUNTIME_OOM[-1]) is None


GPU_LOGS = Path(__file__).parents[2] / "data" / "gpu"


def test_a_kernel_that_runs_out_of_memory_mid_prefill_is_a_memory_failure_in_one_line() -> None:
    """CUDA's own out-of-memory error (torch.AcceleratorError), raised where a long prompt's chunk needs more than
    the boot's profiling saw, after the engine-died wrapper and the scheduler dump, as vLLM 0.32 logs it."""
    log = (GPU_LOGS / "cuda-0.32-oom-mid-prefill.log").read_text().splitlines()
    known = None
    for line in log:  # as the server's log reader keeps it, line by line
        known = watch_line(known, line) or known
    assert known is FailureKind.OUT_OF_MEMORY
    failure = classify_log(log)
    assert failure.kind is FailureKind.OUT_OF_MEMORY
    assert failure.reason == "out of memory: torch.AcceleratorError: CUDA error: out of memory"
    told = while_serving(failure, "concurrency 2")
    assert told.reason == "out of memory while serving concurrency 2: torch.AcceleratorError: CUDA error: out of memory"
    assert "\n" not in told.reason and told.kind.is_memory and told.excerpt == failure.excerpt


def test_other_out_of_memory_wordings_of_a_prefill_are_memory_failures() -> None:
    oom = FailureKind.OUT_OF_MEMORY
    assert classify_line("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
                         ) is oom
    assert classify_line("RuntimeError: CUDA driver error: cudaErrorMemoryAllocation") is oom
    assert classify_line("RuntimeError: [enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: not enough "
                         "memory: you tried to allocate 1073741824 bytes.") is oom
    crash = Failure(FailureKind.CRASH, "engine died: EngineCore encountered a fatal error.")
    assert while_serving(crash, "concurrency 2") == crash  # only a memory failure is reworded
