"""The reserve taken out of the budget, and the re-measurement of the top configurations in it, on a real
(in-memory) Optuna study with a fake clock: every trial "takes" 100 s."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import optuna
import pytest

from autotune.search import tell
from autotune.search.budget import Budget
from autotune.search.record import REMEASURE_ATTR
from autotune.search.remeasure import (
    SUMMARY_ATTR,
    RemeasureRun,
    Reserve,
    Searched,
    best,
    best_trial,
    hold,
    length_s,
    next_to_remeasure,
    ranked,
    remeasure_top,
    remeasured,
    reserve,
    score,
    search_and_remeasure,
    spread,
    warm_boot_s,
)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Ran:
    duration_s: float


class Lab:
    """A study whose trials measure config `c` as the next figure in `figures[c]` (or the last one again)."""

    def __init__(self, figures: dict[str, list[float]], clock: Clock, infeasible: frozenset[str] = frozenset(),
                 lengths: dict[str, float] | None = None, cold: dict[str, float] | None = None):
        self.figures = {k: list(v) for k, v in figures.items()}
        self.clock, self.infeasible = clock, infeasible
        self.lengths = lengths or {}  # seconds a trial of that config takes (default 100)
        self.cold = dict(cold or {})  # seconds its first trial also spends on a cold boot, thrown away
        self.study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
        self.order = list(figures)  # the search proposes configs in this order, then repeats the last one

    def run_one(self) -> Ran:
        """Run the queued trial (a re-measurement), else the search's next proposal."""
        if not self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
            self.study.enqueue_trial({"c": self.order.pop(0) if self.order else "z"})
        trial = self.study.ask()
        c = trial.suggest_categorical("c", [*self.figures, "z"])
        trial.set_user_attr("flags", f'{{"c": "{c}"}}')
        length = self.lengths.get(c, 100.0)
        if c in self.cold:  # the first boot of a configuration, cold: failed, then booted again warm
            cold_s = self.cold.pop(c)
            length += cold_s
            trial.set_user_attr("cold_boot_s", cold_s)
        trial.set_user_attr("duration_s", length)
        self.clock.t += length
        figures = self.figures.get(c, [10.0])
        value = figures.pop(0) if len(figures) > 1 else figures[0]
        if c in self.infeasible:
            tell.set_constraints(trial, latency=0.5)
            self.study.tell(trial, 0.0)
        else:
            tell.set_constraints(trial)
            self.study.tell(trial, value)
        return Ran(length)

    def search(self, budget: Budget, top: int = 3) -> int:
        """The study loop's share: trials while one more fits."""
        return self.searched(budget, top).booted

    def searched(self, budget: Budget, top: int = 3) -> Searched:
        n = 0
        while (claimed := budget.claim())[0]:
            budget.record(self.run_one().duration_s)
            hold(budget, self.study.get_trials(deepcopy=False), top)
            n += 1
        return Searched(n, claimed[1])


def test_reserve_takes_a_share_of_time_and_trials_and_gives_it_back():
    clock = Clock()
    budget = Budget(seconds=1000, trials=10, clock=clock)
    r = reserve(budget, top=3)
    assert r == Reserve(top=3, seconds=150.0, trials=2)  # 15% of the time; 2 = min(3, 10 // 5) trials
    assert (budget.remaining(), budget.trials) == (850.0, 8)
    lab = Lab({"a": [5.0]}, clock)
    remeasure_top(lab.study, budget, r, lab.run_one, stop=threading.Event())  # nothing measured yet: gives back
    assert (budget.remaining(), budget.trials) == (1000.0, 10)
    assert reserve(Budget(trials=4), top=3) == Reserve(top=3, trials=0)  # a small budget is all search
    assert reserve(Budget(seconds=100), top=0) == Reserve()


