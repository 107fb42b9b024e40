"""The final pairs' stopping rule, simulated: how often it proves a winner, how often its interval holds the true
gain, how many pairs it takes and what gain it prints, for a range of true gains: the rule autotune had (looks from
the second pair, each at the answer's 90%) and the rule it uses (looks from paired.MIN_PAIRS, each at
paired.LOOK_CONFIDENCE), side by side on the same draws.

    .venv/bin/python -m benchmarks.pair_looks [--runs 40000] [--spread 0.072] [--seed 1]

Each run draws MAX_PAIRS paired log-ratios, log(1 + true gain) + sqrt(2) x spread x N(0, 1) (two measurements, each
spreading by `spread`: the held-down H100 surface's 7.2%), and applies paired.needs_another_pair's rule: look after
each pair from the first look on, stop at the first t interval that excludes no difference, or at MAX_PAIRS.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from autotune.search.paired import CONFIDENCE, LOOK_CONFIDENCE, MAX_PAIRS, MIN_PAIRS

GAINS = (0.0, 0.056, 0.10, 0.15, 0.25)


RULES = (("before: from 2 pairs, 90% each", 2, CONFIDENCE), (f"now: from {MIN_PAIRS} pairs, {LOOK_CONFIDENCE:.1%} each",
                                                            MIN_PAIRS, LOOK_CONFIDENCE))


@dataclass(frozen=True)
class Outcome:
    better: float  # share of runs that showed the winner better (interval above 0)
    worse: float  # share that showed it worse
    holds: float  # share whose interval where they stopped holds the true gain
    pairs: float  # mean pairs measured
    printed: float | None  # median gain printed by the runs that showed it better


def simulate(gain: float, first: int, confidence: float, logs: np.ndarray) -> Outcome:
    """The rule looking from `first` pairs at `confidence` per look, on paired log-ratios `logs` (runs x MAX_PAIRS)
    whose true mean is log(1 + gain)."""
    runs = logs.shape[0]
    mid, low, high = np.zeros(runs), np.zeros(runs), np.zeros(runs)
    pairs, done = np.full(runs, MAX_PAIRS), np.zeros(runs, bool)
    for n in range(first, MAX_PAIRS + 1):
        d = logs[:, :n]
        m = d.mean(1)
        half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * d.std(1, ddof=1) / math.sqrt(n)
        stop = ~done & ((m - half > 0) | (m + half < 0) | (n == MAX_PAIRS))
        mid[stop], low[stop], high[stop], pairs[stop] = m[stop], m[stop] - half[stop], m[stop] + half[stop], n
        done |= stop
    true = math.log1p(gain)
    better = low > 0
    printed = float(np.median(np.expm1(mid[better]))) if better.any() else None
    return Outcome(float(better.mean()), float((high < 0).mean()), float(((low < true) & (true < high)).mean()),
                   float(pairs.mean()), printed)


def table(runs: int, spread: float, seed: int) -> list[str]:
    z = np.random.default_rng(seed).standard_normal((runs, MAX_PAIRS))
    lines = [f"{runs:,} runs per row (the same draws for both rules), one measurement spreading by ±{spread:.1%}, "
             f"at most {MAX_PAIRS} pairs",
             "| true gain | rule | shown better | shown worse | interval holds the true gain | mean pairs "
             "| median gain printed when shown better |", "|---|---|---|---|---|---|---|"]
    for gain in GAINS:
        logs = math.log1p(gain) + math.sqrt(2) * spread * z
        for label, first, confidence in RULES:
            o = simulate(gain, first, confidence, logs)
            printed = "-" if o.printed is None else f"{o.printed:+.1%}"
            lines.append(f"| {gain:+.1%} | {label} | {o.better:.1%} | {o.worse:.1%} | {o.holds:.1%} | "
                         f"{o.pairs:.1f} | {printed} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=40_000)
    ap.add_argument("--spread", type=float, default=0.072)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    print("\n".join(table(a.runs, a.spread, a.seed)))


if __name__ == "__main__":
    main()
