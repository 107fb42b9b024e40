"""The one place where a trial's ending becomes an Optuna outcome: its state, its constraints, its reason.

Optuna's samplers learn from COMPLETE (and TPE from PRUNED) trials and ignore FAIL ones, so a configuration that
runs out of memory, cannot meet the latency limits or does not boot with its flags is a COMPLETE trial with a
violated constraint (value > 0), never a bare FAIL. FAIL is kept for what says nothing about the configuration.

    ending                       function             state      constraint (> 0 violated)  status
    refused before boot          tell_rejected        COMPLETE   boots=1 (vLLM would refuse) infeasible
                                                                 memory=excess GiB (no fit)
    out of memory                tell_result          COMPLETE   memory=1                   infeasible
    missed the limits            tell_result          COMPLETE   latency=worst p95/limit-1  infeasible
    failed to boot for its flags tell_result          COMPLETE   boots=1                    failed
    unresponsive (hung, timeout) tell_result          COMPLETE   boots=1                    failed
    screened out (failed at the  tell_result          PRUNED     -                          stopped
      incumbent's level)                                         (0 everywhere)
    screened out before boot     tell_screened_before PRUNED     - (0 everywhere)           stopped
      (measure/queueing.py)        _boot
    stopped at the budget's end  tell_result          FAIL       -                          stopped
    interrupted (Ctrl-C)         tell_interrupted     FAIL       -                          failed
    GPU busy (before boot)       tell_gpu_busy        FAIL       -                          failed
    memory held, port in use,    tell_result          FAIL       -                          failed
      model not found, killed from outside
    the machine or setup failed  tell_engine_error    FAIL       -                          failed
    re-measured                  any of the above; the trial carries remeasure_of (search/remeasure.py)

A missing model (abort_if_model_missing) and a busy GPU end the run after the tell: every other trial would end
the same way. A FAIL is measured when the study resumes: a baseline until it has a measurement, a sampled trial
once (search/study.py).
"""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from autotune.engine.logs import FailureKind
from autotune.errors import EngineError
from autotune.measure.trial import SCREENED, TrialResult
from autotune.search.record import result_attrs

# Constraint names (each <= 0 when satisfied), shown by the dashboard as the trial's constraints.
MEMORY = "memory"  # ran (or was predicted to run) out of memory


LATENCY = "latency"  # worst p95 / limit - 1 at the lowest level when no level met the limits


BOOTS = "boots"  # the configuration does not boot for a reason other than memory (1 = it did not)


CONSTRAINTS = (MEMORY, LATENCY, BOOTS)


INTERRUPTED = "interrupted by the user"


SCREENED_BEFORE_BOOT = "screened out before boot"


_NOT_THE_CONFIGS_FAULT = (FailureKind.MEMORY_HELD, FailureKind.PORT_IN_USE, FailureKind.MODEL_NOT_FOUND,
                         FailureKind.KILLED, FailureKind.FROZEN, FailureKind.NOT_MEASURED)


def set_constraints(trial: optuna.Trial, *, memory: float = 0.0, latency: float = 0.0, boots: float = 0.0) -> None:
    for key, value in ((MEMORY, memory), (LATENCY, latency), (BOOTS, boots)):
        trial.set_constraint(key, value)


