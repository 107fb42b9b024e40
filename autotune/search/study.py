"""The study: storage, sampler, baselines and the budget loop that runs trials until the budget is spent.

Trials are asked for and told one at a time (ask/tell), so a trial's outcome is recorded the moment it ends:
a kill of the tuner loses at most the trial in flight, and the next run of the same command resumes the study.
"""

from __future__ import annotations

import contextlib
import functools
import json
import shlex
import signal
import threading
import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import optuna
from optuna.artifacts import FileSystemArtifactStore
from optuna.trial import TrialState

from autotune.config.study_file import StudySpec
from autotune.engine.flags import Build, detect_build, invalid_reason, value_text
from autotune.engine.server import reap_leftover_servers
from autotune.errors import EngineError, SpecError, StorageError
from autotune.fit import feasibility
from autotune.fit.estimate import Estimate
from autotune.fit.hardware import GpuInfo, GpuProfile, card_mismatch
from autotune.fit.memcap import MemoryCap
from autotune.measure.ladder import Prior, capacity
from autotune.measure.queueing import cannot_sustain, holds_too_few
from autotune.measure.trial import LevelOutcome, TrialResult, configured, plan_trial, run_trial, warm_kv_blocks
from autotune.search import paired, record, remeasure, start, tell
from autotune.search.budget import Budget
from autotune.search.record import (
    BASELINE_ATTR,
    CAP_ATTR,
    REMEASURE_ATTR,
    feasible,
    save_trial_note,
    searched_trial,
    trial_baseline,
    view,
)
from autotune.search.remeasure import best_trial
from autotune.search.samplers import make_sampler
from autotune.search.slots import Slot, present_gpus
from autotune.search.space import EngineConfig, engine_config, enqueue_baseline, suggest
from autotune.search.sqlite_file import held
from autotune.search.storage import (
    attach_log,
    default_storage,
    heartbeat,
    load_existing_study,
    open_artifact_store,
    open_storage,
    resume,
    retry_trial,
    shown_url,
    sqlite_path,
)
from autotune.units import GiB, MiB, format_gib

MAX_REJECTED_IN_A_ROW = 200


# More in use before a boot than this, and than what was in use when the run began (planned around) by more than
# HELD_MORE_BYTES, means something else holds the GPU (an idle card shows its driver's reserve, 0.4-0.6 GiB, as used).
HELD_GPU_BYTES = 1 * GiB
HELD_MORE_BYTES = 256 * MiB


class Progress(Protocol):
    """What the loop tells whoever shows progress (the CLI draws it with rich; tests record it)."""

    def trial_started(self, number: int, label: str, slot: str) -> None: ...
    def stage(self, number: int, text: str) -> None: ...
    def trial_ended(self, number: int, state: TrialState, summary: str, best: remeasure.Best | None) -> None: ...


class NoProgress:
    def trial_started(self, number: int, label: str, slot: str) -> None: ...
    def stage(self, number: int, text: str) -> None: ...
    def trial_ended(self, number: int, state: TrialState, summary: str, best: remeasure.Best | None) -> None: ...


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

    def lines(self) -> list[str]:
        """The summary a person reads at the end of the run (without the best configuration's command)."""
        out = [f"this run: {self.booted} booted, {self.refused} refused before boot, {self.remeasured} re-measured; "
               f"stopped: {self.stopped_because or 'done'}"]
        out.append(f"best: {self.best.text}" if self.best is not None else "no feasible configuration yet")
        if self.figure:
            out.append(self.figure)
        if self.comparison is not None:
            out.append(f"answer: {self.comparison.sentence}")
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
             "objective_ref": tomllib.loads(spec.path.read_text())["objective"]}
    if not study.trials:
        study.set_metric_names(["output_tok_s"])
        study.set_user_attr("objective", spec.objective.name)
        study.set_user_attr("limits", {k: v for k, v in vars(spec.objective.limits).items() if v is not None})
        study.set_user_attr("hardware", spec.hardware)
        study.set_user_attr("study_file", str(spec.path))
        study.set_user_attr("files", files)  # so that `autotune worker` on another host needs only the storage URL
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
    from autotune.engine import flags as engine_flags
    from autotune.errors import ModelUnavailable

    cpu_build, gpus = detect_build() is Build.CPU, present_gpus(slots)
    if why := card_mismatch(spec.hardware, gpus, cpu_build, spec.memory_cap is not None):
        raise SpecError(str(spec.path), "hardware", why)
    if cpu_build and spec.objective.limits.joules_per_token is not None:
        raise SpecError(str(spec.objective.path), "limits.joules_per_token",
                        "energy is measured with NVML on a CUDA GPU; on the CPU build it is not measured")
    if spec.memory_cap is not None:
        try:
            feasibility.planned_profiles(spec.hardware, spec.memory_cap, cpu_build, gpus)  # the card present
        except SpecError as e:
            raise SpecError(str(spec.path), "memory_cap_gib", e.message) from None
    engine_flags.check(study_file.study_flag_names(spec))
    engine_flags.check_values(study_file.study_flag_values(spec))
    for key, model in study_file.study_model_keys(spec):
        if model.startswith("tiny:") or Path(model).is_dir():
            continue
        try:
            feasibility.model_shape(model)
        except ModelUnavailable as e:
            raise SpecError(str(spec.path), key, f"cannot resolve {model!r}: {e}") from None


