"""The final pairs' looks, simulated: the stopping rule looks after every pair from MIN_PAIRS to MAX_PAIRS, so each
look's interval must be wider than the answer's 90% for the interval printed where the pairs stopped to be a 90%
one. Seeded normal log-ratios (the paired t interval's model); the product's own gain_interval judges each look."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autotune.search.paired import (
    CONFIDENCE,
    LOOK_CONFIDENCE,
    MAX_PAIRS,
    MIN_PAIRS,
    Pair,
    gain_interval,
)

RUNS = 4000


def missed_somewhere(true_gain: float, confidence: float, seed: int = 0) -> float:
    """The share of simulated runs of MAX_PAIRS pairs (one measurement spreading by ±7%, as on the held-down H100)
    in which some look's interval at `confidence` leaves out the true gain."""
    rng = np.random.default_rng(seed)
    logs = math.log1p(true_gain) + math.sqrt(2) * 0.072 * rng.standard_normal((RUNS, MAX_PAIRS))
    missed = 0
    for run in logs:
        pairs = [Pair(i, 100.0 * math.exp(x), 100.0) for i, x in enumerate(run)]
        for n in range(MIN_PAIRS, MAX_PAIRS + 1):
            got = gain_interval(pairs[:n], confidence)
            assert got is not None
            if not got.low < true_gain < got.high:
                missed += 1
                break
    return missed / RUNS


@pytest.mark.parametrize("true_gain", [0.0, 0.056])
def test_the_looks_together_hold_the_true_gain_as_often_as_the_answer_says(true_gain):
    # 4,000 runs: a share near 0.10 is within ±0.015 of it (three standard errors)
    assert missed_somewhere(true_gain, LOOK_CONFIDENCE) == pytest.approx(1 - CONFIDENCE, abs=0.015)


def test_the_answers_confidence_at_every_look_would_resolve_a_difference_that_is_not_there():
    """With 90% at each of the six looks, a winner no better than its baseline is 'resolved' in about 26% of runs:
    why each look takes LOOK_CONFIDENCE."""
    assert missed_somewhere(0.0, CONFIDENCE) > 0.2
