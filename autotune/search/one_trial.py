"""One trial of the loop, as a straight line: ask, prepare the configuration (no boot), judge it before boot,
wait for a free GPU, boot and measure, tell. Every way it can end goes through search/tell.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import optuna
from optuna.artifacts import FileSystemArtifactStore
from optuna.trial import TrialState

from autotune.config.study_file import StudySpec, foreign_config_problem
from autotune.engine.flags import invalid_reason, value_text
from autotune.errors import EngineError
from autotune.fit import feasibility
from autotune.fit.estimate import Estimate
from autotune.fit.hardware import GpuProfile
from autotune.measure.ladder import Prior
from autotune.measure.plan import TrialPlan, configured, plan_trial, warm_kv_blocks
from autotune.measure.trial import LevelOutcome, TrialResult, run_trial
from autotune.search import record, remeasure, start, tell
from autotune.search.budget import Budget
from autotune.search.gpu_wait import still_taken
from autotune.search.record import CAP_ATTR, save_trial_note, searched_trial, trial_baseline
from autotune.search.remeasure import best_trial
from autotune.search.screen import load_prior, runs_at_once, screen_before_boot
from autotune.search.slots import Slot
from autotune.search.space import engine_config, suggest
from autotune.search.storage import attach_log, heartbeat, unwritable

PREDICTED_NOT_TO_FIT = "predicted not to fit"  # the reason's head of a trial refused on the memory estimate


class Progress(Protocol):
    """What the loop tells whoever shows progress (the CLI draws it with rich; tests record it)."""

    def trial_started(self, number: int, label: str, slot: str) -> None: ...
    def stage(self, number: int, text: str) -> None: ...
    def trial_ended(self, number: int, state: TrialState, summary: str, best: remeasure.Best | None) -> None: ...


class NoProgress:
    def trial_started(self, number: int, label: str, slot: str) -> None: ...
    def stage(self, number: int, text: str) -> None: ...
    def trial_ended(self, number: int, state: TrialState, summary: str, best: remeasure.Best | None) -> None: ...


@dataclass
class StudyRun:
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
    # NVML's used bytes per GPU before the run's first server: not ours to wait for (gpu_wait.taken_since_start)
    used_at_start: dict[int, int] = field(default_factory=dict)
    why_stopped: str = ""  # what the trials in flight when it stopped are recorded as (tell.tell_interrupted)
    say: Callable[[str], object] = field(default=lambda line: None)  # warnings that do not stop the run
    booted: int = 0  # trials of the search that booted, counted by the slots under `asking`
    refused: int = 0  # refused before boot, likewise
    reasons: list[str] = field(default_factory=list)  # why each slot stopped searching, this search
    errors: list[BaseException] = field(default_factory=list)  # what failed a slot: re-raised in the main thread

    def halt(self, why: str) -> None:
        """Stop every slot; the first reason given is what the trials in flight are recorded with. No lock: the
        Ctrl-C handler calls it, in the main thread, between any two of its steps."""
        if not self.stop.is_set():
            self.why_stopped = why
            self.stop.set()

    def ended(self, trial: optuna.Trial, state: TrialState, summary: str) -> None:
        save_trial_note(self.study, trial)
        self.progress.trial_ended(trial.number, state, summary, best_trial(self.study))

    def why_stop_early(self, step: int, value: float, level: LevelOutcome) -> str | None:
        """run_trial's on_level: stop the load search when the run stops or the time budget is spent."""
        if self.stop.is_set():
            return self.why_stopped or tell.INTERRUPTED
        if self.budget.remaining() <= 0:
            return "stopped at the end of the time budget"
        return None

    def raise_first_error(self) -> None:
        """The first slot's failure, as one line where it is the database's (storage.unwritable)."""
        if self.errors:
            raise unwritable(self.errors[0]) or self.errors[0]


@dataclass(frozen=True)
class Booted:
    """A trial that booted: its result, and whether it was the search's own (sampled, and so screened: not a
    baseline or a re-measurement, which are searched in full), whose lengths say what the next one costs."""

    result: TrialResult
    searched: bool

    @property
    def duration_s(self) -> float:
        return self.result.duration_s


