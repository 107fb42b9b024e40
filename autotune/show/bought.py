"""What the run bought, the report's first panel: the winner's gain over each baseline, the best figure found
against the study's elapsed time, and what the rest of its budget (as its runs recorded it) would likely add, all
read from the study's own trials.

A gain is the paired comparison's interval where the comparison measured the winner against that baseline
(search/paired.py, the sentence every output prints); against any other baseline it is the ratio of the two
configurations' figures (remeasure.Best.figure), unpaired, which carries the whole of the machine's noise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import optuna
import plotly.graph_objects as go
from optuna.trial import FrozenTrial
from plotly.subplots import make_subplots

from autotune.search import paired, remeasure
from autotune.search.budget import Spent, spent
from autotune.search.record import BASELINE_ATTR, REMEASURE_ATTR, figure_unit, format_figure, view

MIN_BOOTED = 4  # booted trials before the rate of improvement says anything about more time


@dataclass(frozen=True)
class BaselineGain:
    """The winner against one baseline: low/high are None for an unpaired ratio (no interval measured)."""

    baseline: str
    trial: int
    mid: float | None  # a fraction (0.14 = +14%); None when the baseline did not hold its limits
    low: float | None
    high: float | None
    how: str  # "paired, 90% interval", "unpaired ratio of figures", or why there is no gain
    unit: str = "output tok/s"  # what the figures count (record.figure_unit)

    def text(self) -> str:
        if self.mid is None:
            return f"{self.baseline} (trial {self.trial}): no gain to give: {self.how}"
        head = f"{self.baseline} (trial {self.trial}): {_pct(self.mid)} {self.unit}"
        if self.low is not None and self.high is not None:
            return f"{head} ({paired.CONFIDENCE:.0%} interval {_pct(self.low)} to {_pct(self.high)}, paired)"
        return f"{head} ({self.how})"


@dataclass(frozen=True)
class BestSoFar:
    """The winner's figure as the study stood when one booted trial finished."""

    minutes: float  # since the study's first trial started
    figure: float  # 0 before anything met the limits
    trial: int  # the trial that finished then


def _pct(x: float) -> str:
    return f"{x * 100:+.0f}%"


def _is_baseline_original(t: FrozenTrial) -> bool:
    return BASELINE_ATTR in t.user_attrs and REMEASURE_ATTR not in t.user_attrs and t.state.is_finished()


def baseline_gains(study: optuna.Study) -> list[BaselineGain]:
    """For each baseline, the winner's gain over it: paired where the comparison measured it, else unpaired."""
    trials = study.get_trials(deepcopy=False)
    winner = remeasure.best(trials)
    said = paired.answer(study)
    out = []
    for t in (t for t in trials if _is_baseline_original(t)):
        name = paired.baseline_name(t)
        if winner is None:
            out.append(BaselineGain(name, t.number, None, None, None, "no configuration met the limits"))
            continue
        if winner.trial.number == t.number:
            out.append(BaselineGain(name, t.number, 0.0, None, None, "it is the winner itself"))
            continue
        if said is not None and said.baseline_trial == t.number and said.interval is not None:
            i = said.interval
            out.append(BaselineGain(name, t.number, i.mid, i.low, i.high, f"paired, {paired.CONFIDENCE:.0%} interval",
                                    figure_unit(winner.trial)))
            continue
        own = remeasure.best(trials, keep=lambda r, n=t.number: r.number == n)  # type: ignore[misc]
        if own is None or not own.figure:
            out.append(BaselineGain(name, t.number, None, None, None, view(t).ending))
            continue
        out.append(BaselineGain(name, t.number, winner.figure / own.figure - 1, None, None,
                                "unpaired ratio of figures, no interval", figure_unit(winner.trial)))
    return out


def best_over_time(trials: Sequence[FrozenTrial]) -> list[BestSoFar]:
    """The winner's figure (remeasure.best over the trials finished by then) after each booted trial, by the
    minutes since the first trial started: from the trials' own datetime_start and datetime_complete."""
    starts = [t.datetime_start for t in trials if t.datetime_start is not None]
    done = sorted((t for t in trials if t.datetime_complete is not None and view(t).booted),
                  key=lambda t: t.datetime_complete or datetime.min)
    if not starts or not done:
        return []
    origin = min(starts)
    out = []
    for k, t in enumerate(done, 1):
        so_far = remeasure.best(done[:k])
        minutes = ((t.datetime_complete or origin) - origin).total_seconds() / 60
        out.append(BestSoFar(minutes, so_far.figure if so_far is not None else 0.0, t.number))
    return out


def last_improvement(curve: Sequence[BestSoFar]) -> BestSoFar:
    """When the best figure last rose above every figure before it (a re-measurement may lower it since)."""
    last, peak = curve[0], 0.0
    for p in curve:
        if p.figure > peak:
            last, peak = p, p.figure
    return last


