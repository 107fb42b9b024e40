"""How many booted trials each search method needs on a recorded response surface, replayed (no engine), and what
each of autotune's parts buys:

    python -m benchmarks.search_efficiency --surface PATH [--seeds 50] [--limit p95_ttft_ms=1000] [--noise]

benchmarks/replay.py replays one study (the rules are there: a sampled configuration judged before boot on its own
flags by the product's functions, measured as the nearest recorded configuration judged alike, the answer
re-measured as search/remeasure.py does); benchmarks/replay_rows.py names the rows, from plain random search to the
default, and the grids. Per row, under the recorded limits and each `--limit` (the rungs judged again from the
requests' own timings; tighter only): the median and mean booted trials until the run's answer is within 5% of the
surface's best, the share of runs that never get there, the share there within 10 boots, and engine minutes; then
what each part buys (the decomposition), and the same on the surface without the configurations the plan took from
the default's own first proposals (its start picks), where a plan says which those are. `--noise`: the
repeats' spread and the headline on surfaces redrawn with it; `--tuning`: the settings the defaults came from.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import optuna

from autotune.measure.stats import Limits, read_limits
from autotune.measure.stop_rule import percentile_interval
from benchmarks.record_surface import params_key, plan_indices
from benchmarks.replay import REPO, Refusal, judged_alike, recorded_again, refusal_now
from benchmarks.replay_figures import LEGEND, WITHIN, Figures, fmt, mean, median, table
from benchmarks.replay_noise import label_params, redraws, rung_spread, spread
from benchmarks.replay_rows import DECOMPOSITION, DEFAULT, SCREENS, TPE, evaluate, methods
from benchmarks.replay_settings import tuning_methods
from benchmarks.surface import Point, Surface, level_records, load_surface, measurements

SURFACE = REPO / "benchmarks" / "data" / "cpu-tiny-grid/surface.json"
REDRAWS = 20  # surfaces redrawn with the repeats' spread (--noise)


def left_one_out(surface: Surface, refusal: Refusal | None = None) -> tuple[int, float]:
    """Each recorded configuration predicted by the map from the others: how many get feasibility right, and the
    mean |throughput error| as a share of the best. `refusal`: the nearest that autotune judges alike (the
    replay's map); None: the nearest of all."""
    right, errors = 0, []
    for p in surface.points:
        def among(q: Point, p: Point = p) -> bool:
            return q is not p and (refusal is None or judged_alike(refusal, refusal(p.params), q))
        q = surface.nearest(p.params, among)
        right += q.feasible == p.feasible
        errors.append(abs(q.value - p.value) / surface.best)
    return right, statistics.fmean(errors)


def surrogate_fit(surface: Surface, refusal: Refusal | None) -> str:
    """How well the replay's map predicts a recorded configuration from the others (left_one_out), beside the
    plain nearest one."""
    rows = [("the nearest recorded configuration", left_one_out(surface))]
    if refusal is not None:
        rows.append(("the nearest that autotune judges alike (the replay's map)", left_one_out(surface, refusal)))
    n = len(surface.points)
    return "the replay's map, left one out: " + "; ".join(
        f"{name}: feasibility right for {right} of {n}, mean |throughput error| {err:.0%} of the best"
        for name, (right, err) in rows)


def ceiling(points: int, feasible: int, near: int) -> str:
    """What knowing feasibility alone is worth on a surface: drawing configurations without repeats, the first of
    `near` good ones among n comes on average at draw (n + 1) / (near + 1). A method that knows which are feasible
    (and nothing of their throughput) draws among `feasible`; random search among all `points`."""
    oracle, blind = (feasible + 1) / (near + 1), (points + 1) / (near + 1)
    return (f"knowing which configurations are feasible and nothing more, a method needs {oracle:.1f} configurations "
            f"on average (random order among the {feasible} feasible), random search {blind:.1f} (among all "
            f"{points}): {blind / oracle:.2f}x on 'points'; more needs a prediction of throughput")


def describe(surface: Surface) -> str:
    prov = surface.provenance
    feasible = [p for p in surface.points if p.feasible]
    refused = [p for p in surface.points if p.refused is not None]
    target = (1 - WITHIN) * surface.best
    near = [p for p in feasible if p.value >= target]
    best = max(feasible, key=lambda p: p.value)
    rows = [f"surface: {len(surface.points)} configurations, {len(feasible)} feasible, {len(refused)} refused before "
            f"boot by autotune ({sum(p.feasible for p in refused)} of them feasible), "
            f"{len(surface.points) - len(feasible)} meeting no limit or not booting; best {best.value:,.0f} output "
            f"tok/s ({label_params(best.params)}); {len(near)} within {WITHIN:.0%} of it",
            "baselines: " + "; ".join(f"{p.baseline} {p.value / surface.best:.0%} of the best" for p in
                                        surface.baselines),
            f"recorded {prov.get('started')} .. {prov.get('finished')} with {prov.get('vllm')} on "
            f"{prov.get('device') or prov.get('machine')}",
            f"workload {prov.get('workload')}, limits {prov.get('limits')}, ladder {prov.get('ladder')}",
            ceiling(len(surface.points), len(feasible), len(near))]
    names = [p.name for p in surface.space]
    if names == ["max_num_seqs", "max_num_batched_tokens"]:  # a grid: print it
        seqs = sorted({int(p.params["max_num_seqs"]) for p in surface.points})  # type: ignore[call-overload]
        tokens = sorted({int(p.params["max_num_batched_tokens"]) for p in surface.points})  # type: ignore[call-overload]
        at = {(p.params["max_num_seqs"], p.params["max_num_batched_tokens"]): p for p in surface.points}
        rows.append("throughput (output tok/s) per configuration; '-' met no limit, 'x' refused before boot:")
        rows.append("  seqs\\tokens " + "".join(f"{b:>8}" for b in tokens))
        for s in seqs:
            cells = ["x" if at[s, b].refused else "-" if not at[s, b].feasible else f"{at[s, b].value:,.0f}"
                     for b in tokens]
            rows.append(f"  {s:>11} " + "".join(f"{c:>8}" for c in cells))
    return "\n".join(rows)


def measurement(doc: dict) -> str:
    """What the stopping rule says about the recorded rungs (each measured with a fixed count): how many were
    judged on a p95 whose 90% interval still straddled the limit, i.e. whose verdict a fixed count left to luck."""
    limits = read_limits(doc["provenance"]["limits"])
    rows = {"pass": [0, 0], "fail": [0, 0]}
    for c in doc["configs"]:
        for lv in c.get("levels", []):
            ok = [r for r in level_records(lv) if r.error is None and r.ttft is not None]
            undecided = False
            for key, values in (("p95_ttft_ms", [r.ttft for r in ok]),
                                ("p95_tpot_ms", [(r.end - r.start - r.ttft) / (r.output_tokens - 1)
                                                 for r in ok if r.output_tokens > 1])):
                limit = getattr(limits, key)
                lo, hi = percentile_interval(values, 0.95, 0.90)
                undecided = undecided or (limit is not None and lo * 1000 <= limit < hi * 1000)
            row = rows["pass" if lv["passed"] else "fail"]
            row[0] += 1
            row[1] += undecided
    return "\n".join(f"  {k}ed rungs: {n}, of which {u} ({u / max(n, 1):.0%}) had the limit inside the p95's 90% "
                     f"interval" for k, (n, u) in rows.items())


def label(surface: Surface, point: Point) -> str:
    """How the datasets' READMEs and the recorder name a configuration: its index in the plan a GPU surface was recorded
    from (the recorder takes them out of order, e.g. the start picks #42-#44 before #24), else its place in the
    surface file."""
    plan = surface.provenance.get("plan")
    if isinstance(plan, str) and (REPO / plan).is_file():
        if (i := plan_indices(plan).get(params_key(point.params))) is not None:
            return f"#{i}"
    return f"#{surface.points.index(point)}"


def without_picks(surface: Surface) -> Surface | None:
    """The surface without the configurations its plan took from the default's own first proposals (origin
    "pick": search/start.py's first pick of a few seeds); None where the plan took none, or keeps no plan."""
    plan = surface.provenance.get("plan")
    if not (isinstance(plan, str) and (REPO / plan).is_file()):
        return None
    picks = {params_key(c["params"]) for c in json.loads((REPO / plan).read_text())["configs"]
             if c.get("origin") == "pick"}
    kept = tuple(p for p in surface.points if params_key(p.params) not in picks)
    return replace(surface, points=kept) if len(kept) < len(surface.points) else None


def decomposition(results: dict[str, list[Figures]]) -> str:
    """What each part buys: each row of DECOMPOSITION against the one before it, in median and mean booted trials
    (a run that never got there counted at the cap), and its share of the whole gain in the mean from plain random
    search to the default (the median of a row whose runs mostly never get there is no number); TPE, after the
    default, is what the model-based sampler adds to it."""
    meds = [median(results[name]) for name in DECOMPOSITION]
    means = [mean(results[name]) for name in DECOMPOSITION]
    whole = means[0] - means[DECOMPOSITION.index(DEFAULT)]
    rows = [f"  {DECOMPOSITION[0]}: median {fmt(meds[0])}, mean {means[0]:.1f}"]
    for k, name in enumerate(DECOMPOSITION[1:], start=1):
        part = "TPE in place of random sampling" if name == TPE else name.split(" + ")[-1].replace(" (the default)", "")
        share = f", {(means[k - 1] - means[k]) / whole:.0%} of the whole gain" if whole > 0 else ""
        rows.append(f"  + {part}: median {fmt(meds[k])}, mean {means[k]:.1f} ({means[k] - means[k - 1]:+.1f}"
                    f"{share})")
    d, c = results[DEFAULT], results[SCREENS]
    rows.append(f"  the default against {SCREENS}: median {fmt(median(d))} vs {fmt(median(c))}, mean "
                f"{mean(d):.1f} vs {mean(c):.1f} (goal: at most half of both)")
    return "\n".join(rows)


def replayed(surface: Surface, seeds: int, path: Path, limits: Limits | None) -> str:
    """One surface's table and decomposition."""
    again = recorded_again(measurements(path, limits))
    results = evaluate(surface, methods(), seeds, again)
    return "\n".join([f"over {seeds} seeds:", LEGEND, table(results), "what each part buys:", decomposition(results)])


def parse_limits(items: list[str], recorded: dict[str, float]) -> list[Limits]:
    """Each --limit KEY=MS[,KEY=MS]: the recorded limits with those tightened. A bad item raises ValueError."""
    out = []
    recorded = read_limits(recorded).set()
    for item in items:
        given = dict(recorded)
        for part in item.split(","):
            key, _, ms = part.partition("=")
            if key not in recorded or not ms.replace(".", "", 1).isdigit():
                raise ValueError(f"--limit {item}: expected KEY=MS with KEY one of {', '.join(recorded)}")
            given[key] = float(ms)
        out.append(read_limits(given))
    return out


def commit() -> str:
    """The code's commit, as the data file's first line names it (a change not committed is marked)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False).stdout.strip()
    changed = git("status", "--porcelain", "--", "autotune", "benchmarks/*.py")
    return git("rev-parse", "--short", "HEAD") + (" with changes not committed" if changed else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--surface", type=Path, default=SURFACE)
    ap.add_argument("--tuning", action="store_true", help="Also compare the settings the defaults came from.")
    ap.add_argument("--noise", action="store_true", help="Also the repeats' spread and the headline redrawn with it.")
    ap.add_argument("--measurement", action="store_true", help="Also judge the recorded rungs' fixed counts.")
    ap.add_argument("--limit", action="append", default=[], metavar="KEY=MS[,KEY=MS]",
                    help="Also replay with the recorded rungs judged again under tighter p95 limits, e.g. "
                         "--limit p95_ttft_ms=1000 (repeatable: one more table each).")
    opts = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore")
    print(f"# python -m benchmarks.search_efficiency {shlex.join(sys.argv[1:])} with the code at {commit()}")
    try:
        doc = json.loads(opts.surface.read_text())
        limits: list[Limits | None] = [None, *parse_limits(opts.limit, doc["provenance"]["limits"])]
        surfaces = [load_surface(opts.surface, lim) for lim in limits]
    except (OSError, ValueError, KeyError, TypeError) as e:
        ap.error(f"--surface {opts.surface}: {e}" if not isinstance(e, ValueError) or "--limit" not in str(e)
                 else str(e))
    for surface, lim in zip(surfaces, limits, strict=True):
        print(describe(surface))
        print(surrogate_fit(surface, refusal_now(surface)))
        print(replayed(surface, opts.seeds, opts.surface, lim))
        if (rest := without_picks(surface)) is not None:
            print(f"\nwithout the {len(surface.points) - len(rest.points)} configurations the plan took from the "
                  f"default's own first proposals (best {rest.best:,.0f} output tok/s):")
            print(replayed(rest, opts.seeds, opts.surface, lim))
        print()
    if opts.measurement:
        print("recorded rungs (fixed count per level):")
        print(measurement(doc))
    if opts.noise and doc.get("repeats"):
        rows, sd = spread(doc)
        print("\nthe same configurations measured again (a figure's spread):")
        print(rows)
        for surface, lim in zip(surfaces, limits, strict=True):
            at_rung = rung_spread(doc, lim)
            print(f"under {surface.provenance.get('limits')}: sd {at_rung:.1%} at the rung each sustains "
                  f"({sd:.1%} at the highest passing level)")
            print(redraws(surface, at_rung, REDRAWS, opts.seeds, recorded_again(measurements(opts.surface, lim))))
    for surface, lim in zip(surfaces, limits, strict=True) if opts.tuning else ():
        print(f"\nthe settings compared, under {surface.provenance.get('limits')}:")
        again = recorded_again(measurements(opts.surface, lim))
        print(table(evaluate(surface, tuning_methods(), opts.seeds, again, with_grids=False)))


if __name__ == "__main__":
    main()