PREDICTED_NOT_TO_FIT = "predicted not to fit"  # the reason's head of a trial refused on the memory estimate


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


@dataclass
class _Run:
    """What every trial of one `run_study` shares."""

    spec: StudySpec
    study: optuna.Study
    budget: Budget
    progress: Progress
    artifacts_dir: Path
    profile: GpuProfile  # what the estimator plans with: the capped card under a memory cap
    real_profile: GpuProfile  # the card present, for which the flags are translated
    store: FileSystemArtifactStore  # server logs, shown by optuna-dashboard
    stop: threading.Event  # set by halt: every slot ends its trial and takes no other
    # SQLite ignores SELECT ... FOR UPDATE, so two slots asking at once could both pop the same enqueued trial.
    asking: threading.Lock = field(default_factory=threading.Lock)
    # NVML's used bytes per GPU before the run's first server: not ours to wait for (taken_since_start)
    used_at_start: dict[int, int] = field(default_factory=dict)
    why_stopped: str = ""  # what the trials in flight when it stopped are recorded as (tell.tell_interrupted)

    def halt(self, why: str) -> None:
        """Stop every slot; the first reason given is what the trials in flight are recorded with. No lock: the
        Ctrl-C handler calls it, in the main thread, between any two of its steps."""
        if not self.stop.is_set():
            self.why_stopped = why
            self.stop.set()

    def ended(self, trial: optuna.Trial, state: TrialState, summary: str) -> None:
        save_trial_note(self.study, trial)
        self.progress.trial_ended(trial.number, state, summary, best_trial(self.study))


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
    artifacts_dir = artifacts_dir or spec.path.parent / f"{spec.name}-artifacts"
    reap_leftover_servers()
    reserved = remeasure.reserve(budget, spec.remeasure)  # spent at the end
    for t in study.trials:
        if "duration_s" in t.user_attrs and t.state.is_finished():
            budget.record(t.user_attrs["duration_s"], searched=searched_trial(t))
    remeasure.hold(budget, study.get_trials(deepcopy=False), spec.remeasure)
    gpus = present_gpus(slots)  # before any server of this run
    profile, real_profile = feasibility.planned_profiles(spec.hardware, spec.memory_cap,
                                                         detect_build() is Build.CPU, gpus)
    if profile.held_bytes:
        say(f"{profile.label} when the study began: trials are planned on the "
            f"{format_gib(profile.usable_bytes, 2)} they leave")
    run = _Run(spec, study, budget, progress or NoProgress(), artifacts_dir, profile, real_profile,
               open_artifact_store(artifacts_dir), threading.Event(),
               used_at_start={g.index: g.used_bytes for g in gpus})
    counts = {"booted": 0, "refused": 0}
    reasons: list[str] = []
    errors: list[BaseException] = []

    def worker(slot: Slot) -> None:
        try:
            work(slot)
        except BaseException as e:  # the machine, the setup or a bug, not a configuration: stop every slot cleanly
            errors.append(e)
            run.halt(f"stopped when slot {slot.name} failed: {e}")

    def work(slot: Slot) -> None:
        rejected_in_a_row = 0
        while not run.stop.is_set():
            fits, why = budget.claim()
            if not fits:
                reasons.append(why)
                return
            result = _one_trial(run, slot)
            if result is None:  # rejected before boot: costs nothing, so it does not count against --n-trials
                with run.asking:  # slots count from their own threads; += on a dict entry is not atomic
                    counts["refused"] += 1
                budget.release()
                rejected_in_a_row += 1
                if rejected_in_a_row >= MAX_REJECTED_IN_A_ROW:
                    reasons.append(f"{MAX_REJECTED_IN_A_ROW} configurations in a row rejected before boot")
                    return
                continue
            rejected_in_a_row = 0
            with run.asking:
                counts["booted"] += 1
            budget.record(result.duration_s, searched=result.searched)
            remeasure.hold(budget, study.get_trials(deepcopy=False), spec.remeasure)

    def search() -> remeasure.Searched:
        before = counts["booted"]
        reasons.clear()
        _until_done([(f"slot-{slot.name}", functools.partial(worker, slot)) for slot in slots])
        if errors:
            raise errors[0]
        return remeasure.Searched(counts["booted"] - before, reasons[0] if reasons else "")

    def remeasure_in(reserved: remeasure.Reserve) -> remeasure.RemeasureRun:
        ran: list[remeasure.RemeasureRun] = []

        def target() -> None:
            try:
                one = functools.partial(_one_trial, run, slots[0])
                again = remeasure.remeasure_top(study, budget, reserved, stop=run.stop, run_one=one)
                # the winner settled, what is left of the reserve boots it against the best baseline in pairs
                pairs = paired.measure_pairs(study, budget, one, run.stop) if reserved.top > 0 else None
                ran.append(again if pairs is None else remeasure.RemeasureRun(
                    again.done + pairs.done, again.booted + pairs.booted,
                    pairs.stopped_because or again.stopped_because))
            except BaseException as e:
                errors.append(e)

        _until_done([("remeasure", target)])
        if errors:
            raise errors[0]
        return ran[0]

    with _ctrl_c_stops(run.halt) as interrupted:
        again = remeasure.search_and_remeasure(search, remeasure_in, reserved, run.stop)
    why = "interrupted" if interrupted.is_set() else again.stopped_because
    best = best_trial(study)
    figure = remeasure.figure_line(best, study.get_trials(deepcopy=False)) if best is not None else ""
    return RunSummary(counts["booted"], counts["refused"] + len(again.done) - again.booted, again.booted, why,
                      best, export_command(spec, storage_url), paired.answer(study), figure)


