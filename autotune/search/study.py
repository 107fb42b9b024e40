"""The study: opened or resumed (storage, sampler, baselines), its inputs checked before anything is written, and
the budget loop that runs trials on each slot until the budget is spent (one trial: search/one_trial.py).

Trials are asked for and told one at a time (ask/tell), so a trial's outcome is recorded the moment it ends:
a kill of the tuner loses at most the trial in flight, and the next run of the same command resumes the study.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import shlex
import threading
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config.study_file import StudySpec
from autotune.engine.flags import Build, detect_build
from autotune.engine.server import reap_leftover_servers
from autotune.errors import SpecError
from autotune.fit import feasibility
from autotune.fit.hardware import card_mismatch
from autotune.measure.plan import TrialPlan, configured, plan_trial
from autotune.search import paired, remeasure, soak_winner
from autotune.search.budget import Budget, record_spent
from autotune.search.one_trial import PREDICTED_NOT_TO_FIT, NoProgress, Progress, StudyRun, one_trial
from autotune.search.record import BASELINE_ATTR, searched_trial
from autotune.search.remeasure import best_trial
from autotune.search.samplers import make_sampler
from autotune.search.slots import Slot, present_gpus
from autotune.search.space import enqueue_baseline
from autotune.search.sqlite_file import held
from autotune.search.storage import (
    default_storage,
    open_artifact_store,
    open_storage,
    resume,
    retry_trial,
    shown_url,
    sqlite_path,
    store_files,
)
from autotune.search.threads import ctrl_c_stops, until_done
from autotune.units import format_gib

MAX_REJECTED_IN_A_ROW = 200


@dataclass(frozen=True)
class RunSummary:
    """What one `run_study` did, counted as it did it, and the study's winner afterwards."""

    booted: int  # trials of the search that booted a server
    # refused before boot (vLLM would reject the flags, predicted not to fit, or screened out before boot: it cannot
    # sustain the incumbent's level, measure/queueing.py): cost nothing
    refused: int
    remeasured: int  # re-measurements that booted
    stopped_because: str  # why the run ended ("" when the search and the re-measuring ran their course)
    best: remeasure.Best | None
    export_command: str = ""  # what gives the winner's flags, for a person to run next
    comparison: paired.Comparison | None = None  # the winner against the best baseline (paired.answer)
    figure: str = ""  # the measurement the winner's figure is (remeasure.figure_line)
    # a budget too short for the final pairs (paired.too_short_line), this machine's spread, and whether it kept
    # the answer open (paired.noise_lines)
    noise: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        """The summary a person reads at the end of the run (without the best configuration's command)."""
        out = [f"this run: {self.booted} booted, {self.refused} refused before boot, {self.remeasured} re-measured; "
               f"stopped: {self.stopped_because or 'done'}"]
        out.append(f"best: {self.best.text}" if self.best is not None else "no feasible configuration yet")
        if self.figure:
            out.append(self.figure)
        if self.comparison is not None:
            out.append(f"answer: {self.comparison.sentence}")
        out += self.noise
        if self.best is not None and self.export_command:
            out.append(f"export it: {self.export_command}")
        return out


def export_command(spec: StudySpec, storage_url: str | None) -> str:
    """`autotune export` for this study as it was run: its file (which names it), and the storage if not the
    default one beside the file, its password masked (this line is printed and logged)."""
    return shlex.join(["autotune", "export", "--study", str(spec.path),
                       *(["--storage", shown_url(storage_url)] if storage_url else []), "--format", "flags"])


def open_study(spec: StudySpec, storage_url: str | None = None,
               say: Callable[[str], None] = lambda text: None) -> optuna.Study:
    """Create the study, or resume it. A resumed study must search the same space for the same objective as when
    it began (else its trials would be mixed with others measured differently: refused, nothing written); new
    baselines are queued and said; the stored study file (what `autotune worker` rebuilds from) follows the file."""
    url = storage_url or spec.storage or default_storage(spec)
    storage = open_storage(url)
    with held(sqlite_path(url)):  # runs started at once: the first sets the study up, the others find it so
        return _set_up(spec, storage, say)