def tell_result(study: optuna.Study, trial: optuna.Trial, result: TrialResult) -> TrialState:
    """Record a booted (or boot-failed) trial. Returns the state it was told with."""
    for key, value in result_attrs(result).items():
        trial.set_user_attr(key, value)
    failure = result.failure
    if failure is not None and failure.kind in _NOT_THE_CONFIGS_FAULT:
        study.tell(trial, state=TrialState.FAIL)
        return TrialState.FAIL
    if result.status == "stopped":
        if result.stop_reason == SCREENED:
            # Not beating the incumbent, not infeasible: TPE ranks a PRUNED trial below every COMPLETE one and
            # above every one with a violated constraint, which is what is known. No throughput is claimed.
            # Among themselves TPE ranks PRUNED trials by their last intermediate value; every screened trial
            # failed the same level, so each reports what it delivered there within the limits (goodput): a near
            # miss ranks above a far one.
            step, screened = len(result.levels) - 1, result.levels[-1][1]
            trial.report(screened.stats.goodput_output_tok_s, step)
            set_constraints(trial)
            study.tell(trial, state=TrialState.PRUNED)
            return TrialState.PRUNED
        study.tell(trial, state=TrialState.FAIL)  # stopped at the budget's end or by the user
        return TrialState.FAIL
    if result.status == "ok":
        set_constraints(trial)
    elif failure is not None and failure.kind.is_memory:
        set_constraints(trial, memory=1.0)
    elif failure is not None:
        set_constraints(trial, boots=1.0)
    else:  # booted, measured, no level met the limits
        set_constraints(trial, latency=max((result.miss_ratio or 2.0) - 1.0, 1e-3))
    study.tell(trial, result.value, state=TrialState.COMPLETE)
    return TrialState.COMPLETE


def tell_rejected(study: optuna.Study, trial: optuna.Trial, reason: str, *, memory_excess: float = 0.0) -> None:
    """A configuration rejected before boot (vLLM would refuse it, or it cannot fit): costs no boot."""
    trial.set_user_attr("status", "infeasible")
    trial.set_user_attr("reason", reason)
    trial.set_user_attr("booted", False)
    if memory_excess > 0:
        set_constraints(trial, memory=memory_excess)
    else:
        set_constraints(trial, boots=1.0)
    study.tell(trial, 0.0, state=TrialState.COMPLETE)


def tell_screened_before_boot(study: optuna.Study, trial: optuna.Trial, reason: str) -> None:
    """A sampled configuration that must fail the incumbent's level (measure/queueing.py): screened out as if it
    had booted and failed there with nothing delivered (goodput 0: the lowest of the screened), at no cost."""
    trial.set_user_attr("status", "stopped")
    trial.set_user_attr("reason", f"{SCREENED_BEFORE_BOOT}: {reason}")
    trial.set_user_attr("booted", False)
    trial.report(0.0, 0)
    set_constraints(trial)
    study.tell(trial, state=TrialState.PRUNED)


def tell_interrupted(study: optuna.Study, trial: optuna.Trial, why: str = INTERRUPTED) -> None:
    """Ctrl-C (or another slot's failure, `why`): whatever the trial saw after it says nothing about the
    configuration; it is measured on resume."""
    _tell_fail(study, trial, why)


def tell_gpu_busy(study: optuna.Study, trial: optuna.Trial, held: str) -> EngineError:
    """Another process holds GPU memory before boot; returns the error that stops the run (raised by the caller
    once the trial's ending is shown)."""
    _tell_fail(study, trial, f"GPU memory held by another process ({held})")
    return EngineError(f"GPU memory is held by another process before trial {trial.number} ({held}); "
                       "free the GPU and run the same command again to resume")


def tell_engine_error(study: optuna.Study, trial: optuna.Trial, error: EngineError) -> None:
    """The machine or the setup failed mid-trial (not the configuration); the caller re-raises and the run stops."""
    _tell_fail(study, trial, str(error))


def abort_if_model_missing(result: TrialResult, model: str) -> None:
    """A model that cannot be found fails every trial alike: stop the run instead (after the trial is told)."""
    if result.failure is not None and result.failure.kind is FailureKind.MODEL_NOT_FOUND:
        raise EngineError(f"model {model!r}: {result.failure.reason}")


def _tell_fail(study: optuna.Study, trial: optuna.Trial, reason: str) -> None:
    trial.set_user_attr("status", "failed")
    trial.set_user_attr("reason", reason)
    study.tell(trial, state=TrialState.FAIL)
