"""The winner's soak, the last step before its answer is final: once the final pairs proved it better than the best
baseline (paired.measure_pairs), it boots again and serves its own load level for the study's [budget] soak
(measure/soak.py). The outcome is stored with the comparison (paired.with_soak): a winner that fails it, or that
the budget left no time to soak, is not proven, and every output falls back to the best baseline with the reason.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import optuna
from optuna.trial import FrozenTrial

from autotune.measure.client import LoadLevel
from autotune.measure.plan import TrialPlan
from autotune.measure.soak import run_soak
from autotune.search import paired, remeasure
from autotune.search.budget import Budget
from autotune.search.record import view


def soak_level(study: optuna.Study, winner: int, mode: str) -> LoadLevel | None:
    """The load the winner serves in its soak: the level of the measurement its figure is (remeasure.Best)."""
    best = remeasure.best(study.get_trials(deepcopy=False), keep=lambda t: t.number == winner)
    if best is None:
        return None
    at = view(next(t for t in study.get_trials(deepcopy=False) if t.number == best.figure_trial))
    value = at.best_level if at.best_level is not None else at.level
    return LoadLevel("rate" if mode == "rate" else "concurrency", value) if value else None


def soak(study: optuna.Study, budget: Budget, soak_s: float, plan_for: Callable[[FrozenTrial], TrialPlan],
         mode: str, stop: threading.Event | None = None,
         say: Callable[[str], object] = lambda line: None) -> paired.Comparison | None:
    """Soak the answer's winner where it is due (paired.soak_due), store the comparison with its outcome, and
    return it. `plan_for` plans a boot of a trial's configuration as the study boots it."""
    said = paired.answer(study)
    if not paired.soak_due(said) or (stop is not None and stop.is_set()):
        return said
    assert said is not None
    winner = next(t for t in study.get_trials(deepcopy=False) if t.number == said.winner)
    level = soak_level(study, winner.number, mode)
    needed = paired.soak_length_s(winner, soak_s)
    if level is None:
        ended = paired.with_soak(said, None, "its load level is not recorded")
    elif budget.seconds is not None and needed > budget.remaining():
        ended = paired.with_soak(said, None, f"{budget.remaining():.0f} s left, less than its soak (~{needed:.0f} s)")
    else:
        say(f"soaking trial {winner.number}: serving {level.mode} {level.value:g} for {soak_s:.0f} s on a fresh boot")
        soaked = run_soak(plan_for(winner), level, soak_s, stop)
        if stop is not None and stop.is_set():  # cut short (Ctrl-C): it says nothing of the winner
            return said
        ended = paired.with_soak(said, soaked)
    study.set_user_attr(paired.COMPARISON_ATTR, ended.to_attr())
    paired.save_answer_note(study)
    return ended
