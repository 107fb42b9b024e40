"""The search space against a real Optuna study (in-memory storage), and the flags a trial boots."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from autotune.config.params import Baseline, Param
from autotune.config.study_file import load_study
from autotune.engine.flags import invalid_reason, to_engine_flags
from autotune.search.record import BASELINE_ATTR, trial_baseline
from autotune.search.space import (
    EngineConfig,
    baseline_params,
    engine_config,
    enqueue_baseline,
    suggest,
)

ROOT = Path(__file__).resolve().parents[3]
optuna.logging.set_verbosity(optuna.logging.WARNING)

SPEC_SPACE = (
    Param("max_num_seqs", "int", low=1, high=64, log=True),
    Param("gpu_memory_utilization", "float", low=0.85, high=0.97, step=0.01),
    Param("kv_cache_dtype", "categorical", choices=("auto", "fp8")),
    Param("enable_prefix_caching", "bool"),
    Param("speculative_method", "categorical", choices=("none", "mtp")),
    Param("num_speculative_tokens", "int", low=1, high=3, when={"speculative_method": "mtp"}),
)


def _study(seed: int = 0) -> optuna.Study:
    return optuna.create_study(storage=optuna.storages.InMemoryStorage(), sampler=optuna.samplers.RandomSampler(seed))


def test_suggest_respects_conditions_and_ranges() -> None:
    study = _study()
    seen_methods = set()
    for _ in range(40):
        trial = study.ask()
        values = suggest(trial, SPEC_SPACE)
        study.tell(trial, 0.0)
        seen_methods.add(values["speculative_method"])
        assert ("num_speculative_tokens" in values) == (values["speculative_method"] == "mtp")
        assert trial.params == values  # every value is a recorded Optuna param, nothing else
        assert 1 <= values["max_num_seqs"] <= 64
        assert 0.85 <= values["gpu_memory_utilization"] <= 0.97
        assert values["enable_prefix_caching"] in (False, True)
        if "num_speculative_tokens" in values:
            assert values["num_speculative_tokens"] in (1, 2, 3)
    assert seen_methods == {"none", "mtp"}  # both branches were exercised


def test_condition_with_a_list_of_values() -> None:
    space = (Param("max_model_len", "categorical", choices=(512, 1024, 2048)),
             Param("enable_chunked_prefill", "bool", when={"max_model_len": [1024, 2048]}))
    study = _study(1)
    for _ in range(20):
        trial = study.ask()
        values = suggest(trial, space)
        study.tell(trial, 0.0)
        assert ("enable_chunked_prefill" in values) == (values["max_model_len"] != 512)


def test_bool_condition_does_not_match_one() -> None:
    space = (Param("a", "categorical", choices=(1, 2)), Param("b", "bool", when={"a": True}))
    study = _study()
    for _ in range(10):
        trial = study.ask()
        assert "b" not in suggest(trial, space)  # True is not 1 here
        study.tell(trial, 0.0)


def test_engine_flags_fold_speculation() -> None:
    fixed = {"enforce_eager": True}
    assert to_engine_flags({"speculative_method": "mtp", "num_speculative_tokens": 2, "max_num_seqs": 8}, fixed) == {
        "enforce_eager": True, "max_num_seqs": 8, "speculative_config": {"method": "mtp", "num_speculative_tokens": 2}}
    assert to_engine_flags({"speculative_method": "none"}, {"speculative_config": {"method": "mtp"}}) == {}
    # tokens alone update a fixed speculative_config
    assert to_engine_flags({"num_speculative_tokens": 3}, {"speculative_config": {"method": "mtp"}}) == {
        "speculative_config": {"method": "mtp", "num_speculative_tokens": 3}}
    with pytest.raises(ValueError):
        to_engine_flags({"num_speculative_tokens": 3}, {})


def test_engine_flags_params_override_fixed_and_model_is_dropped() -> None:
    flags = to_engine_flags({"max_num_seqs": 4, "model": "org/other"}, {"max_num_seqs": 2, "load_format": "dummy"})
    assert flags == {"max_num_seqs": 4, "load_format": "dummy"}


def test_baseline_flags_are_exactly_what_boots() -> None:
    sampled = {"max_num_seqs": 3, "kv_cache_dtype": "fp8"}
    baseline = {"max_num_batched_tokens": 8192, "scheduling_policy": "fcfs"}  # neither is in the space
    assert to_engine_flags(sampled, {"enforce_eager": True}, baseline=baseline) == {
        "enforce_eager": True, "max_num_batched_tokens": 8192, "scheduling_policy": "fcfs"}
    assert to_engine_flags(sampled, {"enforce_eager": True}, baseline={}) == {"enforce_eager": True}


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        ({"max_num_seqs": 48, "max_num_batched_tokens": 32},
         "max_num_batched_tokens (32) must be >= max_num_seqs (48)"),
        ({"max_num_batched_tokens": 2048, "max_model_len": 4096, "enable_chunked_prefill": False},
         "max_num_batched_tokens (2048) < max_model_len (4096) with chunked prefill off"),
        ({"max_num_seqs": 8, "max_num_active_seqs": 16}, "max_num_active_seqs (16) must be <= max_num_seqs (8)"),
        ({"long_prefill_token_threshold": 5000, "max_model_len": 4096}, "long_prefill_token_threshold (5000)"),
        ({"gpu_memory_utilization": 1.2}, "gpu_memory_utilization (1.2) must be in (0, 1]"),
    ],
)
def test_invalid_reason_refuses(flags: dict, fragment: str) -> None:
    reason = invalid_reason(flags)
    assert reason is not None and fragment in reason


@pytest.mark.parametrize(
    "flags",
    [
        {},
        {"max_num_seqs": 48, "max_num_batched_tokens": 48},  # equal is allowed
        {"max_num_batched_tokens": 2048, "max_model_len": 4096, "enable_chunked_prefill": True},
        {"max_num_batched_tokens": 2048, "max_model_len": 4096},  # chunked prefill left to vLLM (on by default)
        {"max_num_batched_tokens": 4096, "max_model_len": 4096, "enable_chunked_prefill": False},
        {"max_num_seqs": 256},  # vLLM derives max_num_batched_tokens itself
        {"gpu_memory_utilization": 1.0},
    ],
)
def test_invalid_reason_accepts(flags: dict) -> None:
    assert invalid_reason(flags) is None


def test_baseline_params() -> None:
    space = (
        Param("max_num_seqs", "int", low=1, high=64, log=True, default=128),
        Param("max_model_len", "categorical", choices=(512, 1024), default=2048),  # default outside: left out
        Param("enable_chunked_prefill", "bool", default=True),
        Param("speculative_method", "categorical", choices=("none", "mtp"), default="none"),
        Param("num_speculative_tokens", "int", low=1, high=3, when={"speculative_method": "mtp"}),
    )
    assert baseline_params(Baseline("vllm-defaults", {}), space) == {
        "max_num_seqs": 128, "enable_chunked_prefill": True, "speculative_method": "none"}
    recipe = Baseline("recipe", {"max_num_seqs": 48, "max_model_len": 1024, "enable_chunked_prefill": False,
                                 "speculative_config": {"method": "mtp", "num_speculative_tokens": 2}})
    assert baseline_params(recipe, space) == {"max_num_seqs": 48, "max_model_len": 1024,
                                              "enable_chunked_prefill": False, "speculative_method": "mtp",
                                              "num_speculative_tokens": 2}


def test_enqueued_baseline_boots_its_flags() -> None:
    study_spec = load_study(ROOT / "studies" / "tiny-cpu.toml")
    study = _study()
    for b in study_spec.baselines:
        enqueue_baseline(study, b, study_spec.space)
    booted = []
    for _ in range(3):
        trial = study.ask()
        params = suggest(trial, study_spec.space)
        booted.append((trial.user_attrs.get(BASELINE_ATTR, {}).get("name"),
                       engine_config(study_spec, params, baseline=trial_baseline(trial)), params))
        study.tell(trial, 0.0)
    (n0, cfg0, p0), (n1, cfg1, p1), (n2, cfg2, p2) = booted
    fixed = {"load_format": "dummy", "enforce_eager": True, "dtype": "float32"}  # [model] and [engine]
    assert n0 == "vllm-defaults" and cfg0 == EngineConfig("tiny:dense", fixed)
    assert p0["max_num_batched_tokens"] == 2048 and p0["max_model_len"] == 8192  # recorded at vLLM's defaults
    assert n1 == "recipe" and cfg1.flags == {**fixed, "max_num_seqs": 16, "max_num_batched_tokens": 1024,
                                             "enable_chunked_prefill": True, "max_model_len": 1024}
    assert p1["max_num_seqs"] == 16 and p1["max_num_batched_tokens"] == 1024
    assert n2 is None and cfg2.flags == {**fixed, **p2}


def test_model_pseudo_param_chooses_the_checkpoint() -> None:
    spec = load_study(ROOT / "studies" / "qwen3.5-27b-rtx3090.toml")
    cfg = engine_config(spec, {"model": "QuantTrio/Qwen3.5-27B-AWQ", "max_num_seqs": 8})
    assert cfg.model == "QuantTrio/Qwen3.5-27B-AWQ"
    assert cfg.flags == {"language_model_only": True, "max_num_seqs": 8}
    assert engine_config(spec, {}, baseline={}).model == "Qwen/Qwen3.5-27B-GPTQ-Int4"


def test_qwen_space_suggests_valid_conditionals() -> None:
    spec = load_study(ROOT / "studies" / "qwen3.5-27b-rtx3090.toml")
    study = _study(3)
    for _ in range(30):
        trial = study.ask()
        values = suggest(trial, spec.space)
        study.tell(trial, 0.0)
        cfg = engine_config(spec, values)
        sc = cfg.flags.get("speculative_config")
        assert (sc is not None) == (values["speculative_method"] == "mtp")
        if sc is not None:
            assert sc == {"method": "mtp", "num_speculative_tokens": values["num_speculative_tokens"]}
        assert "speculative_method" not in cfg.flags and "model" not in cfg.flags


def test_model_max_len_stands_in_for_an_absent_max_model_len() -> None:
    flags = {"max_num_batched_tokens": 64, "enable_chunked_prefill": False}
    assert invalid_reason(flags) is None
    assert "max_model_len (8192)" in invalid_reason(flags, model_max_len=8192)
    assert invalid_reason({**flags, "max_model_len": 64}, model_max_len=8192) is None


def test_invalid_reason_agrees_with_vllm_config(tmp_path: Path) -> None:
    """vLLM's own EngineArgs -> VllmConfig validation (no server, no weights) on a grid around the rules."""
    pytest.importorskip("vllm", reason="vLLM is not installed")
    import itertools

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from autotune.engine.flags import to_argv
    from autotune.engine.models import CONFIGS, tiny_model_dir

    parser = make_arg_parser(FlexibleArgumentParser())
    model_dir = str(tiny_model_dir("dense", cache_root=tmp_path))
    context = CONFIGS["dense"]["max_position_embeddings"]
    grid = [dict(max_num_seqs=s, max_num_batched_tokens=b, enable_chunked_prefill=c, max_model_len=m)
            for s, b, c, m in itertools.product([1, 64], [32, 64, 4096], [True, False], [512, 8192])]
    grid += [{}, {"max_num_batched_tokens": 64, "enable_chunked_prefill": False}, {"max_num_seqs": 300}]
    refused = 0
    for flags in grid:
        ns = parser.parse_args(["--model", model_dir, *to_argv({"load_format": "dummy", **flags})])
        try:
            AsyncEngineArgs.from_cli_args(ns).create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
            vllm_refuses = False
        except ValueError:  # pydantic's ValidationError is a ValueError
            vllm_refuses = True
        refused += vllm_refuses
        assert (invalid_reason(flags, model_max_len=context) is not None) == vllm_refuses, flags
    assert 0 < refused < len(grid)
