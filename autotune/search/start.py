"""The start of a search: of a few random configurations, the one that runs the most requests at once.

TPE's first trials are random (samplers.TPE_STARTUP_TRIALS): it has nothing to model yet. But where memory decides
what a configuration can serve (a 27B hybrid model in 24 GB), the estimator knows before any boot how many requests
each configuration runs at once (ladder.capacity: max_num_seqs, the KV tokens per request, and what the KV cache
holds, estimate.max_running_seqs), and throughput under a latency limit comes from requests running at once: on the
device's surface (benchmarks/data/surface-rtx3090.json, 22 configurations) the level each configuration sustained was
within one step of that count on the ladder (which doubles), and ordered by it the configurations autotune boots there
ran 612, 516, 671, 539, 677, 470, 442, 535, 471, 135 output tok/s and, tied, 128, 144 and one that did not boot (the
third, fourth and fifth are the picks below, recorded after they were chosen). So each of the first
START_PICKS sampled trials is, of START_CANDIDATES random configurations the estimator does not refuse, the one that
runs the most (the first drawn on a tie); the rest of the start stays random, which is what TPE learns from. The
estimator judges a configuration in about 0.2 ms, so drawing many costs nothing (a pick of 64 takes about 30 ms).

Chosen by benchmarks/search_efficiency.py --tuning (50 seeds; median booted trials to within 5% of the best, without
baselines / with them) on the first 19 configurations. GPU surface, chat limits: no picks 9.0 / 15.5; 3 of 16: 6.0 /
5.5; 3 of 64: 3.0 / 4.5; 3 of 256: 2.0 / 3.0; 10 of 64: 3.0 / 4.5; random search 16.5, vLLM's auto_tune grid 15. At a 1
s TTFT 3 of 16: 5.5 / 5.5; 3 of 64: 3.0 / 4.0. CPU surface at its 500 ms TTFT: 3 of 16: 2.0 / 1.0; 3 of 64: 3.0 / 1.0.
At 150 ms, where capacity is not what wins on two cores (the best there is a noise peak): 3 of 16: 16.0 / 16.0; 3 of 64:
14.5 / 20.0; random search 17.0 / 19.0. 64 met the GPU goal there (a fifth of the grid's trials) and keeps the picks
random: the estimator accepts a third of the 3090 space on the capped H200 and half on the 3090's own profile, so each
pick is the most of some 20-30. More would take the estimator's argmax, which 19 recorded configurations cannot tell
apart from luck; the plan's #42-44 (what these picks boot first for seeds 0-2) test it. Recorded after (stop 26), they
served 677 (the new best), 539 and 671 tok/s where the replay had mapped them to 516 and 471; on the 22 points the
default needs 3.0 / 4.0, random search 13.5, the grid 11 (3.7x: its order reaches the new best sooner than #9).
Held down to a 3090's total through Marlin (stop 38) the same three served 602, 793 (that file's best) and 701; on its
33 points (stop 39) the default needs 7.0 / 6.5 under the chat limits, random search 37.5, the grid 24, and 3 picks of
64 were the best start-up compared or within half a trial of it (benchmarks/data/search-efficiency-rtx3090-marlin.txt).
Measured again on one machine, #43 served 718 and the recipe 648 (that machine a tenth slower for both); on those
figures the default needs 3.0 / 4.0, random search 15.5, the grid 22. On its 43 points (s41) it needs 16.0 under the
chat limits (random search 63.5, the grid 32) and 2.0 under a 1 s TTFT; there 10 picks of 64 need 9.0 under the chat
limits, as many as 3 on the H200 surface, and more on the CPU surface at 150 ms (18.0 against 14.5): not yet changed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import optuna
from optuna.trial import TrialState

from autotune.config.params import Param
from autotune.search.space import suggest

START_PICKS = 3
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