def _set_up(spec: StudySpec, storage: optuna.storages.BaseStorage, say: Callable[[str], None]) -> optuna.Study:
    study = optuna.create_study(study_name=spec.name, storage=storage, direction="maximize",
                                sampler=make_sampler(spec),
                                # Screening at the incumbent's level (ladder.Prior) is what stops a worse trial.
                                pruner=optuna.pruners.NopPruner(), load_if_exists=True)
    files = {"study": spec.path.read_text(), "objective": spec.objective.path.read_text(),
             "objective_ref": tomllib.loads(spec.path.read_text())["objective"],
             "limits": json.dumps(spec.objective.limits.set(), sort_keys=True)}  # the objective's, or --goodput's
    if not study.trials:
        study.set_metric_names([spec.objective.maximize])
        study.set_user_attr("objective", spec.objective.name)
        study.set_user_attr("limits", spec.objective.limits.set())
        study.set_user_attr("hardware", spec.hardware)
        study.set_user_attr("study_file", str(spec.path))
        store_files(study, files)  # so that `autotune worker` on another host needs only the storage URL
    else:
        resume(spec, study, files, say)
    optuna.storages.fail_stale_trials(study)
    _queue_unmeasured_baselines(study, spec)  # a new study's baselines too: none is measured yet
    _queue_unmeasured_searched(study, say)
    return study


def fetch_checkpoints(spec: StudySpec, say: Callable[[str], object]) -> None:
    """Every hub checkpoint the study boots, on disk before the first boot (engine/weights.py says why)."""
    from autotune.config.study_file import study_model_keys
    from autotune.engine.weights import fetch_named

    flags = spec.fixed_flags()
    for key, model in study_model_keys(spec):
        fetch_named(model, flags, say, str(spec.path), key)


def check_inputs(spec: StudySpec, slots: tuple[Slot, ...] = (Slot(),)) -> None:
    """What a study file cannot show by itself, checked before anything is written (no database, no trial):
    that the GPU it names is the one here, the flags the installed vLLM knows and the values they take, and that
    every model named can be resolved (a hub id: from the cache, or the hub in one quick request)."""
    from autotune.config import study_file
    from autotune.engine import flag_checks
    from autotune.errors import ModelUnavailable

    cpu_build, gpus = detect_build() is Build.CPU, present_gpus(slots)
    if why := card_mismatch(spec.hardware, gpus, cpu_build, spec.memory_cap is not None):
        raise SpecError(str(spec.path), "hardware", why)
    if cpu_build and (key := spec.objective.energy_key):
        raise SpecError(str(spec.objective.path), key,
                        "energy is measured with NVML on a CUDA GPU; on the CPU build it is not measured")
    if spec.memory_cap is not None:
        try:
            feasibility.planned_profiles(spec.hardware, spec.memory_cap, cpu_build, gpus)  # the card present
        except SpecError as e:
            raise SpecError(str(spec.path), "memory_cap_gib", e.message) from None
    flag_checks.check(study_file.study_flag_names(spec))
    flag_checks.check_values(study_file.study_flag_values(spec))
    for key, model in study_file.study_model_keys(spec):
        if model.startswith("tiny:") or Path(model).is_dir():
            continue
        try:
            feasibility.model_shape(model)
        except ModelUnavailable as e:
            raise SpecError(str(spec.path), key, f"cannot resolve {model!r}: {e}") from None


def _queue_unmeasured_baselines(study: optuna.Study, spec: StudySpec) -> None:
    """Queue every baseline that has no measured trial (COMPLETE or PRUNED) and none queued or running: one
    interrupted, killed or otherwise failed through no fault of its own is measured when the study resumes."""
    settled = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.WAITING, TrialState.RUNNING)
    # One refused before boot on a memory estimate is not settled: calibration may have moved since, and it is judged
    # again under today's corrections.
    have = {(t.user_attrs.get(BASELINE_ATTR) or {}).get("name")
            for t in study.get_trials(deepcopy=False, states=settled)
            if not str(t.user_attrs.get("reason", "")).startswith(PREDICTED_NOT_TO_FIT)}
    for baseline in spec.baselines:
        if baseline.name not in have:
            enqueue_baseline(study, baseline, spec.space)


def _queue_unmeasured_searched(study: optuna.Study, say: Callable[[str], object]) -> None:
    """Queue once more, as it was, each sampled trial that ended FAIL and was not retried: FAIL says nothing about
    a configuration (Ctrl-C, the budget's end, a busy GPU, the machine failing: search/tell.py), and TPE learns
    nothing from it: without this a configuration interrupted by Ctrl-C would be lost, where one whose tuner
    was killed (-9) is retried (storage.retry_stale_trial). Its user attrs are not copied: they tell how it ended."""
    trials = study.get_trials(deepcopy=False)
    retried = {t.system_attrs.get("failed_trial") for t in trials}
    queued = [t.number for t in trials
              if t.state is TrialState.FAIL and t.params and searched_trial(t) and t.number not in retried
              and retry_trial(study, t, {})]
    if queued:
        say(f"{len(queued)} trial(s) that ended without a measurement queued again, as they were: "
            + ", ".join(f"#{n}" for n in queued))


