"""The time budget of a run: a deadline, and whether one more trial fits before it.

The clock is injectable so the arithmetic is tested without sleeping.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

Clock = Callable[[], float]


@dataclass
class Budget:
    """`seconds` of wall clock from `start` (None: no time limit), and at most `trials` trials (None: no limit)."""

    seconds: float | None = None
    trials: int | None = None
    clock: Clock = time.monotonic
    start: float = field(default=0.0)
    durations: list[float] = field(default_factory=list)  # of the trials that booted, this run and before

    def __post_init__(self) -> None:
        self.start = self.clock()
        self.started_trials = 0
        self._lock = threading.Lock()  # several slots claim trials from one budget

    @property
    def deadline(self) -> float | None:
        return None if self.seconds is None else self.start + self.seconds

    def remaining(self) -> float:
        return float("inf") if self.deadline is None else max(0.0, self.deadline - self.clock())

    def expected_trial_s(self) -> float | None:
        """What the next trial is likely to take: the median of the trials seen so far."""
        return statistics.median(self.durations) if self.durations else None

    def next_trial_fits(self) -> tuple[bool, str]:
        if self.trials is not None and self.started_trials >= self.trials:
            return False, f"{self.trials} trial(s) done"
        left = self.remaining()
        if left <= 0:
            return False, "time budget spent"
        expected = self.expected_trial_s()
        if expected is not None and expected > left:
            return False, f"{left:.0f} s left, a trial takes about {expected:.0f} s"
        return True, ""

    def claim(self) -> tuple[bool, str]:
        """Atomically: does one more trial fit, and if so count it as started."""
        with self._lock:
            fits, why = self.next_trial_fits()
            if fits:
                self.started_trials += 1
            return fits, why

    def release(self) -> None:
        """A claimed trial that cost nothing (rejected before boot) gives its place back."""
        with self._lock:
            self.started_trials -= 1

    def record(self, duration_s: float) -> None:
        with self._lock:
            self.durations.append(duration_s)
