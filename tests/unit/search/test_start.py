"""The start's pick (search/start.py): of a few random configurations, the one the estimator says runs the most
requests at once; on the shipped RTX 3090 study with the real estimator."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from autotune.config.study_file import load_study
from autotune.fit.hardware import PROFILES
from autotune.search import start
from autotune.search.screen import runs_at_once
from autotune.search.space import condition_met

ROOT = Path(__file__).resolve().parents[3]
SPEC = load_study(ROOT / "studies" / "qwen3.5-27b-rtx3090.toml")
GPTQ = "Qwen/Qwen3.5-27B-GPTQ-Int4"


def test_candidates_are_drawn_from_the_space_with_its_conditions_and_repeat_with_the_seed() -> None:
    drawn = start.candidates(SPEC.space, 7, 20)
    assert drawn == start.candidates(SPEC.space, 7, 20) and drawn != start.candidates(SPEC.space, 8, 20)
    by_name = {p.name: p for p in SPEC.space}
    for params in drawn:
        assert all(by_name[k].holds(v) for k, v in params.items())
        assert ("num_speculative_tokens" in params) == (params["speculative_method"] == "mtp")
        assert all(p.name in params for p in SPEC.space if condition_met(p, params))


def test_the_pick_runs_the_most_at_once_the_first_on_a_tie_and_none_when_all_are_refused() -> None:
    configs = [{"n": 1}, {"n": 5}, {"n": 3}, {"n": 5}]
    best = start.best_of(configs, lambda p: float(p["n"]) if p["n"] != 3 else None)
    assert best is not None and best[0] is configs[1] and best[1] == 5.0
    assert start.best_of(configs, lambda p: None) is None


def test_what_a_3090_runs_at_once_is_the_estimators() -> None:
    """The recipe's shape (48 seqs, 8k context): the KV cache, not max_num_seqs, bounds it; a 262k context, which
    the estimator refuses, runs nothing."""
    card = PROFILES["rtx3090"]
    recipe = {"model": GPTQ, "kv_cache_dtype": "auto", "mamba_ssm_cache_dtype": "auto", "max_num_seqs": 48,
              "max_num_batched_tokens": 8192, "enable_chunked_prefill": True, "max_model_len": 8192,
              "gpu_memory_utilization": 0.92, "enable_prefix_caching": False, "speculative_method": "none",
              "async_scheduling": True}
    runs = runs_at_once(SPEC, card, None, recipe)
    assert runs is not None and 1 <= runs < 48
    fp8 = runs_at_once(SPEC, card, None, {**recipe, "kv_cache_dtype": "fp8", "mamba_ssm_cache_dtype": "float16"})
    assert fp8 is not None and fp8 > runs  # half the KV bytes, half the state: more of them at once
    assert runs_at_once(SPEC, card, None, {**recipe, "max_num_seqs": 2}) == 2.0
    smaller_step = {**recipe, "max_num_batched_tokens": 2048}  # a smaller activation peak leaves more KV cache
    plain = runs_at_once(SPEC, card, None, smaller_step)
    drafted = runs_at_once(SPEC, card, None, {**smaller_step, "speculative_method": "mtp", "num_speculative_tokens": 1})
    assert plain is not None and plain > runs
    assert drafted is not None and drafted < plain / 2  # each running request holds 1 + 1 state blocks per group
    assert runs_at_once(SPEC, card, None, {**recipe, "gpu_memory_utilization": 0.85, "max_model_len": 32768,
                                           "max_num_batched_tokens": 16384}) is None


def test_the_first_sampled_trials_are_picked_then_the_sampler_takes_over() -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    space = [p for p in SPEC.space if p.name != "model"]
    runs = {}

    def capacity(params: dict[str, object]) -> float | None:
        runs[len(runs)] = float(params["max_num_seqs"])  # type: ignore[arg-type]
        return runs[len(runs) - 1]

    study.enqueue_trial({"max_num_seqs": 7})  # queued (a baseline): it goes first, nothing is picked over it
    assert start.queue_pick(study, space, capacity, 0) is None
    study.tell(study.ask(), 1.0)
    for _ in range(start.START_PICKS):
        picked = start.queue_pick(study, space, capacity, 0)
        assert picked is not None
        trial = study.ask()
        assert trial.params == {} and trial.user_attrs[start.PICK_ATTR]["of"] == start.START_CANDIDATES
        drawn = start.candidates(space, 0 * 10_007 + len(study.trials) - 1, start.START_CANDIDATES)
        assert picked == max(drawn, key=lambda p: p["max_num_seqs"])  # type: ignore[arg-type, return-value]
        trial.suggest_int("max_num_seqs", 1, 128, log=True)
        assert trial.params["max_num_seqs"] == picked["max_num_seqs"]  # the queued value, not a sampled one
        study.tell(trial, 1.0)
    assert start.queue_pick(study, space, capacity, 0) is None  # START_PICKS picked: the sampler's own from here


@pytest.mark.parametrize("seed", [None, 3])
def test_a_pick_that_every_candidate_refuses_queues_nothing(seed: int | None) -> None:
    study = optuna.create_study()
    assert start.queue_pick(study, SPEC.space, lambda p: None, seed) is None
    assert not study.trials


@pytest.mark.parametrize("picks", [0, 2])
def test_a_study_with_the_default_random_sampler_picks_its_start_as_start_picks_says(picks: int) -> None:
    """The default sampler is random (search/samplers.py) and the picks are autotune's start whichever the sampler
    (they were TPE's only): as many as `[sampler] start_picks` says; 0 turns them off (random search with the
    estimator and the screens, the fair comparator)."""
    import threading
    from dataclasses import replace
    from pathlib import Path

    from autotune.config.study_file import load_study
    from autotune.fit.hardware import PROFILES
    from autotune.search import one_trial

    spec = load_study(Path(__file__).resolve().parents[3] / "studies" / "tiny-cpu.toml")
    assert spec.sampler.name == "random" and spec.sampler.start_picks == start.START_PICKS
    spec = replace(spec, sampler=replace(spec.sampler, start_picks=picks))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0), direction="maximize")
    run = one_trial.StudyRun(spec, study, None, None, None, PROFILES["cpu"], PROFILES["cpu"],  # type: ignore[arg-type]
                             None, threading.Event())
    marked = []
    for _ in range(picks + 1):
        trial = one_trial._ask(run)
        marked.append(start.PICK_ATTR in trial.user_attrs)
        study.tell(trial, 1.0)
    assert marked == [True] * picks + [False]
