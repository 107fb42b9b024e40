"""How many trials each search method needs on a real, recorded response surface (replayed, no engine).

The surface (benchmarks/data/surface-tiny-cpu.json, recorded by benchmarks/record_surface.py) holds, for a
grid of max_num_seqs x max_num_batched_tokens of the tiny dense model on the vLLM CPU build, what each
configuration did at each rung of a load ladder, with every request's timings. Replaying it, a trial's outcome
is looked up instead of measured, with the constraint semantics of autotune/outcome.py, so methods compare over
many seeds in minutes (most of it the GP sampler's model fits; the other methods take seconds):

    .venv/bin/python -m benchmarks.search_efficiency [--seeds 50] [--tuning] [--limit ttft_p95_ms=150]

Reported per method: the median number of booted trials (and engine minutes) until a configuration within 5% of
the surface's best feasible throughput has been measured, the share of that effort spent on infeasible
configurations, pruned trials, and how close the best of the first 10 trials came. `--limit` judges the recorded
rungs again under a tighter limit (from the requests' own timings), which gives a surface on which vLLM's
defaults are far from the best. Replay rules: a sampled value is snapped to the nearest recorded grid value (in
log2; ties go up); a trial's value is its highest passing ladder rung (the real search would bisect towards the
next one: its time is counted, its finer value is not recorded); a configuration vLLM rejects is refused before
boot (free, not a trial) except by the grid, which, like vLLM's auto_tune script, boots everything in order.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna.trial import TrialState

from autotune.measure.client import LevelRun, LoadLevel, RequestRecord
from autotune.measure.ladder import percentile_interval
from autotune.measure.stats import Limits, judge, level_stats
from autotune.search import tell as search_tell
from autotune.search.samplers import sampler_for

REPO = Path(__file__).resolve().parents[1]

SURFACE = REPO / "benchmarks" / "data" / "surface-tiny-cpu.json"
WITHIN = 0.05
AT_N = 10
BISECTION_LEVELS = 2
MAX_BOOTED = 64


# --- the surface ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rung:
    concurrency: int
    passed: bool
    output_tok_s: float
    misses: dict[str, float]
    duration_s: float


@dataclass(frozen=True)
class Point:
    """One configuration as recorded: rejected by vLLM, failed to boot, or measured rung by rung."""

    max_num_seqs: int
    max_num_batched_tokens: int
    status: str  # "measured" | "boot_failed" | "died"
    precheck: str | None  # why autotune refuses it before boot (vLLM would), else None
    rungs: tuple[Rung, ...]
    boot_s: float
    wall_s: float

    @property
    def value(self) -> float:
        """Throughput of the highest passing rung (rungs stop at the first miss); 0 when none passed."""
        passing = [r.output_tok_s for r in self.rungs if r.passed]
        return passing[-1] if passing and self.status == "measured" else 0.0

    @property
    def feasible(self) -> bool:
        return self.precheck is None and self.value > 0

    def schedule(self) -> list[tuple[float, float]]:
        """(value reported to the pruner, engine seconds) per load level the real search would measure: the
        recorded rungs, then, when a rung failed after one passed, the 2 bisection levels autotune's SLA search
        adds between them (factor 2, tolerance 0.25; not recorded: each costs the mean of the two rungs, and
        reports the best passing figure so far). Each rung also carries its share of the recorded wall time
        that was neither boot nor measurement (warm-ups, stop)."""
        if not self.rungs:
            return []
        overhead = max(0.0, self.wall_s - self.boot_s - sum(r.duration_s for r in self.rungs)) / len(self.rungs)
        out, best = [], 0.0
        for r in self.rungs:
            best = r.output_tok_s if r.passed else best
            out.append((best, r.duration_s + overhead))
        last = self.rungs[-1]
        if not last.passed and len(self.rungs) > 1:
            between = (self.rungs[-2].duration_s + last.duration_s) / 2 + overhead
            out += [(best, between)] * BISECTION_LEVELS
        return out

    def cost_s(self, levels: int | None = None) -> float:
        """Engine seconds to boot it and measure its first `levels` load levels (all by default)."""
        if not self.rungs:
            return self.wall_s
        return self.boot_s + sum(c for _, c in self.schedule()[:levels])


@dataclass(frozen=True)
class Surface:
    points: dict[tuple[int, int], Point]
    provenance: dict[str, object] = field(hash=False)

    @property
    def seqs_axis(self) -> list[int]:
        return sorted({s for s, _ in self.points})

    @property
    def tokens_axis(self) -> list[int]:
        return sorted({b for _, b in self.points})

    @property
    def best(self) -> float:
        return max(p.value for p in self.points.values() if p.feasible)

    def snap(self, seqs: float, tokens: float) -> Point:
        return self.points[(_nearest(self.seqs_axis, seqs), _nearest(self.tokens_axis, tokens))]

    def baselines(self) -> list[dict[str, int]]:
        """studies/tiny-cpu.toml's baselines on this grid: vLLM's CPU defaults (128 seqs, 2048 tokens) and the
        recipe (16 seqs, 1024 tokens), snapped."""
        return [{"max_num_seqs": _nearest(self.seqs_axis, s), "max_num_batched_tokens": _nearest(self.tokens_axis, b)}
                for s, b in ((128, 2048), (16, 1024))]


def _nearest(axis: list[int], v: float) -> int:
    return min(axis, key=lambda a: (abs(math.log2(a) - math.log2(v)), -a))


def _records(level: dict) -> list[RequestRecord]:
    """A recorded rung's requests as the client saw them (record_surface.compact: times from the rung's start)."""
    return [RequestRecord(r[0], r[1], [], r[2], 0, r[3], r[4]) for r in level["records"]]


def rejudge(level: dict, limits: Limits) -> tuple[bool, dict[str, float]]:
    """A recorded rung's verdict under other limits, from its per-request records (metrics.judge, as the
    recording judged it)."""
    run = LevelRun(LoadLevel("concurrency", level["concurrency"]), _records(level), 0.0, level["duration_s"])
    verdict = judge(level_stats(run, limits), limits)
    return verdict.passed, verdict.misses


def _rungs(levels: list[dict], limits: Limits | None) -> tuple[Rung, ...]:
    """The recorded rungs, or under `limits` the rungs up to the first one they fail (where the ladder would have
    stopped)."""
    out = []
    for lv in levels:
        passed, misses = (lv["passed"], lv.get("misses", {})) if limits is None else rejudge(lv, limits)
        out.append(Rung(lv["concurrency"], passed, lv["output_tok_s"], misses, lv["duration_s"]))
        if not passed:
            break
    return tuple(out)


def load_surface(path: Path = SURFACE, limits: Limits | None = None) -> Surface:
    """The recorded surface; with `limits`, each rung judged again under them (tighter limits than the recording's
    only: a rung the recording failed was the last one measured)."""
    doc = json.loads(path.read_text())
    if limits is not None:
        recorded = doc["provenance"]["limits"]
        for key, value in dataclasses.asdict(limits).items():
            if value is not None and recorded.get(key) is not None and value > recorded[key]:
                raise ValueError(f"{key}: {value} is looser than the recorded {recorded[key]}")
    points = {}
    for c in doc["configs"]:
        rungs = _rungs(c.get("levels", []), limits)
        p = Point(c["max_num_seqs"], c["max_num_batched_tokens"], c["status"], c.get("precheck"), rungs,
                  c.get("boot_s", 0.0), c["wall_s"])
        points[(p.max_num_seqs, p.max_num_batched_tokens)] = p
    provenance = dict(doc.get("provenance", {}))
    if limits is not None:
        provenance["limits"] = {k: v for k, v in dataclasses.asdict(limits).items() if v is not None}
        provenance["rejudged"] = f"rungs judged again under these limits (recorded under {doc['provenance']['limits']})"
    return Surface(points, provenance)


# --- one replayed study -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One booted trial of a replayed run."""

    point: Point
    cost_s: float
    found: float  # the throughput the study learned for it (0: infeasible or pruned)
    pruned: bool


