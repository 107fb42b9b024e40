"""The final paired comparison: its interval and stopping rule on known inputs, its sentence, and the loop that
boots the winner and the best baseline in pairs (A B, then B A) on a real Optuna study."""

from __future__ import annotations

import math

import optuna
import pytest

from autotune.measure.stats import limits_text
from autotune.search import remeasure, tell
from autotune.search.budget import Budget
from autotune.search.paired import (
    COMPARISON_ATTR,
    MAX_PAIRS,
    PAIR_ATTR,
    Comparison,
    Interval,
    Pair,
    answer,
    compare,
    gain_interval,
    measure_pairs,
    needs_another_pair,
    noise_lines,
    within_noise,
)
from autotune.search.record import BASELINE_ATTR, REMEASURE_ATTR
from autotune.search.remeasure import spread

LIMITS = {"p95_ttft_ms": 2000, "p95_tpot_ms": 100}


def ratios(*logs: float, base: float = 100.0) -> list[Pair]:
    return [Pair(i, base * math.exp(x), base) for i, x in enumerate(logs)]


def test_the_interval_is_the_t_interval_of_the_mean_paired_log_ratio():
    # logs 0.10, 0.12, 0.08: mean 0.10, sd 0.02; each look is a 96.8% interval: t(0.984, 2 df) = 5.455101 from
    # the table; half 0.0629901
    got = gain_interval(ratios(0.10, 0.12, 0.08))
    assert got is not None
    assert got.mid == pytest.approx(math.expm1(0.10))
    assert got.low == pytest.approx(math.expm1(0.10 - 5.455101 * 0.02 / math.sqrt(3)), abs=1e-6)
    assert got.high == pytest.approx(math.expm1(0.10 + 5.455101 * 0.02 / math.sqrt(3)), abs=1e-6)
    assert got.resolved
    ninety = gain_interval(ratios(0.10, 0.12, 0.08), confidence=0.90)  # t(0.95, 2 df) = 2.919986
    assert ninety is not None and ninety.low == pytest.approx(math.expm1(0.10 - 2.919986 * 0.02 / math.sqrt(3)))


def test_two_pairs_that_disagree_leave_the_difference_unresolved():
    got = gain_interval(ratios(0.10, -0.02))  # t(0.984, 1 df) = 19.88: far beyond -34%..+47% at 90%
    assert got is not None and got.low < 0 < got.high and not got.resolved
    assert gain_interval(ratios(0.10)) is None  # one pair says nothing of its own spread


def test_a_pair_in_which_a_measurement_missed_the_limits_has_no_ratio():
    pairs = [*ratios(0.10, 0.12), Pair(2, None, 100.0)]
    assert gain_interval(pairs) == gain_interval(ratios(0.10, 0.12))


