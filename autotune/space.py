"""The search space: Optuna suggestions, baseline trials, and the engine flags a trial boots with.

Three pseudo-parameters are not vLLM flags and are folded here, in one place:
`model` (the checkpoint, so a study can choose between builds) becomes `EngineConfig.model`;
`speculative_method` ("none" or a method such as "mtp") and `num_speculative_tokens` become vLLM's
`speculative_config` dict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import optuna

    from autotune.spec import StudySpec

ParamType = Literal["int", "float", "categorical", "bool"]

MODEL = "model"
SPEC_METHOD = "speculative_method"
SPEC_TOKENS = "num_speculative_tokens"
PSEUDO_PARAMS = (MODEL, SPEC_METHOD, SPEC_TOKENS)

# The trial user attribute that marks a baseline: {"name": ..., "flags": {...}}.
BASELINE_ATTR = "baseline"


@dataclass(frozen=True)
class Param:
    """One searched flag (a vLLM dest name or a pseudo-parameter). `when` gates it on other params."""

    name: str
    type: ParamType
    low: int | float | None = None
    high: int | float | None = None
    log: bool = False
    step: int | float | None = None
    choices: tuple[object, ...] = ()
    when: dict[str, object] = field(default_factory=dict)  # {param: value or [values]}
    default: object = None  # the value vLLM uses when the flag is absent; fills baselines' params


@dataclass(frozen=True)
class Baseline:
    """A configuration booted exactly as written (on top of the study's fixed flags)."""

    name: str
    flags: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineConfig:
    """What one trial boots: the model (hub id, directory or "tiny:KIND") and vLLM flags by dest name."""

    model: str
    flags: dict[str, object]


def same_value(a: object, b: object) -> bool:
    """Equality that keeps True apart from 1 (TOML and Optuna both distinguish them)."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def condition_met(param: Param, values: Mapping[str, object]) -> bool:
    """True when every `when` entry holds for the values chosen so far."""
    for name, wanted in param.when.items():
        if name not in values:
            return False
        options = wanted if isinstance(wanted, list | tuple) else (wanted,)
        if not any(same_value(values[name], w) for w in options):
            return False
    return True


def suggest(trial: optuna.Trial, params: Sequence[Param]) -> dict[str, object]:
    """Ask the trial for each parameter in order (spec.py orders conditions before their dependents)."""
    values: dict[str, object] = {}
    for p in params:
        if not condition_met(p, values):
            continue
        if p.type == "int":
            values[p.name] = trial.suggest_int(p.name, int(p.low), int(p.high), step=int(p.step or 1), log=p.log)
        elif p.type == "float":
            values[p.name] = trial.suggest_float(p.name, float(p.low), float(p.high), step=p.step, log=p.log)
        elif p.type == "categorical":
            values[p.name] = trial.suggest_categorical(p.name, list(p.choices))
        else:
            values[p.name] = trial.suggest_categorical(p.name, [False, True])
    return values


def _merged(
    params: Mapping[str, object], fixed: Mapping[str, object], baseline: Mapping[str, object] | None
) -> dict[str, object]:
    """fixed, overlaid with the baseline's flags (a baseline trial) or else the sampled params; folded."""
    out = dict(fixed)
    out.update(baseline if baseline is not None else params)
    method = out.pop(SPEC_METHOD, None)
    tokens = out.pop(SPEC_TOKENS, None)
    if method == "none":
        out.pop("speculative_config", None)
    elif method is not None or tokens is not None:
        config = dict(out.get("speculative_config") or {})
        if method is not None:
            config["method"] = method
        if "method" not in config:
            raise ValueError(f"{SPEC_TOKENS} given without {SPEC_METHOD} or a speculative_config method")
        if tokens is not None:
            config["num_speculative_tokens"] = tokens
        out["speculative_config"] = config
    return {k: v for k, v in out.items() if v is not None}


def to_engine_flags(
    params: Mapping[str, object],
    fixed: Mapping[str, object],
    *,
    baseline: Mapping[str, object] | None = None,
) -> dict[str, object]:
    """vLLM flags (dest names) for a trial. With `baseline`, the sampled params are ignored so the
    baseline's flags are exactly what boots. The `model` pseudo-param is dropped: see engine_config."""
    flags = _merged(params, fixed, baseline)
    flags.pop(MODEL, None)
    return flags


def engine_config(
    study: StudySpec, params: Mapping[str, object], *, baseline: Mapping[str, object] | None = None
) -> EngineConfig:
    """The one call a trial makes: model (a `model` param, else the study's model) and all flags."""
    flags = _merged(params, study.fixed_flags(), baseline)
    model = flags.pop(MODEL, study.model.path)
    return EngineConfig(model=str(model), flags=flags)


def _int(flags: Mapping[str, object], key: str) -> int | None:
    v = flags.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def invalid_reason(flags: Mapping[str, object], *, model_max_len: int | None = None) -> str | None:
    """Why vLLM would refuse these flags before loading anything (vllm/config/scheduler.py,
    SchedulerConfig.verify_max_model_len; cache.py), or None. Only explicit values are judged:
    vLLM derives a missing max_num_seqs / max_num_batched_tokens so that they agree.
    `model_max_len` (the model's context) stands in for an absent max_model_len, as in vLLM."""
    seqs, batched = _int(flags, "max_num_seqs"), _int(flags, "max_num_batched_tokens")
    model_len, active = _int(flags, "max_model_len") or model_max_len, _int(flags, "max_num_active_seqs")
    if batched is not None and model_len is not None and flags.get("enable_chunked_prefill") is False:
        if batched < model_len:
            return (
                f"max_num_batched_tokens ({batched}) < max_model_len ({model_len}) with chunked prefill off: "
                "vLLM requires a whole prompt to fit in one batch"
            )
    if batched is not None and seqs is not None and batched < seqs:
        return f"max_num_batched_tokens ({batched}) must be >= max_num_seqs ({seqs})"
    if active is not None and seqs is not None and active > seqs:
        return f"max_num_active_seqs ({active}) must be <= max_num_seqs ({seqs})"
    threshold = _int(flags, "long_prefill_token_threshold")
    if threshold is not None and model_len is not None and threshold > model_len:
        return f"long_prefill_token_threshold ({threshold}) must be <= max_model_len ({model_len})"
    util = flags.get("gpu_memory_utilization")
    if isinstance(util, int | float) and not isinstance(util, bool) and not 0 < util <= 1:
        return f"gpu_memory_utilization ({util}) must be in (0, 1]"
    return None


def _in_domain(p: Param, v: object) -> bool:
    if p.type == "bool":
        return isinstance(v, bool)
    if p.type == "categorical":
        return any(same_value(v, c) for c in p.choices)
    # Numbers outside [low, high] are kept: Optuna records a fixed out-of-range value with a warning.
    if p.type == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    return isinstance(v, int | float) and not isinstance(v, bool)


def baseline_params(baseline: Baseline, params: Sequence[Param]) -> dict[str, object]:
    """The space's params as the baseline sets them, for `study.enqueue_trial`: the baseline's value,
    else the param's declared vLLM `default`; values the space cannot hold are left out (Optuna then
    samples them, but they do not reach the engine: the baseline's flags do)."""
    flags = dict(baseline.flags)
    spec_config = flags.get("speculative_config")
    if isinstance(spec_config, Mapping):  # read the pseudo-params back out of a literal speculative_config
        flags.setdefault(SPEC_METHOD, spec_config.get("method"))
        flags.setdefault(SPEC_TOKENS, spec_config.get("num_speculative_tokens"))
    values: dict[str, object] = {}
    for p in params:
        if not condition_met(p, values):
            continue
        v = flags.get(p.name) if flags.get(p.name) is not None else p.default
        if v is not None and _in_domain(p, v):
            values[p.name] = v
    return values


def enqueue_baseline(study: optuna.Study, baseline: Baseline, params: Sequence[Param]) -> None:
    """Queue a baseline trial; its flags travel in the BASELINE_ATTR user attribute."""
    attrs = {BASELINE_ATTR: {"name": baseline.name, "flags": dict(baseline.flags)}}
    study.enqueue_trial(baseline_params(baseline, params), user_attrs=attrs)


def trial_baseline(trial: optuna.Trial | optuna.trial.FrozenTrial) -> Mapping[str, object] | None:
    """The baseline flags a trial must boot with, or None for an ordinary sampled trial."""
    mark = trial.user_attrs.get(BASELINE_ATTR)
    return mark["flags"] if isinstance(mark, Mapping) else None