def test_the_top_configurations_are_re_measured_in_the_reserved_time():
    clock = Clock()
    budget = Budget(seconds=1050, clock=clock)
    lab = Lab({"a": [1000.0, 800.0, 790.0], "b": [950.0, 940.0, 945.0], "c": [900.0, 905.0], "d": [100.0],
               "e": [200.0], "f": [300.0], "g": [400.0], "h": [500.0]}, clock)
    r = reserve(budget, top=3)
    assert lab.search(budget) == 8  # 892.5 s: at t = 800 only 92.5 s are left for a 100 s trial
    done = remeasure_top(lab.study, budget, r, lab.run_one).done
    # 157.5 s given back: 250 s left, two more trials with a quarter to spare (125 s each): the best
    # (a, trial 0) and the second (b, trial 1).
    assert done == (0, 1) and clock.t == 1000.0
    trials = lab.study.get_trials()
    assert [t.user_attrs.get(REMEASURE_ATTR) for t in trials[8:]] == [0, 1]
    assert [t.params["c"] for t in trials[8:]] == ["a", "b"]
    assert remeasured(trials) == {0: [800.0], 1: [940.0]}
    # a's first figure was luck: on all their measurements b (940) wins over a (800), though a's single figure
    # is the highest. Of two measurements the figure is the lower: a measurement of its own, with its latencies.
    assert best(trials).trial.params["c"] == "b"
    assert best_trial(lab.study).trial.number == 1  # what status, export and the run's summary report
    assert best_trial(lab.study).figure == 940.0 and best_trial(lab.study).figure_trial == 9
    assert score(trials[0], trials) == 800.0 and score(trials[2], trials) == 900.0
    assert lab.study.user_attrs[SUMMARY_ATTR] == {
        "0": {"output_throughput": [1000.0, 800.0], "median": 800.0, "min": 800.0, "max": 1000.0},
        "1": {"output_throughput": [950.0, 940.0], "median": 940.0, "min": 940.0, "max": 950.0},
    }


def test_the_reserve_is_never_shorter_than_a_re_measurement():
    """15% of 600 s is 90 s, less than one 100 s trial with its quarter to spare: set aside as such, it would
    leave the re-measurement 90 s (the search stops at 500 s) and none would fit. The search keeps one
    re-measurement's length (125 s) back instead."""
    clock = Clock()
    budget = Budget(seconds=600, clock=clock)
    lab = Lab({"a": [1000.0], "b": [900.0], "c": [800.0]}, clock)
    r = reserve(budget, top=3)
    assert budget.remaining() == 600 - 90  # before any trial: 15%
    assert lab.search(budget) == 4  # at t = 400 the search sees 600 - 125 - 400 = 75 s: a trial does not fit
    assert remeasure_top(lab.study, budget, r, lab.run_one).done == (0,)
    assert clock.t == 500.0


def test_a_configuration_is_re_measured_only_when_its_own_trial_length_fits():
    clock = Clock()
    budget = Budget(seconds=1000, clock=clock)
    lab = Lab({"slow": [1000.0], "a": [900.0], "b": [800.0], "c": [100.0]}, clock, lengths={"slow": 180.0})
    lab.order = ["a", "b", "c", "slow", "c"]
    r = reserve(budget, top=2)
    for _ in range(7):  # 4 x 100 + 180 s, then three more 100 s trials (whatever let the search run them)
        lab.run_one()
    # 220 s left: the median trial (100 s) would fit, and the best configuration's 180 s too, but not with the
    # quarter to spare that a boot's variation asks for (225 s): not started, rather than cut off at the end.
    ran = remeasure_top(lab.study, budget, r, lab.run_one)
    assert ran.done == () and ran.booted == 0
    assert ran.stopped_because == "220 s left, less than one re-measurement of trial 3 (~225 s with a quarter to spare)"
    assert clock.t == 780.0 and budget.started_trials == 0


