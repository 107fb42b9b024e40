"""The time budget of a run: a deadline, and whether one more trial fits before it.

The clock is injectable so the arithmetic is tested without sleeping.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import optuna

from autotune.config.toml import parse_duration
from autotune.errors import SpecError
from autotune.units import format_hms

if TYPE_CHECKING:
    from autotune.config.study_file import StudySpec

Clock = Callable[[], float]


RESERVE_MAX_SHARE = 0.5  # of a time budget, at most, is held back from the search: the search keeps half


@dataclass
class Budget:
    """`seconds` of wall clock from `start` (None: no time limit), and at most `trials` trials (None: no limit)."""

    seconds: float | None = None
    trials: int | None = None
    clock: Clock = time.monotonic
    start: float = field(default=0.0)
    durations: list[float] = field(default_factory=list)  # of the trials that booted, this run and before
    searched_durations: list[float] = field(default_factory=list)  # of those, the search's own (record)
    # Seconds kept at the end for re-measuring: the search sees its deadline earlier by what `held` says.
    held_s: float = 0.0  # the reserve's share of the budget (remeasure.reserve)
    remeasure_s: float = 0.0  # what the re-measurement due next will take, with its margin (remeasure.hold)
    pairs_s: float = 0.0  # what the final pairs will take, with their margin (paired.hold_pairs); 0: none due

    def __post_init__(self) -> None:
        self.start = self.clock()
        self.started_trials = 0
        self._lock = threading.Lock()  # several slots claim trials from one budget

    @property
    def deadline(self) -> float | None:
        if self.seconds is None:
            return None
        return self.start + self.seconds - self.held()

    def held(self) -> float:
        """Seconds the search leaves for the end of the run: the re-measurement due next (`remeasure_s`: sized
        on that configuration's own warm measurement, as the median trial says nothing of it: screened trials
        are short) and the final pairs and soak after it (`pairs_s`), or at least the reserve (`held_s`, before
        anything is measured); never more than RESERVE_MAX_SHARE of the budget. Where both do not fit in that,
        the pairs alone (a re-measurement then runs only if the search leaves time for it), else the
        re-measurement alone (and the run says the budget is too short for the pairs: `pairs_short_s`); where
        that does not fit either, nothing is held: the search keeps the whole budget."""
        if self.held_s <= 0 or self.seconds is None:
            return 0.0
        cap = RESERVE_MAX_SHARE * self.seconds
        for end in (self.remeasure_s + self.pairs_s, *([self.pairs_s] if self.pairs_s else []), self.remeasure_s):
            if max(self.held_s, end) <= cap:
                return max(self.held_s, end)
        return 0.0

    def pairs_held(self) -> float:
        """Seconds of the final pairs that the reserve holds: all of `pairs_s`, or 0 when they do not fit in it."""
        fits = self.seconds is not None and self.pairs_s <= RESERVE_MAX_SHARE * self.seconds
        return self.pairs_s if fits else 0.0

    def pairs_short_s(self) -> float:
        """How much longer the budget would have to be for the reserve to hold the final pairs (0: it holds
        them, or none are due)."""
        if self.seconds is None or self.pairs_s <= 0:
            return 0.0
        return max(0.0, self.pairs_s / RESERVE_MAX_SHARE - self.seconds)

    def remaining(self) -> float:
        """Seconds the search has left: the budget's, less what is held for re-measuring."""
        return float("inf") if self.deadline is None else max(0.0, self.deadline - self.clock())

    def time_left(self) -> float:
        """Seconds the whole budget has left (the search's and the re-measurements')."""
        return float("inf") if self.seconds is None else max(0.0, self.start + self.seconds - self.clock())

    def left_text(self) -> str:
        """'17m04s left, 3m45s of it for re-measuring': what the progress lines print. The budget's own clock,
        which only runs down; the search's share alone jumped as the reserve was sized anew (seen on a GPU:
        13m19s, 12m54s, then 6m18s after a 112 s trial)."""
        left = self.time_left()
        if left == float("inf"):
            return "no time limit"
        kept = min(self.held(), left)
        return f"{format_hms(left)} left" + (f", {format_hms(kept)} of it for re-measuring" if kept >= 1 else "")

    def expected_trial_s(self) -> float | None:
        """What the next trial is likely to take: the median of the search's trials so far (a sampled one is
        screened at the incumbent's level, 157-159 s on a GPU where a baseline's full search took 256-379 s
        and a re-measurement 265 s), else of every trial."""
        seen = self.searched_durations or self.durations
        return statistics.median(seen) if seen else None

    def next_trial_fits(self, expected_s: float | None = None) -> tuple[bool, str]:
        """Whether a trial expected to take `expected_s` (default: the median so far) fits in what is left."""
        if self.trials is not None and self.started_trials >= self.trials:
            return False, f"{self.trials} trial(s) done"
        left = self.remaining()
        if left <= 0:
            return False, "time budget spent"
        expected = expected_s if expected_s is not None else self.expected_trial_s()
        if expected is not None and expected > left:
            return False, f"{left:.0f} s left, less than one trial (~{expected:.0f} s)"
        return True, ""

    def claim(self, expected_s: float | None = None) -> tuple[bool, str]:
        """Atomically: does one more trial fit, and if so count it as started."""
        with self._lock:
            fits, why = self.next_trial_fits(expected_s)
            if fits:
                self.started_trials += 1
            return fits, why

    def release(self) -> None:
        """A claimed trial that cost nothing (rejected before boot) gives its place back."""
        with self._lock:
            self.started_trials -= 1

    def record(self, duration_s: float, searched: bool = True) -> None:
        """A booted trial's length; `searched`: one of the search's own, not a baseline or a re-measurement."""
        with self._lock:
            self.durations.append(duration_s)
            if searched:
                self.searched_durations.append(duration_s)