@contextlib.contextmanager
def _ctrl_c_stops(halt: Callable[[str], None]) -> Iterator[threading.Event]:
    """While the study runs, Ctrl-C (SIGINT) or SIGTERM (systemd, `docker stop`) calls `halt` and sets the event
    it yields, and raises nothing: each slot stops its server and records its trial as interrupted by the user.
    A KeyboardInterrupt could land anywhere in the main thread, even between two waits, and escape with the trials
    RUNNING (seen in CI: exit 1, "Aborted!").
    Only the main thread may set a handler; elsewhere no signal reaches this code anyway."""
    pressed = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield pressed
        return

    def handler(signum: int, frame: object) -> None:
        pressed.set()
        halt(tell.INTERRUPTED)

    before = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield pressed
    finally:
        for s, previous in before.items():
            signal.signal(s, previous)


def _until_done(targets: list[tuple[str, Callable[[], None]]]) -> None:
    """Run each target in a thread of its own until all have ended.

    Waits on events, never on Thread.join: on CPython 3.11 a join interrupted by a signal marks the live thread
    as stopped, so the next join returns at once and the thread dies at exit with its trial RUNNING."""
    ended = [threading.Event() for _ in targets]

    def run(target: Callable[[], None], done: threading.Event) -> None:
        try:
            target()
        finally:
            done.set()

    for (name, target), done in zip(targets, ended, strict=True):  # one event per target
        threading.Thread(target=run, args=(target, done), name=name, daemon=True).start()
    for done in ended:
        done.wait()  # a signal's handler runs during the wait (Ctrl-C's: _ctrl_c_stops), and the wait goes on


