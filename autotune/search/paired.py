"""The final paired comparison: does the winner beat what the user runs today, beyond this machine's noise?

The winner (remeasure.best) and the best baseline are booted again on fresh boots, interleaved so that a drift
of the machine (heat, a neighbour's load) hits both: pair 0 boots the winner then the baseline, pair 1 the
baseline then the winner, and so on (A B B A: a steady drift cancels over two pairs, where A B A B would always
favour the one booted first). Each pair gives the log of the ratio of their throughputs; the mean of those logs
and its t interval (90% over all the looks: below), turned back into percentages, say how much better the winner
is and how sure that is.

Why a t interval on paired log-ratios, not a bootstrap: a pair shares the machine's state, so its ratio carries
much less of the drift than two unpaired figures; throughput noise is multiplicative, so logs make it additive
and symmetric; and there are only 2-8 pairs, where a bootstrap's percentile interval is too narrow (it never
reaches past the sample's own extremes, and 3 pairs have 10 distinct resamples) while the t interval is exact
for normal log-ratios and honestly wide for few of them.

Each look's interval is a 96.8% one (LOOK_CONFIDENCE) where the answer says 90%: the rule looks after every pair
from the third to the eighth and stops at the first interval that excludes no difference, which at 90% a look
"resolved" a winner no better than its baseline in 26% of simulated runs. At 96.8% the six intervals hold the true
gain together 90% of the time (repeated confidence intervals), whichever look the pairs stopped at
(benchmarks/pair_looks.py; docs/answer.md).

The outcome is one record in the study (COMPARISON_ATTR) with its sentence: every output (the run's summary,
`status`, the report, `export`, `autotune compare`) prints that sentence and nothing of its own.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState
from scipy import stats

from autotune.measure.soak import Soak
from autotune.measure.stats import limits_text
from autotune.search import noise, remeasure
from autotune.search.budget import RESERVE_MAX_SHARE, Budget
from autotune.search.record import (
    BASELINE_ATTR,
    PAIR_ATTR,
    QUEUED,
    REMEASURE_ATTR,
    feasible,
    figure_unit,
    pair_marks,
    view,
)

CONFIDENCE = 0.90  # two-sided, over all the looks together: what the answer's interval is


LOOK_CONFIDENCE = 0.968  # each look's t interval: over the looks MIN_PAIRS..MAX_PAIRS together, CONFIDENCE


MIN_PAIRS = 3  # the first look (a t interval needs two pairs; at two, LOOK_CONFIDENCE's is too wide to resolve)


MAX_PAIRS = 8  # beyond this the difference is too small for this machine to resolve in any sensible time


COMPARISON_ATTR = "comparison"  # study user attr: the Comparison, as asdict


@dataclass(frozen=True)
class Pair:
    """One pair of fresh boots; a throughput is None where that measurement missed the limits."""

    index: int
    winner_tok_s: float | None
    baseline_tok_s: float | None


@dataclass(frozen=True)
class Interval:
    """The winner's gain over the baseline as fractions (0.14 = +14%): the central estimate and its interval."""

    mid: float
    low: float
    high: float

    @property
    def resolved(self) -> bool:
        """The interval excludes no difference: the winner is better (low > 0) or worse (high < 0)."""
        return self.low > 0 or self.high < 0


def gain_interval(pairs: Sequence[Pair], confidence: float = LOOK_CONFIDENCE) -> Interval | None:
    """The t interval of the mean paired log-ratio (winner over baseline), as gains, at each look's confidence
    (the answer's CONFIDENCE over all the looks); None with fewer than two pairs in which both met the limits."""
    logs = [math.log(p.winner_tok_s / p.baseline_tok_s) for p in pairs
            if p.winner_tok_s and p.baseline_tok_s]
    if len(logs) < 2:
        return None
    mean, sd = statistics.fmean(logs), statistics.stdev(logs)
    half = float(stats.t.ppf(0.5 + confidence / 2, len(logs) - 1)) * sd / math.sqrt(len(logs))
    return Interval(math.expm1(mean), math.expm1(mean - half), math.expm1(mean + half))


def needs_another_pair(pairs: Sequence[Pair]) -> bool:
    """The stopping rule: measure another pair until the interval is resolved, or MAX_PAIRS were measured, or
    the winner missed the limits on a fresh boot (then it is not shown better, whatever the others say)."""
    if len(pairs) >= MAX_PAIRS or any(p.winner_tok_s is None for p in pairs):
        return False
    if len(pairs) < MIN_PAIRS:
        return True
    interval = gain_interval(pairs)
    return interval is None or not interval.resolved