def test_more_time_means_more_rounds_and_the_median_decides():
    clock = Clock()
    budget = Budget(trials=12, clock=clock)
    lab = Lab({"a": [1000.0, 800.0, 990.0, 995.0], "b": [950.0, 940.0, 930.0, 900.0], "c": [10.0]}, clock)
    lab.order = ["a", "b", "c", "c", "c", "c", "c"]
    r = reserve(budget, top=2)  # a trial budget: 2 = min(2, 12 // 5) of 12 set aside
    budget.trials -= 3  # leave the search 7
    assert lab.search(budget) == 7
    budget.trials += 3  # 5 for re-measuring
    done = remeasure_top(lab.study, budget, r, lab.run_one).done
    # a is confirmed (800: median 900); b (950) could beat it and is measured (940: 945, now the incumbent); the
    # two are within each other's bands, so the one with fewer measurements goes next, the incumbent on a tie.
    assert done == (0, 1, 1, 0, 0)
    trials = lab.study.get_trials()
    assert remeasured(trials) == {0: [800.0, 990.0, 995.0], 1: [940.0, 930.0]}
    assert best(trials).trial.params["c"] == "a"  # median of all four 992.5 > 940 (of three)


def test_a_re_measurement_that_misses_the_limits_is_a_failed_measurement_not_a_zero_figure():
    clock = Clock()
    lab = Lab({"a": [1000.0], "b": [900.0]}, clock, infeasible=frozenset())
    lab.order = ["a", "a", "b"]
    for _ in range(3):
        lab.run_one()
    assert [b.trial.params["c"] for b in ranked(lab.study.get_trials())] == ["a", "b"]  # a twice: one config
    lab.infeasible = frozenset({"a"})
    lab.study.enqueue_trial({"c": "a"}, user_attrs={REMEASURE_ATTR: 0})
    lab.run_one()
    trials = lab.study.get_trials()
    assert remeasured(trials) == {0: [0.0]}
    # One of two measurements met the limits: the configuration keeps its measured figure, and says so.
    winner = best(trials)
    assert winner.trial.number == 0 and winner.figure == 1000.0
    assert winner.describe() == "1,000 output tok/s (1 of 2 measurements met the limits)"
    # Most of its measurements missed them: it does not hold its limits (0), and an original that was not
    # re-measured wins on its single figure.
    lab.study.enqueue_trial({"c": "a"}, user_attrs={REMEASURE_ATTR: 0})
    lab.run_one()
    trials = lab.study.get_trials()
    assert score(trials[0], trials) == 0.0
    assert best(trials).trial.number == 1 and best(trials).describe() == "1,000 output tok/s (one measurement)"


def test_nothing_is_re_measured_after_a_stop_or_with_trials_still_queued():
    clock = Clock()
    budget = Budget(seconds=1000, clock=clock)
    lab = Lab({"a": [1000.0], "b": [900.0]}, clock)
    r = reserve(budget)
    lab.search(Budget(trials=2))
    stop = threading.Event()
    stop.set()
    assert remeasure_top(lab.study, budget, r, lab.run_one, stop).done == ()
    assert budget.held_s == 0 and budget.remaining() == 800.0  # the reserve came back all the same
    lab.study.enqueue_trial({"c": "b"})
    assert remeasure_top(lab.study, budget, Reserve(top=3), lab.run_one).done == ()


@pytest.mark.parametrize("kept", [True, False])
def test_best_respects_the_caller_filter(kept):
    clock = Clock()
    lab = Lab({"a": [1000.0], "b": [900.0]}, clock)
    lab.run_one(), lab.run_one()
    pick = best(lab.study.get_trials(), keep=lambda t: kept or t.params["c"] != "a")
    assert pick.trial.params["c"] == ("a" if kept else "b")


def test_the_summary_and_the_table_say_which_figures_chose_the_winner():
    from rich.console import Console

    from autotune.show.tables import study_table

    clock = Clock()
    lab = Lab({"a": [1000.0, 800.0], "b": [950.0, 940.0]}, clock)
    lab.run_one(), lab.run_one()
    assert best_trial(lab.study).text == "trial 0, 1,000 output tok/s (one measurement)"  # nothing re-measured yet
    ran = remeasure_top(lab.study, Budget(trials=2, clock=clock), Reserve(top=2, trials=2), lab.run_one)
    assert ran.done == (0, 1, 1, 0) and ran.booted == 4  # the 2 trials given back, and 2 the budget had
    assert ran.stopped_because == "4 trial(s) done"
    winner = best_trial(lab.study)
    assert winner.text == "trial 1, 940 output tok/s (median of 3 measurements, 940-950)"
    console = Console(width=200, record=True)
    console.print(study_table(lab.study.trials))
    text = console.export_text()
    # one row per configuration, by its figure, with how many runs it stands on: no row of its own for a re-measure
    rows = [line.split("│")[1:5] for line in text.splitlines() if line.startswith("│")]
    assert [[cell.strip() for cell in row] for row in rows] == [["1", "measured", "940", "3"],
                                                                 ["0", "measured", "800", "3"]]
    assert "re-measure of" not in text


