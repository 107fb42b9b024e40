"""The highest load level that meets the limits: a pure function of a measure(level, exact) callable.

Where the search starts (`Prior`, `first_level`). A trial starts near its likely answer, not at 1: at the
incumbent's best level when the study has one (the screening level, below), else at the median best level of
similar configurations, else one geometric step below what the configuration can hold at once (`cap`: the
smaller of max_num_seqs and the predicted KV tokens / tokens per request), else the geometric middle of
[start, max]. From there levels go up by `factor` while they pass, or down by `factor` while they fail, and the
gap between the last pass and the first fail is bisected. `start` is the lowest level ever measured.

Screening (multi-fidelity): with `Prior.screen`, the first level is the incumbent's best level (less this machine's
measured noise, `Prior.noise`, once it is known) and a failure there ends the search (`SlaResult.screened_out`): a
configuration that cannot sustain the incumbent's load costs one boot and one short level. The incumbent's level is
the bar; it can screen out a configuration whose fewer, faster requests would beat the incumbent's throughput at a
lower level.

How long a level runs: measure/stop_rule.py (a sequential verdict, and the exact rule for the answer).

Compared with the tools the issue names. GuideLLM's sweep measures a synchronous run (concurrency 1) and a
throughput run (everything at once), then spreads its rates linearly between the two; vLLM 0.32's
`vllm bench sweep serve_workload` (vllm/benchmarks/sweep/serve_workload.py, explore_comb_workloads) does the
same for max_concurrency: concurrency 1 and concurrency = dataset size, estimating each end's sustained
concurrency as request throughput x mean E2E latency (Little's law), then np.linspace between them. Both map
the whole curve at fixed-size runs; neither searches for a limit. Taken from them: the bracket comes from the
configuration's own capacity (their "batch" end, here predicted, not measured, since a run at full load is
the most expensive one) and concurrency is an integer; not taken: the linear grid and fixed request counts,
since only the boundary matters here and a geometric ladder plus bisection needs log2 of the range.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from autotune.measure.stop_rule import StopRule

T = TypeVar("T")


@dataclass(frozen=True)
class LoadSearch:
    """How load levels are chosen: from a first level derived from the `Prior`, by `factor` up or down within
    [start, max], then bisect to `tolerance`."""

    mode: Literal["concurrency", "rate"] = "concurrency"
    start: float = 1  # the lowest level measured
    max: float = 256
    factor: float = 2.0
    tolerance: float = 0.25  # stop bisecting when (fail - pass) <= tolerance * pass (and >= 1 for concurrency)
    min_requests: int = 72  # requests per exact level at least (concurrency mode: at least 3 x concurrency too)
    warmup_requests: int = 4  # per level, not counted
    # An exact level goes on until each limited p95 is known to +-p95_margin (relative, at p95_confidence, from
    # order statistics) or is clearly on one side of its limit; 0 = exactly min_requests, as a fixed count.
    p95_margin: float = 0.1
    p95_confidence: float = 0.9
    max_requests: int = 400  # per level at most (raised to the level's minimum when that is more)
    # Each error rate of the sequential verdict (a level clearly inside or outside its limits ends early);
    # 0: none, every level is measured by the exact rule.
    verdict_error: float = 0.05

    def stop_rule(self, level: float, exact: bool = True) -> StopRule:
        """How many requests the level at `level` measures (see StopRule); not `exact`: a sequential verdict
        may end it first."""
        low = max(self.min_requests, int(3 * level)) if self.mode == "concurrency" else self.min_requests
        error = 0.0 if exact else self.verdict_error
        burst = int(level) if self.mode == "concurrency" else 0
        if self.p95_margin <= 0:
            return StopRule(low, low, None, self.p95_confidence, error, burst)
        return StopRule(low, max(low, self.max_requests), self.p95_margin, self.p95_confidence, error, burst)


@dataclass(frozen=True)
class Prior:
    """What is known before a trial's first level: from earlier trials of the study and from the configuration."""

    incumbent: float | None = None  # the best level of the study's best configuration so far
    similar: tuple[float, ...] = ()  # best levels of the most similar configurations measured
    cap: float | None = None  # the most the configuration holds at once (max_num_seqs, KV tokens / request)
    screen: bool = False  # measure at `incumbent` (less `noise`) first and stop there if it fails
    noise: float = 0.0  # the spread of one measurement on this machine, once measured well enough (search/noise.py)
    # Measure the first level exactly: a re-measurement's first level, its original's best, is most often the
    # answer, which is measured exactly anyway; judged sequentially first, it would be measured twice.
    exact_first: bool = False


