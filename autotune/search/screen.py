"""Screening before boot: what a sampled configuration runs at once, as the estimator predicts it, and whether
at the incumbent's level it must fail (measure/queueing.py), so that it is refused without a boot; and where a
trial's load search starts (ladder.Prior)."""

from __future__ import annotations

from collections.abc import Sequence

import optuna

from autotune.config.study_file import StudySpec
from autotune.engine.flags import invalid_reason
from autotune.fit import feasibility
from autotune.fit.estimate import Estimate
from autotune.fit.hardware import GpuProfile
from autotune.measure.ladder import Prior, capacity
from autotune.measure.plan import configured
from autotune.measure.queueing import cannot_sustain, holds_too_few
from autotune.search import noise
from autotune.search.record import REMEASURE_ATTR, feasible, trial_baseline, view
from autotune.search.remeasure import best_trial, spread
from autotune.search.space import engine_config


def runs_at_once(spec: StudySpec, profile: GpuProfile, model: str | None, params: dict[str, object],
                 seen: Sequence[feasibility.Observation] = ()) -> float | None:
    """How many requests a sampled configuration runs at once, as the estimator predicts (ladder.capacity with
    its central KV cache's bound, estimate.running_seqs); None when it would be refused before boot. `model`
    replaces the configuration's."""
    judged = judge_sampled(spec, profile, model, params, seen)
    return None if judged is None else _runs_as_booted(spec, *judged)


def judge_sampled(spec: StudySpec, profile: GpuProfile, model: str | None, params: dict[str, object],
                  seen: Sequence[feasibility.Observation] = ()) -> tuple[dict[str, object], Estimate] | None:
    """A sampled configuration's flags as it boots (measure/plan.configured) and the estimator's estimate of it,
    as search/one_trial.py judges it before boot; None when vLLM would reject it or it is predicted not to fit.
    What screen_before_boot is given, here and in the replay of a recorded surface."""
    config = engine_config(spec, params)
    path, flags = configured(model or config.model, config.flags)
    if invalid_reason(flags):
        return None
    verdict = feasibility.judge(path, profile, flags, spec.env, seen, spec.vllm_version)
    return (flags, verdict.estimate) if verdict.fits else None


def _runs_as_booted(spec: StudySpec, flags: dict[str, object], estimate: Estimate) -> float | None:
    """_holds_at_once with the estimate's central KV cache: what the configuration runs at once as booted."""
    return _holds_at_once(spec, flags, estimate.kv_tokens, estimate.running_seqs or None)


def _holds_at_once(spec: StudySpec, flags: dict[str, object], kv_tokens: int | None,
                   running: int | None = None) -> float | None:
    """ladder.capacity of a configuration's flags for the study's mean request."""
    seqs, context = flags.get("max_num_seqs"), flags.get("max_model_len")
    per_request = spec.objective.workload.mean_request_tokens(context if isinstance(context, int) else None)
    return capacity(float(seqs) if isinstance(seqs, int | float) else None, kv_tokens, per_request, running)


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
    return holds_too_few(prior.incumbent, runs, o.limits, prior.noise)


def load_prior(study: optuna.Study, trial: optuna.Trial, flags: dict[str, object], spec: StudySpec,
               kv_tokens: int | None) -> Prior:
    """Where this trial's load search starts (ladder.Prior): the incumbent's best level, the best levels of the
    measured configurations that differ from this one in the fewest parameters, and what this configuration
    holds at once. A sampled configuration is screened at the incumbent's level; a baseline (a reference the
    user reads) and a re-measurement (of the incumbent's figure) are searched in full, the latter from its own
    first best level, measured exactly at once (it is most often the answer: measured once, not twice). The
    screen before boot allows for this machine's noise once it is measured well enough (noise.screen_noise)."""
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
                 exact_first=original is not None, noise=noise.screen_noise(spread(study.get_trials(deepcopy=False))))
