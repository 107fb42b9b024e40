"""The SLA search against fake measures (pure functions of the level): which levels, in which order, which of
them exact; where it starts from what earlier trials reached; screening at the incumbent's level."""

from __future__ import annotations

import math

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
    # sqrt(1 * 256) = 16 passes, 32 fails; bisect: 24 fails, 20 passes, gap 4 <= 0.25 * 20 stops; 20 once more
    assert levels(r) == [16, 32, 24, 20, 20]
    assert [s.exact for s in r.steps] == [False, False, False, False, True]  # only the answer is exact
    assert r.best_level == 20 and r.best == {"level": 20, "p95_ms": 200}
    assert all(isinstance(x, int) for x in levels(r))


def test_capacity_sets_the_first_level_one_step_below_it():
    # max_num_seqs 64, KV for 40 requests of 320 tokens: 40 at once at most; start at 20
    cap = capacity(64, 40 * 320, 320)
    assert cap == 40
    r = run(LoadSearch(start=1, max=256), lambda x: x <= 12, Prior(cap=cap))
    assert levels(r) == [20, 10, 15, 12, 12]  # 20 fails, down to 10 passes, bisect: 15 - 12 <= 0.25 * 12
    assert r.best_level == 12


def test_it_comes_down_from_a_failing_first_level_until_one_passes():
    r = run(LoadSearch(start=1, max=64, tolerance=0), lambda x: x <= 3, Prior(incumbent=32))
    assert levels(r) == [32, 16, 8, 4, 2, 3, 3]
    assert r.best_level == 3 and r.steps[-1].exact


def test_nothing_passes_down_to_start_is_infeasible():
    r = run(LoadSearch(start=2, max=64), lambda x: False, Prior(incumbent=8))
    assert levels(r) == [8, 4, 2]
    assert not r.feasible and not r.screened_out


def test_similar_configurations_set_the_start_when_not_screening():
    assert first_level(LoadSearch(max=64), Prior(incumbent=32, similar=(6, 8, 12))) == 8
    assert first_level(LoadSearch(max=64), Prior(incumbent=32, similar=(6, 8, 12), screen=True)) == 32


def test_screening_allows_for_this_machines_measured_noise():
    """With one measurement spreading by ±10% here, a configuration that holds 18 of the incumbent's 20 is within
    the noise of it: it is screened at 18 and searched on, not screened out at 20."""
    assert first_level(LoadSearch(max=64), Prior(incumbent=20, screen=True)) == 20
    assert first_level(LoadSearch(max=64), Prior(incumbent=20, screen=True, noise=0.1)) == 18
    r = run(LoadSearch(start=1, max=64), lambda x: x <= 18, Prior(incumbent=20, screen=True, noise=0.1))
    assert not r.screened_out and r.best_level == 18
    r = run(LoadSearch(start=1, max=64), lambda x: x <= 18, Prior(incumbent=20, screen=True))
    assert r.screened_out


def test_screening_ends_after_one_level_when_the_incumbents_level_fails():
    seen: list = []
    r = run(LoadSearch(start=1, max=64), lambda x: x <= 10, Prior(incumbent=16, screen=True), seen)
    assert seen == [(16, False)]
    assert r.screened_out and not r.feasible


def test_a_configuration_that_sustains_the_incumbents_level_gets_the_full_search_above_it():
    r = run(LoadSearch(start=1, max=64, tolerance=0), lambda x: x <= 40, Prior(incumbent=16, screen=True))
    assert levels(r) == [16, 32, 64, 48, 40, 44, 42, 41, 40]
    assert r.best_level == 40 and not r.screened_out


def test_a_best_level_passed_only_early_is_measured_exactly_and_its_failure_counts():
    # A level that passes the early verdict but not the exact one (the p95 sits at the limit).
    calls: list = []

    def measure(x, exact):
        calls.append((x, exact))
        return {"level": x, "ok": x <= 7 or (x == 8 and not exact)}

    r = find_sustainable(measure, lambda o: o["ok"], LoadSearch(start=1, max=8, tolerance=0), Prior(incumbent=8))
    # 8 passes early and is the top: measured exactly, fails; 7 is not measured yet: down to 4, bisect to 7
    # (judged early), which is measured exactly in turn
    assert calls == [(8, False), (8, True), (4, False), (6, False), (7, False), (7, True)]
    assert r.best_level == 7


def test_every_level_passes_up_to_a_max_that_is_not_a_power():
    r = run(LoadSearch(start=1, max=100), lambda x: True, Prior(incumbent=10))
    assert levels(r) == [10, 20, 40, 80, 100, 100]  # the top, passed early, once more exactly
    assert r.best_level == 100 and r.steps[-1].exact


def test_non_monotone_never_skips_past_a_failure():
    ok = {1, 2, 4, 6, 12, 16}  # 12 and 16 pass but lie above the first failure (8)
    r = run(LoadSearch(start=1, max=64, tolerance=0.25), lambda x: x in ok, Prior(incumbent=2))
    assert levels(r) == [2, 4, 8, 6, 7, 6]
    assert r.best_level == 6


def test_rate_mode_bisects_real_numbers():
    r = run(LoadSearch(mode="rate", start=0.5, max=64, tolerance=0.1), lambda x: x <= 3.3, Prior(incumbent=1))
    assert levels(r) == [1, 2, 4, 3, 3.5, 3.25, 3.25]
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


def calls_of(passes_exact, passes_early):
    """A fake measure whose verdict depends on how the level is judged (a sequential verdict may go either way near
    the limit), recording (level, exact); the outcome is that verdict."""
    calls: list = []

    def measure(x, exact):
        calls.append((x, exact))
        return passes_exact(x) if exact else passes_early(x)
    return measure, calls


