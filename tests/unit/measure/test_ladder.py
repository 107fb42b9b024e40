"""The SLA search against fake measures (pure functions of the level): which levels, in which order."""

from __future__ import annotations

import pytest

from autotune.measure.ladder import LoadSearch, find_sustainable


def run(search: LoadSearch, passes):
    """Search with a measure whose outcome is a fake p95 (10 ms per unit of load) and a pass predicate."""
    return find_sustainable(lambda x: {"level": x, "p95_ms": 10 * x}, lambda o: passes(o["level"]), search)


def levels(result):
    return [s.level for s in result.steps]


def test_monotone_concurrency_doubles_then_bisects():
    r = run(LoadSearch(start=1, max=256, factor=2, tolerance=0.25), lambda x: x <= 20)
    # ramp 1..16 pass, 32 fails; bisect: 24 fails, 20 passes, gap 4 <= 0.25 * 20 stops
    assert levels(r) == [1, 2, 4, 8, 16, 32, 24, 20]
    assert [s.passed for s in r.steps] == [True] * 5 + [False, False, True]
    assert r.best_level == 20 and r.best == {"level": 20, "p95_ms": 200}
    assert all(isinstance(x, int) for x in levels(r))
    assert r.feasible


def test_concurrency_bisects_to_one_with_zero_tolerance():
    r = run(LoadSearch(start=1, max=64, tolerance=0), lambda x: x <= 21)
    assert levels(r) == [1, 2, 4, 8, 16, 32, 24, 20, 22, 21]
    assert r.best_level == 21


def test_every_level_passes_up_to_a_max_that_is_not_a_power():
    r = run(LoadSearch(start=1, max=100), lambda x: True)
    assert levels(r) == [1, 2, 4, 8, 16, 32, 64, 100]
    assert r.best_level == 100


def test_first_level_fails_is_infeasible():
    r = run(LoadSearch(start=4, max=64), lambda x: False)
    assert levels(r) == [4]
    assert r.best is None and r.best_level is None and not r.feasible


def test_non_monotone_never_skips_past_a_failure():
    ok = {1, 2, 4, 6, 12, 16}  # 12 and 16 pass but lie above the first failure (8)
    r = run(LoadSearch(start=1, max=64, tolerance=0.25), lambda x: x in ok)
    assert levels(r) == [1, 2, 4, 8, 6, 7]
    assert r.best_level == 6


def test_rate_mode_bisects_real_numbers():
    r = run(LoadSearch(mode="rate", start=0.5, max=64, tolerance=0.1), lambda x: x <= 3.3)
    assert levels(r) == [0.5, 1, 2, 4, 3, 3.5, 3.25]
    assert r.best_level == 3.25


def test_small_factor_still_rises_by_whole_requests():
    r = run(LoadSearch(start=3, max=8, factor=1.1), lambda x: True)
    assert levels(r) == [3, 4, 5, 6, 7, 8]


def test_measure_exception_propagates_and_stops():
    seen = []

    def measure(x):
        seen.append(x)
        if x == 8:
            raise KeyboardInterrupt("pruned")
        return x

    with pytest.raises(KeyboardInterrupt):
        find_sustainable(measure, lambda o: True, LoadSearch(start=1, max=64))
    assert seen == [1, 2, 4, 8]


@pytest.mark.parametrize(
    "search",
    [LoadSearch(start=0), LoadSearch(start=8, max=4), LoadSearch(factor=1), LoadSearch(mode="rate", tolerance=0)],
)
def test_bad_search_rejected(search):
    with pytest.raises(ValueError):
        find_sustainable(lambda x: x, lambda o: True, search)