def run_study(
    spec: StudySpec,
    budget: Budget,
    *,
    storage_url: str | None = None,
    progress: Progress | None = None,
    artifacts_dir: Path | None = None,
    slots: tuple[Slot, ...] = (Slot(),),
    say: Callable[[str], object] = lambda line: None,
) -> RunSummary:
    """Run trials until the budget is spent, one at a time on each slot (a thread per slot)."""
    study = open_study(spec, storage_url)
    reap_leftover_servers()
    reserved = remeasure.reserve(budget, spec.remeasure)  # spent at the end
    _count_past_trials(study, budget, spec)
    run = _start_run(spec, study, budget, progress or NoProgress(),
                     artifacts_dir or spec.path.parent / f"{spec.name}-artifacts", slots, say)
    with ctrl_c_stops(run.halt) as interrupted:
        again = remeasure.search_and_remeasure(functools.partial(_search, run, slots),
                                               functools.partial(_remeasure, run, slots[0]), reserved, run.stop)
    why = "interrupted" if interrupted.is_set() else again.stopped_because
    record_spent(study, budget)  # what the report's first panel says the rest of the budget would add
    best = best_trial(study)
    figure = remeasure.figure_line(best, study.get_trials(deepcopy=False)) if best is not None else ""
    said = paired.answer(study)
    short = paired.too_short_line(budget, said)
    return RunSummary(run.booted, run.refused + len(again.done) - again.booted, again.booted, why,
                      best, export_command(spec, storage_url), said, figure,
                      (*([short] if short else []), *paired.noise_lines(study)))


def compare_study(spec: StudySpec, budget: Budget, *, storage_url: str | None = None,
                  progress: Progress | None = None, say: Callable[[str], object] = lambda line: None
                  ) -> paired.PairsRun:
    """`autotune compare`: the final paired comparison (paired.measure_pairs) of a study that has run, on fresh
    boots, until the difference is resolved, MAX_PAIRS were measured or the budget has no room for a pair."""
    study = open_study(spec, storage_url)
    if any(t.state == TrialState.WAITING for t in study.get_trials(deepcopy=False)):
        raise SpecError(str(spec.path), None, "the study has queued trials (a baseline not measured yet, or one "
                        "to retry): finish them with `autotune run` before comparing")
    reap_leftover_servers()
    for t in study.trials:
        if "duration_s" in t.user_attrs and t.state.is_finished():
            budget.record(t.user_attrs["duration_s"], searched=searched_trial(t))
    slot = Slot()
    run = _start_run(spec, study, budget, progress or NoProgress(), spec.path.parent / f"{spec.name}-artifacts",
                     (slot,), say)
    ran: list[paired.PairsRun] = []

    def target() -> None:
        try:
            pairs = paired.measure_pairs(study, budget, functools.partial(one_trial, run, slot), run.stop)
            ran.append(dataclasses.replace(pairs, comparison=_soak(run, slot)))
        except BaseException as e:
            run.errors.append(e)

    with ctrl_c_stops(run.halt):
        until_done([("compare", target)])
    run.raise_first_error()
    return ran[0] if ran else paired.PairsRun(paired.answer(study))


def _soak(run: StudyRun, slot: Slot) -> paired.Comparison | None:
    """The proven winner's soak (soak_winner.soak), booted as the study boots its trials."""
    spec = run.spec

    def plan_for(t: FrozenTrial) -> TrialPlan:
        log_path = run.artifacts_dir / f"soak-trial-{t.number:04d}.log"
        model, flags = configured(str(t.user_attrs["model"]), json.loads(t.user_attrs["flags"]))
        return plan_trial(model, flags, spec.objective, log_path, env=spec.env, boot_timeout_s=spec.boot_timeout_s,
                          gpu_indices=slot.gpu_indices, memory_cap=spec.memory_cap, real_gpu=run.real_profile)

    return soak_winner.soak(run.study, run.budget, spec.soak_s, plan_for, spec.objective.load.mode, run.stop,
                            run.say)