def test_the_stopping_rule():
    assert needs_another_pair([])
    assert needs_another_pair(ratios(0.10))  # no interval before the second pair
    assert not needs_another_pair(ratios(0.10, 0.12, 0.08))  # resolved: better
    assert not needs_another_pair(ratios(-0.10, -0.12, -0.08))  # resolved: worse
    assert needs_another_pair(ratios(0.10, -0.02))  # inside the noise: measure again
    assert not needs_another_pair(ratios(*[0.05, -0.05] * (MAX_PAIRS // 2)))  # unresolved, but enough pairs
    assert not needs_another_pair([Pair(0, None, 100.0)])  # the winner missed its limits on a fresh boot


def test_the_sentence_of_a_proven_winner():
    c = compare(12, "recipe", 1, ratios(0.12, 0.14, 0.13), LIMITS)
    assert c.proven
    assert c.sentence == ("trial 12: +14% output tok/s over the recipe (90% interval +10% to +18%) "
                          "within p95 TTFT 2 s and TPOT 100 ms")


def test_the_sentence_when_no_configuration_beat_the_baseline_beyond_the_noise():
    c = compare(12, "recipe", 1, ratios(0.08, -0.04), LIMITS)
    assert not c.proven
    assert c.sentence.startswith("no configuration beat the recipe beyond the noise of this machine (+2%, interval ")
    assert c.sentence.endswith(": keep it")
    assert not compare(12, "recipe", 1, ratios(0.10), LIMITS).proven  # too few pairs: not shown better
    assert "too few for an interval" in compare(12, "recipe", 1, ratios(0.10), LIMITS).sentence
    worse = compare(12, "recipe", 1, ratios(-0.10, -0.12, -0.08), LIMITS)
    assert not worse.proven and "-10% against it on fresh boots" in worse.sentence


def test_a_baseline_that_won_and_a_study_without_a_feasible_baseline():
    itself = compare(1, "recipe", 1, (), LIMITS)
    assert not itself.proven and itself.sentence == ("no configuration beat the recipe: it measured best itself "
                                                     "(trial 1): keep it")
    alone = compare(5, "", None, (), LIMITS)
    assert alone.proven and "no baseline met the limits" in alone.sentence


def test_limits_in_words_and_the_record_round_trips():
    assert limits_text({"p95_ttft_ms": 500, "p95_tpot_ms": 50}) == "p95 TTFT 500 ms and TPOT 50 ms"
    assert limits_text({"p99_ttft_ms": 1500, "p95_tpot_ms": 50}) == "p99 TTFT 1.5 s and p95 TPOT 50 ms"
    assert limits_text({"ttft_p99_ms": 1500, "tpot_p95_ms": 50}) == "p99 TTFT 1.5 s and p95 TPOT 50 ms"  # old names
    c = compare(12, "recipe", 1, ratios(0.12, 0.14, 0.13), LIMITS)
    assert Comparison.from_attr(c.to_attr()) == c
    assert Interval(0.0, -0.01, 0.01).resolved is False


class Machine:
    """A study whose configurations measure the next figure of their list each time they are booted."""

    def __init__(self, figures: dict[str, list[float]]):
        self.figures = {k: list(v) for k, v in figures.items()}
        self.study = optuna.create_study(direction="maximize")
        self.study.set_user_attr("limits", LIMITS)
        self.booted: list[str] = []
        self.t = 0.0  # the clock: each boot takes 100 s

    def clock(self) -> float:
        return self.t

    def run_one(self) -> object:
        trial = self.study.ask()
        c = trial.suggest_categorical("c", list(self.figures))
        self.booted.append(c)
        trial.set_user_attr("duration_s", 100.0)
        self.t += 100.0
        tell.set_constraints(trial)
        figures = self.figures[c]
        self.study.tell(trial, figures.pop(0) if len(figures) > 1 else figures[0])
        return trial

    def first(self, c: str, baseline: bool = False) -> None:
        attrs = {BASELINE_ATTR: {"name": c, "flags": {}}} if baseline else {}
        self.study.enqueue_trial({"c": c}, user_attrs=attrs)
        self.run_one()


def test_the_winner_and_the_recipe_are_booted_in_pairs_until_the_gain_is_resolved():
    lab = Machine({"recipe": [100, 100, 101, 99, 100], "w": [130, 112, 110, 113, 111]})
    lab.first("recipe", baseline=True)
    lab.first("w")
    lab.booted.clear()
    ran = measure_pairs(lab.study, Budget(seconds=10_000), lab.run_one)
    # A B, then B A, then A B: a drift hits both alike. The first look, after the third pair (+12%, +9%, +14%),
    # resolves it.
    assert lab.booted == ["w", "recipe", "recipe", "w", "w", "recipe"]
    c = ran.comparison
    assert c is not None and c.proven and c.winner == 1 and c.baseline_trial == 0 and len(c.pairs) == 3
    assert c.sentence.startswith("trial 1: +12% output tok/s over the recipe (90% interval +4% to +20%)")
    marks = [t.user_attrs for t in lab.study.trials[2:]]
    assert [m[REMEASURE_ATTR] for m in marks] == [1, 0, 0, 1, 1, 0]
    assert [m[PAIR_ATTR]["index"] for m in marks] == [0, 0, 1, 1, 2, 2]
    assert lab.study.user_attrs[COMPARISON_ATTR]["sentence"] == c.sentence == answer(lab.study).sentence


def test_once_the_pairs_started_the_answer_stays_with_the_configuration_they_measure():
    # A fresh clone's run: trial 10's three paired boots (846, 712, 563) took its median under trial 9's (727,
    # 753), the answer moved to trial 9 and said "0 paired measurement(s)", dropping the pairs it had measured.
    lab = Machine({"recipe": [600, 610, 590, 600, 605, 595, 600], "w": [900, 850, 560, 550, 565, 555],
                   "v": [740, 750]})
    lab.first("recipe", baseline=True)
    lab.first("w")
    lab.first("v")
    for t in lab.study.trials[1:3]:
        remeasure.enqueue_again(lab.study, t, {})
        lab.run_one()
    assert remeasure.best(lab.study.trials).trial.number == 1  # type: ignore[union-attr]
    ran = measure_pairs(lab.study, Budget(seconds=10_000), lab.run_one)
    c = ran.comparison
    assert c is not None and c.winner == 1 and len(c.pairs) >= 2 and not c.proven
    assert set(lab.booted[-2 * len(c.pairs):]) == {"w", "recipe"}  # no pair of v, whose figure is now higher
    assert answer(lab.study) == c and remeasure.best(lab.study.trials).trial.number == 1  # type: ignore[union-attr]


def test_pairs_stop_when_the_budget_has_no_room_for_a_whole_pair():
    lab = Machine({"recipe": [100, 104, 96], "w": [130, 101, 99]})
    lab.first("recipe", baseline=True)
    lab.first("w")
    lab.t = 0.0
    budget = Budget(seconds=600, clock=lab.clock)
    lab.t = 200.0  # the first two trials took 200 s; a pair takes 2 x 125 s (a quarter to spare)
    ran = measure_pairs(lab.study, budget, lab.run_one)
    assert ran.booted == 2 and not ran.comparison.proven  # type: ignore[union-attr]
    assert "less than one more pair of trial 1 and the recipe" in ran.stopped_because
    assert "too few for an interval: keep it" in answer(lab.study).sentence  # type: ignore[union-attr]


def test_the_spread_of_one_measurement_is_the_pooled_deviation_of_the_repeats():
    lab = Machine({"recipe": [100.0], "w": [100.0]})
    assert spread(lab.study.trials) is None  # nothing measured twice
    for c, figures in (("recipe", [100.0, 110.0]), ("w", [200.0, 180.0, 220.0])):
        lab.figures[c] = list(figures)
        lab.first(c, baseline=c == "recipe")
        for _ in figures[1:]:
            first = next(t for t in lab.study.trials if t.params["c"] == c)
            lab.study.enqueue_trial({"c": c}, user_attrs={REMEASURE_ATTR: first.number})
            lab.run_one()
    # logs: recipe ln 100, ln 110 (1 dof); w ln 200, ln 180, ln 220 (2 dof): pooled over 3 dof
    logs = {"recipe": [math.log(100), math.log(110)], "w": [math.log(200), math.log(180), math.log(220)]}
    squares = sum((x - sum(g) / len(g)) ** 2 for g in logs.values() for x in g)
    got = spread(lab.study.trials)
    assert got is not None and (got.measurements, got.configurations) == (5, 2)
    assert got.sd == pytest.approx(math.expm1(math.sqrt(squares / 3)))
    assert 0.09 < got.sd < 0.10  # ±9.5%


def test_a_run_says_when_its_noise_cannot_separate_its_top_configurations():
    lab = Machine({"recipe": [100.0], "w": [130.0, 120.0, 140.0, 131.0, 129.0], "v": [125.0, 135.0, 115.0]})
    lab.first("recipe", baseline=True)
    for c in ("w", "v"):  # each measured three times: 4 repeats, the spread steers
        lab.first(c)
        first = lab.study.trials[-1]
        for _ in range(2):
            lab.study.enqueue_trial({"c": c}, user_attrs={REMEASURE_ATTR: first.number})
            lab.run_one()
    trials = lab.study.trials
    assert within_noise(trials, spread(trials), None) is not None
    ran = measure_pairs(lab.study, Budget(seconds=100_000, clock=lab.clock), lab.run_one)
    assert ran.comparison is not None and ran.comparison.proven  # w beat the recipe: 131, 129, 129 against 100
    lines = noise_lines(lab.study)
    assert lines[0].startswith("noise: one measurement on this machine spreads by ±5% (standard deviation of 13 ")
    assert lines[1] == ("this machine's noise is too large to separate the top configurations: trial 1 (129 output "
                        "tok/s) and trial 4 (125) differ by +3%, inside the ±6% this machine's noise leaves on figures "
                        "of 6 and 3 measurement(s): more requests per load level ([load] min_requests in the "
                        "objective), a quieter machine, or more time for re-measuring would separate them")
    far = Machine({"recipe": [100.0], "w": [130.0, 120.0, 140.0], "v": [95.0, 103.0, 87.0]})  # v 27% below
    far.first("recipe", baseline=True)
    for c in ("w", "v"):
        far.first(c)
        first = far.study.trials[-1]
        for _ in range(2):
            far.study.enqueue_trial({"c": c}, user_attrs={REMEASURE_ATTR: first.number})
            far.run_one()
    assert spread(far.study.trials).steers and within_noise(far.study.trials, spread(far.study.trials), None) is None


def test_a_spread_from_too_few_repeats_says_nothing_of_the_top_configurations():
    lab = Machine({"recipe": [100.0], "w": [130.0, 120.0], "v": [125.0]})
    lab.first("recipe", baseline=True)
    lab.first("w")
    lab.study.enqueue_trial({"c": "w"}, user_attrs={REMEASURE_ATTR: 1})
    lab.run_one()
    lab.first("v")
    trials = lab.study.trials
    assert spread(trials) is not None and not spread(trials).steers
    assert within_noise(trials, spread(trials), None) is None
