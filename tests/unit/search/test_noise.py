"""This machine's noise (search/noise.py) on recorded figures: the spread of one measurement, and when it rests
on enough repeats to steer the re-measure band and the screen before boot."""

from __future__ import annotations

import math

import pytest

from autotune.measure.queueing import HELD_SHARE, held_share
from autotune.search import noise


def test_one_pair_of_measurements_does_not_steer_the_rules():
    # one configuration measuring 1,000 then 500 output tok/s: ±63%, which as a band would put every runner-up in
    # reach of the incumbent; and the same flags measuring 1,054 and 1,583 on two boots of a fresh clone's make run
    for figures, sd in (([1000.0, 500.0], 0.63), ([1054.0, 1583.0], 0.33)):
        spread = noise.pooled([figures])
        assert spread is not None and spread.sd == pytest.approx(sd, abs=0.005)
        assert (spread.repeats, spread.steers) == (1, False)
        assert noise.band(spread) == noise.DEFAULT_BAND and noise.screen_noise(spread) == 0.0
    assert noise.pooled([[1000.0]]) is None and noise.band(None) == noise.DEFAULT_BAND


def test_the_spread_steers_once_it_stands_on_enough_repeats():
    # benchmarks/data/cpu-first-level-repeat: one level measured three times on each server (2 cores)
    servers = [[855.0, 926.0, 1069.0], [1070.0, 1127.0, 996.0], [1038.0, 961.0, 871.0]]
    two = noise.pooled(servers[:2])
    assert two is not None and (two.measurements, two.configurations, two.repeats) == (6, 2, 4) and two.steers
    logs = [[math.log(x) for x in g] for g in servers[:2]]
    squares = sum((x - sum(g) / len(g)) ** 2 for g in logs for x in g)
    assert two.sd == pytest.approx(math.expm1(math.sqrt(squares / 4)))
    assert 0.09 < two.sd < 0.10  # ±10%: twice the default band
    assert noise.band(two) == two.sd and noise.screen_noise(two) == two.sd
    assert two.text() == ("one measurement on this machine spreads by ±10% (standard deviation of 6 measurements "
                          "of 2 configuration(s) measured more than once)")
    one = noise.pooled(servers[:1])  # two repeats: not yet
    assert one is not None and one.repeats == 2 and not one.steers


def test_the_screen_before_boot_lowers_its_share_only_for_a_spread_past_what_it_leaves():
    assert held_share() == HELD_SHARE == 7 / 8
    assert held_share(0.08) == HELD_SHARE  # the GPU surfaces' spread (6-9%): 7/8 was set on them
    assert held_share(0.20) == pytest.approx(0.80)  # a busy 2-core machine: within a fifth of the incumbent boots