@dataclass(frozen=True)
class Comparison:
    """The answer: the winner against the best baseline, and the one sentence every output prints."""

    winner: int  # the winner's original trial
    baseline: str  # the best baseline's name ("" when no baseline met the limits)
    baseline_trial: int | None
    pairs: tuple[Pair, ...]
    interval: Interval | None
    proven: bool  # the winner beat the best baseline beyond the noise (or no baseline met the limits), and held up
    sentence: str
    soak: Soak | None = None  # the proven winner's soak (with_soak); None: not soaked (yet)

    def to_attr(self) -> dict[str, object]:
        return asdict(self)

    @staticmethod
    def from_attr(doc: Mapping[str, Any]) -> Comparison:
        interval = Interval(**doc["interval"]) if doc.get("interval") else None
        soak = Soak.from_attr(doc["soak"]) if doc.get("soak") else None
        return Comparison(int(doc["winner"]), str(doc["baseline"]), doc["baseline_trial"],
                          tuple(Pair(**p) for p in doc["pairs"]), interval, bool(doc["proven"]), str(doc["sentence"]),
                          soak)


def with_soak(c: Comparison, soak: Soak | None, why_not: str = "") -> Comparison:
    """A proven winner after its soak: still proven, its sentence saying so, if it held up; else not proven, the
    answer falling back to the best baseline with the reason. `soak` None: it could not be soaked (`why_not`)."""
    keep = f"keep the {c.baseline}"
    if soak is None:
        return replace(c, proven=False, sentence=f"trial {c.winner} beat the {c.baseline} in the pairs but was not "
                                                 f"soaked ({why_not}): {keep}; `autotune compare` soaks it")
    if soak.verdict:
        return replace(c, proven=False, soak=soak, sentence=f"trial {c.winner} {soak.text}: {keep}")
    return replace(c, soak=soak, sentence=f"{c.sentence}; {soak.text}")


def soak_due(c: Comparison | None) -> bool:
    """Whether the answer waits on a soak: a winner proven against a baseline, not soaked yet."""
    return c is not None and c.proven and bool(c.baseline) and c.soak is None


def _pct(x: float) -> str:
    return f"{x * 100:+.0f}%"


def sentence(winner: int, baseline: str, interval: Interval | None, pairs: Sequence[Pair], proven: bool,
             limits: Mapping[str, float], unmet: str = "", unit: str = "output tok/s") -> str:
    """"trial 12: +14% output tok/s over the recipe (90% interval +9% to +19%) within p95 TTFT 2 s and TPOT
    100 ms", or why no configuration was shown better and what to keep."""
    within = limits_text(limits)
    if not baseline:
        how = f" ({unmet})" if unmet else ""
        return f"trial {winner}: no baseline met the limits{how}, so there is nothing to beat: use it"
    if proven and interval is not None:
        return (f"trial {winner}: {_pct(interval.mid)} {unit} over the {baseline} ({CONFIDENCE:.0%} interval "
                f"{_pct(interval.low)} to {_pct(interval.high)}) within {within}")
    if any(p.winner_tok_s is None for p in pairs):
        return (f"no configuration beat the {baseline}: trial {winner} missed the limits ({within}) on a fresh "
                "boot: keep it")
    if interval is None:
        n = len([p for p in pairs if p.winner_tok_s and p.baseline_tok_s])
        return (f"no configuration was shown to beat the {baseline}: {n} paired measurement(s) of trial {winner} "
                f"against it, too few for an interval: keep it")
    if interval.high < 0:
        return (f"no configuration beat the {baseline}: trial {winner} measured {_pct(interval.mid)} against it on "
                f"fresh boots (interval {_pct(interval.low)} to {_pct(interval.high)}): keep it")
    return (f"no configuration beat the {baseline} beyond the noise of this machine ({_pct(interval.mid)}, interval "
            f"{_pct(interval.low)} to {_pct(interval.high)}): keep it")


