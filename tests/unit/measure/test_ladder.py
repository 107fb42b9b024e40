"""The SLA search against fake measures (pure functions of the level): which levels, in which order, which of
them exact; where it starts from what earlier trials reached; screening at the incumbent's level."""

from __future__ import annotations

import pytest

from autotune.measure.ladder import NO_PRIOR, LoadSearch, Prior, capacity, find_sustainable, first_level


def run(search: LoadSearch, passes, prior: Prior = NO_PRIOR, seen=None):
    """Search with a measure whose outcome is a fake p95 (10 ms per unit of load) and a pass predicate."""
    def measure(x, exact):
        if seen is not None:
            seen.append((x, exact))
        return {"level": x, "p95_ms": 10 * x}
    return find_sustainable(measure, lambda o: passes(o["level"]), search, prior)


def levels(result):
    return [s.level for s in result.steps]


def test_without_history_it_starts_in_the_geometric_middle_not_at_one():
    r = run(LoadSearch(start=1, max=256, factor=2, tolerance=0.25), lambda x: x <= 20)
    # sqrt(1 * 256) = 16 passes, 32 fails; bisect: 24 fails, 20 passes, gap 4 <= 0.25 * 20 stops
    assert levels(r) == [16, 32, 24, 20]
    assert [s.exact for s in r.steps] == [False, False, True, True]  # the ramp is judged early, bisection exactly
    assert r.best_level == 20 and r.best == {"level": 20, "p95_ms": 200}
    assert all(isinstance(x, int) for x in levels(r))


def test_capacity_sets_the_first_level_one_step_below_it():
    # max_num_seqs 64, KV for 40 requests of 320 tokens: 40 at once at most; start at 20
    cap = capacity(64, 40 * 320, 320)
    assert cap == 40
    r = run(LoadSearch(start=1, max=256), lambda x: x <= 12, Prior(cap=cap))
    assert levels(r) == [20, 10, 15, 12]  # 20 fails, down to 10 passes, bisect: 15 - 12 <= 0.25 * 12
    assert r.best_level == 12


def test_it_comes_down_from_a_failing_first_level_until_one_passes():
    r = run(LoadSearch(start=1, max=64, tolerance=0), lambda x: x <= 3, Prior(incumbent=32))
    assert levels(r) == [32, 16, 8, 4, 2, 3]
    assert r.best_level == 3 and r.steps[-1].exact


def test_nothing_passes_down_to_start_is_infeasible():
    r = run(LoadSearch(start=2, max=64), lambda x: False, Prior(incumbent=8))
    assert levels(r) == [8, 4, 2]
    assert not r.feasible and not r.screened_out


def test_similar_configurations_set_the_start_when_not_screening():
    assert first_level(LoadSearch(max=64), Prior(incumbent=32, similar=(6, 8, 12))) == 8
    assert first_level(LoadSearch(max=64), Prior(incumbent=32, similar=(6, 8, 12), screen=True)) == 32


def test_screening_ends_after_one_level_when_the_incumbents_level_fails():
    seen: list = []
    r = run(LoadSearch(start=1, max=64), lambda x: x <= 10, Prior(incumbent=16, screen=True), seen)
    assert seen == [(16, False)]
    assert r.screened_out and not r.feasible


def test_a_configuration_that_sustains_the_incumbents_level_gets_the_full_search_above_it():
    r = run(LoadSearch(start=1, max=64, tolerance=0), lambda x: x <= 40, Prior(incumbent=16, screen=True))
    assert levels(r) == [16, 32, 64, 48, 40, 44, 42, 41]
    assert r.best_level == 40 and not r.screened_out


def test_a_best_level_passed_only_early_is_measured_exactly_and_its_failure_counts():
    # A level that passes the early verdict but not the exact one (the p95 sits at the limit).
    calls: list = []

    def measure(x, exact):
        calls.append((x, exact))
        return {"level": x, "ok": x <= 7 or (x == 8 and not exact)}

    r = find_sustainable(measure, lambda o: o["ok"], LoadSearch(start=1, max=8, tolerance=0), Prior(incumbent=8))
    # 8 passes early and is the top: measured exactly, fails; 7 is not measured yet: down to 4, bisect to 7
    assert calls == [(8, False), (8, True), (4, False), (6, True), (7, True)]
    assert r.best_level == 7


def test_every_level_passes_up_to_a_max_that_is_not_a_power():
    r = run(LoadSearch(start=1, max=100), lambda x: True, Prior(incumbent=10))
    assert levels(r) == [10, 20, 40, 80, 100, 100]  # the top, passed early, once more exactly
    assert r.best_level == 100 and r.steps[-1].exact


def test_non_monotone_never_skips_past_a_failure():
    ok = {1, 2, 4, 6, 12, 16}  # 12 and 16 pass but lie above the first failure (8)
    r = run(LoadSearch(start=1, max=64, tolerance=0.25), lambda x: x in ok, Prior(incumbent=2))
    assert levels(r) == [2, 4, 8, 6, 7]
    assert r.best_level == 6


def test_rate_mode_bisects_real_numbers():
    r = run(LoadSearch(mode="rate", start=0.5, max=64, tolerance=0.1), lambda x: x <= 3.3, Prior(incumbent=1))
    assert levels(r) == [1, 2, 4, 3, 3.5, 3.25]
    assert r.best_level == 3.25


def test_small_factor_still_rises_by_whole_requests():
    r = run(LoadSearch(start=3, max=8, factor=1.1), lambda x: True, Prior(incumbent=3))
    assert levels(r) == [3, 4, 5, 6, 7, 8, 8]


def test_measure_exception_propagates_and_stops():
    seen = []

    def measure(x, exact):
        seen.append(x)
        if x == 8:
            raise KeyboardInterrupt("pruned")
        return x

    with pytest.raises(KeyboardInterrupt):
        find_sustainable(measure, lambda o: True, LoadSearch(start=1, max=64), Prior(incumbent=2))
    assert seen == [2, 4, 8]


@pytest.mark.parametrize(
    "search",
    [LoadSearch(start=0), LoadSearch(start=8, max=4), LoadSearch(factor=1), LoadSearch(mode="rate", tolerance=0)],
)
def test_bad_search_rejected(search):
    with pytest.raises(ValueError):
        find_sustainable(lambda x, exact: x, lambda o: True, search)