NO_PRIOR = Prior()  # nothing known: start from the geometric middle of [start, max]


def capacity(max_num_seqs: float | None, kv_tokens: float | None, tokens_per_request: float,
             running: float | None = None) -> float | None:
    """Concurrent requests a configuration can hold at once: the smaller of its batch, its KV tokens over a
    request's, and `running`, what its KV cache's blocks run at once (estimate.max_running_seqs)."""
    caps = [c for c in (max_num_seqs, kv_tokens / tokens_per_request if kv_tokens and tokens_per_request else None,
                        running) if c]
    return min(caps) if caps else None


def first_level(search: LoadSearch, prior: Prior) -> float:
    """Where the search starts (see the module docstring), within [start, max]."""
    top = search.max if prior.cap is None else max(search.start, min(search.max, prior.cap))
    if prior.screen and prior.incumbent is not None:
        # the incumbent's load less what one measurement's noise moves it: a configuration within the noise of
        # the incumbent is measured, not screened out by a noisy level
        guess = prior.incumbent * (1.0 - prior.noise)
    elif prior.similar:
        guess = statistics.median(prior.similar)
    elif prior.incumbent is not None:
        guess = prior.incumbent
    elif prior.cap is not None:
        guess = top / search.factor
    else:
        guess = math.sqrt(search.start * search.max)
    guess = min(max(guess, search.start), top if not prior.screen else search.max)
    return max(1, round(guess)) if search.mode == "concurrency" else guess


@dataclass(frozen=True)
class SlaStep(Generic[T]):
    """One measured level: what `measure` returned, whether `passed` accepted it, and whether it was exact."""

    level: float
    outcome: T
    passed: bool
    exact: bool = True


@dataclass(frozen=True)
class SlaResult(Generic[T]):
    steps: tuple[SlaStep[T], ...]  # in the order measured
    screened_out: bool = False  # failed at the incumbent's level: ended there (Prior.screen)

    @property
    def best_step(self) -> SlaStep[T] | None:
        latest = {s.level: s for s in self.steps}  # a level measured again counts as last measured
        passes = [s for s in latest.values() if s.passed]
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


class Ladder(Generic[T]):
    """The load search as ask and tell: `next` is the (level, exact) to measure next, None once the search is
    done (then `result`); `tell` gives it what that level measured. The caller owns the loop, so it can end the
    search between any two levels (a server that died, a pruner) by not telling it more."""

    def __init__(self, passed: Callable[[T], bool], search: LoadSearch, prior: Prior = NO_PRIOR):
        self._walk = _Walk(passed, search, prior).run()
        self.result: SlaResult[T] | None = None
        self.next: tuple[float, bool] | None = self._advance(None)

    def tell(self, outcome: T) -> None:
        self.next = self._advance(outcome)

    def _advance(self, outcome: T | None) -> tuple[float, bool] | None:
        try:
            return self._walk.send(outcome)  # type: ignore[arg-type]  # the first send starts the walk: None
        except StopIteration as done:
            self.result = done.value
            return None


