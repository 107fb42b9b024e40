"""The search space: Optuna suggestions, baseline trials, and the engine flags a trial boots with.

Three pseudo-parameters are not vLLM flags and are folded here, in one place:
`model` (the checkpoint, so a study can choose between builds) becomes `EngineConfig.model`;
`speculative_method` ("none" or a method such as "mtp") and `num_speculative_tokens` become vLLM's
`speculative_config` dict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import optuna

    from autotune.config.study_file import StudySpec
from autotune.config.params import Baseline, Param, same_value
from autotune.engine.compile_cache import capture_pin
from autotune.engine.flags import MODEL, SPEC_METHOD, SPEC_TOKENS, merged_flags
from autotune.search.record import BASELINE_ATTR


@dataclass(frozen=True)
class EngineConfig:
    """What one trial boots: the model (hub id, directory or "tiny:KIND") and vLLM flags by dest name."""

    model: str
    flags: dict[str, object]


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
    """Ask the trial for each parameter in order (config/params.py in_dependency_order puts conditions before
    their dependents)."""
    values: dict[str, object] = {}
    for p in params:
        if not condition_met(p, values):
            continue
        if p.type == "int":
            assert p.low is not None and p.high is not None  # the study file requires both for a number
            values[p.name] = trial.suggest_int(p.name, int(p.low), int(p.high), step=int(p.step or 1), log=p.log)
        elif p.type == "float":
            assert p.low is not None and p.high is not None
            values[p.name] = trial.suggest_float(p.name, float(p.low), float(p.high), step=p.step, log=p.log)
        elif p.type == "categorical":
            # the study file admits only bool, int, float and str choices: optuna's CategoricalChoiceType
            values[p.name] = trial.suggest_categorical(p.name, list(p.choices))  # type: ignore[arg-type]
        else:
            values[p.name] = trial.suggest_categorical(p.name, [False, True])
    return values


def engine_config(
    study: StudySpec, params: Mapping[str, object], *, baseline: Mapping[str, object] | None = None
) -> EngineConfig:
    """The one call a trial makes: model (a `model` param, else the study's model) and all flags. A sampled
    trial of a space that varies max_num_seqs gets the study's one CUDA-graph capture size (compile_cache.py: so
    that its boot finds the compiled graphs of the others); a baseline boots exactly its own flags."""
    flags = merged_flags(params, study.fixed_flags(), baseline)
    model = flags.pop(MODEL, study.model.path)
    if baseline is None:
        flags = capture_pin(flags, _largest(study.space, "max_num_seqs"), _largest(study.space, SPEC_TOKENS) or 0)
    return EngineConfig(model=str(model), flags=flags)


def _largest(space: Sequence[Param], name: str) -> int | None:
    """The largest value a searched int parameter can take; None when the space does not vary it."""
    for p in space:
        if p.name == name and p.type == "int" and p.high is not None:
            return int(p.high)
        if p.name == name and p.type == "categorical" and len(p.choices) > 1:
            numbers = [int(c) for c in p.choices if isinstance(c, int | float) and not isinstance(c, bool)]
            return max(numbers, default=None)
    return None


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
        if v is not None and p.holds(v, in_range=False):
            values[p.name] = v
    return values


def enqueue_baseline(study: optuna.Study, baseline: Baseline, params: Sequence[Param]) -> None:
    """Queue a baseline trial; its flags travel in the BASELINE_ATTR user attribute."""
    attrs = {BASELINE_ATTR: {"name": baseline.name, "flags": dict(baseline.flags)}}
    study.enqueue_trial(baseline_params(baseline, params), user_attrs=attrs)