def test_a_remeasurement_measures_its_originals_best_level_once_exactly_and_judges_bisection_early():
    # The device's re-measurement of its incumbent (chat-p95 as an RTX 3090, p95 TTFT binding, best level 37) ran
    # 37 early (113 requests), 74 early (12), 55 exact (219) and 46 exact (183), both far over the limit, then 37
    # exactly again (175): 165 s. Now 37 is measured once, exactly, and the failing mids stop early.
    measure, calls = calls_of(lambda x: x <= 37, lambda x: x <= 37)
    search = LoadSearch(start=1, max=128, factor=2, tolerance=0.25)
    r = find_sustainable(measure, bool, search, Prior(incumbent=37, exact_first=True))
    assert calls == [(37, True), (74, False), (55, False), (46, False)]
    assert r.best_level == 37 and r.best_step is not None and r.best_step.exact


def test_a_baseline_first_trial_measures_only_its_answer_exactly():
    # The device baseline's first trial: 15, 30 early, 60 early (fails), 45 exact (fails), 37 exact (passes).
    measure, calls = calls_of(lambda x: x <= 37, lambda x: x <= 37)
    find_sustainable(measure, bool, LoadSearch(start=1, max=128), Prior(cap=30))
    assert calls == [(15, False), (30, False), (60, False), (45, False), (37, False), (37, True)]


def test_a_final_level_passed_early_that_fails_exactly_sends_the_search_below_it():
    # Sequential verdicts pass up to 24 (the p95 just over its limit there), exact ones up to 20.
    measure, calls = calls_of(lambda x: x <= 20, lambda x: x <= 24)
    r = find_sustainable(measure, bool, LoadSearch(start=1, max=256, tolerance=0.25), Prior(incumbent=16))
    # 16 passes, 32 fails, 24 passes early, 28 fails: 24 is measured exactly and fails; between 16 (the highest
    # level still passed) and 24 the search bisects again: 20 passes early, then exactly
    assert calls == [(16, False), (32, False), (24, False), (28, False), (24, True), (20, False), (20, True)]
    assert r.best_level == 20 and r.best_step is not None and r.best_step.exact


def test_with_no_pass_below_the_failed_answer_it_comes_down_by_factor():
    measure, calls = calls_of(lambda x: x <= 18, lambda x: x <= 24)
    r = find_sustainable(measure, bool, LoadSearch(start=1, max=256, tolerance=0.25), Prior(incumbent=24))
    # 24 passes early, 48 36 30 fail: 24 fails exactly, nothing below was measured: 12, bisect 18 and 21 (passed
    # early); 21 fails exactly; between 18 and 21 nothing to bisect: 18 exactly
    assert calls == [(24, False), (48, False), (36, False), (30, False), (24, True), (12, False), (18, False),
                     (21, False), (21, True), (18, True)]
    assert r.best_level == 18


def old_search(measure, search: LoadSearch, prior: Prior):
    """The search before bisection was judged early (commit 8069757): bisection levels exact; only what this
    comparison needs (concurrency, no screening)."""
    steps: dict = {}
    exact: dict = {}

    def step(x, ex):
        steps[x], exact[x] = measure(x, ex), ex
        return steps[x]

    up = lambda x: min(int(search.max), max(x + 1, math.ceil(x * search.factor)))  # noqa: E731
    down = lambda x: max(int(search.start), min(x - 1, math.floor(x / search.factor)))  # noqa: E731

    def descend(fail):
        while fail > search.start:
            x = down(fail)
            if step(x, False):
                return x, fail
            fail = x
        return None, fail

    level = first_level(search, prior)
    lo, hi = None, None
    if step(level, False):
        lo = level
        while lo < search.max:
            if not step(nxt := up(lo), False):
                hi = nxt
                break
            lo = nxt
    else:
        lo, hi = descend(level)
    while lo is not None:
        while hi is not None and hi - lo > max(search.tolerance * lo, 1):
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if step(mid, True) else (lo, mid)
        if exact[lo] or step(lo, True):
            return lo
        below = [x for x, ok in steps.items() if ok and x < lo]
        lo, hi = (max(below), lo) if below else descend(lo)
    return None


@pytest.mark.parametrize("limit", [3, 7, 12, 20, 37, 55, 90])
@pytest.mark.parametrize("band", [-0.15, 0.0, 0.15])  # where early verdicts switch, relative to exact ones
@pytest.mark.parametrize("prior", [NO_PRIOR, Prior(incumbent=10), Prior(incumbent=37), Prior(cap=64)])
def test_the_answer_is_within_one_bisection_step_of_the_old_search(limit, band, prior):
    # Monotone responses: exact verdicts pass up to `limit`, early ones up to limit x (1 + band): harsher or more
    # lenient near the limit, as a sequential test may be. Where both agree (band 0) the answer is the old one;
    # else within one bisection step of it, plus the band where early verdicts fail levels that pass exactly
    # (limit 7, band -15%: 6 fails early, so 5 where the old search measured 6 and 7 exactly).
    search = LoadSearch(start=1, max=128, tolerance=0.25)
    early = limit * (1 + band)
    measure, calls = calls_of(lambda x: x <= limit, lambda x: x <= early)
    new = find_sustainable(measure, bool, search, prior).best_level
    old = old_search(calls_of(lambda x: x <= limit, lambda x: x <= early)[0], search, prior)
    assert new is not None and old is not None and new <= limit
    if band == 0:
        assert new == old
    else:
        assert abs(new - old) <= max(search.tolerance * max(new, old), 1) + (-band * limit if band < 0 else 0)
    assert sum(ex for _, ex in calls) <= 2  # the answer, and at most one level passed early that failed exactly
