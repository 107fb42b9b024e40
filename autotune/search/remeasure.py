"""Re-measure the best configurations before the budget ends, and choose the winner on those figures.

A search keeps the configuration whose one measurement came out highest, and among several close ones that is
partly luck: its figure is biased upwards (the winner's curse) and may not hold when the user deploys it. So
part of the budget is set aside (`reserve`, at most half: see Budget.held) and spent at the end
(`remeasure_top`) booting configurations again, each as a new trial marked `remeasure_of`, but only where a
measurement can change the answer (`next_to_remeasure`); what it cannot spend goes back to the search
(`search_and_remeasure`): the reserve never leaves time idle. The winner is then chosen on all of each configuration's
measurements (`best`): every reader (the run's summary, status, the report, export) takes the winner and its
figure from there, so that they cannot disagree.
"""

from __future__ import annotations

import statistics
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config.study_file import DEFAULT_TOP
from autotune.search import noise, remeasure
from autotune.search.budget import Budget
from autotune.search.record import (
    BASELINE_ATTR,
    REMEASURE_ATTR,
    at_level,
    feasible,
    figure_number,
    figure_text,
    pair_marks,
    view,
)

SUMMARY_ATTR = "remeasured"  # study user attr: {original number: {"output_throughput": [...], "median": ...}}


RESERVE_FRACTION = 0.15  # of a time budget


LENGTH_MARGIN = 1.25  # boots and loads vary: a re-measurement starts only with a quarter of its length to spare


MAX_ROUNDS = 3  # re-measurements per configuration at most, whatever time is left


@dataclass(frozen=True)
class Reserve:
    """What was set aside for re-measuring: seconds of a time budget, trials of a trial budget."""

    top: int = 0
    seconds: float = 0.0
    trials: int = 0