@dataclass(frozen=True)
class Method:
    name: str
    sampler: Callable[[int], optuna.samplers.BaseSampler]
    baselines: bool = True
    constraints: bool = True  # False: infeasible trials are FAIL (what a plain Optuna objective that raises does)
    pruner: Callable[[], optuna.pruners.BasePruner] | None = None


def tell(study: optuna.Study, trial: optuna.Trial, point: Point, method: Method, gain: float = 1.0) -> Step | None:
    """Replay one trial: the same outcomes outcome.py gives a real one. None when refused before boot.
    `gain` scales the throughputs the study sees (measurement noise; the Step keeps the recorded value)."""
    if point.precheck is not None:  # outcome.tell_rejected: COMPLETE, value 0, boots violated; no boot
        if method.constraints:
            search_tell.set_constraints(trial, boots=1.0)
            study.tell(trial, 0.0)
        else:
            study.tell(trial, state=TrialState.FAIL)
        return None
    if point.status != "measured" or not point.rungs:  # did not boot, or died: boots violated
        if method.constraints:
            search_tell.set_constraints(trial, boots=1.0)
            study.tell(trial, 0.0)
        else:
            study.tell(trial, state=TrialState.FAIL)
        return Step(point, point.cost_s(), 0.0, False)
    plan = point.schedule()
    for k, (best, _) in enumerate(plan):
        trial.report(best * gain, k)  # as study._one_trial does: the best passing throughput so far, per level
        if k < len(plan) - 1 and method.pruner is not None and trial.should_prune():
            if method.constraints:
                search_tell.set_constraints(trial, latency=0.0 if best > 0 else 1.0)
            study.tell(trial, state=TrialState.PRUNED)
            return Step(point, point.cost_s(k + 1), 0.0, True)
    if point.value > 0:
        if method.constraints:
            search_tell.set_constraints(trial)
        study.tell(trial, point.value * gain)
        return Step(point, point.cost_s(), point.value * gain, False)
    first = point.rungs[0]
    if method.constraints:  # no rung passed: latency violated by the worst miss at the lowest rung
        search_tell.set_constraints(trial, latency=max(max(first.misses.values(), default=2.0) - 1.0, 1e-3))
        study.tell(trial, 0.0)
    else:
        study.tell(trial, state=TrialState.FAIL)
    return Step(point, point.cost_s(), 0.0, False)


