"""The study: storage, sampler, baselines and the budget loop that runs trials until the budget is spent.

Trials are asked for and told one at a time (ask/tell), so a trial's outcome is recorded the moment it ends:
a kill of the tuner loses at most the trial in flight, and the next run of the same command resumes the study.
"""

from __future__ import annotations

import contextlib
import json
import threading
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Protocol

import optuna
from optuna.artifacts import FileSystemArtifactStore
from optuna.trial import FrozenTrial, TrialState

from autotune import feasibility, memcap, outcome, remeasure
from autotune.budget import Budget
from autotune.dashboard import attach_log, open_artifact_store, save_trial_note
from autotune.engine import Build, EngineSpec, FailureKind, detect_build, reap_leftover_servers
from autotune.errors import EngineError, StorageError
from autotune.export import value_text
from autotune.hardware import GpuProfile, detect_gpus
from autotune.samplers import make_pruner, make_sampler
from autotune.space import EngineConfig, enqueue_baseline, engine_config, invalid_reason, suggest, trial_baseline
from autotune.spec import StudySpec, load_study
from autotune.tinymodel import resolve_model
from autotune.trial import LevelOutcome, TrialPlan, TrialResult, model_vocab_size, run_trial

HEARTBEAT_S = 5
GRACE_S = 30  # a RUNNING trial without a heartbeat for this long belongs to a dead worker: marked FAIL, retried once
INTERRUPTED = "interrupted by the user"
MAX_REJECTED_IN_A_ROW = 200
HELD_GPU_BYTES = 1 << 30  # more than this in use before a boot means something else holds the GPU


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
    refused: int  # refused before boot (vLLM would reject the flags, or predicted not to fit): cost nothing
    remeasured: int  # re-measurements that booted
    stopped_because: str  # why the run ended ("" when the search and the re-measuring ran their course)
    best: remeasure.Best | None

    def lines(self) -> list[str]:
        """The summary a person reads at the end of the run (without the best configuration's command)."""
        out = [f"this run: {self.booted} booted, {self.refused} refused before boot, {self.remeasured} re-measured; "
               f"stopped: {self.stopped_because or 'done'}"]
        out.append(f"best: {self.best.text}" if self.best is not None else "no feasible configuration yet")
        return out


def default_storage(spec: StudySpec) -> str:
    return f"sqlite:///{spec.path.parent / (spec.name + '.db')}"


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """An RDB storage with heartbeats, so a trial whose worker died is found and marked, not left RUNNING."""
    retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1)
    try:
        return optuna.storages.RDBStorage(url, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S,
                                          heartbeat_stale_trial_callback=retry)
    except Exception as e:  # sqlalchemy/driver errors vary by backend; all mean the same thing to a user
        raise StorageError(f"--storage {url}: cannot open: {str(e).splitlines()[0]}") from e


def open_study(spec: StudySpec, storage_url: str | None = None) -> optuna.Study:
    url = storage_url or spec.storage or default_storage(spec)
    storage = open_storage(url)
    study = optuna.create_study(study_name=spec.name, storage=storage, direction="maximize",
                                sampler=make_sampler(spec), pruner=make_pruner(), load_if_exists=True)
    if not study.trials:
        study.set_metric_names(["output_tok_s"])
        study.set_user_attr("objective", spec.objective.name)
        study.set_user_attr("limits", {k: v for k, v in vars(spec.objective.limits).items() if v is not None})
        study.set_user_attr("hardware", spec.hardware)
        study.set_user_attr("study_file", str(spec.path))
        study.set_user_attr("files", {  # so that `autotune worker` on another host needs only the storage URL
            "study": spec.path.read_text(), "objective": spec.objective.path.read_text(),
            "objective_ref": tomllib.loads(spec.path.read_text())["objective"],
        })
        for baseline in spec.baselines:
            enqueue_baseline(study, baseline, spec.space)
    optuna.storages.fail_stale_trials(study)
    return study


@dataclass(frozen=True)
class Slot:
    """Where one trial at a time runs: a GPU (or several, for one server) or, on the CPU build, a share of it."""

    name: str = "0"
    gpu_indices: tuple[int, ...] = ()

    @property
    def cuda_visible_devices(self) -> str | None:
        return ",".join(map(str, self.gpu_indices)) if self.gpu_indices else None