@dataclass(frozen=True)
class _Candidate:
    """The configuration a trial was given, as it boots (measure/plan.configured)."""

    params: dict[str, object]  # what the sampler chose (empty for a baseline)
    model: str  # the study's model name, which abort_if_model_missing checks
    model_path: str
    flags: dict[str, object]
    searched: bool


@dataclass(frozen=True)
class _Cleared:
    """A candidate that every check before boot let through: its estimate, and where its load search starts."""

    estimate: Estimate
    prior: Prior


def one_trial(run: StudyRun, slot: Slot) -> Booted | None:
    """Ask, judge before boot, boot and measure, tell. None when the configuration was refused (or screened out)
    before boot."""
    trial = _ask(run)
    candidate = _candidate(run, trial)
    run.progress.trial_started(trial.number, _label(trial, candidate.params), slot.name)
    cleared = _judge_before_boot(run, trial, candidate)
    if cleared is None:
        return None
    if run.profile.kind == "cuda":
        _wait_for_gpu(run, trial, slot)
    log_path = run.artifacts_dir / f"trial-{trial.number:04d}.log"
    result = _boot_and_measure(run, trial, _plan(run, trial, slot, candidate, cleared, log_path), log_path)
    _tell(run, trial, result, candidate.model)
    return Booted(result, candidate.searched)


def _ask(run: StudyRun) -> optuna.Trial:
    """The next trial, asked under the lock; stale trials of dead workers are marked first (and retried once), and
    a start pick is queued when one is due."""
    spec, study = run.spec, run.study
    with run.asking:
        optuna.storages.fail_stale_trials(study)
        picks = spec.sampler.start_picks
        if picks and spec.objective.load.mode == "concurrency" and start.due(study, picks):
            seen = feasibility.observations(study.trials)
            start.queue_pick(study, spec.space, lambda p: runs_at_once(spec, run.profile, None, p, seen),
                             spec.sampler.seed, picks=picks)
        return study.ask()


def _candidate(run: StudyRun, trial: optuna.Trial) -> _Candidate:
    """The trial's configuration, folded as it boots, and recorded on the trial."""
    params = suggest(trial, run.spec.space)
    config = engine_config(run.spec, params, baseline=trial_baseline(trial))
    model_path, flags = configured(config.model, config.flags)
    for key, value in record.config_attrs(model_path, flags, run.spec.env).items():
        trial.set_user_attr(key, value)
    return _Candidate(params, config.model, model_path, flags, searched_trial(trial))


def _label(trial: optuna.Trial, params: dict[str, object]) -> str:
    label = ((trial.user_attrs.get("baseline") or {}).get("name")
             or ", ".join(f"{k}={value_text(v)}" for k, v in params.items()))
    if pick := trial.user_attrs.get(start.PICK_ATTR):
        label += f" (start pick: runs {pick['runs_at_once']:g} at once, the most of {pick['of']} drawn)"
    return label


def _judge_before_boot(run: StudyRun, trial: optuna.Trial, c: _Candidate) -> _Cleared | None:
    """Refuse, told at once and without a boot, what vLLM would reject, what is predicted not to fit, and what
    screening at the incumbent's level says must fail there."""
    spec, study = run.spec, run.study
    if reason := foreign_config_problem(spec, c.model, c.flags):  # a trial someone added to a shared database
        tell.tell_rejected(study, trial, f"not booted: {reason}")
        run.ended(trial, TrialState.COMPLETE, f"rejected before boot: {reason}")
        return None
    if reason := invalid_reason(c.flags):
        tell.tell_rejected(study, trial, f"vLLM would reject it: {reason}")
        run.ended(trial, TrialState.COMPLETE, f"rejected before boot: {reason}")
        return None
    verdict = feasibility.judge(c.model_path, run.profile, c.flags, spec.env, feasibility.observations(study.trials),
                                spec.vllm_version)
    for key, value in feasibility.prediction_attrs(verdict.estimate, verdict.predicted_on).items():
        trial.set_user_attr(key, value)
    if not verdict.fits:
        tell.tell_rejected(study, trial, f"{PREDICTED_NOT_TO_FIT}: {verdict.reason}", memory_excess=verdict.excess_gib)
        run.ended(trial, TrialState.COMPLETE, f"pruned before boot: {verdict.reason}")
        return None
    prior = load_prior(study, trial, c.flags, spec, verdict.estimate.kv_tokens)
    if why := screen_before_boot(prior, c.flags, verdict.estimate, run.profile, spec):
        tell.tell_screened_before_boot(study, trial, why)
        run.ended(trial, TrialState.PRUNED, f"{tell.SCREENED_BEFORE_BOOT}: {why}")
        return None
    return _Cleared(verdict.estimate, prior)