def replay(surface: Surface, method: Method, seed: int, target: float, max_booted: int = MAX_BOOTED,
           noise: Callable[[], float] = lambda: 1.0, min_booted: int = 0) -> list[Step]:
    """Booted trials of one study, until one has measured at least `target` and `min_booted` have run, or
    `max_booted` have run. Each trial's throughputs are scaled by a fresh `noise()` (1: as recorded)."""
    study = optuna.create_study(direction="maximize", sampler=method.sampler(seed),
                                pruner=method.pruner() if method.pruner else optuna.pruners.NopPruner())
    if method.baselines:
        for params in surface.baselines():
            study.enqueue_trial(params)
    seqs, tokens = surface.seqs_axis, surface.tokens_axis
    steps: list[Step] = []
    reached = False
    for _ in range(20 * max_booted):  # proposals; refusals before boot cost nothing but are bounded
        trial = study.ask()
        s = trial.suggest_int("max_num_seqs", seqs[0], seqs[-1], log=True)
        b = trial.suggest_int("max_num_batched_tokens", tokens[0], tokens[-1], log=True)
        step = tell(study, trial, surface.snap(s, b), method, noise())
        if step is not None:
            steps.append(step)
            reached = reached or step.found >= target
            if (reached and len(steps) >= min_booted) or len(steps) >= max_booted:
                break
    return steps


def grid(surface: Surface, order: list[tuple[int, int]], target: float) -> list[Step]:
    """vLLM's auto_tune: every configuration booted in turn (no pre-boot check), until the target is met."""
    steps = []
    for key in order:
        p = surface.points[key]
        steps.append(Step(p, p.cost_s(), p.value if p.precheck is None else 0.0, False))
        if steps[-1].found >= target:
            break
    return steps


# --- figures -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Figures:
    trials: float  # booted trials until the target was met (inf: not within MAX_BOOTED)
    minutes: float  # engine minutes until then
    infeasible_share: float  # of those minutes, spent on configurations that met no limit or did not boot
    pruned: int
    lost_best: bool  # a configuration within WITHIN of the best was pruned
    at_n: float = math.nan  # best recorded throughput measured within AT_N booted trials / the surface's best
    minutes_n: float = math.nan  # engine minutes of the first AT_N booted trials


def figures(steps: list[Step], target: float, best: float = math.inf) -> Figures:
    """Counted up to the first trial that met the target (all steps when none did); `at_n` over the first
    AT_N steps: the recorded throughput of the best configuration measured (not pruned) by then / `best`."""
    hit = next((i + 1 for i, s in enumerate(steps) if s.found >= target), None)
    upto = steps[:hit] if hit else steps
    minutes = sum(s.cost_s for s in upto) / 60
    waste = sum(s.cost_s for s in upto if not s.point.feasible) / 60
    at_n = max((s.point.value for s in steps[:AT_N] if s.found > 0), default=0.0) / best
    return Figures(hit or math.inf, minutes if hit else math.inf, waste / minutes if minutes else 0.0,
                   sum(s.pruned for s in upto), any(s.pruned and s.point.value >= target for s in steps), at_n,
                   sum(s.cost_s for s in steps[:AT_N]) / 60)


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