def spec_from_storage(name: str, url: str, root: Path) -> StudySpec:
    """Rebuild a study's spec from the files `autotune run` stored with it (for workers on other hosts)."""
    try:
        files = optuna.load_study(study_name=name, storage=open_storage(url)).user_attrs.get("files")
    except KeyError as e:
        raise StorageError(f"--study {name}: no such study in {url}") from e
    if not files:
        raise StorageError(f"--study {name}: the study holds no study file; create it with `autotune run`")
    ref = files["objective_ref"]
    base = root.joinpath(*["study"] * ref.count("..")) if not Path(ref).is_absolute() else root
    objective = base / ref if not Path(ref).is_absolute() else Path(ref)
    objective.parent.mkdir(parents=True, exist_ok=True)
    if not Path(ref).is_absolute():
        objective.write_text(files["objective"])
    study_file = base / f"{name}.toml"
    study_file.write_text(files["study"])
    return load_study(study_file)


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
    stop: threading.Event
    # SQLite ignores SELECT ... FOR UPDATE, so two slots asking at once could both pop the same enqueued trial.
    asking: threading.Lock = field(default_factory=threading.Lock)

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
) -> RunSummary:
    """Run trials until the budget is spent, one at a time on each slot (a thread per slot)."""
    study = open_study(spec, storage_url)
    artifacts_dir = artifacts_dir or spec.path.parent / f"{spec.name}-artifacts"
    reap_leftover_servers()
    reserved = remeasure.reserve(budget, spec.remeasure)  # spent at the end
    budget.durations.extend(
        t.user_attrs["duration_s"] for t in study.trials if "duration_s" in t.user_attrs and t.state.is_finished()
    )
    real_profile = feasibility.resolve_profile(spec.hardware, detect_build() is Build.CPU)
    # Under a memory cap, plan as on the capped card; boot with flags translated for the real one.
    profile = memcap.capped_profile(real_profile, spec.memory_cap) if spec.memory_cap else real_profile
    run = _Run(spec, study, budget, progress or NoProgress(), artifacts_dir, profile, real_profile,
               open_artifact_store(artifacts_dir), threading.Event())
    counts = {"booted": 0, "refused": 0}
    reasons: list[str] = []
    errors: list[BaseException] = []

    def worker(slot: Slot) -> None:
        try:
            work(slot)
        except BaseException as e:  # the machine, the setup or a bug, not a configuration: stop every slot cleanly
            errors.append(e)
            run.stop.set()

    def work(slot: Slot) -> None:
        rejected_in_a_row = 0
        while not run.stop.is_set():
            fits, why = budget.claim()
            if not fits:
                reasons.append(why)
                return
            result = _one_trial(run, slot)
            if result is None:  # rejected before boot: costs nothing, so it does not count against --n-trials
                counts["refused"] += 1
                budget.release()
                rejected_in_a_row += 1
                if rejected_in_a_row >= MAX_REJECTED_IN_A_ROW:
                    reasons.append(f"{MAX_REJECTED_IN_A_ROW} configurations in a row rejected before boot")
                    return
                continue
            rejected_in_a_row = 0
            counts["booted"] += 1
            budget.record(result.duration_s)

    threads = [threading.Thread(target=worker, args=(slot,), name=f"slot-{slot.name}", daemon=True) for slot in slots]
    for t in threads:
        t.start()
    try:
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(timeout=0.2)
    except KeyboardInterrupt:
        run.stop.set()  # each slot stops its server and records its trial as interrupted
        for t in threads:
            t.join()
        reasons.insert(0, "interrupted")
    if errors:
        raise errors[0]
    again = remeasure.remeasure_top(study, budget, reserved, stop=run.stop, run_one=lambda: _one_trial(run, slots[0]))
    refused_again = len(again.done) - again.booted
    # The last thing that stopped the run is why it ended: the re-measuring's want of time, else the search's.
    why = again.stopped_because or (reasons[0] if reasons else "")
    return RunSummary(counts["booted"], counts["refused"] + refused_again, again.booted, why, best_trial(study))


def preview_configs(spec: StudySpec, n: int, seed: int = 0) -> list[tuple[str, EngineConfig]]:
    """The baselines and n configurations sampled from the space (uniformly), as a study would boot them."""
    out = [(f"baseline: {b.name}", engine_config(spec, {}, baseline=b.flags)) for b in spec.baselines]
    scratch = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    for _ in range(n):
        params = suggest(scratch.ask(), spec.space)
        out.append((", ".join(f"{k}={value_text(v)}" for k, v in params.items()), engine_config(spec, params)))
    return out