def reserve(budget: Budget, top: int = DEFAULT_TOP, fraction: float = RESERVE_FRACTION) -> Reserve:
    """Take the reserve out of `budget` before the search: `fraction` of its time until a trial is measured, then
    the re-measurement due next and the final pairs (Budget.held, `hold`, paired.hold_pairs), and `top` trials of
    a trial budget when that leaves the search at least four fifths of it. Give it back with `remeasure_top`."""
    if top <= 0:
        return Reserve()
    seconds = fraction * budget.seconds if budget.seconds is not None else 0.0
    trials = min(top, budget.trials // 5) if budget.trials is not None else 0
    budget.held_s = seconds
    if budget.trials is not None:
        budget.trials -= trials
    return Reserve(top, seconds, trials)


def _release(budget: Budget, r: Reserve) -> None:
    budget.held_s = 0.0
    if budget.trials is not None:
        budget.trials += r.trials


def length_s(t: FrozenTrial, warm_s: float | None = None) -> float | None:
    """What booting `t`'s configuration again takes, with LENGTH_MARGIN to spare: its own trial's length less a
    cold boot that was thrown away before it booted warm, and with a boot that compiled cold counted as a warm
    boot of this machine (`warm_s`, warm_boot_s) where one was seen: a re-measurement boots warm. None when not
    recorded."""
    v = view(t)
    if v.duration_s is None:
        return None
    measured = v.duration_s - (v.cold_boot_s or 0.0)
    boot = t.user_attrs.get("boot_s")
    if warm_s is not None and isinstance(boot, int | float) and t.user_attrs.get("compile_cache") == "cold":
        measured -= boot - min(float(boot), warm_s)
    return LENGTH_MARGIN * measured


def warm_boot_s(trials: Sequence[FrozenTrial]) -> float | None:
    """The median boot of this study's warm-compiled boots (on the H200 as a 3090: 100 s, where a compile key's
    first boot took 129-254 s), None before one was seen."""
    seen = [float(t.user_attrs["boot_s"]) for t in trials
            if t.user_attrs.get("compile_cache") == "warm" and isinstance(t.user_attrs.get("boot_s"), int | float)]
    return statistics.median(seen) if seen else None


def hold(budget: Budget, trials: Sequence[FrozenTrial], top: int = DEFAULT_TOP) -> None:
    """Size the time the search leaves for re-measuring (Budget.held) on the re-measurements due next
    (due_next): the search calls it after each trial, as the incumbent changes. With none due, it keeps one
    re-measurement of a trial's usual length: the search's next trial may measure higher once, and must then be
    measured again before the pairs (a fresh clone's run ended with "trial 57 measured higher once ... it may still
    win": that trial came last, and its re-measurement and the pairs no longer fitted)."""
    due = due_next(trials, top)
    expected = budget.expected_trial_s()
    if not due:
        budget.remeasure_s = LENGTH_MARGIN * expected if expected is not None else 0.0
        return
    budget.remeasure_s = sum(length_s(t, warm_boot_s(trials)) or 0.0 for t in due)


def due_next(trials: Sequence[FrozenTrial], top: int = DEFAULT_TOP) -> list[FrozenTrial]:
    """The re-measurement due next, and after a lone incumbent's confirmation the closest runner-up whose band
    reaches it: a confirmation that comes out lower puts that runner-up in reach, and its re-measurement must fit
    before the pairs too (a fresh clone's run spent its reserve confirming the recipe, 940 then 853, and had no time
    left for the trial that measured 913 once)."""
    t = next_to_remeasure(trials, top)
    incumbent = best(trials)
    if t is None or incumbent is None or t.number != incumbent.trial.number:
        return [] if t is None else [t]
    close = in_reach(trials, incumbent, top)
    return [t, close[0].trial] if close else [t]


def remeasured(trials: Sequence[FrozenTrial]) -> dict[int, list[float]]:
    """{original trial number: its re-measured throughputs}, in order. A re-measurement that was infeasible
    (missed the limits, ran out of memory) counts as 0; one that was pruned, failed or still runs does not count."""
    out: dict[int, list[float]] = {}
    for t in sorted(trials, key=lambda t: t.number):
        of = view(t).remeasure_of
        if of is None or t.state != TrialState.COMPLETE:
            continue
        out.setdefault(int(of), []).append(float(t.value or 0.0) if feasible(t) else 0.0)
    return out


def score(t: FrozenTrial, trials: Sequence[FrozenTrial]) -> float:
    """What a trial's configuration is ranked by: its figure over all its measurements (see Best.figure)."""
    return _best_of(t, trials).figure


@dataclass(frozen=True)
class Measurement:
    """One boot and measurement of a configuration: the original trial or one of its re-measurements."""

    trial: int
    output_tok_s: float | None  # None: it missed the limits (or ran out of memory): no throughput within them


@dataclass(frozen=True)
class Best:
    """The winning configuration and the one figure every reader gives for it.

    The figure is the (lower) median of the measurements that met the limits, unless most of its measurements missed
    them (then 0: the configuration does not hold its limits). A re-measurement that misses a limit by noise is
    counted and said ("1 of 2 measurements met the limits"), but it does not pull a figure measured within the
    limits towards 0, which no run of the configuration ever delivered."""

    trial: FrozenTrial  # the original trial of the configuration (its flags, its command)
    measurements: tuple[Measurement, ...]  # the first figure first, then each re-measurement in order
    # a configuration measured once, higher than this one's figure, that the run had no time to boot again: its
    # single figure is not comparable (the winner's curse), but the reader is told it may still win
    rival: Best | None = None

    @property
    def passing(self) -> list[float]:
        return [m.output_tok_s for m in self.measurements if m.output_tok_s is not None]

    @property
    def holds(self) -> bool:
        return 2 * len(self.passing) >= len(self.measurements) and bool(self.passing)

    @property
    def figure(self) -> float:
        return statistics.median_low(self.passing) if self.holds else 0.0

    @property
    def figure_trial(self) -> int:
        """The trial whose measurement is the figure: the lower median (of an even count, the lower of the middle
        two) is one real measurement, so the latencies printed beside the figure are that measurement's own."""
        if not self.holds:
            return self.trial.number
        return next(m.trial for m in self.measurements if m.output_tok_s == self.figure)

    def describe(self) -> str:
        """"181 output tok/s (1 of 2 measurements met the limits)": the figure and what it stands on."""
        n, ok = len(self.measurements), self.passing
        head = figure_text(self.figure, self.trial)
        if n == 1:
            return f"{head} (one measurement)"
        if not self.holds:
            return f"{head} ({n - len(ok)} of {n} measurements missed the limits)"
        low, high = (figure_number(v, self.trial) for v in (min(ok), max(ok)))
        spread = f", {low}-{high}" if len(ok) > 1 else ""
        median = "median" if len(ok) % 2 else "lower median"
        if len(ok) == n:
            return f"{head} ({median} of {n} measurements{spread})"
        if len(ok) == 1:
            return f"{head} (1 of {n} measurements met the limits)"
        return f"{head} ({median} of the {len(ok)} of {n} measurements that met the limits{spread})"

    @property
    def text(self) -> str:
        """What each reader prints after "best: "."""
        text = f"trial {self.trial.number}, {self.describe()}"
        if self.rival is None:
            return text
        r = self.rival
        name = f" ({view(r.trial).baseline})" if view(r.trial).baseline else ""
        return (f"{text}; trial {r.trial.number}{name} measured higher once, {figure_text(r.figure, r.trial)}, and was "
                "not re-measured: it may still win")


def figure_line(b: Best, trials: Sequence[FrozenTrial]) -> str:
    """"its figure is trial 9's measurement: 1,319 output tok/s at concurrency 16 (p95 TTFT 412 ms, p95 TPOT
    31.2 ms)": the latencies beside the figure are those of the measurement the figure is (Best.figure_trial)."""
    at = view(next(t for t in trials if t.number == b.figure_trial))
    ttft = "-" if at.p95_ttft_ms is None else f"{at.p95_ttft_ms:,.0f} ms"
    tpot = "-" if at.p95_tpot_ms is None else f"{at.p95_tpot_ms:,.1f} ms"
    return (f"its figure is trial {at.number}'s measurement: {figure_text(b.figure, b.trial)} {at_level(at)} "
            f"(p95 TTFT {ttft}, p95 TPOT {tpot})")


def _best_of(t: FrozenTrial, trials: Sequence[FrozenTrial]) -> Best:
    again = [r for r in sorted(trials, key=lambda r: r.number)
             if view(r).remeasure_of == t.number and r.state == TrialState.COMPLETE]
    return Best(t, tuple(Measurement(r.number, float(r.value or 0.0) if feasible(r) else None) for r in [t, *again]))


def best(trials: Sequence[FrozenTrial], keep: Callable[[FrozenTrial], bool] = lambda t: True) -> Best | None:
    """The winner and its figure: the one place that decides them. Once some configurations were re-measured,
    the winner is chosen among those that hold their limits; the others' single figures are biased upwards
    (the winner's curse) and are not comparable with figures of several measurements."""
    candidates = [_best_of(t, trials) for t in trials
                  if feasible(t) and keep(t) and view(t).remeasure_of is None]
    held = paired_winner(trials)
    paired = [b for b in candidates if b.trial.number == held]
    if paired:  # the final pairs' boots move their winner's own figure: that must not hand the answer to another
        return paired[0]
    again = [b for b in candidates if len(b.measurements) > 1 and b.holds]
    winner = max(again or candidates, key=lambda b: b.figure, default=None)
    if winner is None or not again:
        return winner
    higher = [b for b in candidates if len(b.measurements) == 1 and b.figure > winner.figure]
    return replace(winner, rival=max(higher, key=lambda b: b.figure, default=None))


def paired_winner(trials: Sequence[FrozenTrial]) -> int | None:
    """The configuration the final pairs measure (the latest pair's winner), once they have started; None before."""
    marks = pair_marks(trials)
    return int(max(marks, key=lambda m: int(m["index"]))["winner"]) if marks else None


def ranked(trials: Sequence[FrozenTrial]) -> list[Best]:
    """Each measured configuration (vLLM flags) once, by its original trial with the highest first figure, with
    all its measurements: best figure (Best.figure) first."""
    out: dict[str, FrozenTrial] = {}
    for t in sorted((t for t in trials if feasible(t) and view(t).remeasure_of is None),
                    key=lambda t: t.value or 0.0, reverse=True):
        out.setdefault(view(t).config_key, t)
    return sorted((_best_of(t, trials) for t in out.values()), key=lambda b: b.figure, reverse=True)


def spread(trials: Sequence[FrozenTrial]) -> noise.Spread | None:
    """The spread of one measurement on this machine (noise.pooled), over the configurations measured more than
    once within the limits (re-measurements and pairs); None before any repeat."""
    return noise.pooled([b.passing for b in ranked(trials)])


def band(b: Best, widen: float = noise.DEFAULT_BAND) -> tuple[float, float]:
    """What the configuration may deliver: the min-max of its measurements within the limits, widened by `widen`
    (noise.band: one measurement says nothing of its own spread, and a few rarely span the whole of it); (0, 0)
    when it does not hold its limits."""
    if not b.holds:
        return 0.0, 0.0
    return min(b.passing) * (1 - widen), max(b.passing) * (1 + widen)


def in_reach(trials: Sequence[FrozenTrial], incumbent: Best, top: int = DEFAULT_TOP) -> list[Best]:
    """The runners-up among the `top` best, best first, that can still change the answer: the top of each one's
    band reaches the bottom of the incumbent's (bands widened by noise.band)."""
    widen = noise.band(spread(trials))
    low = band(incumbent, widen)[0]
    return [b for b in ranked(trials)[:top]
            if b.trial.number != incumbent.trial.number and b.holds and band(b, widen)[1] >= low]


def next_to_remeasure(trials: Sequence[FrozenTrial], top: int = DEFAULT_TOP) -> FrozenTrial | None:
    """The original trial whose configuration to boot again, or None when no measurement can change the answer.

    The rule: the incumbent is `best`'s winner. It is re-measured once if it has only its first figure (a lone
    clear winner gets this one confirmation, and no more). A runner-up (one of the `top` best configurations) can
    change the answer when the top of its band reaches the bottom of the incumbent's; while one does, the one with
    the fewest measurements among the incumbent and those runners-up is measured again (the better first on a
    tie), each at most MAX_ROUNDS times. A runner-up clearly below the incumbent is never booted again: whatever
    it measures, it does not win. The bands are widened by this machine's measured spread once it rests on
    enough repeats (noise.band), else by noise.DEFAULT_BAND."""
    incumbent = best(trials)
    if incumbent is None:
        return None
    again = Counter(view(t).remeasure_of for t in trials if t.state.is_finished())  # pruned and refused ones too
    if again[incumbent.trial.number] == 0:
        return incumbent.trial
    close = in_reach(trials, incumbent, top)
    open_ = [b for b in [incumbent, *close] if again[b.trial.number] < MAX_ROUNDS] if close else []
    pick = min(open_, key=lambda b: len(b.measurements), default=None)
    return pick.trial if pick is not None else None


def summary(trials: Sequence[FrozenTrial]) -> dict[str, dict[str, object]]:
    """Per re-measured configuration: every figure (the first one first; None where it missed the limits), and
    the figure it is reported with (Best.figure) with the min and max of those that met the limits."""
    by_number = {t.number: t for t in trials}
    out: dict[str, dict[str, object]] = {}
    for number in remeasured(trials):
        if number not in by_number:
            continue
        b = _best_of(by_number[number], trials)
        figures = [None if m.output_tok_s is None else round(m.output_tok_s, 1) for m in b.measurements]
        ok = b.passing or [0.0]
        out[str(number)] = {"output_throughput": figures, "median": round(b.figure, 1),
                            "min": round(min(ok), 1), "max": round(max(ok), 1)}
    return out


@dataclass(frozen=True)
class RemeasureRun:
    """What `remeasure_top` did: the original trial numbers re-measured (in order), how many of those booted,
    and why it stopped when it stopped for want of time ("" when every round ran or nothing was to be done).
    From `search_and_remeasure`: every re-measurement of the run, and why the run stopped."""

    done: tuple[int, ...] = ()
    booted: int = 0
    stopped_because: str = ""


def claim(budget: Budget, needed: float | None, what: str, spare: str = "") -> tuple[bool, str]:
    """Claim `needed` seconds of the budget for `what`; where too little time is left, say so in those words."""
    fits, why = budget.claim(needed)
    if not fits and needed is not None and "left" in why:
        why = f"{budget.remaining():.0f} s left, less than {what} (~{needed:.0f} s{spare})"
    return fits, why


def enqueue_again(study: optuna.Study, t: FrozenTrial, marks: dict[str, object] | None = None) -> None:
    """Queue trial t's configuration to boot again, marked as its re-measurement (plus `marks`); a baseline boots
    exactly what it booted."""
    attrs: dict[str, object] = {REMEASURE_ATTR: t.number, **(marks or {})}
    if BASELINE_ATTR in t.user_attrs:
        attrs[BASELINE_ATTR] = t.user_attrs[BASELINE_ATTR]
    study.enqueue_trial(t.params, user_attrs=attrs)


def remeasure_top(study: optuna.Study, budget: Budget, reserved: Reserve, run_one: Callable[[], object | None],
                  stop: threading.Event | None = None) -> RemeasureRun:
    """Give the reserve back to `budget` and spend it booting configurations again, as `next_to_remeasure`
    says, while one still fits. `run_one` runs the next queued trial (the study loop's own trial function) and
    returns its result, or None when it was rejected before boot. The study's SUMMARY_ATTR holds the figures."""
    pairs_s = budget.pairs_held()  # a re-measurement starts only if the final pairs still fit after it
    _release(budget, reserved)
    if reserved.top <= 0 or (stop is not None and stop.is_set()):
        return RemeasureRun()
    if any(t.state == TrialState.WAITING for t in study.get_trials(deepcopy=False)):  # they would run first, unmarked
        return RemeasureRun()
    done: list[int] = []
    booted = 0
    why = ""
    while stop is None or not stop.is_set():
        trials = study.get_trials(deepcopy=False)
        t = next_to_remeasure(trials, reserved.top)
        if t is None:
            break
        length = length_s(t, warm_boot_s(trials))
        fits, why = claim(budget, None if length is None else length + pairs_s,
                          f"one re-measurement of trial {t.number}" + (" and the final pairs" if pairs_s else ""),
                          " with a quarter to spare")
        if not fits:
            break
        enqueue_again(study, t)
        result = run_one()
        if result is None:
            budget.release()
        else:
            booted += 1
            budget.record(float(getattr(result, "duration_s", 0.0)), searched=False)
        done.append(t.number)
    if done:
        study.set_user_attr(SUMMARY_ATTR, summary(study.get_trials(deepcopy=False)))
    return RemeasureRun(tuple(done), booted, why)


@dataclass(frozen=True)
class Searched:
    """What one phase of the search did: the trials it booted, and why it stopped."""

    booted: int
    stopped_because: str


def search_and_remeasure(search: Callable[[], Searched], remeasure_in: Callable[[Reserve], RemeasureRun],
                         reserved: Reserve, stop: threading.Event) -> RemeasureRun:
    """Search until no trial fits, then spend the reserve re-measuring (`remeasure_in`: remeasure_top) while a
    re-measurement fits and can change the answer. What is left goes back to the search, and a trial it boots
    may want re-measuring in turn: the run stops only once a search boots nothing, that is when neither a trial
    nor a re-measurement fits (or is due). Returns all re-measurements, and why the run stopped: the last
    search's reason, then the last re-measuring's."""
    searched = search()  # leaving the reserve
    runs = [remeasure_in(reserved)]  # gives back what it cannot spend
    while not stop.is_set():
        searched = search()  # the rest of the budget is the search's
        if stop.is_set() or not searched.booted:
            break
        runs.append(remeasure_in(Reserve(reserved.top)))
    why = "; ".join(dict.fromkeys(w for w in (searched.stopped_because, runs[-1].stopped_because) if w))
    return RemeasureRun(tuple(n for r in runs for n in r.done), sum(r.booted for r in runs), why)


def best_trial(study: optuna.Study, keep: Callable[[FrozenTrial], bool] = lambda t: True) -> remeasure.Best | None:
    """The winner (its original trial) and the figure every reader gives for it (remeasure.best): chosen on
    all measurements once the top configurations were re-measured. Optuna's own best_trial ignores constraints."""
    return remeasure.best(study.get_trials(deepcopy=False), keep)