def _fmt(x: float, digits: int = 1) -> str:
    return f">{MAX_BOOTED}" if math.isinf(x) else f"{x:.{digits}f}"


def evaluate(surface: Surface, methods: list[Method], seeds: int) -> dict[str, list[Figures]]:
    target = (1 - WITHIN) * surface.best
    out: dict[str, list[Figures]] = {}
    for m in methods:
        t0 = time.perf_counter()
        out[m.name] = [figures(replay(surface, m, seed, target, min_booted=AT_N), target, surface.best)
                       for seed in range(seeds)]
        print(f"  {m.name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    keys = sorted(surface.points)  # max_num_seqs outer, max_num_batched_tokens inner, ascending
    out["grid (vLLM auto_tune order)"] = [figures(grid(surface, keys, math.inf)[:MAX_BOOTED], target, surface.best)]
    shuffled = []
    for seed in range(seeds):
        order = keys[:]
        random.Random(seed).shuffle(order)
        shuffled.append(figures(grid(surface, order, math.inf), target, surface.best))
    out["grid, shuffled"] = shuffled
    return out


def table(results: dict[str, list[Figures]], reference: str) -> str:
    ref = _median([f.trials for f in results[reference]])
    head = (f"{'method':<52}{'runs':>5}{'trials':>8}{'x default':>10}{'minutes':>9}{'infeasible':>11}"
            f"{'pruned':>8}{'lost best':>10}{'@' + str(AT_N) + ' trials':>11}{'min/' + str(AT_N):>8}")
    lines = [head, "-" * len(head)]
    for name, figs in results.items():
        trials = _median([f.trials for f in figs])
        lines.append(
            f"{name:<52}{len(figs):>5}{_fmt(trials):>8}{_fmt(trials / ref, 2):>10}"
            f"{_fmt(_median([f.minutes for f in figs])):>9}{_median([f.infeasible_share for f in figs]):>10.0%}"
            f"{_median([f.pruned for f in figs]):>8.1f}{sum(f.lost_best for f in figs) / len(figs):>10.0%}"
            f"{statistics.fmean(f.at_n for f in figs):>11.1%}{_median([f.minutes_n for f in figs]):>8.1f}")
    return "\n".join(lines)


def default_methods() -> list[Method]:
    tpe = lambda seed: sampler_for("tpe", seed)  # noqa: E731
    old = lambda seed: sampler_for("tpe", seed, startup_trials=5)  # noqa: E731
    old_pruner = lambda: optuna.pruners.PercentilePruner(25.0, n_startup_trials=5, n_warmup_steps=1)  # noqa: E731
    return [
        # No pruner: autotune screens a sampled configuration at the incumbent's level instead, which this replay
        # of recorded ladders from concurrency 1 cannot play back.
        Method("autotune default (TPE+constraints, baselines)", tpe),
        Method("autotune default without the baselines", tpe, baselines=False),
        Method("before: TPE startup 5, Percentile(25), no baselines", old, baselines=False, pruner=old_pruner),
        Method("random search", lambda seed: sampler_for("random", seed), baselines=False),
        Method("TPE without constraints (infeasible = FAIL)", tpe, baselines=False, constraints=False),
        Method("GP with constraints (startup 5), no baselines", lambda seed: sampler_for("gp", seed),
               baselines=False),
    ]


def tuning_methods() -> list[Method]:
    """The settings the defaults were chosen among, all without baselines (with them, every method meets the
    target at the first trial on this surface and nothing can be told apart)."""
    P = optuna.pruners.PercentilePruner
    out = [Method(f"TPE startup {n}",  # the outer lambda binds n: each method keeps its own
                  (lambda n: lambda seed: sampler_for("tpe", seed, startup_trials=n))(n),  # noqa: B023
                  baselines=False) for n in (2, 3, 5, 10)]
    tpe = lambda seed: sampler_for("tpe", seed)  # noqa: E731
    for label, pruner in [
        ("Percentile(25) = keep top quarter, warmup 1", lambda: P(25.0, n_startup_trials=5, n_warmup_steps=1)),
        ("Percentile(75) = prune bottom quarter, warmup 1", lambda: P(75.0, n_startup_trials=5, n_warmup_steps=1)),
        ("Percentile(75), warmup 2", lambda: P(75.0, n_startup_trials=5, n_warmup_steps=2)),
        ("Median, warmup 1", lambda: optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=1)),
        ("Median, warmup 2", lambda: optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=2)),
    ]:
        out.append(Method(f"TPE + {label}", tpe, baselines=False, pruner=pruner))
    return out