def preview_configs(spec: StudySpec, n: int, seed: int = 0) -> list[tuple[str, EngineConfig]]:
    """The baselines and n configurations sampled from the space (uniformly), as a study would boot them."""
    out = [(f"baseline: {b.name}", engine_config(spec, {}, baseline=b.flags)) for b in spec.baselines]
    scratch = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    for _ in range(n):
        params = suggest(scratch.ask(), spec.space)
        out.append((", ".join(f"{k}={value_text(v)}" for k, v in params.items()), engine_config(spec, params)))
    return out


def preview_estimates(spec: StudySpec, hardware: str | None, samples: int,
                      storage_url: str | None = None) -> tuple[GpuProfile, list[tuple]]:
    """`autotune estimate STUDY`: the card the study plans with (capped when it has a memory cap) and, for the
    baselines and `samples` sampled configurations, (label, model, flags, memory verdict), calibrated by the study's
    stored warm boots when its storage exists."""
    profile = estimate_profile(hardware, spec.hardware, spec.memory_cap)
    seen = stored_observations(spec, storage_url)
    rows = []
    for label, config in preview_configs(spec, samples):
        path, flags = configured(config.model, config.flags)
        rows.append((label, config.model, flags, feasibility.judge(path, profile, flags, spec.env, seen)))
    return profile, rows


def estimate_profile(named: str | None, hardware: str, cap: MemoryCap | None) -> GpuProfile:
    """The card `autotune estimate` plans on: --gpu's card as named (`named`), else `hardware` as a run here would
    plan it (the card present, with what other processes hold on it)."""
    return feasibility.planned_profiles(named or hardware, cap, detect_build() is Build.CPU,
                                        [] if named else present_gpus())[0]


def stored_observations(spec: StudySpec, storage_url: str | None) -> list[feasibility.Observation]:
    """The booted trials of the study's storage, read-only; none when it has not run yet (nothing is created)."""
    url = storage_url or spec.storage or default_storage(spec)
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        return []
    try:
        return feasibility.observations(load_existing_study(spec.name, url).trials)
    except StorageError:
        return []


@dataclass(frozen=True)
class _Booted:
    """A trial that booted: its result, and whether it was the search's own (sampled, and so screened: not a
    baseline or a re-measurement, which are searched in full), whose lengths say what the next one costs."""

    result: TrialResult
    searched: bool

    @property
    def duration_s(self) -> float:
        return self.result.duration_s


