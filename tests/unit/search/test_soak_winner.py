"""The soak's place in the answer: a proven winner that fails its soak, or that the budget left no time to soak,
is not proven, and the one sentence falls back to the best baseline with the reason; one that holds up keeps its
sentence with the soak's line; a later `autotune compare` keeps a soak of the same winner."""

from __future__ import annotations

import optuna
import pytest

from autotune.measure.soak import Soak
from autotune.search import tell
from autotune.search.budget import Budget
from autotune.search.paired import (
    COMPARISON_ATTR,
    Comparison,
    answer,
    measure_pairs,
    soak_due,
    soak_length_s,
    with_soak,
)
from autotune.search.record import BASELINE_ATTR
from autotune.search.soak_winner import soak

LIMITS = {"p95_ttft_ms": 500, "p95_tpot_ms": 50}


def held_up() -> Soak:
    return Soak(30.0, "concurrency 14", 120, 0, 0, "rss", 3 * 2**30, 3 * 2**30 + 2**20)


def study_with_proven_winner() -> optuna.Study:
    """vllm-defaults at ~100, trial 1 at ~130, and three pairs that prove it (+31%)."""
    study = optuna.create_study(direction="maximize")
    study.set_user_attr("limits", LIMITS)
    figures = iter([100, 130, 131, 100, 99, 129, 132, 100])
    study.enqueue_trial({"c": "d"}, user_attrs={BASELINE_ATTR: {"name": "vllm-defaults", "flags": {}}})
    study.enqueue_trial({"c": "w"})

    def run_one() -> object:
        trial = study.ask()
        trial.suggest_categorical("c", ["d", "w"])
        trial.set_user_attr("duration_s", 60.0)
        trial.set_user_attr("boot_s", 40.0)
        trial.set_user_attr("best_level", 14)
        tell.set_constraints(trial)
        study.tell(trial, next(figures))
        return trial

    run_one()
    run_one()
    measure_pairs(study, Budget(seconds=10_000), run_one)
    return study


def test_a_proven_winner_is_soaked_before_it_is_final():
    study = study_with_proven_winner()
    said = answer(study)
    assert said is not None and said.proven and soak_due(said)
    assert said.sentence.startswith("trial 1: +31% output tok/s over the vllm-defaults")


def test_one_that_holds_up_keeps_its_sentence_with_the_soak():
    said = answer(study_with_proven_winner())
    assert said is not None
    ended = with_soak(said, held_up())
    assert ended.proven and not soak_due(ended)
    assert ended.sentence == (f"{said.sentence}; soaked 30 s at concurrency 14: 120 requests, no error, no empty "
                              "reply, memory within what vLLM reserved (+0.00 GiB)")
    assert Comparison.from_attr(ended.to_attr()) == ended


def test_one_that_fails_its_soak_is_not_exported_and_the_answer_says_why():
    said = answer(study_with_proven_winner())
    assert said is not None
    failed = Soak(30.0, "concurrency 14", 240, 3, 0, "rss", 3 * 2**30, 3 * 2**30, "HTTP 500")
    ended = with_soak(said, failed)
    assert not ended.proven
    assert ended.sentence == ("trial 1 failed its soak: 3 of 240 requests errored (HTTP 500): keep the "
                              "vllm-defaults")


def test_a_winner_the_budget_left_no_time_to_soak_is_not_final():
    study = study_with_proven_winner()
    now = [0.0]
    budget = Budget(seconds=600, clock=lambda: now[0])
    now[0] = 590.0
    winner = study.trials[1]
    assert soak_length_s(winner, 30.0) == pytest.approx(1.25 * (40.0 + 30.0))
    ended = soak(study, budget, 30.0, plan_for=lambda t: pytest.fail("nothing boots"), mode="concurrency")
    assert ended is not None and not ended.proven
    assert ended.sentence == ("trial 1 beat the vllm-defaults in the pairs but was not soaked (10 s left, less "
                              "than its soak (~88 s)): keep the vllm-defaults; `autotune compare` soaks it")
    assert study.user_attrs[COMPARISON_ATTR]["sentence"] == ended.sentence == answer(study).sentence  # type: ignore[union-attr]


def test_a_later_compare_keeps_the_soak_of_the_same_winner():
    study = study_with_proven_winner()
    said = answer(study)
    assert said is not None
    study.set_user_attr(COMPARISON_ATTR, with_soak(said, held_up()).to_attr())
    again = measure_pairs(study, Budget(seconds=10_000), lambda: pytest.fail("the pairs are resolved"))
    assert again.comparison is not None and again.comparison.soak == held_up() and again.comparison.proven