def pairs_of(trials: Sequence[FrozenTrial], winner: int, baseline: int) -> list[Pair]:
    """The finished pairs of fresh boots of `winner` against `baseline` (original trial numbers), in order. A
    pair with a measurement that failed for reasons not the configuration's own (FAIL) is left out."""
    sides: dict[int, dict[int, float | None]] = {}
    failed: set[int] = set()
    for t in trials:
        mark = t.user_attrs.get(PAIR_ATTR)
        if not isinstance(mark, dict) or (mark.get("winner"), mark.get("baseline")) != (winner, baseline):
            continue
        index = int(mark["index"])
        if t.state != TrialState.COMPLETE:
            failed.add(index)
            continue
        sides.setdefault(index, {})[int(t.user_attrs[REMEASURE_ATTR])] = (
            float(t.value or 0.0) if feasible(t) else None)
    return [Pair(i, s[winner], s[baseline]) for i, s in sorted(sides.items())
            if i not in failed and winner in s and baseline in s]


def next_index(trials: Sequence[FrozenTrial]) -> int:
    """The index of the next pair: one past every pair recorded (finished or not)."""
    return 1 + max((int(m["index"]) for m in pair_marks(trials)), default=-1)


def compare(winner: int, baseline: str, baseline_trial: int | None, pairs: Sequence[Pair],
            limits: Mapping[str, float], unmet: str = "", unit: str = "output tok/s") -> Comparison:
    """The comparison from its pairs: proven when the interval's low end is above 0 and the winner met the limits
    on every fresh boot; with no baseline that met the limits, the winner stands unopposed."""
    interval = gain_interval(pairs)
    if not baseline:
        proven = True
    else:
        proven = (interval is not None and interval.low > 0 and winner != baseline_trial
                  and all(p.winner_tok_s is not None for p in pairs))
    if baseline and winner == baseline_trial:
        text = f"no configuration beat the {baseline}: it measured best itself (trial {winner}): keep it"
    else:
        text = sentence(winner, baseline, interval, pairs, proven, limits, unmet, unit)
    return Comparison(winner, baseline, baseline_trial, tuple(pairs), interval, proven, text)


def baseline_name(t: FrozenTrial) -> str:
    mark = t.user_attrs.get(BASELINE_ATTR)
    return str(mark.get("name")) if isinstance(mark, dict) else (view(t).baseline or "")


def best_baseline(trials: Sequence[FrozenTrial]) -> remeasure.Best | None:
    """The baseline to beat: among the baselines that hold their limits, the one with the best figure."""
    return remeasure.best(trials, keep=lambda t: BASELINE_ATTR in t.user_attrs)


def current(trials: Sequence[FrozenTrial], limits: Mapping[str, float]) -> Comparison | None:
    """The comparison as the trials stand: the winner (remeasure.best) against the best baseline, on their pairs
    so far. None when nothing met the limits."""
    winner = remeasure.best(trials)
    if winner is None:
        return None
    base = best_baseline(trials)
    if base is None:  # each baseline as it ended: "vllm-defaults failed to boot, recipe missed the limits"
        unmet = ", ".join(f"{v.baseline} {v.ending}" for t in trials
                          if BASELINE_ATTR in t.user_attrs and REMEASURE_ATTR not in t.user_attrs
                          and (v := view(t)).ending != QUEUED)
        return compare(winner.trial.number, "", None, (), limits, unmet, figure_unit(winner.trial))
    return compare(winner.trial.number, baseline_name(base.trial), base.trial.number,
                   pairs_of(trials, winner.trial.number, base.trial.number), limits, unit=figure_unit(winner.trial))


def answer(study: optuna.Study) -> Comparison | None:
    """What every output prints: the comparison stored when the run ended, while it still concerns the study's
    winner; else (a study still running, or recorded before comparisons) the comparison as the trials stand."""
    trials = study.get_trials(deepcopy=False)
    now = current(trials, study.user_attrs.get("limits") or {})
    stored = study.user_attrs.get(COMPARISON_ATTR)
    if isinstance(stored, dict) and now is not None and stored.get("winner") == now.winner:
        return Comparison.from_attr(stored)
    return now


def pair_sides(trials: Sequence[FrozenTrial]) -> tuple[FrozenTrial, FrozenTrial] | None:
    """The two sides a final pair would boot, as the trials stand: the best searched configuration (the best
    baseline itself while none is measured) and the best baseline. None without a baseline that met the limits."""
    base = best_baseline(trials)
    if base is None:
        return None
    rival = remeasure.best(trials, keep=lambda t: BASELINE_ATTR not in t.user_attrs) or base
    return rival.trial, base.trial


