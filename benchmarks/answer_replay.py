"""The answer on a recorded GPU surface, over many seeds: is what autotune exports within 5% of the best
configuration, or the best baseline, and never worse than that baseline by more than the interval it printed?

    .venv/bin/python -m benchmarks.answer_replay [--seeds 50] [--out DIR]

Each seed replays one study of BUDGET_S on the surface (benchmarks/data/h100-as-rtx3090-awq-marlin, the chat
limits), each boot costing its recorded engine time, with the surface's own spread of one measurement at a fixed rung
(replay_noise.rung_spread, sd):

1. the search: autotune's default method as the replay runs it (benchmarks/replay.py search: TPE, the start picks,
   refusals and screens before boot, screening at the incumbent's level), with the baselines queued first, on the
   surface as this seed's first measurements give it (each configuration's throughputs x one draw of 1 + N(0, sd):
   replay_noise.redrawn), until the search's share of the budget is spent (the budget less RESERVE_SHARE, kept for
   the end);
2. the end of the run, by the product's own code on a study holding those trials as a run records them (each
   configuration's params, its length, its figure within the limits, the baselines marked): remeasure.remeasure_top
   (booting again where a measurement can change the winner) and paired.measure_pairs (the final paired
   comparison of the winner against the best baseline, A B B A, until its 90% interval is resolved, MAX_PAIRS, or
   the budget's end), each boot the recorded throughput x a fresh draw of 1 + N(0, sd);
3. what is exported: show/export.exported's choice (the winner where the pairs showed it better, else the best
   baseline).

Counted per seed, by the exported configuration's recorded (noise-free) throughput: within 5% of the surface's best,
or the best baseline itself (the target: in at least 95% of seeds); worse than the best baseline by more than the
low end of the printed interval (the target: never); and whether the printed interval holds the true gain.
Not modelled: whether a level passes is as recorded (only throughput is redrawn, as search_efficiency's redraws).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import optuna
from optuna.trial import TrialState

from autotune.search import paired, remeasure, tell
from autotune.search.budget import Budget
from autotune.search.record import BASELINE_ATTR
from autotune.show.export import exported
from benchmarks.replay import Judges, Method, Step, judges, search
from benchmarks.replay_noise import redrawn, rung_spread
from benchmarks.replay_rows import DEFAULT, methods
from benchmarks.search_efficiency import label
from benchmarks.surface import Point, Surface, load_surface

REPO = Path(__file__).resolve().parents[1]


SURFACE = REPO / "benchmarks" / "data" / "h100-as-rtx3090-awq-marlin" / "surface.json"


DATASET = REPO / "benchmarks" / "data" / "answer-replay-h100-as-rtx3090-awq-marlin"


BUDGET_S = 4 * 3600  # the reference user's overnight-or-less study (the README's `--budget 4h`)


RESERVE_SHARE = 0.25  # of the budget kept from the search for re-measuring and the pairs (Budget.held's most)


WITHIN = 0.05


SEARCH_S = (1 - RESERVE_SHARE) * BUDGET_S




POINT_ATTR = "surface_point"  # a trial's configuration: its index on the surface


@dataclass(frozen=True)
class Outcome:
    """One seed's study as it ended: the winner, the answer and what was exported, by surface index."""

    seed: int
    booted: int  # the search's booted trials
    winner: int
    exported: int
    proven: bool
    pairs: int
    interval: tuple[float, float, float] | None  # mid, low, high
    sentence: str


class Run:
    """One seed's study: its trials as a run records them, booted by `boot` (a fresh draw of the noise each)."""

    def __init__(self, surface: Surface, limits: dict, draw: Callable[[], float]):
        self.surface, self.draw = surface, draw
        self.clock = 0.0
        self.study = optuna.create_study(direction="maximize")
        self.study.set_user_attr("limits", limits)

    def now(self) -> float:
        return self.clock

    def record(self, point: Point, found: float, cost_s: float, pruned: bool = False) -> None:
        """The queued trial (or a new one of `point`) told as search/tell.py tells a real one."""
        if not self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            attrs = {BASELINE_ATTR: {"name": point.baseline, "flags": {}}} if point.baseline else {}
            self.study.enqueue_trial({POINT_ATTR: self.surface.points.index(point)}, user_attrs=attrs)
        trial = self.study.ask()
        trial.suggest_categorical(POINT_ATTR, list(range(len(self.surface.points))))
        trial.set_user_attr("duration_s", cost_s)
        self.clock += cost_s
        if pruned:
            tell.set_constraints(trial)
            self.study.tell(trial, state=TrialState.PRUNED)
        elif found > 0:
            tell.set_constraints(trial)
            self.study.tell(trial, found)
        else:
            tell.set_constraints(trial, latency=1.0)
            self.study.tell(trial, 0.0)

    def boot_again(self) -> object:
        """run_one for remeasure_top and measure_pairs: the queued re-measurement, measured with a fresh draw."""
        waiting = self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))[0]
        point = self.surface.points[int(waiting.system_attrs["fixed_params"][POINT_ATTR])]
        cost = point.cost_s()
        self.record(point, point.value * self.draw(), cost)
        return _Booted(cost)