def _one_trial(run: _Run, slot: Slot) -> _Booted | None:
    """Ask, judge before boot, boot and measure, tell. None when the configuration was refused (or screened out)
    before boot."""
    spec, study = run.spec, run.study
    with run.asking:
        optuna.storages.fail_stale_trials(study)  # another worker died mid-trial: mark it, and it is retried once
        if spec.sampler.name == "tpe" and spec.objective.load.mode == "concurrency" and start.due(study):
            seen = feasibility.observations(study.trials)
            start.queue_pick(study, spec.space, lambda p: runs_at_once(spec, run.profile, None, p, seen),
                             spec.sampler.seed)
        trial = study.ask()
    baseline = trial_baseline(trial)
    searched = searched_trial(trial)
    params = suggest(trial, spec.space)
    config = engine_config(spec, params, baseline=baseline)
    model_path, flags = configured(config.model, config.flags)
    for key, value in record.config_attrs(model_path, flags, spec.env).items():
        trial.set_user_attr(key, value)
    label = ((trial.user_attrs.get("baseline") or {}).get("name")
             or ", ".join(f"{k}={value_text(v)}" for k, v in params.items()))
    if pick := trial.user_attrs.get(start.PICK_ATTR):
        label += f" (start pick: runs {pick['runs_at_once']:g} at once, the most of {pick['of']} drawn)"
    run.progress.trial_started(trial.number, label, slot.name)

    if reason := invalid_reason(flags):
        tell.tell_rejected(study, trial, f"vLLM would reject it: {reason}")
        run.ended(trial, TrialState.COMPLETE, f"rejected before boot: {reason}")
        return None

    verdict = feasibility.judge(model_path, run.profile, flags, spec.env, feasibility.observations(study.trials))
    for key, value in feasibility.prediction_attrs(verdict.estimate, verdict.predicted_on).items():
        trial.set_user_attr(key, value)
    if not verdict.fits:
        tell.tell_rejected(study, trial, f"{PREDICTED_NOT_TO_FIT}: {verdict.reason}", memory_excess=verdict.excess_gib)
        run.ended(trial, TrialState.COMPLETE, f"pruned before boot: {verdict.reason}")
        return None
    prior = load_prior(study, trial, flags, spec, verdict.estimate.kv_tokens)
    if why := screen_before_boot(prior, flags, verdict.estimate, run.profile, spec):
        tell.tell_screened_before_boot(study, trial, why)
        run.ended(trial, TrialState.PRUNED, f"{tell.SCREENED_BEFORE_BOOT}: {why}")
        return None
    if run.profile.kind == "cuda":
        _check_gpu_free(run, trial, slot)

    log_path = run.artifacts_dir / f"trial-{trial.number:04d}.log"
    plan = plan_trial(model_path, flags, spec.objective, log_path, env=spec.env,
                      boot_timeout_s=max(1.0, min(spec.boot_timeout_s, run.budget.remaining())),
                      gpu_indices=slot.gpu_indices, memory_cap=spec.memory_cap, real_gpu=run.real_profile,
                      prior=prior, warm_kv_blocks=warm_kv_blocks(verdict.estimate, run.profile.kind == "cuda"))
    if spec.memory_cap is not None:
        trial.set_user_attr("engine_flags", json.dumps(plan.engine.flags, sort_keys=True))
        trial.set_user_attr(CAP_ATTR, spec.memory_cap.cuda_total_gib)

    def on_level(step: int, value: float, level: LevelOutcome) -> str | None:
        if run.stop.is_set():
            return run.why_stopped or tell.INTERRUPTED
        if run.budget.remaining() <= 0:
            return "stopped at the end of the time budget"
        return None

    try:
        with heartbeat(study, trial):
            result = run_trial(plan, on_level=on_level, on_stage=lambda text: run.progress.stage(trial.number, text),
                               cancel=run.stop)
    except EngineError as e:
        attach_log(study, trial, log_path, run.store)
        tell.tell_engine_error(study, trial, e)
        run.ended(trial, TrialState.FAIL, str(e))
        raise
    attach_log(study, trial, log_path, run.store)  # before the tell: Optuna refuses artifacts on finished trials
    if run.stop.is_set():  # whatever the trial saw after Ctrl-C (or another slot's failure) says nothing about it
        why = run.why_stopped or tell.INTERRUPTED
        tell.tell_interrupted(study, trial, why)
        run.ended(trial, TrialState.FAIL, "interrupted" if why == tell.INTERRUPTED else why)
        return _Booted(result, searched)
    state = tell.tell_result(study, trial, result)
    run.ended(trial, state, _summary(result))
    tell.abort_if_model_missing(result, config.model)
    return _Booted(result, searched)


def runs_at_once(spec: StudySpec, profile: GpuProfile, model: str | None, params: dict[str, object],
                 seen: Sequence[feasibility.Observation] = ()) -> float | None:
    """How many requests a sampled configuration runs at once, as the estimator predicts (ladder.capacity with
    its central KV cache's bound, estimate.running_seqs); None when it would be refused before boot. `model`
    replaces the configuration's."""
    config = engine_config(spec, params)
    path, flags = configured(model or config.model, config.flags)
    if invalid_reason(flags):
        return None
    verdict = feasibility.judge(path, profile, flags, spec.env, seen)
    if not verdict.fits:
        return None
    return _runs_as_booted(spec, flags, verdict.estimate)


def _runs_as_booted(spec: StudySpec, flags: dict[str, object], estimate: Estimate) -> float | None:
    """_holds_at_once with the estimate's central KV cache: what the configuration runs at once as booted."""
    return _holds_at_once(spec, flags, estimate.kv_tokens, estimate.running_seqs or None)


def _holds_at_once(spec: StudySpec, flags: dict[str, object], kv_tokens: int | None,
                   running: int | None = None) -> float | None:
    """ladder.capacity of a configuration's flags for the study's mean request."""
    w, seqs = spec.objective.workload, flags.get("max_num_seqs")
    return capacity(float(seqs) if isinstance(seqs, int | float) else None, kv_tokens,
                    w.input_len.mean + w.output_len.mean, running)