def pair_length_s(trials: Sequence[FrozenTrial]) -> float | None:
    """What one pair takes on this machine: a warm boot and measurement of each side (pair_sides), as
    remeasure.length_s sizes it. None without a baseline that met the limits, or a recorded length."""
    sides = pair_sides(trials)
    warm_s = remeasure.warm_boot_s(trials)
    lengths = [remeasure.length_s(t, warm_s) for t in sides] if sides is not None else [None]
    return None if None in lengths else sum(x for x in lengths if x is not None)


def soak_length_s(t: FrozenTrial, soak_s: float) -> float:
    """A boot of `t`'s configuration (its trial's whole length where the boot is not recorded) and its soak, with
    remeasure.LENGTH_MARGIN to spare."""
    boot_s = t.user_attrs.get("boot_s") or t.user_attrs.get("duration_s") or 0.0
    return remeasure.LENGTH_MARGIN * (float(boot_s) + soak_s)


def pairs_due(trials: Sequence[FrozenTrial], limits: Mapping[str, float]) -> int:
    """How many more pairs the run owes at least: MIN_PAIRS, less those the winner has measured already."""
    now = current(trials, limits)
    if now is None or not now.baseline:
        return 0
    measured = len(now.pairs) if now.winner != now.baseline_trial else 0
    return max(0, MIN_PAIRS - measured) if measured == 0 or needs_another_pair(now.pairs) else 0


def hold_pairs(budget: Budget, study: optuna.Study, soak_s: float = 0.0) -> None:
    """Size the time the search leaves for the final pairs and the winner's soak after them (Budget.pairs_s) on
    what they cost here: the search calls it after each trial, beside remeasure.hold."""
    trials = study.get_trials(deepcopy=False)
    length, sides = pair_length_s(trials), pair_sides(trials)
    due = pairs_due(trials, study.user_attrs.get("limits") or {})
    if not length or not due or sides is None:
        budget.pairs_s = 0.0
        return
    budget.pairs_s = due * length + (soak_length_s(sides[0], soak_s) if soak_s > 0 else 0.0)


def too_short_line(budget: Budget, comparison: Comparison | None) -> str:
    """When the budget was too short to hold the final pairs and the run ended without them, by how much."""
    short = budget.pairs_short_s()
    if comparison is None or not comparison.baseline or comparison.winner == comparison.baseline_trial or short <= 0:
        return ""
    if len(comparison.pairs) >= MIN_PAIRS or budget.seconds is None:
        return ""
    kept = RESERVE_MAX_SHARE * budget.seconds
    return (f"the budget ({budget.seconds / 60:g} min) is too short for the final pairs: {MIN_PAIRS} pairs of the "
            f"winner and the {comparison.baseline} and its soak take ~{budget.pairs_s:.0f} s here, "
            f"{budget.pairs_s - kept:.0f} s more than the {kept:.0f} s the search leaves them: "
            f"--budget {math.ceil((budget.seconds + short) / 60)}m would hold them")


@dataclass(frozen=True)
class PairsRun:
    """What `measure_pairs` did: the comparison it ended with, the original trials it booted again (in order),
    how many of those booted, and why it stopped for want of time."""

    comparison: Comparison | None
    done: tuple[int, ...] = ()
    booted: int = 0
    stopped_because: str = ""


def measure_pairs(study: optuna.Study, budget: Budget, run_one: Callable[[], object | None],
                  stop: threading.Event | None = None) -> PairsRun:
    """Boot pairs of the winner and the best baseline (A B, then B A) while the stopping rule asks for another
    and a whole pair fits in the budget; store the comparison (COMPARISON_ATTR) and return it. `run_one` runs
    the next queued trial (the study loop's own) and returns its result, or None when it was refused before boot."""
    limits = study.user_attrs.get("limits") or {}
    booted, why, done = 0, "", []
    while stop is None or not stop.is_set():
        trials = study.get_trials(deepcopy=False)
        now = current(trials, limits)
        if now is None or now.baseline_trial is None or now.winner == now.baseline_trial:
            break
        if not needs_another_pair(now.pairs):
            break
        by_number = {t.number: t for t in trials}
        a, b = by_number[now.winner], by_number[now.baseline_trial]
        warm_s = remeasure.warm_boot_s(trials)
        la, lb = remeasure.length_s(a, warm_s), remeasure.length_s(b, warm_s)
        needed = la + lb if la is not None and lb is not None else None
        fits, why = remeasure.claim(budget, needed, f"one more pair of trial {a.number} and the {now.baseline}")
        if not fits:
            break
        index = next_index(trials)
        for t in (a, b) if index % 2 == 0 else (b, a):
            remeasure.enqueue_again(study, t, {PAIR_ATTR: {"winner": a.number, "baseline": b.number, "index": index}})
            result = run_one()
            done.append(t.number)
            if result is not None:
                booted += 1
                budget.record(float(getattr(result, "duration_s", 0.0)), searched=False)
            if stop is not None and stop.is_set():
                break
    ended = current(study.get_trials(deepcopy=False), limits)
    stored = study.user_attrs.get(COMPARISON_ATTR)
    before = Comparison.from_attr(stored) if isinstance(stored, dict) else None
    if ended is not None and ended.proven and before is not None and before.soak and before.winner == ended.winner:
        ended = with_soak(ended, before.soak)  # its soak still holds: the configuration is the same
    if ended is not None:
        study.set_user_attr(COMPARISON_ATTR, ended.to_attr())
    save_answer_note(study)
    return PairsRun(ended, tuple(done), booted, why)