def describe(surface: Surface) -> str:
    prov = surface.provenance
    feasible = [p for p in surface.points.values() if p.feasible]
    rejected = [p for p in surface.points.values() if p.precheck is not None]
    target = (1 - WITHIN) * surface.best
    near = [p for p in feasible if p.value >= target]
    best = max(feasible, key=lambda p: p.value)
    rows = [f"surface: {len(surface.points)} configurations, {len(feasible)} feasible, {len(rejected)} rejected by "
            f"vLLM, {len(surface.points) - len(feasible) - len(rejected)} meeting no limit; best "
            f"{best.value:,.0f} output tok/s (max_num_seqs={best.max_num_seqs}, "
            f"max_num_batched_tokens={best.max_num_batched_tokens}); {len(near)} within {WITHIN:.0%} of it",
            f"recorded {prov.get('started')} .. {prov.get('finished')} with {prov.get('vllm')} "
            f"(torch {prov.get('torch')}) on {prov.get('machine')}",
            f"workload {prov.get('workload')}, limits {prov.get('limits')}, ladder {prov.get('ladder')}",
            "throughput (output tok/s) per configuration; '-' met no limit, 'x' rejected by vLLM:"]
    rows.append("  seqs\\tokens " + "".join(f"{b:>8}" for b in surface.tokens_axis))
    for s in surface.seqs_axis:
        cells = []
        for b in surface.tokens_axis:
            p = surface.points[(s, b)]
            cells.append("x" if p.precheck else "-" if not p.feasible else f"{p.value:,.0f}")
        rows.append(f"  {s:>11} " + "".join(f"{c:>8}" for c in cells))
    return "\n".join(rows)


def measurement(doc: dict) -> str:
    """What the stopping rule says about the recorded rungs (each measured with a fixed count): how many were
    judged on a p95 whose 90% interval still straddled the limit, i.e. whose verdict a fixed count left to luck."""
    limits = Limits(**doc["provenance"]["limits"])
    rows = {"pass": [0, 0], "fail": [0, 0]}
    for c in doc["configs"]:
        for lv in c.get("levels", []):
            ok = [r for r in _records(lv) if r.error is None and r.ttft is not None]
            undecided = False
            for key, values in (("ttft_p95_ms", [r.ttft for r in ok]),
                                ("tpot_p95_ms", [(r.end - r.start - r.ttft) / (r.output_tokens - 1)
                                                 for r in ok if r.output_tokens > 1])):
                limit = getattr(limits, key)
                lo, hi = percentile_interval(values, 0.95, 0.90)
                undecided = undecided or (limit is not None and lo * 1000 <= limit < hi * 1000)
            row = rows["pass" if lv["passed"] else "fail"]
            row[0] += 1
            row[1] += undecided
    return "\n".join(f"  {k}ed rungs: {n}, of which {u} ({u / max(n, 1):.0%}) had the limit inside the p95's 90% "
                     f"interval" for k, (n, u) in rows.items())


def spread(doc: dict) -> tuple[str, float]:
    """The repeated measurements of the top configurations: each one's figures, and the pooled relative
    standard deviation (a configuration's figure / the mean of its figures)."""
    def value(c: dict) -> float:
        passing = [lv["output_tok_s"] for lv in c.get("levels", []) if lv["passed"]]
        return passing[-1] if passing and c["status"] == "measured" else 0.0

    groups: dict[tuple[int, int], list[float]] = {}
    for c in doc["configs"] + doc.get("repeats", []):
        groups.setdefault((c["max_num_seqs"], c["max_num_batched_tokens"]), []).append(value(c))
    rows, rel = [], []
    for key, vals in groups.items():
        if len(vals) > 1:
            mean = statistics.fmean(vals)
            rel += [v / mean - 1 for v in vals]
            rows.append(f"  max_num_seqs={key[0]}, max_num_batched_tokens={key[1]}: "
                        + ", ".join(f"{v:,.0f}" for v in vals) + " output tok/s")
    sd = statistics.pstdev(rel) if rel else 0.0
    return "\n".join(rows), sd


