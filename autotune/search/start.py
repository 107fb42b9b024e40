"""The start of a search: of a few random configurations, the one that runs the most requests at once.

A search's first trials know nothing of the surface yet. But where memory decides what a configuration can serve (a
27B hybrid model in 24 GB), the estimator knows before any boot how many requests each configuration runs at once
(ladder.capacity: max_num_seqs, the KV tokens per request, and what the central KV cache's blocks run at once,
estimate.running_seqs), and throughput under a latency limit comes from requests running at once: on the recorded
GPU surfaces each configuration sustained a level within one ladder step of that count, and of the 22 measured at 16
requests every one it put at 14 or more sustained 16 and none it put at 13 or fewer did
(benchmarks/tests/test_replay.py). So each of the first START_PICKS sampled trials is, of START_CANDIDATES random
configurations the estimator does not refuse, the one that runs the most (the first drawn on a tie); the sampler
proposes the rest (`[sampler] start_picks` sets how many are picked), and a proposal that runs too few for the
incumbent's level is screened out before boot (measure/queueing.py holds_too_few). The estimator judges a
configuration in about 0.2 ms: a pick of 64 takes ~30 ms.

The settings (10 picks, each the most of 64) were chosen in sample, on the surfaces they were first scored on, by
a replay that judged the screens on the recorded neighbour rather than on the configuration sampled. What they buy,
judged as the product judges, is in the fair replay's dataset `search-replay-h100-as-rtx3090-awq-marlin` (with and
without the surface's points that the default's own first picks had placed there); `rtx3090-long-context-surface-plan`
is the surface planned to test them out of sample. The picks stay random among the best of 64: the estimator accepts
a third to a half of the 3090 space, so each pick is the most of some 20-30.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import optuna
from optuna.trial import TrialState

from autotune.config.params import Param
from autotune.config.study_file import DEFAULT_START_PICKS
from autotune.search.space import suggest

START_PICKS = DEFAULT_START_PICKS
START_CANDIDATES = 64
PICK_ATTR = "start_pick"  # trial user attr: {"runs_at_once": n, "of": candidates} of a picked configuration

Capacity = Callable[[dict[str, object]], "float | None"]  # requests it runs at once; None: refused before boot


def candidates(space: Sequence[Param], seed: int | None, n: int) -> list[dict[str, object]]:
    """n configurations drawn uniformly from the space (as Optuna's RandomSampler draws them, conditions kept)."""
    scratch = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    return [suggest(scratch.ask(), space) for _ in range(n)]


def best_of(configs: Sequence[dict[str, object]], capacity: Capacity) -> tuple[dict[str, object], float] | None:
    """The configuration that runs the most requests at once, the first on a tie; None when all are refused."""
    scored = [(params, c) for params in configs if (c := capacity(params)) is not None]
    return max(scored, key=lambda s: s[1]) if scored else None


def due(study: optuna.Study, picks: int = START_PICKS) -> bool:
    """Whether the next sampled trial is picked: fewer than `picks` were, and nothing is queued (a baseline, a
    warm start or a re-measurement goes first)."""
    trials = study.get_trials(deepcopy=False)
    if any(t.state is TrialState.WAITING for t in trials):
        return False
    return sum(PICK_ATTR in t.user_attrs for t in trials) < picks


def queue_pick(study: optuna.Study, space: Sequence[Param], capacity: Capacity, seed: int | None,
               n: int = START_CANDIDATES, picks: int = START_PICKS) -> dict[str, object] | None:
    """Queue the pick of `n` fresh random configurations as the next trial; None (nothing queued) when the
    estimator refuses every one, or when the pick is not due. `seed` with the count of trials so far draws them."""
    if not due(study, picks):
        return None
    drawn = candidates(space, None if seed is None else seed * 10_007 + len(study.trials), n)
    best = best_of(drawn, capacity)
    if best is None:
        return None
    params, runs = best
    study.enqueue_trial(params, user_attrs={PICK_ATTR: {"runs_at_once": runs, "of": n}})
    return params
