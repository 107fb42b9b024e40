"""The settings autotune's search defaults were chosen among (search_efficiency --tuning): TPE's start-up, a Sobol
start, the start picks' count and candidates, and Optuna's pruners. They were chosen on the recorded surfaces the
replay scores: in sample, which the out-of-sample plan (benchmarks/data/rtx3090-long-context-surface-plan) is for."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import optuna
from optuna.trial import TrialState

from autotune.search.samplers import sampler_for
from benchmarks.replay import Method


class SobolStartTPE(optuna.samplers.BaseSampler):
    """autotune's TPE whose first `n` proposals are scrambled Sobol points instead of random ones: a space-filling
    start, tried against the random one."""

    def __init__(self, seed: int, n: int) -> None:
        self.qmc = optuna.samplers.QMCSampler(seed=seed, scramble=True, warn_independent_sampling=False,
                                              warn_asynchronous_seeding=False)
        self.tpe = sampler_for("tpe", seed, startup_trials=n)
        self.n = n

    def _now(self, study: optuna.Study) -> optuna.samplers.BaseSampler:
        told = study._get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED), use_cache=True)
        return self.qmc if len(told) < self.n else self.tpe

    def infer_relative_search_space(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> dict:
        return self._now(study).infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, space: dict) -> dict:
        return self._now(study).sample_relative(study, trial, space)

    def sample_independent(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, name: str,
                           distribution: optuna.distributions.BaseDistribution) -> object:
        return self._now(study).sample_independent(study, trial, name, distribution)

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self.tpe.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self.tpe.after_trial(study, trial, state, values)


def tuning_methods() -> list[Method]:
    """The settings the defaults were chosen among, without baselines (with them, every method meets the target at
    the first trial on the CPU surface and nothing can be told apart), and the start-ups chosen between with them."""
    P = optuna.pruners.PercentilePruner

    def tpe_startup(n: int) -> Callable[[int], optuna.samplers.BaseSampler]:  # binds n: each method keeps its own
        return lambda seed: sampler_for("tpe", seed, startup_trials=n)

    out = [Method(f"TPE startup {n}", tpe_startup(n), baselines=False) for n in (2, 3, 5, 10)]
    # as autotune runs a study that has baselines
    out += [Method(f"TPE startup {n}, baselines first", tpe_startup(n)) for n in (3, 10)]
    out += [Method(f"TPE, Sobol startup {n}", (lambda n: lambda seed: SobolStartTPE(seed, n))(n),  # noqa: B023
                   baselines=False) for n in (3, 5, 10)]
    out.append(Method("random search + estimator + screening", lambda seed: sampler_for("random", seed),
                      baselines=False))
    tpe = lambda seed: sampler_for("tpe", seed)  # noqa: E731
    # search/start.py: the first `picks` sampled trials each the one of `of` random ones that runs the most at once
    for picks, of in itertools.product((1, 3, 10), (4, 16, 64, 256)):
        for baselines in (False, True):
            out.append(Method(f"start: pick {picks} of {of}" + (", baselines first" if baselines else ""), tpe,
                              baselines=baselines, start_picks=picks, start_candidates=of))
    for label, pruner in [
        ("Percentile(25) = keep top quarter, warmup 1", lambda: P(25.0, n_startup_trials=5, n_warmup_steps=1)),
        ("Percentile(75) = prune bottom quarter, warmup 1", lambda: P(75.0, n_startup_trials=5, n_warmup_steps=1)),
        ("Median, warmup 1", lambda: optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=1)),
    ]:
        out.append(Method(f"TPE + {label}", tpe, baselines=False, pruner=pruner))
    return out


