"""The reserve sized to hold the final pairs: on what a pair costs on this machine (the study's own trial lengths),
so that MIN_PAIRS pairs of the winner and the best baseline fit before the budget ends, and a budget too short
for them is said, with by how much. A real (in-memory) Optuna study on a fake clock, with the trial lengths and
figures of a 2-core `make run` (vllm-defaults 98 s, the recipe 116 s, searched trials 65-73 s)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import optuna
import pytest

from autotune.search import paired, remeasure, tell
from autotune.search.budget import Budget
from autotune.search.paired import (
    MIN_PAIRS,
    hold_pairs,
    measure_pairs,
    pair_length_s,
    soak_length_s,
    too_short_line,
)
from autotune.search.record import BASELINE_ATTR
from autotune.search.remeasure import LENGTH_MARGIN, Searched, remeasure_top, reserve, search_and_remeasure

LIMITS = {"p95_ttft_ms": 500, "p95_tpot_ms": 50}


SOAK_S = 30.0  # the CPU build's default


@dataclass
class Ran:
    duration_s: float


class Machine:
    """Configuration `c` measures the next figure of its list each boot (the last one again once spent) and
    takes its length in seconds of the clock. Baselines are queued first, then the search proposes `order`."""

    def __init__(self, configs: dict[str, tuple[list[float], float]], baselines: tuple[str, ...], order: list[str]):
        self.figures = {c: list(f) for c, (f, _) in configs.items()}
        self.lengths = {c: length for c, (_, length) in configs.items()}
        self.order = list(order)
        self.t = 0.0
        self.soaked_with_s_left: float | None = None  # the time left when the winner's soak began
        self.study = optuna.create_study(direction="maximize")
        self.study.set_user_attr("limits", LIMITS)
        for name in baselines:
            self.study.enqueue_trial({"c": name}, user_attrs={BASELINE_ATTR: {"name": name, "flags": {}}})

    def clock(self) -> float:
        return self.t

    def run_one(self) -> Ran:
        if not self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
            self.study.enqueue_trial({"c": self.order.pop(0) if self.order else "slow"})
        trial = self.study.ask()
        c = trial.suggest_categorical("c", [*self.figures, "slow"])
        trial.set_user_attr("flags", f'{{"c": "{c}"}}')
        length = self.lengths.get(c, 70.0)
        trial.set_user_attr("duration_s", length)
        self.t += length
        figures = self.figures.get(c, [10.0])
        tell.set_constraints(trial)
        self.study.tell(trial, figures.pop(0) if len(figures) > 1 else figures[0])
        return Ran(length)

    def search(self, budget: Budget) -> Searched:
        """The study loop's search (study._search_on): claim, boot, record, size what is held."""
        n = 0
        while (claimed := budget.claim())[0]:
            budget.record(self.run_one().duration_s)
            remeasure.hold(budget, self.study.get_trials(deepcopy=False))
            hold_pairs(budget, self.study, SOAK_S)
            n += 1
        return Searched(n, claimed[1])

    def run(self, seconds: float) -> tuple[Budget, paired.Comparison | None]:
        """A whole run as study.run_study drives it: search, re-measure, then pairs, in the reserve."""
        budget = Budget(seconds=seconds, clock=self.clock)
        reserved = reserve(budget)
        stop = threading.Event()

        def remeasure_and_compare(r: remeasure.Reserve) -> remeasure.RemeasureRun:
            again = remeasure_top(self.study, budget, r, self.run_one, stop)
            said = measure_pairs(self.study, budget, self.run_one, stop).comparison
            if paired.soak_due(said) and self.soaked_with_s_left is None:  # it boots (as long as its trial)
                assert said is not None  # and serves for SOAK_S
                self.soaked_with_s_left = budget.time_left()
                self.t += self.lengths[self.study.trials[said.winner].params["c"]] + SOAK_S
            return again

        search_and_remeasure(lambda: self.search(budget), remeasure_and_compare, reserved, stop)
        return budget, paired.answer(self.study)


def make_run() -> Machine:
    """The winner (b) beats vllm-defaults by ~25% on every boot; the machine's noise is a few percent."""
    configs = {"vllm-defaults": ([625, 640, 610, 630], 98.0), "recipe": ([473], 116.0),
               "a": ([774], 66.0), "b": ([802, 790, 815, 800, 805], 73.0), "c": ([747], 65.0)}
    return Machine(configs, ("vllm-defaults", "recipe"), ["a", "b", "c"])


def test_a_pair_costs_the_warm_lengths_of_the_best_searched_configuration_and_the_best_baseline():
    lab = make_run()
    lab.run_one()  # vllm-defaults alone: a pair is sized on its length twice
    assert pair_length_s(lab.study.get_trials()) == pytest.approx(2 * 98.0 * LENGTH_MARGIN)
    lab.run_one()
    lab.run_one()  # a, the incumbent, 66 s against vllm-defaults' 98 s
    assert pair_length_s(lab.study.get_trials()) == pytest.approx((66.0 + 98.0) * LENGTH_MARGIN)
    budget = Budget(seconds=1200)
    hold_pairs(budget, lab.study)
    assert budget.pairs_s == pytest.approx(MIN_PAIRS * (66.0 + 98.0) * LENGTH_MARGIN)


def test_no_pairs_are_held_without_a_baseline_that_met_the_limits():
    lab = Machine({"w": ([100], 60.0)}, (), ["w"])
    lab.run_one()
    budget = Budget(seconds=1200)
    hold_pairs(budget, lab.study)
    assert pair_length_s(lab.study.get_trials()) is None and budget.pairs_s == 0.0