def remeasure_gain(surface: Surface, sd: float, seeds: int, trials: int = 20, top: int = 3,
                   rounds: int = 1) -> str:
    """With each measurement off by a factor 1 + N(0, sd): how good is the configuration chosen on single figures,
    and the one chosen on re-measured medians (top `top`, `rounds` more each), by its recorded throughput?"""
    single, again, over, over_again = [], [], [], []
    for seed in range(seeds):
        rng = random.Random(1000 + seed)
        noise = lambda: max(0.0, 1 + rng.gauss(0, sd))  # noqa: E731, B023 (used within this iteration only)
        steps = replay(surface, default_methods()[0], seed, math.inf, trials, noise)
        measured = [s for s in steps if s.found > 0]
        if not measured:
            continue
        pick = max(measured, key=lambda s: s.found)
        single.append(pick.point.value / surface.best)
        over.append(pick.found / pick.point.value - 1)
        seen: dict[tuple[int, int], Step] = {}
        for s in sorted(measured, key=lambda s: s.found, reverse=True):
            seen.setdefault((s.point.max_num_seqs, s.point.max_num_batched_tokens), s)
        finalists = list(seen.values())[:top]
        medians = [statistics.median(s.point.value * noise() for _ in range(rounds)) for s in finalists]
        winner = finalists[medians.index(max(medians))]
        again.append(winner.point.value / surface.best)
        over_again.append(max(medians) / winner.point.value - 1)
    return (f"  noise sd {sd:.1%} per measurement, {trials} trials, {seeds} seeds: the winner on single figures "
            f"reaches {statistics.median(single):.1%} of the best (mean {statistics.fmean(single):.1%}) and its "
            f"figure overstates it by {statistics.median(over):+.1%} (median); re-measuring the top {top} "
            f"{rounds} time(s) and choosing on the medians reaches {statistics.median(again):.1%} "
            f"(mean {statistics.fmean(again):.1%}), its re-measured figure off by {statistics.median(over_again):+.1%} "
            f"(median)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--surface", type=Path, default=SURFACE)
    ap.add_argument("--tuning", action="store_true", help="Also compare the settings the defaults came from.")
    ap.add_argument("--measurement", action="store_true", help="Also judge the recorded rungs' fixed counts.")
    ap.add_argument("--limit", action="append", default=[], metavar="KEY=MS",
                    help="Judge the recorded rungs again under a tighter p95 limit, e.g. --limit ttft_p95_ms=150 "
                         "(a surface on which vLLM's defaults are not near the best).")
    opts = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore")
    doc = json.loads(opts.surface.read_text())
    limits = None
    if opts.limit:
        given = dict(doc["provenance"]["limits"])
        for item in opts.limit:
            key, _, ms = item.partition("=")
            if key not in given or not ms.replace(".", "", 1).isdigit():
                ap.error(f"--limit {item}: expected KEY=MS with KEY one of {', '.join(given)}")
            given[key] = float(ms)
        try:
            limits = Limits(**given)
            surface = load_surface(opts.surface, limits)
        except ValueError as e:
            ap.error(f"--limit: {e}")
    else:
        surface = load_surface(opts.surface)
    print(describe(surface))
    results = evaluate(surface, default_methods(), opts.seeds)
    print(f"\nmedian over seeds of: booted trials (and engine minutes) until a configuration within {WITHIN:.0%} of "
          f"the best was measured; share of those minutes on infeasible configurations; pruned trials; share of "
          f"runs in which a configuration within {WITHIN:.0%} of the best was pruned")
    print(table(results, next(iter(results))))
    med = {name: _median([f.trials for f in figs]) for name, figs in results.items()}
    rnd, grd = med["random search"], med["grid (vLLM auto_tune order)"]
    for name in list(results)[:2]:
        print(f"{name}: random search needs {rnd / med[name]:.1f}x its trials (target >= 2), the grid in vLLM's "
              f"order {grd / med[name]:.1f}x (target >= 5)")
    if opts.measurement and limits is None:
        print("\nrecorded rungs (fixed count, max(32, 3 x concurrency) requests):")
        print(measurement(doc))
    if doc.get("repeats") and limits is None:
        rows, sd = spread(doc)
        print("\nthe same configurations measured again (a figure's spread):")
        print(rows)
        for rounds in (1, 2):
            print(remeasure_gain(surface, sd, opts.seeds, rounds=rounds))
    if opts.tuning:
        print()
        print(table(evaluate(surface, tuning_methods(), opts.seeds), "TPE startup 5"))


if __name__ == "__main__":
    main()
