"""The highest load level that meets the limits: a pure function of a measure(level) callable.

Levels rise geometrically from `start` until one fails (or `max` passes), then the gap between the last pass
and the first fail is bisected. Measuring a level is the caller's business (boot nothing here), so the search
is tested with a fake measure and reused for concurrency and request-rate modes alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from autotune.metrics import StopRule

T = TypeVar("T")


@dataclass(frozen=True)
class LoadSearch:
    """How load levels are chosen: double from `start` up to `max`, then bisect to `tolerance`."""

    mode: Literal["concurrency", "rate"] = "concurrency"
    start: float = 1
    max: float = 256
    factor: float = 2.0
    tolerance: float = 0.25  # stop bisecting when (fail - pass) <= tolerance * pass (and >= 1 for concurrency)
    min_requests: int = 72  # requests per level at least (concurrency mode: at least 3 x concurrency too)
    warmup_requests: int = 4  # per level, not counted
    # A level goes on until each limited p95 is known to +-p95_margin (relative, at p95_confidence, from order
    # statistics) or is clearly on one side of its limit; 0 = exactly min_requests, as a fixed count.
    p95_margin: float = 0.1
    p95_confidence: float = 0.9
    max_requests: int = 400  # per level at most (raised to the level's minimum when that is more)

    def stop_rule(self, level: float) -> StopRule:
        """How many requests the level at `level` measures (see metrics.StopRule)."""
        low = max(self.min_requests, int(3 * level)) if self.mode == "concurrency" else self.min_requests
        if self.p95_margin <= 0:
            return StopRule(low, low, None, self.p95_confidence)
        return StopRule(low, max(low, self.max_requests), self.p95_margin, self.p95_confidence)


@dataclass(frozen=True)
class SlaStep(Generic[T]):
    """One measured level: what `measure` returned and whether `passed` accepted it."""

    level: float
    outcome: T
    passed: bool


@dataclass(frozen=True)
class SlaResult(Generic[T]):
    steps: tuple[SlaStep[T], ...]  # in the order measured

    @property
    def best_step(self) -> SlaStep[T] | None:
        passes = [s for s in self.steps if s.passed]
        return max(passes, key=lambda s: s.level) if passes else None

    @property
    def best(self) -> T | None:
        """The outcome of the highest passing level; None when no level passed (the trial is infeasible)."""
        step = self.best_step
        return step.outcome if step else None

    @property
    def best_level(self) -> float | None:
        step = self.best_step
        return step.level if step else None

    @property
    def feasible(self) -> bool:
        return self.best_step is not None


def _check(search: LoadSearch) -> None:
    if search.mode not in ("concurrency", "rate"):
        raise ValueError(f"unknown load search mode {search.mode!r}")
    if not 0 < search.start <= search.max:
        raise ValueError(f"need 0 < start <= max, got start={search.start} max={search.max}")
    if search.factor <= 1:
        raise ValueError(f"factor must be > 1, got {search.factor}")
    if search.tolerance < 0 or (search.mode == "rate" and search.tolerance == 0):
        raise ValueError(f"tolerance must be > 0 (>= 0 for concurrency), got {search.tolerance}")


def find_sustainable(
    measure: Callable[[float], T], passed: Callable[[T], bool], search: LoadSearch
) -> SlaResult[T]:
    """Measure rising levels and bisect to the highest passing one; exceptions from `measure` propagate.

    Concurrency levels are integers (start rounded up, each step at least one more than the last, max rounded
    down). In a non-monotone response only measured levels count: the search never skips past a failure.
    """
    _check(search)
    ints = search.mode == "concurrency"
    top = math.floor(search.max) if ints else search.max
    level: float = max(1, math.ceil(search.start)) if ints else search.start
    if level > top:
        raise ValueError(f"no integer concurrency in [{search.start}, {search.max}]")
    steps: list[SlaStep[T]] = []

    def step(x: float) -> bool:
        outcome = measure(x)
        ok = bool(passed(outcome))
        steps.append(SlaStep(x, outcome, ok))
        return ok

    lo: float | None = None
    hi: float | None = None
    while True:
        if not step(level):
            hi = level
            break
        lo = level
        if level >= top:
            break
        nxt = level * search.factor
        level = min(top, max(level + 1, math.ceil(nxt)) if ints else nxt)

    if lo is None or hi is None:  # nothing passed, or max passed
        return SlaResult(tuple(steps))
    while hi - lo > max(search.tolerance * lo, 1 if ints else 0):
        mid = (lo + hi) // 2 if ints else (lo + hi) / 2
        if step(mid):
            lo = mid
        else:
            hi = mid
    return SlaResult(tuple(steps))
