"""Which configuration comes next: the sampler, and warm start from another study.

The default is random sampling after the start picks (search/start.py), with the estimator's refusals and the
screens before and after boot. Replayed on every recorded surface with the screens judged as the product judges them
and the answer re-measured (`benchmarks/search_efficiency.py`; the search-replay-* datasets, "what each part buys"),
nearly all of the gain over plain random search is the estimator's, the screens' and the picks'; TPE in place of
random sampling after the picks needed no fewer booted trials on the GPU surfaces, and on the H100 one a fifth of its
runs never reached the target where none of random sampling's failed to. It helped on one surface only, the CPU grid
at a 150 ms TTFT, whose best runs few requests at once and the picks start away from it. The simpler sampler is the
default; TPE and GP stay a study file's choice (`[sampler] name`).

No pruner between load levels: a sampled configuration is screened at the incumbent's level instead
(measure/ladder.py, Prior.screen), which stops one that cannot beat it after one short level. Constraints reach
every sampler through `trial.set_constraint` (search/tell.py), so infeasible trials teach those that learn.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import optuna
from optuna.trial import TrialState

from autotune.config.params import Param, same_value
from autotune.config.study_file import SAMPLERS
from autotune.search.record import REMEASURE_ATTR, feasible
from autotune.search.remeasure import score
from autotune.search.space import condition_met

if TYPE_CHECKING:
    from autotune.config.study_file import StudySpec
from autotune.search.record import WARM_START_ATTR

# TPE's first trials are random (the enqueued baselines, and configurations refused before boot, count among them);
# after that it models good vs bad configurations. Optuna's own default, 10, chosen on the recorded surfaces
# themselves (in sample: tpe-startup-200-seeds): three random points in 11 parameters is too little to model.
TPE_STARTUP_TRIALS = 10


GP_STARTUP_TRIALS = 5


WARM_START_TOP = 3


def sampler_for(name: str, seed: int | None, *, startup_trials: int | None = None) -> optuna.samplers.BaseSampler:
    """A sampler by the study file's name for it: the names are study_file.SAMPLERS, which the file reader
    checks; every one has a branch here (tests/unit/search/test_samplers.py builds each)."""
    if name == "tpe":
        # Multivariate TPE with groups models the conditional parameters (speculative tokens only with MTP)
        # jointly; constant_liar keeps parallel slots from proposing the same point.
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=True,
                                          n_startup_trials=TPE_STARTUP_TRIALS if startup_trials is None
                                          else startup_trials)
    if name == "gp":
        # Needs scipy and torch (torch comes with vLLM). Learns from COMPLETE trials only (not PRUNED).
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=GP_STARTUP_TRIALS if startup_trials is None
                                         else startup_trials)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"unknown sampler {name!r} (one of {', '.join(SAMPLERS)})")


def make_sampler(spec: StudySpec) -> optuna.samplers.BaseSampler:
    return sampler_for(spec.sampler.name, spec.sampler.seed)


def transfer_params(params: Mapping[str, object], space: Sequence[Param]) -> dict[str, object] | None:
    """The earlier trial's values for this study's space, or None when one of them cannot be taken here.

    Parameters this space does not search are dropped; ones the earlier study did not search take the
    parameter's declared default when the space can hold it (else the sampler fills them in)."""
    out: dict[str, object] = {}
    for p in space:
        if not condition_met(p, out):
            continue
        if p.name in params:
            v = params[p.name]
            if not p.holds(v):
                return None
            if p.type == "int":
                assert isinstance(v, int | float)  # holds() takes only a number for an int parameter
                v = int(v)
            out[p.name] = v
        elif p.default is not None and p.holds(p.default):
            out[p.name] = p.default
    return out


def _same(a: Mapping[str, object], b: Mapping[str, object]) -> bool:
    return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)


def warm_start(study: optuna.Study, source: optuna.Study, space: Sequence[Param],
               k: int = WARM_START_TOP) -> list[dict[str, object]]:
    """Queue the best `k` feasible configurations of `source` (an earlier study: another GPU, another model)
    as new trials of `study`, to be booted and measured here, not copied. Configurations that do not fit this
    study's space, and ones already tried or queued here, are skipped. Returns the queued params."""
    trials = source.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    # Re-measured medians rank the earlier study's trials when present.
    ranked = sorted((t for t in trials if feasible(t) and REMEASURE_ATTR not in t.user_attrs),
                    key=lambda t: score(t, trials), reverse=True)
    # A queued trial's params are not suggested yet: Optuna keeps them as its fixed_params.
    known = [{**t.system_attrs.get("fixed_params", {}), **t.params} for t in study.get_trials(deepcopy=False)]
    queued: list[dict[str, object]] = []
    seen_flags: set[str] = set()
    for t in ranked:
        if len(queued) >= k:
            break
        flags = json.dumps(t.user_attrs.get("flags"), sort_keys=True)
        params = transfer_params(t.params, space)
        if params is None or flags in seen_flags or any(_same(params, p) for p in known):
            continue
        seen_flags.add(flags)
        # A baseline of the earlier study comes as its params (its flags may not suit this model or GPU).
        attrs = {WARM_START_ATTR: {"study": source.study_name, "trial": t.number, "output_throughput": t.value}}
        study.enqueue_trial(params, user_attrs=attrs)
        known.append(params)
        queued.append(params)
    return queued