SPENT_ATTR = "budget"  # study user attr: Spent, as asdict


@dataclass(frozen=True)
class Spent:
    """What the study's runs were given and took: the sum of their time budgets (None once a run had no time
    limit) and of the wall time they ran, over how many runs."""

    seconds: float | None
    used_s: float
    runs: int

    @property
    def left_s(self) -> float | None:
        return None if self.seconds is None else max(0.0, self.seconds - self.used_s)


def spent(study: optuna.Study) -> Spent | None:
    """The budget the study's runs recorded (record_spent); None for a study recorded before they did."""
    doc = study.user_attrs.get(SPENT_ATTR)
    return Spent(doc["seconds"], float(doc["used_s"]), int(doc["runs"])) if isinstance(doc, dict) else None


def record_spent(study: optuna.Study, budget: Budget) -> Spent:
    """Add this run's budget and the time it ran (its clock since it started) to what the study recorded."""
    before = spent(study) or Spent(0.0, 0.0, 0)
    seconds = None if before.seconds is None or budget.seconds is None else before.seconds + budget.seconds
    now = Spent(seconds, before.used_s + max(0.0, budget.clock() - budget.start), before.runs + 1)
    study.set_user_attr(SPENT_ATTR, asdict(now))
    return now


def check_budget_options(budget: str | None, n_trials: int | None) -> float | None:
    """--budget's seconds, and --n-trials at least 1: checked before anything is read or written."""
    if n_trials is not None and n_trials < 1:
        raise SpecError("--n-trials", None, f"must be at least 1, got {n_trials}")
    return parse_duration(budget, "--budget") if budget is not None else None


def budget_for(budget: str | None, n_trials: int | None, spec: StudySpec) -> Budget:
    """The run's budget: --budget (else the study's [budget] time), --n-trials (else the study's), at least one."""
    seconds = check_budget_options(budget, n_trials)
    seconds = spec.time_budget_s if seconds is None else seconds
    if seconds is None and n_trials is None and spec.max_trials is None:
        raise SpecError("--budget", None, "give a time budget (e.g. --budget 4h) or --n-trials")
    return Budget(seconds=seconds, trials=n_trials or spec.max_trials)
