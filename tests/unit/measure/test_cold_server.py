"""Whether a cold CUDA server's short KV cache can decide a trial's first level (measure/trial.py): figures from
the device's chat study (benchmarks/data/h200-as-rtx3090-chat-cold-then-warm, objectives/chat-p95.toml, cold boots
screened at the incumbent's concurrency 37)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from autotune.config.objective import load_objective
from autotune.engine.flags import Build, to_argv
from autotune.engine.logs import BootInfo
from autotune.engine.server import EngineSpec
from autotune.measure.ladder import Prior
from autotune.measure.plan import TrialPlan, blocks_for_first_boot, given_blocks, kv_may_bind, plan_first_boot

CHAT = Path(__file__).parents[3] / "objectives" / "chat-p95.toml"


def plan(max_num_seqs: int) -> TrialPlan:
    return TrialPlan(EngineSpec("m", flags={"max_num_seqs": max_num_seqs}), load_objective(CHAT), 1000,
                     Path("trial.log"), prior=Prior(incumbent=37, screen=True))


@pytest.mark.parametrize(("seqs", "max_concurrency", "binds"), [
    (18, 2.78, True),   # trial 2 (8k context): held 6 requests of ~700 tokens at once, with 31 waiting
    (16, 1.11, True),   # trial 3 (32k context)
    (1, 3.36, False),   # trial 4: one sequence at a time; screened out by its queue, not its KV cache
    (64, 36.9, True),   # 37 running at the incumbent's level
    (64, 37.0, False),
])
def test_the_kv_cache_binds_unless_it_holds_the_first_levels_running_requests_at_full_length(
        seqs: int, max_concurrency: float, binds: bool) -> None:
    boot = BootInfo(100.0, kv_cache_tokens=22_755, max_concurrency=max_concurrency)
    assert kv_may_bind(plan(seqs), boot) is binds


def test_a_capacity_the_server_did_not_print_might_bind() -> None:
    assert kv_may_bind(plan(1), BootInfo(100.0, kv_cache_tokens=500_000))


def chat_plan(flags: dict[str, object], blocks: int | None = 1500) -> TrialPlan:
    return TrialPlan(EngineSpec("m", flags=flags), load_objective(CHAT), 1000, Path("trial.log"),
                     warm_kv_blocks=blocks)


def test_a_cuda_boot_that_compiles_is_given_the_estimates_warm_kv_cache() -> None:
    flags = {"max_num_seqs": 18, "max_model_len": 8192}
    assert blocks_for_first_boot(chat_plan(flags), Build.CUDA, compiles=True) == 1500
    assert blocks_for_first_boot(chat_plan(flags), Build.CUDA, compiles=False) is None  # vLLM sizes a warm one
    assert blocks_for_first_boot(chat_plan(flags), Build.CPU, compiles=True) is None
    assert blocks_for_first_boot(chat_plan(flags, blocks=None), Build.CUDA, compiles=True) is None
    for own in ({"num_gpu_blocks_override": 900}, {"kv_cache_memory_bytes": 2 << 30}):  # the user's size boots
        assert blocks_for_first_boot(chat_plan({**flags, **own}), Build.CUDA, compiles=True) is None


def test_the_blocks_go_to_vllm_as_its_override_flag() -> None:
    engine = EngineSpec("m", flags={"max_num_seqs": 18})
    assert given_blocks(engine, None) == engine
    assert to_argv(given_blocks(engine, 1500).flags) == ["--max-num-seqs", "18", "--num-gpu-blocks-override", "1500"]


S20 = Path(__file__).parents[3] / "benchmarks" / "data" / "h200-as-rtx3090-chat-kv-blocks-given"


def test_the_first_boot_of_a_new_key_is_given_blocks_and_once_it_compiled_the_next_is_sized_by_vllm(
        tmp_path: Path) -> None:
    """plan_first_boot, shared by run_trial and benchmarks/record_surface.py: the compile cache's ledger (here a
    folder of its own, named by the server's VLLM_CACHE_ROOT) decides, and a boot that compiled is noted in it."""
    flags = {"max_num_seqs": 64, "max_model_len": 32768}
    plan = TrialPlan(EngineSpec("m", flags=flags, env={"VLLM_CACHE_ROOT": str(tmp_path)}), load_objective(CHAT),
                     1000, Path("trial.log"), warm_kv_blocks=142)
    first = plan_first_boot(plan, Build.CUDA)
    assert first.blocks == 142 and first.engine.flags == {**flags, "num_gpu_blocks_override": 142}
    # the device's boot given 142: compiled
    first.note(gzip.decompress((S20 / "trial-0001.log.gz").read_bytes()).decode().splitlines())
    again = plan_first_boot(plan, Build.CUDA)
    assert again.blocks is None and again.engine == plan.engine
    assert plan_first_boot(plan, Build.CPU).blocks is None


def test_a_boot_that_neither_compiled_nor_loaded_leaves_the_key_new(tmp_path: Path) -> None:
    plan = TrialPlan(EngineSpec("m", flags={"max_num_seqs": 8}, env={"VLLM_CACHE_ROOT": str(tmp_path)}),
                     load_objective(CHAT), 1000, Path("trial.log"), warm_kv_blocks=40)
    eager = (Path(__file__).parents[3] / "tests" / "data" / "gpu" / "cuda-0.25-boot-eager.log").read_text()
    plan_first_boot(plan, Build.CUDA).note(eager.splitlines())
    assert plan_first_boot(plan, Build.CUDA).blocks == 40
