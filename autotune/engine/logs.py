"""The server log read as vLLM writes it: why a boot or a run failed, and the figures a boot prints."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Literal, overload


class FailureKind(str, Enum):
    OUT_OF_MEMORY = "out_of_memory"
    KV_CACHE_TOO_SMALL = "kv_cache_too_small"
    TOO_MANY_SEQS_FOR_STATE = "too_many_seqs_for_state"
    MEMORY_HELD = "memory_held_by_another_process"
    INVALID_CONFIG = "invalid_config"
    PORT_IN_USE = "port_in_use"
    MODEL_NOT_FOUND = "model_not_found"
    BOOT_TIMEOUT = "boot_timeout"
    CRASH = "crash"
    UNRESPONSIVE = "unresponsive"
    CANCELLED = "cancelled"
    KILLED = "killed_from_outside"  # a signal autotune did not send, and no failure in the log
    FROZEN = "frozen_from_outside"  # silent because a process of it was stopped (SIGSTOP) by someone else
    NOT_MEASURED = "not_measured"  # served, but the figure the objective maximises was not measured (no NVML energy)

    @property
    def is_memory(self) -> bool:
        return self in (FailureKind.OUT_OF_MEMORY, FailureKind.KV_CACHE_TOO_SMALL, FailureKind.TOO_MANY_SEQS_FOR_STATE)


# The memory kinds as stored in a trial's `failure_kind` attribute (a plain string there).
MEMORY_FAILURE_KINDS = frozenset(k.value for k in FailureKind if k.is_memory)


@dataclass(frozen=True)
class Failure:
    """Why a server did not boot or died: a class, a one-line reason, and the log lines that prove it."""

    kind: FailureKind
    reason: str
    excerpt: str = ""


# (kind, pattern). Order matters: the specific causes come before the generic wrappers. Patterns match stable
# fragments of vLLM's messages across versions (see tests/data/logs for the real lines they were taken from).
_PATTERNS: list[tuple[FailureKind, re.Pattern[str]]] = [
    (FailureKind.MEMORY_HELD, re.compile(r"Free memory on device .* is less than desired GPU memory utilization")),
    (FailureKind.MEMORY_HELD, re.compile(r"Available memory on node \d+ .* on startup is less than desired")),
    (FailureKind.TOO_MANY_SEQS_FOR_STATE, re.compile(r"exceeds available Mamba cache blocks|mamba cache blocks", re.I)),
    (FailureKind.KV_CACHE_TOO_SMALL, re.compile(
        r"KV cache is needed, which is larger than the available KV cache memory"
        r"|is larger than the maximum number of tokens that can be stored in KV cache")),
    (FailureKind.OUT_OF_MEMORY, re.compile(
        r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError|No available memory for the cache blocks"
        r"|on kv cache allocation is less than requested memory|Cannot allocate memory"
        # An allocation outside PyTorch's caching allocator, as a long prefill's kernels and libraries make (a
        # workspace, cuBLAS's handle): CUDA's own error, raised as torch.AcceleratorError or RuntimeError.
        r"|CUDA error: out of memory|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED"
        r"|DefaultCPUAllocator: (?:not enough memory|can't allocate memory)")),
    (FailureKind.PORT_IN_USE, re.compile(r"Address already in use")),
    (FailureKind.MODEL_NOT_FOUND, re.compile(
        r"Invalid repository ID or local directory|is not a local folder and is not a valid model identifier"
        r"|Repo id must be in the form|HFValidationError|No such file or directory: .*config\.json"
        # The hub unreachable (no network, offline mode) and the weights not in the cache: no trial can boot.
        r"|LocalEntryNotFoundError: |We couldn't connect to 'https://huggingface\.co'"
        r"|RepositoryNotFoundError: |GatedRepoError: ")),
    (FailureKind.INVALID_CONFIG, re.compile(
        r"error: unrecognized arguments|error: argument |must be greater than or equal to max_num_seqs"
        r"|validation errors? for \w+Config|Value error,"
        # vLLM 0.25-0.26 asserts it once the engine has loaded the model (config/vllm.py), not while validating
        r"|In Mamba cache align mode, block_size")),
]


ENGINE_DIED = re.compile(r"Engine core initialization failed|EngineDeadError|EngineCore encountered a fatal error")


# The last line of a Python traceback ("OSError: ...", "torch.AcceleratorError: ..."), vLLM's prefix allowed.
_EXCEPTION = re.compile(r"^(?:\(\w+(?:-\d+)? pid=\d+\)\s+)?[A-Za-z_][\w.]*(?:Error|Exception): ")


_KV_TOKENS = re.compile(r"(?:GPU|CPU|XPU|TPU) KV cache size: ([\d,]+) tokens")


_MAX_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")


# kv_cache_utils.py, when --num-gpu-blocks-override is given: vLLM's own figure, then the one used.
_OVERRIDDEN = re.compile(r"Overriding num_gpu_blocks=(\d+) with num_gpu_blocks_override=(\d+)")


_WEIGHTS = re.compile(r"Model loading took ([\d.]+) GiB")


def classify_line(line: str) -> FailureKind | None:
    """The failure class a single log line proves, if any (the generic engine-died wrapper is not one)."""
    for kind, pattern in _PATTERNS:
        if pattern.search(line):
            return kind
    return None


def watch_line(known: FailureKind | None, line: str) -> FailureKind | None:
    """The failure kind a log line newly proves, given the one already known (None: nothing new), as the
    server's log reader keeps it. The first specific cause wins; the generic engine-died wrapper is only
    provisional: vLLM logs "EngineCore encountered a fatal error" (v1/engine/core.py, logger.exception) before
    the traceback whose last line names the cause, e.g. "torch.OutOfMemoryError: CUDA out of memory" under load,
    which then replaces it."""
    if known is not None and known is not FailureKind.CRASH:
        return None
    kind = classify_line(line)
    if kind is None and known is None and ENGINE_DIED.search(line):
        return FailureKind.CRASH
    return kind


@overload
def classify_log(lines: list[str], *, exited: Literal[True] = True) -> Failure: ...
@overload
def classify_log(lines: list[str], *, exited: bool) -> Failure | None: ...
def classify_log(lines: list[str], *, exited: bool = True) -> Failure | None:
    """Classify a whole log (first specific cause wins; an exit without one is a crash)."""
    for i, line in enumerate(lines):
        kind = classify_line(line)
        if kind is not None:
            return Failure(kind, failure_reason(kind, line), log_excerpt(lines, i))
    if exited:
        for i, line in enumerate(lines):
            if ENGINE_DIED.search(line):
                return Failure(FailureKind.CRASH, "engine died: " + _clip(line), log_excerpt(lines, i))
        last = next((line for line in reversed(lines) if _EXCEPTION.search(line)), None)
        return Failure(FailureKind.CRASH, "server exited" + (f": {_clip(last)}" if last else ""),
                       "\n".join(lines[-12:]))
    return None


@dataclass(frozen=True)
class BootInfo:
    """What the server said about itself while booting."""

    boot_s: float
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    max_concurrency_len: int | None = None
    weights_gib: float | None = None
    profiled_blocks: int | None = None  # what vLLM sized the KV cache at when it was given another (override)


def parse_boot_info(lines: list[str], boot_s: float) -> BootInfo:
    kv = conc = conc_len = weights = profiled = None
    for line in lines:
        if m := _OVERRIDDEN.search(line):
            profiled = int(m.group(1))
        if m := _KV_TOKENS.search(line):
            kv = int(m.group(1).replace(",", ""))
        if m := _MAX_CONCURRENCY.search(line):
            conc_len, conc = int(m.group(1).replace(",", "")), float(m.group(2))
        if m := _WEIGHTS.search(line):
            weights = float(m.group(1))
    return BootInfo(boot_s, kv, conc, conc_len, weights, profiled)


_AVAILABLE_KV = re.compile(r"Available KV cache memory: (-?[\d.]+) GiB")
_KV_NEEDED = re.compile(r"\(([\d.]+) GiB KV cache is needed, which is larger than the available KV cache memory "
                        r"\((-?[\d.]+) GiB\)")


def kv_shortfall_gib(lines: list[str]) -> float | None:
    """How much more KV cache memory a boot that failed for it would have needed, at least: what vLLM said was
    needed for one max_model_len request less what it had ("16.17 GiB KV cache is needed, which is larger than the
    available KV cache memory (0.88 GiB)"), or what it lacked ("Available KV cache memory: -1.38 GiB", then "No
    available memory for the cache blocks"). None when the log says neither."""
    needed = available = None
    for line in lines:
        if m := _KV_NEEDED.search(line):
            needed, available = float(m.group(1)), float(m.group(2))
        elif m := _AVAILABLE_KV.search(line):
            available = float(m.group(1))
    if needed is not None and available is not None:
        return max(0.0, needed - available)
    if available is not None and available <= 0:
        return -available
    return None


def while_serving(failure: Failure, at: str) -> Failure:
    """A memory failure of a server that was up, told as the configuration's: it ran out while serving `at` (a
    load level), which a long prompt's prefill does past what the boot's profiling saw."""
    if not failure.kind.is_memory:
        return failure
    label, _, detail = failure.reason.partition(": ")
    return Failure(failure.kind, f"{label} while serving {at}: {detail}", failure.excerpt)


def failure_reason(kind: FailureKind, line: str) -> str:
    labels = {
        FailureKind.OUT_OF_MEMORY: "out of memory",
        FailureKind.KV_CACHE_TOO_SMALL: "KV cache too small for max_model_len",
        FailureKind.TOO_MANY_SEQS_FOR_STATE: "max_num_seqs exceeds the hybrid model's state blocks",
        FailureKind.MEMORY_HELD: "memory held by another process",
        FailureKind.INVALID_CONFIG: "invalid flag or value",
        FailureKind.PORT_IN_USE: "port already in use",
        FailureKind.MODEL_NOT_FOUND: "model unavailable",
    }
    return f"{labels.get(kind, kind.value)}: {_clip(line)}"


def _clip(line: str, n: int = 240) -> str:
    # Drop vLLM's "(EngineCore pid=123) ERROR 12-02 11:13:45 [file.py:953]" prefix: it says nothing to a user.
    line = re.sub(r"^\(\w+(?:-\d+)? pid=\d+\)\s+", "", line.strip())
    line = re.sub(r"^(?:ERROR|WARNING|INFO)\s+\d\d-\d\d \d\d:\d\d:\d\d\s+\[[^\]]+\]\s+", "", line)
    return line if len(line) <= n else line[: n - 1] + "…"


def log_excerpt(lines: list[str], i: int, before: int = 3, after: int = 2) -> str:
    return "\n".join(lines[max(0, i - before): i + after + 1])
