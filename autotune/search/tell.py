"""The one place where a trial's result becomes an Optuna outcome.

Optuna's samplers learn from COMPLETE (and TPE from PRUNED) trials and ignore FAIL ones, so a configuration that
runs out of memory, cannot meet the latency limits or does not boot with its flags is a COMPLETE trial with a
violated constraint (value > 0), never a bare FAIL. FAIL is kept for what says nothing about the configuration:
another process holding the memory, a port conflict, the tuner being stopped, the server killed by a
signal autotune did not send.
"""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from autotune.engine.logs import FailureKind
from autotune.measure.trial import TrialResult
from autotune.search.record import result_attrs

# Constraint names (each <= 0 when satisfied), shown by the dashboard as the trial's constraints.
MEMORY = "memory"  # ran (or was predicted to run) out of memory


LATENCY = "latency"  # worst p95 / limit - 1 at the lowest level when no level met the limits


BOOTS = "boots"  # the configuration does not boot for a reason other than memory (1 = it did not)


CONSTRAINTS = (MEMORY, LATENCY, BOOTS)


PRUNED = "pruned: throughput clearly below the other trials' at the same load level"


_NOT_THE_CONFIGS_FAULT = (FailureKind.MEMORY_HELD, FailureKind.PORT_IN_USE, FailureKind.MODEL_NOT_FOUND,
                         FailureKind.KILLED)


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
        if result.stop_reason == PRUNED:
            passed = any(o.verdict.passed for _, o in result.levels)
            set_constraints(trial, latency=0.0 if passed else 1.0)
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
    study.tell(trial, result.throughput_tok_s, state=TrialState.COMPLETE)
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


def tell_failed(study: optuna.Study, trial: optuna.Trial, reason: str) -> None:
    trial.set_user_attr("status", "failed")
    trial.set_user_attr("reason", reason)
    study.tell(trial, state=TrialState.FAIL)