def test_the_reserve_never_takes_more_than_half_the_budget():
    """An incumbent of 420 s in a 1,000 s budget: holding its re-measurement back (525 s with its quarter to
    spare) would leave the search less than half; half is the most the end of the run may take."""
    clock = Clock()
    budget = Budget(seconds=1000, clock=clock)
    reserve(budget, top=3)
    assert budget.remaining() == 850.0  # 15% before any trial
    lab = Lab({"a": [900.0], "b": [1000.0]}, clock, lengths={"a": 180.0, "b": 420.0})
    lab.run_one()
    hold(budget, lab.study.get_trials())  # a's re-measurement with a quarter to spare: 225 s, within half
    assert budget.held() == 225.0 and budget.remaining() == 1000 - 180 - 225
    assert budget.left_text() == "13m40s left, 3m45s of it for re-measuring"
    lab.run_one()
    hold(budget, lab.study.get_trials())  # b wins: 525 s with its quarter to spare, so the reserve would buy
    assert budget.held() == 0.0 and budget.remaining() == 1000 - 600  # nothing, and none is held
    assert budget.left_text() == "6m40s left"  # what progress prints: the budget's clock, which only runs down


def test_a_lone_clear_winner_is_confirmed_once_and_nothing_else_is_re_measured():
    clock = Clock()
    lab = Lab({"a": [1000.0, 990.0], "b": [700.0], "c": [600.0]}, clock)
    for _ in range(3):
        lab.run_one()
    ran = remeasure_top(lab.study, Budget(trials=10, clock=clock), Reserve(top=3), lab.run_one)
    assert ran.done == (0,) and ran.stopped_because == ""  # b's band (up to 735) is far below a's (from 940)
    assert best_trial(lab.study).text == "trial 0, 990 output tok/s (lower median of 2 measurements, 990-1,000)"
    assert next_to_remeasure(lab.study.get_trials()) is None


def test_a_runner_up_is_re_measured_only_while_it_can_change_the_answer():
    clock = Clock()
    # a's first figure was luck; b's single figure, within a's band once a is confirmed, could win; c cannot.
    lab = Lab({"a": [1000.0, 500.0], "b": [900.0], "c": [400.0]}, clock)
    for _ in range(3):
        lab.run_one()
    trials = lab.study.get_trials()
    assert next_to_remeasure(trials).number == 0  # the incumbent's one confirmation first
    ran = remeasure_top(lab.study, Budget(trials=2, clock=clock), Reserve(top=3), lab.run_one)
    assert ran.done == (0, 1)
    trials = lab.study.get_trials()
    assert best(trials).trial.number == 1 and best(trials).figure == 900.0
    # a (750, 500-1,000) still reaches b's band (855-945): the two go on (two measurements each: the incumbent
    # first), c (up to 420) is never booted again.
    assert next_to_remeasure(trials).number == 1
    assert all(t.params["c"] != "c" for t in trials[3:])


def _measured(lab: Lab, c: str, times: int) -> None:
    """Boot config `c` `times` times: its first trial, then re-measurements of it."""
    lab.study.enqueue_trial({"c": c})
    first = lab.run_one() and lab.study.trials[-1]
    for _ in range(times - 1):
        lab.study.enqueue_trial({"c": c}, user_attrs={REMEASURE_ATTR: first.number})
        lab.run_one()