def _one_trial(run: _Run, slot: Slot) -> TrialResult | None:
    """Ask, judge before boot, boot and measure, tell. None when the configuration was refused before boot."""
    spec, study = run.spec, run.study
    with run.asking:
        optuna.storages.fail_stale_trials(study)  # another worker died mid-trial: mark it, and it is retried once
        trial = study.ask()
    baseline = trial_baseline(trial)
    params = suggest(trial, spec.space)
    config = engine_config(spec, params, baseline=baseline)
    model_path, model_defaults = resolve_model(config.model)
    flags = {**model_defaults, **config.flags}
    for key, value in outcome.config_attrs(model_path, flags).items():
        trial.set_user_attr(key, value)
    label = ((trial.user_attrs.get("baseline") or {}).get("name")
             or ", ".join(f"{k}={value_text(v)}" for k, v in params.items()))
    run.progress.trial_started(trial.number, label, slot.name)

    if reason := invalid_reason(flags):
        outcome.tell_rejected(study, trial, f"vLLM would reject it: {reason}")
        run.ended(trial, TrialState.COMPLETE, f"rejected before boot: {reason}")
        return None

    verdict = feasibility.judge(model_path, run.profile, flags, spec.env, feasibility.observations(study.trials))
    for key, value in feasibility.prediction_attrs(verdict.estimate).items():
        trial.set_user_attr(key, value)
    if not verdict.fits:
        outcome.tell_rejected(study, trial, f"predicted not to fit: {verdict.reason}", memory_excess=verdict.excess_gib)
        run.ended(trial, TrialState.COMPLETE, f"pruned before boot: {verdict.reason}")
        return None
    if run.profile.kind == "cuda":
        _check_gpu_free(run, trial, slot)

    engine_flags = flags
    if spec.memory_cap is not None:
        engine_flags = memcap.engine_flags(flags, spec.memory_cap, run.real_profile)
        trial.set_user_attr("engine_flags", json.dumps(engine_flags, sort_keys=True))
    log_path = run.artifacts_dir / f"trial-{trial.number:04d}.log"
    plan = TrialPlan(
        EngineSpec(model=model_path, flags=engine_flags, env=spec.env,
                   boot_timeout_s=max(1.0, min(spec.boot_timeout_s, run.budget.remaining())),
                   cuda_visible_devices=slot.cuda_visible_devices),
        spec.objective, model_vocab_size(model_path), log_path, slot.gpu_indices,
    )

    passing: list[float] = []

    def on_level(step: int, value: float, level: LevelOutcome) -> str | None:
        if level.verdict.passed:
            passing.append(level.stats.output_tok_s)
        trial.report(max(passing, default=0.0), step)  # best passing throughput so far, per load level
        if run.stop.is_set():
            return INTERRUPTED
        if run.budget.remaining() <= 0:
            return "stopped at the end of the time budget"
        if trial.should_prune():
            return outcome.PRUNED
        return None

    try:
        with _heartbeat(study, trial):
            result = run_trial(plan, on_level=on_level, on_stage=lambda text: run.progress.stage(trial.number, text),
                               cancel=run.stop)
    except EngineError as e:
        attach_log(study, trial, log_path, run.store)
        outcome.tell_failed(study, trial, str(e))
        run.ended(trial, TrialState.FAIL, str(e))
        raise
    attach_log(study, trial, log_path, run.store)  # before the tell: Optuna refuses artifacts on finished trials
    if run.stop.is_set():  # whatever the trial saw after Ctrl-C says nothing about the configuration
        outcome.tell_failed(study, trial, INTERRUPTED)
        run.ended(trial, TrialState.FAIL, "interrupted")
        return result
    state = outcome.tell_result(study, trial, result)
    run.ended(trial, state, _summary(result))
    if result.failure is not None and result.failure.kind is FailureKind.MODEL_NOT_FOUND:
        raise EngineError(f"model {config.model!r} not found: {result.failure.reason}")
    return result


def _check_gpu_free(run: _Run, trial: optuna.Trial, slot: Slot, wait_s: float = 30.0) -> None:
    """Memory already in use on the GPU would be misread as this configuration's failure: wait for a previous
    server to let go, then refuse to boot and stop the run with a message naming what holds it."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        busy = [g for g in detect_gpus() if g.used_bytes > HELD_GPU_BYTES
                and (not slot.gpu_indices or g.index in slot.gpu_indices)]
        if not busy:
            return
        if time.monotonic() > deadline:
            what = ", ".join(f"GPU {g.index}: {g.used_bytes / 2**30:.1f} GiB in use" for g in busy)
            outcome.tell_failed(run.study, trial, f"GPU memory held by another process ({what})")
            run.ended(trial, TrialState.FAIL, "GPU busy")
            raise EngineError(f"GPU memory is held by another process before trial {trial.number} ({what}); "
                              "free the GPU and run the same command again to resume")
        run.progress.stage(trial.number, "waiting for GPU memory to be released")
        time.sleep(2)


def _summary(result: TrialResult) -> str:
    if result.status == "ok":
        best = result.best
        assert best is not None
        return (f"{result.throughput_tok_s:,.0f} tok/s at level {result.best_level:g}, "
                f"p95 TTFT {best.stats.ttft.p95_ms:.0f} ms")
    return f"{result.status}: {result.reason}"


@contextlib.contextmanager
def _heartbeat(study: optuna.Study, trial: optuna.Trial) -> Iterator[None]:
    """Beat while the trial runs, so other workers (and the next run) can tell a live trial from a dead one."""
    storage = study._storage  # the storage the study was opened with (RDBStorage, heartbeat-enabled)
    stop = threading.Event()

    def beat() -> None:
        while True:
            storage.record_heartbeat(trial._trial_id)
            if stop.wait(HEARTBEAT_S):
                return

    thread = threading.Thread(target=beat, name="trial-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def best_trial(study: optuna.Study, keep: Callable[[FrozenTrial], bool] = lambda t: True) -> remeasure.Best | None:
    """The winner (its original trial) and the figure every reader gives for it (remeasure.best): chosen on
    all measurements once the top configurations were re-measured. Optuna's own best_trial ignores constraints."""
    return remeasure.best(study.get_trials(deepcopy=False), keep)