def _count_past_trials(study: optuna.Study, budget: Budget, spec: StudySpec) -> None:
    """What the study's earlier runs took tells the budget what a trial costs; the re-measurements it will owe
    are held back from the search."""
    for t in study.trials:
        if "duration_s" in t.user_attrs and t.state.is_finished():
            budget.record(t.user_attrs["duration_s"], searched=searched_trial(t))
    _hold(budget, study, spec)


def _hold(budget: Budget, study: optuna.Study, spec: StudySpec) -> None:
    """Size what the search leaves for the end of the run: the re-measurement due next and the final pairs."""
    remeasure.hold(budget, study.get_trials(deepcopy=False), spec.remeasure)
    if spec.remeasure > 0:
        paired.hold_pairs(budget, study, spec.soak_s)


def _start_run(spec: StudySpec, study: optuna.Study, budget: Budget, progress: Progress, artifacts_dir: Path,
               slots: tuple[Slot, ...], say: Callable[[str], object]) -> StudyRun:
    """The run's shared state, with the card planned as it is before any server of this run."""
    gpus = present_gpus(slots)
    profile, real_profile = feasibility.planned_profiles(spec.hardware, spec.memory_cap,
                                                         detect_build() is Build.CPU, gpus)
    if profile.held_bytes:
        say(f"{profile.label} when the study began: trials are planned on the "
            f"{format_gib(profile.usable_bytes, 2)} they leave")
    return StudyRun(spec, study, budget, progress, artifacts_dir, profile, real_profile,
                    open_artifact_store(artifacts_dir), threading.Event(),
                    used_at_start={g.index: g.used_bytes for g in gpus}, say=say)


def _search(run: StudyRun, slots: tuple[Slot, ...]) -> remeasure.Searched:
    """Every slot searches in its own thread until no trial fits; how many booted, and why the first stopped."""
    before = run.booted
    run.reasons.clear()
    until_done([(f"slot-{slot.name}", functools.partial(_slot_worker, run, slot)) for slot in slots])
    run.raise_first_error()
    return remeasure.Searched(run.booted - before, run.reasons[0] if run.reasons else "")


def _slot_worker(run: StudyRun, slot: Slot) -> None:
    try:
        _search_on(run, slot)
    except BaseException as e:  # the machine, the setup or a bug, not a configuration: stop every slot cleanly
        run.errors.append(e)
        run.halt(f"stopped when slot {slot.name} failed: {e}")


def _search_on(run: StudyRun, slot: Slot) -> None:
    """One slot's trials, one after another, while the budget gives it one."""
    rejected_in_a_row = 0
    while not run.stop.is_set():
        fits, why = run.budget.claim()
        if not fits:
            run.reasons.append(why)
            return
        result = one_trial(run, slot)
        if result is None:  # rejected before boot: costs nothing, so it does not count against --n-trials
            with run.asking:  # slots count from their own threads; += on a shared counter is not atomic
                run.refused += 1
            run.budget.release()
            rejected_in_a_row += 1
            if rejected_in_a_row >= MAX_REJECTED_IN_A_ROW:
                run.reasons.append(f"{MAX_REJECTED_IN_A_ROW} configurations in a row rejected before boot")
                return
            continue
        rejected_in_a_row = 0
        with run.asking:
            run.booted += 1
        run.budget.record(result.duration_s, searched=result.searched)
        _hold(run.budget, run.study, run.spec)


def _remeasure(run: StudyRun, slot: Slot, reserved: remeasure.Reserve) -> remeasure.RemeasureRun:
    """Spend the reserve on the first slot, in a thread of its own (so Ctrl-C reaches the main thread)."""
    ran: list[remeasure.RemeasureRun] = []

    def target() -> None:
        try:
            ran.append(_remeasure_and_compare(run, slot, reserved))
        except BaseException as e:
            run.errors.append(e)

    until_done([("remeasure", target)])
    run.raise_first_error()
    return ran[0]


def _remeasure_and_compare(run: StudyRun, slot: Slot, reserved: remeasure.Reserve) -> remeasure.RemeasureRun:
    """Re-measure the top configurations; the winner settled, what is left of the reserve boots it against the
    best baseline in pairs."""
    one = functools.partial(one_trial, run, slot)
    again = remeasure.remeasure_top(run.study, run.budget, reserved, stop=run.stop, run_one=one)
    if reserved.top <= 0:
        return again
    pairs = paired.measure_pairs(run.study, run.budget, one, run.stop)
    _soak(run, slot)
    return remeasure.RemeasureRun(again.done + pairs.done, again.booted + pairs.booted,
                                  pairs.stopped_because or again.stopped_because)


