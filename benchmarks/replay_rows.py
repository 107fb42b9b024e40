"""The comparator rows of the search replay, each named for what it has, and their runs over many seeds.

From plain random search, each row adds one of autotune's parts: the estimator's refusals before boot, the screens
(before boot, and at the incumbent's level after it), the start picks (search/start.py): the default; then TPE in
place of random sampling (the default until this replay: autotune/search/samplers.py). The grids boot the recorded
configurations in a fixed order, with or without the estimator's refusals. No row queues the study's baselines: the
rows compare searches, not the baselines."""

from __future__ import annotations

import functools
import random
import sys
import time
from collections.abc import Callable

import optuna

from autotune.search import start
from autotune.search.samplers import sampler_for
from benchmarks.replay import Again, Judges, Method, grid, judges, run, search
from benchmarks.replay_figures import WITHIN, Figures, figures
from benchmarks.surface import Point, Surface

RANDOM = "random search"
ESTIMATOR = "random search + estimator"
SCREENS = "random search + estimator + screens"
DEFAULT = "random search + estimator + screens + start picks (the default)"
TPE = "TPE + estimator + screens + start picks"
TPE_NO_PICKS = "TPE + estimator + screens, no start picks"
DECOMPOSITION = (RANDOM, ESTIMATOR, SCREENS, DEFAULT, TPE)  # each adds one part to the one before
GRID = "grid, vLLM auto_tune order (ascending)"


def _sampler(name: str) -> Callable[[int], optuna.samplers.BaseSampler]:
    return lambda seed: sampler_for(name, seed)


def methods() -> list[Method]:
    rnd, tpe, picks = _sampler("random"), _sampler("tpe"), start.START_PICKS
    return [
        Method(RANDOM, rnd, baselines=False, constraints=False, estimator=False, screen=False),
        Method(ESTIMATOR, rnd, baselines=False, screen=False),
        Method(SCREENS, rnd, baselines=False),
        Method(DEFAULT, rnd, baselines=False, start_picks=picks),
        Method(TPE, tpe, baselines=False, start_picks=picks),
        Method(TPE_NO_PICKS, tpe, baselines=False),
    ]


def grids(surface: Surface, seeds: int) -> dict[str, list[list[Point]]]:
    """Each grid row's orders: vLLM's auto_tune order, its reverse, and one shuffle per seed."""
    ascending = surface.auto_tune_order()
    shuffles = []
    for seed in range(seeds):
        order = list(ascending)
        random.Random(seed).shuffle(order)
        shuffles.append(order)
    return {GRID: [ascending], "grid, descending": [ascending[::-1]], "grid, shuffled": shuffles}


def _refused(judge: Judges, point: Point) -> bool:
    return judge.refusal(point.params) if judge.refusal is not None else point.refused is not None


def evaluate(surface: Surface, rows: list[Method], seeds: int, again: Again | None,
             with_grids: bool = True) -> dict[str, list[Figures]]:
    """Each row's runs over `seeds` seeds (a grid: over its orders), with and without the estimator for the
    grids. `again`: the answer re-measured as autotune does (replay.answer); None: the first within the target."""
    target = (1 - WITHIN) * surface.best
    judge = judges(surface)
    out: dict[str, list[Figures]] = {}
    for m in rows:
        t0 = time.perf_counter()
        used = judge if m.estimator else Judges()
        out[m.name] = [figures(run(search(surface, m, seed, used), target, again), target) for seed in range(seeds)]
        print(f"  {m.name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    if not with_grids:
        return out
    refused = functools.partial(_refused, judge)
    for name, orders in grids(surface, seeds).items():
        out[name] = [figures(run(grid(o), target, again), target) for o in orders]
        out[name + " + estimator"] = [figures(run(grid(o, refused), target, again), target) for o in orders]
    return out