@dataclass(frozen=True)
class _Booted:
    duration_s: float


def default_method() -> Method:
    """autotune's default search as the replay rows run it, with the baselines queued first as a real run does."""
    return replace(next(m for m in methods() if m.name == DEFAULT), baselines=True)


def searched(surface: Surface, seed: int, sd: float, judge: Judges) -> list[tuple[int, Step]]:
    """The search's booted trials (surface index, step) within its share of the budget, on the surface as this
    seed's first measurements give it: each configuration's throughputs scaled by one draw (replay_noise.redrawn),
    so that the search, the screens and the incumbent follow noisy figures as a real study's do."""
    drawn = redrawn(surface, sd, random.Random(seed))
    index = {id(p): i for i, p in enumerate(drawn.points)}
    refused = frozenset(id(d) for d, p in zip(drawn.points, surface.points, strict=True)
                        if id(p) in judge.refused_recorded)
    spent, fit = 0.0, []
    for step in search(drawn, default_method(), seed, replace(judge, refused_recorded=refused)):
        if spent + step.cost_s > SEARCH_S:
            return fit
        spent += step.cost_s
        fit.append((index[id(step.point)], step))
    return fit


def one_study(surface: Surface, sd: float, seed: int, judge: Judges) -> Outcome:
    """Search, re-measure, compare in pairs and export, as the module docstring says, for one seed."""
    rng = random.Random(10_000 + seed)  # the end of the run's draws

    def draw() -> float:
        return max(0.01, 1 + rng.gauss(0, sd))

    run = Run(surface, surface.provenance["limits"], draw)  # type: ignore[arg-type]
    steps = searched(surface, seed, sd, judge)
    for i, s in steps:
        run.record(surface.points[i], s.found, s.cost_s, s.pruned)
    budget = Budget(seconds=BUDGET_S, clock=run.now)
    budget.start = 0.0
    remeasure.remeasure_top(run.study, budget, remeasure.Reserve(top=3), run.boot_again)
    said = paired.measure_pairs(run.study, budget, run.boot_again).comparison
    winner = remeasure.best(run.study.get_trials(deepcopy=False))
    assert winner is not None and said is not None, "the baselines are searched first: the recipe measures"
    chosen, _ = exported(run.study, winner, said, lambda t: True, unproven=False)
    i = said.interval
    return Outcome(seed, len(steps), _index(winner.trial), _index(chosen.trial), said.proven, len(said.pairs),
                   (i.mid, i.low, i.high) if i is not None else None, said.sentence)


def _index(t: optuna.trial.FrozenTrial) -> int:
    return int(t.params[POINT_ATTR])


def best_baseline(surface: Surface) -> Point:
    return max((p for p in surface.baselines if p.feasible), key=lambda p: p.value)


def count(surface: Surface, outcomes: list[Outcome]) -> dict[str, object]:
    """The counts the issue asks for, from the exported configurations' recorded throughputs."""
    base = best_baseline(surface)
    rows = []
    for o in outcomes:
        value = surface.points[o.exported].value
        true_gain = value / base.value - 1
        low = o.interval[1] if o.interval is not None and o.exported != surface.points.index(base) else 0.0
        rows.append({"good": value >= (1 - WITHIN) * surface.best or surface.points[o.exported] is base,
                     "worse_than_interval": true_gain < min(0.0, low) - 1e-9,
                     "covered": o.interval is None or o.interval[1] <= _true_gain(surface, o, base) <= o.interval[2],
                     "true_gain": true_gain})
    n = len(outcomes)
    return {"seeds": n, "good": sum(r["good"] for r in rows), "worse_than_interval": sum(r["worse_than_interval"]
                                                                                          for r in rows),
            "covered": sum(r["covered"] for r in rows), "rows": rows}