def _wait_for_gpu(run: StudyRun, trial: optuna.Trial, slot: Slot) -> None:
    """Boot only on a GPU nothing else took since the run began; else the trial is told and the run stops."""
    if what := still_taken(slot, run.used_at_start,
                           lambda: run.progress.stage(trial.number, "waiting for GPU memory to be released")):
        error = tell.tell_gpu_busy(run.study, trial, what)
        run.ended(trial, TrialState.FAIL, "GPU busy")
        raise error


def _plan(run: StudyRun, trial: optuna.Trial, slot: Slot, c: _Candidate, cleared: _Cleared,
          log_path: Path) -> TrialPlan:
    spec = run.spec
    plan = plan_trial(c.model_path, c.flags, spec.objective, log_path, env=spec.env,
                      boot_timeout_s=max(1.0, min(spec.boot_timeout_s, run.budget.remaining())),
                      gpu_indices=slot.gpu_indices, memory_cap=spec.memory_cap, real_gpu=run.real_profile,
                      prior=cleared.prior,
                      warm_kv_blocks=warm_kv_blocks(cleared.estimate, run.profile.kind == "cuda"))
    if spec.memory_cap is not None:  # what booted on the card present, beside the capped card's flags
        trial.set_user_attr("engine_flags", json.dumps(plan.engine.flags, sort_keys=True))
        trial.set_user_attr(CAP_ATTR, spec.memory_cap.cuda_total_gib)
    return plan


def _boot_and_measure(run: StudyRun, trial: optuna.Trial, plan: TrialPlan, log_path: Path) -> TrialResult:
    """run_trial inside the trial's heartbeat; the server log is attached however it ends (before the tell:
    Optuna refuses artifacts on finished trials). An engine error is told and raised: it stops the run."""
    try:
        with heartbeat(run.study, trial):
            result = run_trial(plan, on_level=run.why_stop_early, cancel=run.stop,
                               on_stage=lambda text: run.progress.stage(trial.number, text))
    except EngineError as e:
        attach_log(run.study, trial, log_path, run.store, run.say)
        tell.tell_engine_error(run.study, trial, e)
        run.ended(trial, TrialState.FAIL, str(e))
        raise
    attach_log(run.study, trial, log_path, run.store, run.say)  # a full disk: said; the result is still told
    return result


def _tell(run: StudyRun, trial: optuna.Trial, result: TrialResult, model: str) -> None:
    if run.stop.is_set():  # whatever the trial saw after Ctrl-C (or another slot's failure) says nothing about it
        why = run.why_stopped or tell.INTERRUPTED
        tell.tell_interrupted(run.study, trial, why)
        run.ended(trial, TrialState.FAIL, "interrupted" if why == tell.INTERRUPTED else why)
        return
    state = tell.tell_result(run.study, trial, result)
    run.ended(trial, state, _summary(result))
    tell.abort_if_model_missing(result, model)


def _summary(result: TrialResult) -> str:
    if result.status == "ok":
        best = result.best
        assert best is not None
        energy = f"{result.maximized:.3g} output tokens/J, " if result.maximized is not None else ""
        return (f"{energy}{result.throughput_tok_s:,.0f} tok/s at level {result.best_level:g}, "
                f"p95 TTFT {best.stats.ttft.p95_ms:.0f} ms")
    return f"{result.status}: {result.reason}"