def test_the_band_widens_to_the_machines_measured_spread_once_it_rests_on_enough_repeats():
    # a confirmed at 980-1,000; b measured once at 850: 7% below a's bottom, out of reach within the default 5% band
    clock = Clock()
    lab = Lab({"a": [1000.0, 980.0], "b": [850.0], "x": [500.0, 400.0, 600.0], "y": [300.0, 360.0, 250.0]}, clock)
    for c, times in (("a", 2), ("b", 1)):
        _measured(lab, c, times)
    assert next_to_remeasure(lab.study.get_trials()) is None
    # a noisy machine: x and y measured three times each spread by ±19% (5 repeats with a's): b is in reach now
    for c in ("x", "y"):
        _measured(lab, c, 3)
    trials = lab.study.get_trials()
    assert spread(trials).steers and spread(trials).sd == pytest.approx(0.189, abs=0.001)
    assert next_to_remeasure(trials).params["c"] == "b"


def test_one_noisy_pair_does_not_put_every_runner_up_in_reach():
    # x measured 500 then 250 (±63% from a single repeat): the band stays the default, b out of reach
    clock = Clock()
    lab = Lab({"a": [1000.0, 980.0], "b": [850.0], "x": [500.0, 250.0]}, clock)
    for c, times in (("a", 2), ("b", 1), ("x", 2)):
        _measured(lab, c, times)
    trials = lab.study.get_trials()
    assert spread(trials).sd > 0.3 and not spread(trials).steers
    assert next_to_remeasure(trials) is None


def test_a_higher_single_figure_the_run_had_no_time_to_re_measure_is_named_beside_the_winner():
    clock = Clock()
    lab = Lab({"a": [1000.0, 500.0], "b": [900.0], "c": [400.0]}, clock)
    for _ in range(3):
        lab.run_one()
    ran = remeasure_top(lab.study, Budget(trials=1, clock=clock), Reserve(top=3), lab.run_one)
    assert ran.done == (0,)  # a confirmed (500), then no time for b
    winner = best(lab.study.get_trials())
    assert winner.trial.number == 0 and winner.rival is not None and winner.rival.trial.number == 1
    assert winner.text == ("trial 0, 500 output tok/s (lower median of 2 measurements, 500-1,000); trial 1 measured "
                           "higher once, 900 output tok/s, and was not re-measured: it may still win")
    remeasure_top(lab.study, Budget(trials=1, clock=clock), Reserve(top=3), lab.run_one)  # b: 900 again
    # b wins, and nothing measured once is higher
    assert best(lab.study.get_trials()).trial.number == 1 and best(lab.study.get_trials()).rival is None


def test_each_configuration_is_re_measured_at_most_max_rounds_times():
    clock = Clock()
    lab = Lab({"a": [1000.0], "b": [1000.0]}, clock)  # a tie that no measurement breaks
    lab.run_one(), lab.run_one()
    ran = remeasure_top(lab.study, Budget(trials=100, clock=clock), Reserve(top=2), lab.run_one)
    assert sorted(ran.done) == [0, 0, 0, 1, 1, 1] and ran.stopped_because == ""


def gpu_run(left: float) -> tuple[Lab, Budget, Reserve]:
    """The GPU run of 1,450 s (chat objective) at the end of its search, `left` seconds before the end: trials 0
    and 1 (the best) each threw a cold boot away (117 s, 110 s: out of memory) and booted again warm; 2 and 3 were
    screened out after one short level; a further configuration (e) would take 150 s."""
    clock = Clock()
    budget = Budget(seconds=1450, clock=clock)
    lab = Lab({"a": [800.0], "b": [1000.0, 990.0], "c": [300.0], "d": [200.0], "e": [250.0]}, clock,
              lengths={"a": 317.5, "b": 253.6, "c": 158.3, "d": 142.9, "e": 150.0}, cold={"a": 117.0, "b": 110.0})
    r = reserve(budget, top=3)
    for _ in range(4):
        budget.record(lab.run_one().duration_s)
    hold(budget, lab.study.get_trials())
    clock.t = 1450 - left  # and the run's own seconds between trials
    return lab, budget, r


def run_to_the_end(lab: Lab, budget: Budget, r: Reserve) -> RemeasureRun:
    stop = threading.Event()
    return search_and_remeasure(lambda: lab.searched(budget),
                                lambda res: remeasure_top(lab.study, budget, res, lab.run_one, stop), r, stop)