def find_sustainable(
    measure: Callable[[float, bool], T], passed: Callable[[T], bool], search: LoadSearch, prior: Prior = NO_PRIOR
) -> SlaResult[T]:
    """Measure levels from the prior's first level up (or down) by `factor` and bisect to the highest passing
    one; `measure(level, exact)`; exceptions from it propagate.

    Concurrency levels are integers (each step at least one away from the last, within [ceil(start), floor(max)]).
    In a non-monotone response only measured levels count: the search never skips past a failure.
    """
    ladder = Ladder(passed, search, prior)
    while ladder.next is not None:
        ladder.tell(measure(*ladder.next))
    assert ladder.result is not None  # the walk ends with its result
    return ladder.result


class _Walk(Generic[T]):
    """find_sustainable's search as a generator: each step yields (level, exact) and is sent what it measured."""

    def __init__(self, passed: Callable[[T], bool], search: LoadSearch, prior: Prior):
        _check(search)
        self.passed, self.search, self.prior = passed, search, prior
        self.ints = search.mode == "concurrency"
        self.bottom = max(1, math.ceil(search.start)) if self.ints else search.start
        self.top = math.floor(search.max) if self.ints else search.max
        if self.bottom > self.top:
            raise ValueError(f"no integer concurrency in [{search.start}, {search.max}]")
        self.steps: list[SlaStep[T]] = []

    def run(self) -> Generator[tuple[float, bool], T, SlaResult[T]]:
        level = min(max(first_level(self.search, self.prior), self.bottom), self.top)
        lo: float | None
        hi: float | None
        if (yield from self.step(level, self.prior.exact_first)):
            lo, hi = yield from self.climb(level)
        elif self.prior.screen:
            return SlaResult(tuple(self.steps), screened_out=True)
        else:
            lo, hi = yield from self.descend(level)
        while lo is not None:
            lo, hi = yield from self.bisect(lo, hi)
            if next(s for s in reversed(self.steps) if s.level == lo).exact or (yield from self.step(lo, True)):
                break
            # The best level passed only by the sequential verdict failed when measured exactly: below it again.
            latest = {s.level: s.passed for s in self.steps}
            below = [x for x, ok in latest.items() if ok and x < lo]
            lo, hi = (max(below), lo) if below else (yield from self.descend(lo))
        return SlaResult(tuple(self.steps))

    def step(self, x: float, exact: bool) -> Generator[tuple[float, bool], T, bool]:
        outcome = yield x, exact
        ok = bool(self.passed(outcome))
        self.steps.append(SlaStep(x, outcome, ok, exact))
        return ok

    def up(self, x: float) -> float:
        return min(self.top, max(x + 1, math.ceil(x * self.search.factor)) if self.ints else x * self.search.factor)

    def down(self, x: float) -> float:
        return max(self.bottom, min(x - 1, math.floor(x / self.search.factor)) if self.ints else x / self.search.factor)

    def climb(self, lo: float) -> Generator[tuple[float, bool], T, tuple[float, float | None]]:
        """Up from a pass while levels pass: (the highest pass, the first failure above it or None at the top)."""
        while lo < self.top:
            nxt = self.up(lo)
            if not (yield from self.step(nxt, False)):
                return lo, nxt
            lo = nxt
        return lo, None

    def descend(self, fail: float) -> Generator[tuple[float, bool], T, tuple[float | None, float]]:
        """Down from a failure until a level passes: (that level or None when `bottom` fails too, the lowest
        failure)."""
        while fail > self.bottom:
            x = self.down(fail)
            if (yield from self.step(x, False)):
                return x, fail
            fail = x
        return None, fail

    def bisect(self, lo: float, hi: float | None) -> Generator[tuple[float, bool], T, tuple[float, float | None]]:
        """Halve the gap between the highest pass and the lowest failure down to the search's tolerance."""
        while hi is not None and hi - lo > max(self.search.tolerance * lo, 1 if self.ints else 0):
            mid = (lo + hi) // 2 if self.ints else (lo + hi) / 2
            if (yield from self.step(mid, False)):  # judged sequentially: only the answer needs an exact figure
                lo = mid
            else:
                hi = mid
        return lo, hi
