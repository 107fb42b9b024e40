"""What a replayed run is scored by (benchmarks/replay.py), and the table of a method's runs over many seeds: the
median and mean booted trials until the run's answer was within the target, the share of runs that never reached
it, the share that reached it within 10 boots, and the engine minutes it took."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.replay import MAX_BOOTED, Run

WITHIN = 0.05
EARLY = 10  # P(within 5% after EARLY boots)


@dataclass(frozen=True)
class Figures:
    trials: float  # booted trials until the answer was within the target, re-measurements counted (inf: never)
    minutes: float  # engine minutes until then (inf: never)
    infeasible_share: float  # of those minutes (all, when never) on configurations that met no limit or did not boot
    pruned: int  # trials screened out after their boot
    again: int  # of `trials`, re-measurements of the answer (search/remeasure.py)
    lost_best: bool  # a configuration within the target was screened out after its boot


def figures(run: Run, target: float) -> Figures:
    """A run (replay.run) scored."""
    steps = run.steps
    minutes = sum(s.cost_s for s in steps) / 60
    waste = sum(s.cost_s for s in steps if not s.point.feasible) / 60
    return Figures(len(steps) if run.reached else math.inf, minutes if run.reached else math.inf,
                   waste / minutes if minutes else 0.0, sum(s.pruned for s in steps), sum(s.again for s in steps),
                   any(s.pruned and s.point.value >= target for s in steps))


def median_interval(xs: list[float], resamples: int = 2000, share: float = 0.90) -> tuple[float, float]:
    """A bootstrap interval of the median over seeds (percentile method, a fixed generator): whether two methods'
    medians differ by more than which seeds were drawn. One run (a fixed order): its own value."""
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(resamples))
    cut = int(resamples * (1 - share) / 2)
    return meds[cut], meds[-cut - 1]


def fmt(x: float, digits: int = 1) -> str:
    return "never" if math.isinf(x) else f"{x:.{digits}f}"


def median(figs: Sequence[Figures], field: str = "trials") -> float:
    return statistics.median(getattr(f, field) for f in figs)


def mean(figs: Sequence[Figures]) -> float:
    """Mean booted trials, a run that never reached the target counted at MAX_BOOTED (a floor on its cost)."""
    return statistics.fmean(min(f.trials, MAX_BOOTED) for f in figs)


def never(figs: Sequence[Figures]) -> float:
    return sum(math.isinf(f.trials) for f in figs) / len(figs)


def early(figs: Sequence[Figures]) -> float:
    return sum(f.trials <= EARLY for f in figs) / len(figs)


HEAD = (f"{'method':<68}{'runs':>5}{'median':>8}{'(90%)':>12}{'mean':>7}{'never':>7}{'@' + str(EARLY):>6}"
        f"{'minutes':>9}{'again':>6}{'infeas.':>8}{'pruned':>7}{'lost':>6}")
LEGEND = (f"median and mean booted trials (re-measurements of the answer included; mean: a run that never got there "
          f"counted at {MAX_BOOTED}) until the run's answer was within {WITHIN:.0%} of the best; the median's 90% "
          f"bootstrap interval over the seeds; never: share of runs not there within {MAX_BOOTED} search boots; "
          f"@{EARLY}: share there within {EARLY} boots; median engine minutes to get there; median re-measurements "
          "among the boots; median share of those minutes on configurations that met no limit or did not boot; "
          "median trials screened out after boot; share of runs that screened out one within the target")


def table(results: dict[str, list[Figures]]) -> str:
    lines = [HEAD, "-" * len(HEAD)]
    for name, figs in results.items():
        lo, hi = median_interval([f.trials for f in figs])
        lines.append(f"{name:<68}{len(figs):>5}{fmt(median(figs)):>8}{fmt(lo) + '-' + fmt(hi):>12}"
                     f"{mean(figs):>7.1f}{never(figs):>7.0%}{early(figs):>6.0%}{fmt(median(figs, 'minutes')):>9}"
                     f"{median(figs, 'again'):>6.1f}{median(figs, 'infeasible_share'):>8.0%}"
                     f"{median(figs, 'pruned'):>7.1f}{sum(f.lost_best for f in figs) / len(figs):>6.0%}")
    return "\n".join(lines)