def screen_before_boot(prior: Prior, flags: dict[str, object], estimate: Estimate, profile: GpuProfile,
                       spec: StudySpec) -> str | None:
    """Why a sampled configuration, screened at the incumbent's level, must or would fail there
    (measure/queueing.py: a queue wait no kernel shortens, or fewer running at once than holds_too_few allows): then
    it is screened out without a boot. None: it boots. A KV cache the estimator does not model bounds nothing."""
    o = spec.objective
    if not prior.screen or prior.incumbent is None or o.load.mode != "concurrency":
        return None
    pool = None if estimate.not_modelled else estimate.max_running_seqs
    if why := cannot_sustain(prior.incumbent, flags, estimate.weights_bytes, profile.bandwidth_gbs, o.workload,
                             o.limits, pool):
        return why
    runs = _holds_at_once(spec, flags, None) if estimate.not_modelled else _runs_as_booted(spec, flags, estimate)
    return holds_too_few(prior.incumbent, runs, o.limits)


def load_prior(study: optuna.Study, trial: optuna.Trial, flags: dict[str, object], spec: StudySpec,
               kv_tokens: int | None) -> Prior:
    """Where this trial's load search starts (ladder.Prior): the incumbent's best level, the best levels of the
    measured configurations that differ from this one in the fewest parameters, and what this configuration
    holds at once. A sampled configuration is screened at the incumbent's level; a baseline (a reference the
    user reads) and a re-measurement (of the incumbent's figure) are searched in full, the latter from its own
    first best level, measured exactly at once (it is most often the answer: measured once, not twice)."""
    trials = [t for t in study.get_trials(deepcopy=False)
              if feasible(t) and t.number != trial.number and view(t).best_level is not None]
    of = trial.user_attrs.get(REMEASURE_ATTR)
    original = next((t for t in trials if t.number == of), None)
    incumbent = best_trial(study)
    anchor = original or (incumbent.trial if incumbent is not None else None)
    level = view(anchor).best_level if anchor is not None else None
    params = trial.params

    def distance(t: optuna.trial.FrozenTrial) -> int:
        return sum(t.params.get(k) != v for k, v in params.items()) + sum(k not in params for k in t.params)
    nearest = min(map(distance, trials), default=None)
    similar = tuple(float(view(t).best_level or 0) for t in trials if distance(t) == nearest)
    cap = _holds_at_once(spec, flags, kv_tokens)
    screen = level is not None and of is None and trial_baseline(trial) is None
    return Prior(incumbent=level, similar=() if original else similar, cap=cap, screen=screen,
                 exact_first=original is not None)


def taken_since_start(gpus: list[GpuInfo], used_at_start: dict[int, int]) -> list[GpuInfo]:
    """The GPUs on which something took memory since the run began (what was in use then is planned around)."""
    return [g for g in gpus if g.used_bytes > max(used_at_start.get(g.index, 0) + HELD_MORE_BYTES, HELD_GPU_BYTES)]


def _check_gpu_free(run: _Run, trial: optuna.Trial, slot: Slot, wait_s: float = 30.0) -> None:
    """Memory in use on the GPU beyond what was when the run began (planned around: feasibility.planned_profiles)
    would be misread as this configuration's failure: wait for a previous server to let go, then refuse to boot and
    stop the run with a message naming what holds it."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        busy = taken_since_start(present_gpus((slot,)), run.used_at_start)
        if not busy:
            return
        if time.monotonic() > deadline:
            what = ", ".join(f"GPU {g.index}: {format_gib(g.used_bytes, 1)} in use" for g in busy)
            error = tell.tell_gpu_busy(run.study, trial, what)
            run.ended(trial, TrialState.FAIL, "GPU busy")
            raise error
        run.progress.stage(trial.number, "waiting for GPU memory to be released")
        time.sleep(2)


def _summary(result: TrialResult) -> str:
    if result.status == "ok":
        best = result.best
        assert best is not None
        return (f"{result.throughput_tok_s:,.0f} tok/s at level {result.best_level:g}, "
                f"p95 TTFT {best.stats.ttft.p95_ms:.0f} ms")
    return f"{result.status}: {result.reason}"