def test_the_reserve_holds_the_re_measurement_and_the_pairs_within_half_the_budget():
    budget = Budget(seconds=1200, clock=lambda: 0.0)
    budget.held_s, budget.remeasure_s, budget.pairs_s = 180.0, 91.25, 410.0
    assert budget.held() == pytest.approx(501.25) and budget.pairs_held() == 410.0
    assert budget.pairs_short_s() == 0.0
    budget.pairs_s = 550.0  # both are more than half: the pairs alone are held, the re-measurement comes after
    assert budget.held() == 550.0 and budget.pairs_held() == 550.0
    short = Budget(seconds=600, clock=lambda: 0.0)  # half of it is 300 s: the pairs do not fit, the re-measurement does
    short.held_s, short.remeasure_s, short.pairs_s = 90.0, 91.25, 410.0
    assert short.held() == pytest.approx(91.25) and short.pairs_held() == 0.0
    assert short.pairs_short_s() == pytest.approx(2 * 410.0 - 600)


def test_the_soak_is_held_after_the_pairs():
    lab = make_run()
    for _ in range(3):
        lab.run_one()
    budget = Budget(seconds=1200)
    hold_pairs(budget, lab.study, soak_s=30.0)
    a = lab.study.get_trials()[2]
    assert budget.pairs_s == pytest.approx(MIN_PAIRS * (66.0 + 98.0) * LENGTH_MARGIN + soak_length_s(a, 30.0))
    assert soak_length_s(a, 30.0) == pytest.approx(LENGTH_MARGIN * (66.0 + 30.0))  # no boot_s recorded: its length


def test_a_thirty_minute_run_ends_with_the_pairs_it_owes():
    """With 15% of the budget held (270 s) the search would run until one pair (~214 s) no longer fitted, and the
    run would end without an interval; held on what the pairs cost (MIN_PAIRS of them, ~641 s, and the soak, ~129 s),
    it ends with the gain proven and time for the winner's soak."""
    lab = make_run()
    budget, said = lab.run(1800)
    assert said is not None and said.baseline == "vllm-defaults" and said.winner != said.baseline_trial
    assert len(said.pairs) >= MIN_PAIRS and said.proven, said.sentence
    assert said.sentence.startswith(f"trial {said.winner}: +")
    assert too_short_line(budget, said) == ""
    assert lab.soaked_with_s_left is not None and lab.soaked_with_s_left >= 70 + SOAK_S  # the soak fitted too
    booted = [t for t in lab.study.get_trials() if paired.PAIR_ATTR not in t.user_attrs]
    assert len(booted) >= 6  # the search still had most of the budget: the baselines and several trials


def test_a_budget_too_short_for_the_pairs_says_so_and_by_how_much():
    lab = make_run()
    budget, said = lab.run(600)
    assert said is not None and len(said.pairs) < MIN_PAIRS
    line = too_short_line(budget, said)
    assert line.startswith(f"the budget (10 min) is too short for the final pairs: {MIN_PAIRS} pairs of the winner "
                           "and the vllm-defaults and its soak take ~"), line
    assert f"{budget.pairs_s - 300:.0f} s more than the 300 s the search leaves them" in line
    assert line.endswith(f"--budget {-(-(600 + budget.pairs_short_s()) // 60):.0f}m would hold them")


def test_a_lone_baseline_incumbent_holds_its_confirmation_and_the_close_runner_up_after_it():
    """A fresh clone's `make run` (25 min, 2 cores): the recipe measured 940 once and led; trial 11 measured 913
    once. The reserve held one re-measurement and the pairs; confirming the recipe (853) took the re-measurement's
    share, trial 11's re-measurement and the pairs no longer fitted, and the time left went back to the search: the
    run ended with "it measured best itself", no pair. Held for both re-measurements, trial 11 is measured again,
    wins on its median and meets the recipe in pairs."""
    configs = {"vllm-defaults": ([898], 64.0), "recipe": ([940, 853, 850, 860], 55.0),
               "x": ([913, 905, 915, 910], 62.0), "y": ([870], 62.0)}
    lab = Machine(configs, ("vllm-defaults", "recipe"), ["x", "y"])
    lab.lengths["slow"] = 62.0  # the search's later proposals: booted, measured low
    budget, said = lab.run(1500.0)
    assert said is not None and said.winner != said.baseline_trial, said
    assert len(said.pairs) >= MIN_PAIRS, said.sentence


def test_with_no_re_measurement_due_the_search_keeps_one_for_what_it_finds_next():
    """A fresh clone's run: vLLM's defaults led, confirmed (1,097 and 1,124), and nothing was in reach, so nothing
    was held for re-measuring; the search's last trial then measured 1,166 once, and its re-measurement with the
    pairs no longer fitted ("trial 57 measured higher once ... it may still win"). With nothing due, the search now
    keeps one re-measurement of its trials' usual length."""
    lab = Machine({"vllm-defaults": ([1097, 1124], 56.0), "recipe": ([900], 50.0)}, ("vllm-defaults", "recipe"), [])
    budget = Budget(seconds=1500, clock=lab.clock)
    for _ in range(2):
        budget.record(lab.run_one().duration_s, searched=False)
    remeasure.enqueue_again(lab.study, lab.study.trials[0])
    lab.run_one()
    for _ in range(2):
        budget.record(lab.run_one().duration_s)  # the search's own: 70 s each, measured low
    trials = lab.study.get_trials()
    assert remeasure.due_next(trials) == []
    remeasure.hold(budget, trials)
    assert budget.remeasure_s == pytest.approx(LENGTH_MARGIN * 70.0)
