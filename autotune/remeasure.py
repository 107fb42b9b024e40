"""Re-measure the best configurations before the budget ends, and choose the winner on those figures.

A search keeps the configuration whose one measurement came out highest, and among several close ones that is
partly luck: its figure is biased upwards (the winner's curse) and may not hold when the user deploys it. So
part of the budget is set aside (`reserve`) and spent at the end (`remeasure_top`) booting the top few
configurations again, each as a new trial marked `remeasure_of`. The winner is then chosen on the median of
its re-measurements alone (the first figure is the biased one) and reported with the spread of all of them.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.budget import Budget
from autotune.space import BASELINE_ATTR

REMEASURE_ATTR = "remeasure_of"  # trial user attr: the number of the trial whose configuration it re-measures
SUMMARY_ATTR = "remeasured"  # study user attr: {original number: {"output_tok_s": [...], "median": ...}}
DEFAULT_TOP = 3  # [budget] remeasure: how many configurations to re-measure (0: none)
RESERVE_FRACTION = 0.15  # of a time budget
MAX_ROUNDS = 3  # re-measurements per configuration at most, whatever time is left
LENGTH_MARGIN = 1.25  # boots and loads vary: a re-measurement starts only with a quarter of its length to spare


@dataclass(frozen=True)
class Reserve:
    """What was set aside for re-measuring: seconds of a time budget, trials of a trial budget."""

    top: int = 0
    seconds: float = 0.0
    trials: int = 0


def reserve(budget: Budget, top: int = DEFAULT_TOP, fraction: float = RESERVE_FRACTION) -> Reserve:
    """Take the reserve out of `budget` before the search: `fraction` of its time (and never less than one
    trial's length, see Budget.held_s), and `top` trials of a trial budget when that leaves the search at least
    four fifths of it. Give it back with `remeasure_top`."""
    if top <= 0:
        return Reserve()
    seconds = fraction * budget.seconds if budget.seconds is not None else 0.0
    trials = min(top, budget.trials // 5) if budget.trials is not None else 0
    budget.held_s = seconds
    if budget.trials is not None:
        budget.trials -= trials
    return Reserve(top, seconds, trials)


def _release(budget: Budget, r: Reserve) -> None:
    budget.held_s = 0.0
    if budget.trials is not None:
        budget.trials += r.trials


def feasible(t: FrozenTrial) -> bool:
    return t.state == TrialState.COMPLETE and bool(t.constraints) and all(c <= 0 for c in t.constraints.values())


def remeasured(trials: Sequence[FrozenTrial]) -> dict[int, list[float]]:
    """{original trial number: its re-measured throughputs}, in order. A re-measurement that was infeasible
    (missed the limits, ran out of memory) counts as 0; one that was pruned, failed or still runs does not count."""
    out: dict[int, list[float]] = {}
    for t in sorted(trials, key=lambda t: t.number):
        of = t.user_attrs.get(REMEASURE_ATTR)
        if of is None or t.state != TrialState.COMPLETE:
            continue
        out.setdefault(int(of), []).append(float(t.value or 0.0) if feasible(t) else 0.0)
    return out


def score(t: FrozenTrial, trials: Sequence[FrozenTrial]) -> float:
    """What a trial's configuration is ranked by: the median of its re-measurements, else its one figure."""
    again = remeasured(trials).get(t.number)
    return statistics.median(again) if again else float(t.value or 0.0)


def best(trials: Sequence[FrozenTrial], keep: Callable[[FrozenTrial], bool] = lambda t: True) -> FrozenTrial | None:
    """The best feasible configuration (its original trial). Once some were re-measured, the winner is chosen
    among those (on their medians); the others' single figures are not comparable with medians."""
    again = remeasured(trials)
    originals = [t for t in trials if feasible(t) and keep(t) and REMEASURE_ATTR not in t.user_attrs]
    pool = [t for t in originals if statistics.median(again.get(t.number) or [0.0]) > 0] or originals

    def rank(t: FrozenTrial) -> float:
        return statistics.median(again[t.number]) if t.number in again else float(t.value or 0.0)

    return max(pool, key=rank, default=None)


def top_configs(trials: Sequence[FrozenTrial], n: int) -> list[FrozenTrial]:
    """The `n` best feasible trials with distinct configurations (vLLM flags), re-measurements excluded."""
    out: list[FrozenTrial] = []
    seen: set[str] = set()
    for t in sorted((t for t in trials if feasible(t) and REMEASURE_ATTR not in t.user_attrs),
                    key=lambda t: t.value or 0.0, reverse=True):
        key = str(t.user_attrs.get("flags", t.params))
        if key not in seen and len(out) < n:
            seen.add(key)
            out.append(t)
    return out


def summary(trials: Sequence[FrozenTrial]) -> dict[str, dict[str, object]]:
    """Per re-measured configuration: every figure (the first one first), the median, min and max."""
    by_number = {t.number: t for t in trials}
    out: dict[str, dict[str, object]] = {}
    for number, values in remeasured(trials).items():
        first = by_number[number].value if number in by_number else None
        figures = ([round(float(first), 1)] if first is not None else []) + [round(v, 1) for v in values]
        out[str(number)] = {"output_tok_s": figures, "remeasured_output_tok_s": [round(v, 1) for v in values],
                            "median": round(statistics.median(values), 1), "min": min(figures), "max": max(figures)}
    return out


def remeasure_top(study: optuna.Study, budget: Budget, reserved: Reserve, run_one: Callable[[], object | None],
                  stop: threading.Event | None = None) -> list[int]:
    """Give the reserve back to `budget` and spend it booting the top configurations again, in rounds (each
    configuration once, best first, then again), while a trial still fits. `run_one` runs the next queued
    trial (the study loop's own trial function) and returns its result, or None when it was rejected before
    boot. Returns the original trial numbers re-measured, in order; the study's SUMMARY_ATTR holds the figures."""
    _release(budget, reserved)
    trials = study.get_trials(deepcopy=False)
    if reserved.top <= 0 or (stop is not None and stop.is_set()):
        return []
    if any(t.state == TrialState.WAITING for t in trials):  # queued trials would run first, unmarked
        return []
    top = top_configs(trials, reserved.top)
    done: list[int] = []
    for _ in range(MAX_ROUNDS if top else 0):
        for t in top:
            if stop is not None and stop.is_set():
                break
            length = t.user_attrs.get("duration_s")  # this configuration's own trial
            fits, _why = budget.claim(LENGTH_MARGIN * length if length is not None else None)
            if not fits:
                break
            attrs: dict[str, object] = {REMEASURE_ATTR: t.number}
            if BASELINE_ATTR in t.user_attrs:  # boot exactly what the baseline booted
                attrs[BASELINE_ATTR] = t.user_attrs[BASELINE_ATTR]
            study.enqueue_trial(t.params, user_attrs=attrs)
            result = run_one()
            if result is None:
                budget.release()
            else:
                budget.record(float(getattr(result, "duration_s", 0.0)))
            done.append(t.number)
        else:
            continue
        break
    if done:
        study.set_user_attr(SUMMARY_ATTR, summary(study.get_trials(deepcopy=False)))
    return done