def test_a_re_measurement_boots_warm_and_is_sized_without_the_cold_boot_thrown_away():
    """The GPU run stopped with 326 s left: trial 1's re-measurement was sized on its whole trial, cold boot
    included (363.6 s x 1.25 = 454 s). It boots warm: (363.6 - 110) x 1.25 = 317 s, and it fits."""
    lab, budget, r = gpu_run(left=326.0)
    trials = lab.study.get_trials()
    assert [t.user_attrs["duration_s"] for t in trials] == pytest.approx([434.5, 363.6, 158.3, 142.9])
    assert next_to_remeasure(trials).number == 1
    assert length_s(trials[1]) == pytest.approx((363.6 - 110.0) * 1.25)
    assert length_s(trials[2]) == pytest.approx(158.3 * 1.25)  # no cold boot: its whole trial
    # The reserve is that re-measurement (317 s), not 1.25 x the median trial (326 s: screened trials are short).
    assert budget.held() == pytest.approx(317.0)
    ran = remeasure_top(lab.study, budget, r, lab.run_one)
    assert ran.done == (1,) and ran.booted == 1 and ran.stopped_because == ""


def booted(number: int, duration_s: float, boot_s: float, cache: str) -> optuna.trial.FrozenTrial:
    return optuna.trial.create_trial(value=600.0, params={}, distributions={}, user_attrs={
        "duration_s": duration_s, "boot_s": boot_s, "compile_cache": cache, "status": "ok"})


def test_a_boot_that_compiled_cold_is_sized_as_this_machines_warm_boot():
    """On the H200 as a 3090 the recipe's trial took 379 s, 254 s of it booting its compile key cold; the warm
    boot of another key took 100 s. Booting the recipe again costs its 125 s measurement and a warm boot, not 379 s."""
    recipe, warm = booted(0, 378.6, 253.7, "cold"), booted(1, 264.9, 100.5, "warm")
    quick = booted(2, 150.0, 80.0, "cold")
    assert warm_boot_s([recipe, quick]) is None  # none seen warm yet: a trial counts its own boot
    assert length_s(recipe, warm_boot_s([recipe, quick])) == pytest.approx(378.6 * 1.25)
    assert warm_boot_s([recipe, warm, quick]) == pytest.approx(100.5)
    assert length_s(recipe, 100.5) == pytest.approx((378.6 - 253.7 + 100.5) * 1.25)
    assert length_s(warm, 100.5) == pytest.approx(264.9 * 1.25)  # booted warm already
    assert length_s(quick, 100.5) == pytest.approx(150.0 * 1.25)  # a cold boot quicker than warm is not lengthened


def test_with_326_s_left_the_run_re_measures_then_stops_only_when_nothing_fits():
    lab, budget, r = gpu_run(left=326.0)
    ran = run_to_the_end(lab, budget, r)
    assert ran.done == (1,) and ran.booted == 1
    assert lab.clock.t == pytest.approx(1450 - 326 + 253.6)  # warm, as estimated
    # 72 s left, too few for a trial; trial 1 is confirmed and no runner-up can change the answer. A trial is
    # the median of the search's own four (the re-measurement is not one of them).
    assert ran.stopped_because == "72 s left, less than one trial (~261 s)"


def test_time_a_re_measurement_cannot_use_goes_back_to_the_search():
    """300 s left: the search stopped at its deadline (the reserve held 317 s, and the last trial ran into it),
    and trial 1's re-measurement no longer fits: the search takes the 300 s back for a 150 s trial."""
    lab, budget, r = gpu_run(left=300.0)
    ran = run_to_the_end(lab, budget, r)
    assert ran.done == () and ran.booted == 0
    trials = lab.study.get_trials()
    assert len(trials) == 5 and trials[4].params["c"] == "e" and lab.clock.t == 1300.0
    assert ran.stopped_because == (
        "150 s left, less than one trial (~158 s); "
        "150 s left, less than one re-measurement of trial 1 (~317 s with a quarter to spare)")
