"""The one place where a trial's result becomes an Optuna outcome.

Optuna's samplers learn from COMPLETE (and TPE from PRUNED) trials and ignore FAIL ones, so a configuration that
runs out of memory, cannot meet the latency limits or does not boot with its flags is a COMPLETE trial with a
violated constraint (value > 0), never a bare FAIL. FAIL is kept for what says nothing about the configuration:
another process holding the memory, a port conflict, the tuner being stopped, the server killed by a
signal autotune did not send.
"""

from __future__ import annotations

import json
from typing import Mapping

import optuna
from optuna.trial import TrialState

from autotune.engine import FailureKind
from autotune.export import serve_command
from autotune.trial import TrialResult

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


def result_attrs(result: TrialResult) -> dict[str, object]:
    """User attributes of a measured trial, with units in their names."""
    attrs: dict[str, object] = {
        "status": result.status,
        "duration_s": round(result.duration_s, 1),
        "output_tok_s": round(result.throughput_tok_s, 1),
    }
    if result.reason:
        attrs["reason"] = result.reason
    if result.failure is not None:
        attrs["failure_kind"] = result.failure.kind.value
        attrs["failure_excerpt"] = result.failure.excerpt[-1500:]
    if result.boot is not None:
        attrs["boot_s"] = round(result.boot.boot_s, 1)
        if result.boot.kv_cache_tokens is not None:
            attrs["kv_cache_tokens"] = result.boot.kv_cache_tokens
        if result.boot.weights_gib is not None:
            attrs["weights_gib"] = result.boot.weights_gib
    if result.memory is not None:
        attrs["peak_memory_gib"] = round(result.memory.peak_bytes / 2**30, 3)
        attrs["memory_source"] = result.memory.source
    best = result.best
    if best is not None:
        s = best.stats
        attrs.update({
            "best_level": result.best_level,
            "req_s": round(s.req_s, 3),
            "ttft_p95_ms": round(s.ttft.p95_ms, 1),
            "tpot_p95_ms": round(s.tpot.p95_ms, 2),
            "itl_p95_ms": round(s.itl.p95_ms, 2),
            "e2e_p95_ms": round(s.e2el.p95_ms, 1),
        })
    attrs["levels"] = [
        {**o.stats.to_dict(), "passed": o.verdict.passed} for _, o in sorted(result.levels, key=lambda lv: lv[0])
    ]
    if result.log_path is not None:
        attrs["log_path"] = str(result.log_path)
    if result.log_error:
        attrs["log_error"] = result.log_error
    return attrs


def config_attrs(model: str, flags: Mapping[str, object], env: Mapping[str, str] | None = None) -> dict[str, object]:
    """What the trial boots with, recorded with it: `export` reads these, not a study file edited since."""
    env = dict(sorted((env or {}).items()))
    return {"model": model, "flags": json.dumps(dict(flags), sort_keys=True), "env": json.dumps(env),
            "vllm_command": serve_command(model, flags, env)}


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