def answer_note(study: optuna.Study) -> str:
    """The study's note on the dashboard (Markdown): the winner, its figure's measurement and the answer, in the
    words of every other output."""
    trials = study.get_trials(deepcopy=False)
    winner = remeasure.best(trials)
    if winner is None:
        return "No feasible configuration yet."
    lines = [f"**best: {winner.text}**", remeasure.figure_line(winner, trials)]
    if (said := answer(study)) is not None:
        lines.append(f"**answer: {said.sentence}**")
    return "\n\n".join(lines) + "\n"


def save_answer_note(study: optuna.Study) -> None:
    from optuna_dashboard import save_note

    save_note(study, answer_note(study))


FIXES = ("more requests per load level ([load] min_requests in the objective), a quieter machine, or more time "
         "for {what}")


def noise_lines(study: optuna.Study) -> list[str]:
    """What the run says of this machine's noise: the spread of one measurement; when the pairs could not separate
    the winner from the baseline, that the noise is why and what would narrow it; else, when the spread (resting on
    enough repeats) is larger than what separates the winner from the next configuration, that too."""
    trials = study.get_trials(deepcopy=False)
    out = []
    if (measured := remeasure.spread(trials)) is not None:
        out.append(f"noise: {measured.text()}")
    said = answer(study)
    if (said is not None and said.baseline and not said.proven and said.winner != said.baseline_trial
            and all(p.winner_tok_s is not None for p in said.pairs)
            and (said.interval is None or not said.interval.resolved)):
        out.append("this machine's noise is too large to separate these configurations in the pairs measured: "
                   + FIXES.format(what="pairs (`autotune compare`)") + " would narrow the interval")
    elif (close := within_noise(trials, measured, said)) is not None:
        out.append(close)
    return out


def within_noise(trials: Sequence[FrozenTrial], measured: noise.Spread | None, said: Comparison | None) -> str | None:
    """Why the top two configurations are not known apart, or None: their figures differ by less than the
    CONFIDENCE reach of the noise on a difference of two medians (z x sd x sqrt(1/n1 + 1/n2), in logs), with the
    spread resting on enough repeats (noise.Spread.steers). A runner-up the pairs compared with the winner is
    left to the pairs' own sentence."""
    winner = remeasure.best(trials)
    if winner is None or measured is None or not measured.steers or not winner.holds:
        return None
    paired_with = said.baseline_trial if said is not None and said.pairs else None
    rival = next((b for b in remeasure.ranked(trials) if b.holds
                  and b.trial.number not in (winner.trial.number, paired_with)), None)
    if rival is None:
        return None
    z = float(stats.norm.ppf(0.5 + CONFIDENCE / 2))
    reach = z * math.log1p(measured.sd) * math.sqrt(1 / len(winner.passing) + 1 / len(rival.passing))
    gap = math.log(winner.figure / rival.figure)
    if abs(gap) >= reach:
        return None
    return (f"this machine's noise is too large to separate the top configurations: trial {winner.trial.number} "
            f"({winner.figure:,.0f} output tok/s) and trial {rival.trial.number} ({rival.figure:,.0f}) differ by "
            f"{_pct(math.expm1(gap))}, inside the ±{math.expm1(reach) * 100:.0f}% this machine's noise leaves on "
            f"figures of {len(winner.passing)} and {len(rival.passing)} measurement(s): "
            + FIXES.format(what="re-measuring") + " would separate them")