def more_time(curve: Sequence[BestSoFar], unit: str = "output tok/s", budget: Spent | None = None) -> str:
    """What the rest of the study's budget (`budget`: what its runs recorded) would likely add, from the study's
    own best-found-against-time curve: the relative gain of the best figure over the last stretch of the run as long
    as the time left (at most half the run), carried on for the time left. Searches improve less as they go, so
    this is an upper estimate. Without a recorded time budget, or with less left than a trial takes, what running
    as long again would add (the same rule over the second half of the run). With fewer than MIN_BOOTED booted
    trials it is unknown."""
    if len(curve) < MIN_BOOTED or curve[-1].figure <= 0:
        return (f"what more time would add: unknown ({len(curve)} booted trial(s) with a figure; it takes "
                f"{MIN_BOOTED} to see a rate of improvement)")
    end = curve[-1]
    per_trial = end.minutes / len(curve)
    left = budget.left_s / 60 if budget is not None and budget.left_s is not None else None
    if budget is None or budget.seconds is None or left is None:
        return "what as long again would add: " + _carried_on(curve, end.minutes / 2, end.minutes, unit)
    head = f"budget: {_min(budget.seconds / 60)} over {budget.runs} run(s), {_min(budget.used_s / 60)} used"
    if left < per_trial:
        return (f"{head}; the {_min(left)} left is less than a trial (~{_min(per_trial)}): it would add nothing; "
                f"as long again: {_carried_on(curve, end.minutes / 2, end.minutes, unit)}")
    return (f"{head}; what the {_min(left)} left would add: "
            f"{_carried_on(curve, min(left, end.minutes / 2), left, unit)}")


def _min(minutes: float) -> str:
    return f"{minutes:,.0f} min"


def _carried_on(curve: Sequence[BestSoFar], stretch: float, ahead: float, unit: str) -> str:
    """The relative gain of the best figure over the curve's last `stretch` minutes, carried on for `ahead`
    minutes (in proportion), with when the best was last improved."""
    end = curve[-1]
    before = [p for p in curve if p.minutes <= end.minutes - stretch]
    at = before[-1].figure if before else 0.0
    last = last_improvement(curve)
    since = len([p for p in curve if p.minutes > last.minutes])
    when = (f"the best was last improved {last.minutes:,.0f} min into the {end.minutes:,.0f} min run (trial "
            f"{last.trial}); {since} booted trial(s) since")
    if at <= 0:
        return f"unknown (nothing met the limits before the run's last {_min(stretch)}); {when}"
    gain = end.figure / at - 1
    if gain <= 0:
        return f"likely little; the best did not improve in the run's last {_min(stretch)}; {when}"
    went = f"{format_figure(at, unit)} to {format_figure(end.figure, unit)} {unit}"
    return (f"at most about {_pct(gain * ahead / stretch)} in {_min(ahead)}, the gain of the run's last "
            f"{_min(stretch)} carried on ({went}); {when}")


def lines(study: optuna.Study) -> list[str]:
    """The panel's words: each baseline's gain, then what more time would add."""
    trials = study.get_trials(deepcopy=False)
    return ([f"gain over {g.text()}" for g in baseline_gains(study)]
            + [more_time(best_over_time(trials), unit_of(trials), spent(study))])


def unit_of(trials: Sequence[FrozenTrial]) -> str:
    """What the study's figures count: its winner's unit (record.figure_unit), output tok/s before one."""
    winner = remeasure.best(trials)
    return figure_unit(winner.trial) if winner is not None else "output tok/s"


def bought_figure(study: optuna.Study) -> go.Figure:
    """The gains as bars (the paired interval as its error bar), and the best figure against elapsed minutes."""
    gains = [g for g in baseline_gains(study) if g.mid is not None]
    trials = study.get_trials(deepcopy=False)
    curve, unit = best_over_time(trials), unit_of(trials)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=("gain over each baseline, %", "best figure found, by elapsed time"))
    fig.add_trace(go.Bar(
        x=[g.baseline for g in gains], y=[g.mid * 100 for g in gains],  # type: ignore[operator]
        error_y={"type": "data", "symmetric": False,
                 "array": [(g.high - g.mid) * 100 if g.high is not None else 0 for g in gains],  # type: ignore
                 "arrayminus": [(g.mid - g.low) * 100 if g.low is not None else 0 for g in gains]},  # type: ignore
        text=[g.how for g in gains], hovertext=[g.text() for g in gains], hoverinfo="text",
        marker_color=["#2ca02c" if g.low is not None else "#9e9e9e" for g in gains], name="gain"), 1, 1)
    fig.add_trace(go.Scatter(
        x=[p.minutes for p in curve], y=[p.figure for p in curve], mode="lines+markers",
        line={"shape": "hv", "color": "#2ca02c"}, name="best figure so far",
        hovertext=[f"after trial {p.trial}: {format_figure(p.figure, unit)} {unit}" for p in curve],
        hoverinfo="text"), 1, 2)
    fig.update_xaxes(title_text="minutes since the study started", row=1, col=2)
    fig.update_yaxes(title_text=unit, rangemode="tozero", row=1, col=2)
    fig.update_layout(title="What the run bought<br><sup>" + more_time(curve, unit, spent(study)) + "</sup>",
                      template="plotly_white", showlegend=False)
    return fig