def _true_gain(surface: Surface, o: Outcome, base: Point) -> float:
    """The recorded gain of the winner the pairs compared over the best baseline."""
    return surface.points[o.winner].value / base.value - 1


def name(surface: Surface, i: int) -> str:
    """A configuration as the datasets name it: the baseline's name, else its plan index (search_efficiency.label)."""
    return surface.points[i].baseline or label(surface, surface.points[i])


def report(surface: Surface, sd: float, outcomes: list[Outcome], counts: dict) -> str:
    base = best_baseline(surface)
    n = counts["seeds"]
    exported_as = statistics.multimode([o.exported for o in outcomes])
    lines = [
        f"surface: {SURFACE.relative_to(REPO)} under {surface.provenance.get('limits')}: best "
        f"{surface.best:,.0f} output tok/s; the best baseline, the {base.baseline}, {base.value:,.0f} "
        f"({base.value / surface.best:.1%} of the best)",
        f"noise: each measurement x (1 + N(0, {sd:.1%})), the surface's spread of one measurement at a fixed rung",
        f"each study: {BUDGET_S / 3600:g} h, the search until {1 - RESERVE_SHARE:.0%} of it, then remeasure_top "
        f"and paired.measure_pairs in the rest; export: show/export.exported",
        "",
        f"{'seed':>4} {'booted':>6} {'winner':>8} {'exported':>9} {'pairs':>5} {'gain (90% interval)':>24} "
        f"{'true gain':>9}  answer",
    ]
    for o in outcomes:
        gain = (f"{o.interval[0]:+.1%} ({o.interval[1]:+.1%}, {o.interval[2]:+.1%})" if o.interval is not None
                else "-")
        lines.append(f"{o.seed:>4} {o.booted:>6} {name(surface, o.winner):>8} {name(surface, o.exported):>9} "
                     f"{o.pairs:>5} {gain:>24} {_true_gain(surface, o, base):>+9.1%}  {o.sentence}")
    proven = sum(o.proven for o in outcomes)
    lines += [
        "",
        f"exported within {WITHIN:.0%} of the best or the best baseline: {counts['good']} of {n} seeds "
        f"({counts['good'] / n:.0%}; target >= 95%)",
        f"exported worse than the best baseline by more than its interval: {counts['worse_than_interval']} of {n} "
        f"(target: never)",
        f"the winner shown better than the {base.baseline} (exported): {proven} of {n}; the {base.baseline} exported: "
        f"{sum(o.exported == surface.points.index(base) for o in outcomes)}; most often exported: "
        + ", ".join(name(surface, i) for i in exported_as),
        f"the printed interval holds the winner's recorded gain over the {base.baseline}: {counts['covered']} of "
        f"{n} (a 90% interval)",
        f"pairs measured: median {statistics.median(o.pairs for o in outcomes):g} "
        f"({min(o.pairs for o in outcomes)}-{max(o.pairs for o in outcomes)})",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--out", type=Path, default=None, help=f"write the dataset there (default: print only; "
                                                          f"{DATASET.relative_to(REPO)} is the one kept)")
    opts = ap.parse_args(argv)
    if opts.seeds < 1:
        ap.error(f"--seeds must be at least 1, got {opts.seeds}")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore")
    surface = load_surface(SURFACE)
    sd = rung_spread(json.loads(SURFACE.read_text()))
    judge = judges(surface)
    outcomes = []
    for seed in range(opts.seeds):
        outcomes.append(one_study(surface, sd, seed, judge))
        print(f"  seed {seed}: {outcomes[-1].sentence}", file=sys.stderr, flush=True)
    counts = count(surface, outcomes)
    text = report(surface, sd, outcomes, counts)
    print(text)
    if opts.out is not None:
        write(opts.out, text, outcomes, opts.seeds)


def write(out: Path, text: str, outcomes: list[Outcome], seeds: int) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    out.mkdir(parents=True, exist_ok=True)
    shown = out.relative_to(REPO) if out.is_relative_to(REPO) else out
    head = (f"# python -m benchmarks.answer_replay --seeds {seeds} --out {shown} at {commit}, "
            f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC\n")
    (out / "answer-replay.txt").write_text(head + text + "\n")
    (out / "outcomes.json").write_text(json.dumps([o.__dict__ for o in outcomes], indent=1) + "\n")


if __name__ == "__main__":
    main()
