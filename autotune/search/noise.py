"""This machine's noise: the spread of one measurement, from the configurations measured more than once, and when
it rests on enough repeats to steer the rules that depend on it.

Two rules need to know how far one measurement can be off: the re-measure band (remeasure.band: may a runner-up
still beat the incumbent?) and the screen before boot (measure/queueing.holds_too_few: does a configuration hold
enough of the incumbent's load to be worth a boot?). Before the study has measured its own noise both use fixed
defaults; once it has, they use the measurement. But a spread from a few repeats is itself very uncertain: a
standard deviation from k repeats is off by about 1/sqrt(2k) of itself (±71% from one, ±35% from four), and one
pair measuring 1,000 and 500 output tok/s says ±63%, which would put every runner-up in reach of the incumbent.
So the measured spread steers the rules only once it stands on MIN_REPEATS repeats.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_BAND = 0.05  # what one boot's noise can move a figure, before the study has measured its own


MIN_REPEATS = 4  # measurements beyond each configuration's first before the spread steers the rules


@dataclass(frozen=True)
class Spread:
    """The spread of one measurement: the pooled standard deviation of log throughput over the configurations
    measured more than once, as a fraction (0.2 = ±20%), and what it stands on."""

    sd: float
    measurements: int
    configurations: int

    @property
    def repeats(self) -> int:
        """Its degrees of freedom: the measurements beyond each configuration's first."""
        return self.measurements - self.configurations

    @property
    def steers(self) -> bool:
        """It rests on enough repeats to replace the rules' defaults."""
        return self.repeats >= MIN_REPEATS

    def text(self) -> str:
        return (f"one measurement on this machine spreads by ±{self.sd * 100:.0f}% (standard deviation of "
                f"{self.measurements} measurements of {self.configurations} configuration(s) measured more than once)")


def pooled(groups: Sequence[Sequence[float]]) -> Spread | None:
    """The Spread of the throughputs of each configuration measured more than once (each group: one
    configuration's figures within the limits); None before any repeat."""
    logs = [[math.log(x) for x in g] for g in groups if len(g) > 1]
    if not logs:
        return None
    squares = sum((x - statistics.fmean(g)) ** 2 for g in logs for x in g)
    dof = sum(len(g) - 1 for g in logs)
    return Spread(math.expm1(math.sqrt(squares / dof)), sum(map(len, logs)), len(logs))


def band(spread: Spread | None) -> float:
    """How far beyond its measured min-max a configuration's figure may lie: the measured spread once it steers,
    else DEFAULT_BAND."""
    return spread.sd if spread is not None and spread.steers else DEFAULT_BAND


def screen_noise(spread: Spread | None) -> float:
    """The spread the screen before boot allows for in the incumbent's level: the measured one once it steers,
    else none (the screen's share was set on machines whose spread it already covers)."""
    return spread.sd if spread is not None and spread.steers else 0.0
