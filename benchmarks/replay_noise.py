"""A recorded figure's spread, and whether the replay's headline hangs on one measurement: the configurations the
surface measured again (its `repeats`), the pooled spread of one measurement, and the headline on surfaces redrawn
with that spread (search_efficiency --noise)."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import replace

from autotune.measure.stats import Limits
from benchmarks.replay import Again
from benchmarks.replay_figures import fmt, median
from benchmarks.replay_rows import DEFAULT, GRID, RANDOM, SCREENS, evaluate, methods
from benchmarks.surface import Point, Surface, config_key, entry_params, judged


def label_params(params: dict[str, object]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())


def spread(doc: dict) -> tuple[str, float]:
    """The repeated measurements of the top configurations: each one's figures, and the pooled relative
    standard deviation of one measurement (a configuration's figure / the mean of its figures, with one degree of
    freedom spent on each mean: two figures scatter about their own mean by 1/sqrt(2) of one measurement's sd)."""
    def value(c: dict) -> float:
        passing = [lv for lv in c.get("levels", []) if lv["passed"]]
        top = max(passing, key=lambda lv: lv["concurrency"]) if passing else None
        return top["output_tok_s"] if top and c["status"] == "measured" else 0.0

    groups = _measured_again(doc)
    rows = [f"  {key}: " + ", ".join(f"{value(c):,.0f}" for c in cs) + " output tok/s" for key, cs in groups.items()]
    return "\n".join(rows), _pooled_sd([[value(c) for c in cs] for cs in groups.values()])


def _measured_again(doc: dict) -> dict[str, list[dict]]:
    """Each configuration measured more than once: its records, the first recorded first, named as it was."""
    groups: dict[str, list[dict]] = {}
    labels = {config_key(c): label_params(entry_params(c)) for c in doc["configs"]}
    for c in doc["configs"] + doc.get("repeats", []):  # named as first recorded, whatever a repeat's key order
        groups.setdefault(labels[config_key(c)], []).append(c)
    return {key: cs for key, cs in groups.items() if len(cs) > 1}


def _pooled_sd(groups: list[list[float]]) -> float:
    """The pooled relative sd of one measurement, one degree of freedom spent on each group's mean."""
    groups = [g for g in groups if len(g) > 1 and statistics.fmean(g) > 0]
    rel = [v / statistics.fmean(g) - 1 for g in groups for v in g]
    return math.sqrt(sum(r * r for r in rel) / (len(rel) - len(groups))) if rel else 0.0


def rung_spread(doc: dict, limits: Limits | None = None) -> float:
    """The spread a redrawn surface scales (redrawn): each repeated configuration's throughput at one rung, the
    level its first record sustains under `limits` (as recorded: None), as each of its records measured that rung,
    passed or not. spread's figure at the highest passing level also counts a rung whose verdict flipped between
    records (h100-as-rtx3090-awq-marlin: #36 passed c=16 once in three, 717 tok/s against 542 and 545 at c=8), which the
    redraw keeps as recorded; so it would count a flip twice, and under a tighter limit it measures the wrong rung."""
    groups = []
    for cs in _measured_again(doc).values():
        first = [lv["concurrency"] for lv in cs[0].get("levels", []) if judged(lv, limits)[0]]
        if cs[0]["status"] != "measured" or not first:
            continue
        rung = max(first)
        groups.append([lv["output_tok_s"] for c in cs for lv in c.get("levels", []) if lv["concurrency"] == rung])
    return _pooled_sd(groups)


def redrawn(surface: Surface, sd: float, rng: random.Random) -> Surface:
    """The surface another recording might have given: each measured configuration's throughputs scaled by one
    factor 1 + N(0, sd) (a configuration is measured in one session, and a session's effect lands on all its
    rungs). Which rungs pass stays as recorded: only throughput is redrawn, the spread that was measured."""
    def scaled(p: Point) -> Point:
        f = max(0.0, 1 + rng.gauss(0, sd))
        return replace(p, rungs=tuple(replace(r, output_tok_s=r.output_tok_s * f) for r in p.rungs))
    return replace(surface, points=tuple(scaled(p) for p in surface.points))


def redraws(surface: Surface, sd: float, draws: int, seeds: int, again: Again | None) -> str:
    """The headline over `draws` redrawn surfaces: whether the default's lead over random search with the estimator
    and screens, and over the grid, holds whatever the measurement noise made of the recorded figures."""
    rows = [m for m in methods() if m.name in (DEFAULT, SCREENS, RANDOM)]
    per_draw: list[dict[str, float]] = []
    bests: dict[str, int] = {}
    for d in range(draws):
        s = redrawn(surface, sd, random.Random(2000 + d))
        res = evaluate(s, rows, seeds, again)
        per_draw.append({name: median(figs) for name, figs in res.items()})
        top = max(range(len(s.points)), key=lambda i: s.points[i].value)
        bests[f"#{top}"] = bests.get(f"#{top}", 0) + 1
    ours = [r[DEFAULT] for r in per_draw]
    halves = sum(2 * r[DEFAULT] <= r[SCREENS] for r in per_draw)
    return (f"  {draws} redrawn surfaces (each configuration's figures x 1 + N(0, {sd:.1%})), {seeds} seeds each, "
            f"median booted trials: the default {fmt(statistics.median(ours))} ({fmt(min(ours))}-{fmt(max(ours))}), "
            f"{SCREENS} {fmt(statistics.median(r[SCREENS] for r in per_draw))}, {RANDOM} "
            f"{fmt(statistics.median(r[RANDOM] for r in per_draw))}, the grid "
            f"{fmt(statistics.median(r[GRID] for r in per_draw))}; the default at most half of {SCREENS} in "
            f"{halves} of {draws}\n  the best was (place in the surface file) "
            + ", ".join(f"{b} in {n}" for b, n in sorted(bests.items())))
