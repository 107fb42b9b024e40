"""Samplers and pruner by name, warm start from an earlier study, and the replay objective of
benchmarks/search_efficiency.py (a recorded surface looked up with outcome.py's constraint semantics)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.config.params import Param
from autotune.config.study_file import load_study
from autotune.measure.stats import Limits, read_limits
from autotune.search import tell
from autotune.search.record import WARM_START_ATTR
from autotune.search.samplers import (
    GP_STARTUP_TRIALS,
    make_sampler,
    sampler_for,
    transfer_params,
    warm_start,
)
from benchmarks import replay as rp
from benchmarks import replay_figures as rf
from benchmarks import search_efficiency as se
from benchmarks import surface as sf

ROOT = Path(__file__).resolve().parents[2]


def test_samplers_by_name_and_the_study_default():
    assert isinstance(sampler_for("tpe", 1), optuna.samplers.TPESampler)
    assert isinstance(sampler_for("gp", 1), optuna.samplers.GPSampler)
    assert isinstance(sampler_for("random", 1), optuna.samplers.RandomSampler)
    with pytest.raises(ValueError):
        sampler_for("cmaes", 1)
    assert isinstance(make_sampler(load_study(ROOT / "studies" / "tiny-cpu.toml")), optuna.samplers.RandomSampler)


def test_a_seeded_sampler_repeats_itself():
    def first_params(seed):
        study = optuna.create_study(sampler=sampler_for("tpe", seed))
        return [study.ask().suggest_int("x", 1, 64, log=True) for _ in range(6)]

    assert first_params(3) == first_params(3)


def test_the_gp_sampler_models_past_its_random_startup():
    """`[sampler] name = "gp"` works with what autotune installs (it needs scipy), seeded and repeatable."""
    def proposals(seed):
        study = optuna.create_study(direction="maximize", sampler=sampler_for("gp", seed))
        out = []
        for _ in range(GP_STARTUP_TRIALS + 3):
            trial = study.ask()
            x = trial.suggest_int("x", 1, 64, log=True)
            tell.set_constraints(trial, latency=0.0 if x <= 32 else 1.0)
            study.tell(trial, -abs(math.log2(x) - 3))
            out.append(x)
        return out

    first = proposals(0)
    assert first == proposals(0)
    assert len(first) == GP_STARTUP_TRIALS + 3


# --- warm start -----------------------------------------------------------------------------------------------

SPACE = (
    Param("max_num_seqs", "int", low=1, high=64, log=True, default=128),
    Param("max_num_batched_tokens", "int", low=64, high=4096, log=True, default=2048),
    Param("enable_chunked_prefill", "bool", default=True),
)


def test_transfer_keeps_what_fits_fills_defaults_and_drops_the_rest():
    assert transfer_params({"max_num_seqs": 16, "max_num_batched_tokens": 512, "kv_cache_dtype": "fp8"}, SPACE) == {
        "max_num_seqs": 16, "max_num_batched_tokens": 512, "enable_chunked_prefill": True}
    assert transfer_params({"max_num_seqs": 128}, SPACE) is None  # outside this space's range
    assert transfer_params({"max_num_seqs": 16.5}, SPACE) is None
    assert transfer_params({"enable_chunked_prefill": 1}, SPACE) is None  # 1 is not a bool here


def earlier_study() -> optuna.Study:
    """Six trials: feasible at 900, 1200 (twice: the same flags), 700 and 1500 (seqs 128: not in the new
    space); one infeasible that 'measured' 2000."""
    study = optuna.create_study(study_name="earlier", direction="maximize")
    rows = [(8, 512, 900.0, True), (16, 1024, 1200.0, True), (16, 1024, 1190.0, True), (4, 256, 700.0, True),
            (128, 2048, 1500.0, True), (32, 4096, 2000.0, False)]
    for seqs, tokens, value, ok in rows:
        study.enqueue_trial({"max_num_seqs": seqs, "max_num_batched_tokens": tokens})
        t = study.ask()
        t.suggest_int("max_num_seqs", 1, 256, log=True)
        t.suggest_int("max_num_batched_tokens", 64, 8192, log=True)
        t.set_user_attr("flags", json.dumps({"max_num_seqs": seqs, "max_num_batched_tokens": tokens}))
        tell.set_constraints(t, latency=0.0 if ok else 0.4)
        study.tell(t, value)
    return study


def test_warm_start_queues_the_best_feasible_configurations_that_fit():
    source = earlier_study()
    study = optuna.create_study(study_name="new", direction="maximize")
    study.enqueue_trial({"max_num_seqs": 4, "max_num_batched_tokens": 256, "enable_chunked_prefill": True})
    queued = warm_start(study, source, SPACE, k=3)
    # 2000 is infeasible, 1500 has 128 seqs (outside 1..64), 1200 and 1190 are one configuration, 700 is here
    # already: what is left, best first, is 1200 and 900.
    assert queued == [{"max_num_seqs": 16, "max_num_batched_tokens": 1024, "enable_chunked_prefill": True},
                      {"max_num_seqs": 8, "max_num_batched_tokens": 512, "enable_chunked_prefill": True}]
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert [t.user_attrs.get(WARM_START_ATTR, {}).get("trial") for t in waiting] == [None, 1, 0]
    assert warm_start(study, source, SPACE, k=3) == []  # run again (a resumed study): nothing twice
    first = study.ask()  # what was queued before (the baselines) runs first
    assert first.suggest_int("max_num_seqs", 1, 64, log=True) == 4


# --- the replay objective -------------------------------------------------------------------------------------


def rung(c, passed, tok_s, misses=None, duration=5.0):
    return {"concurrency": c, "passed": passed, "output_tok_s": tok_s, "misses": misses or {},
            "duration_s": duration}


SURFACE = {
    "provenance": {"started": "test"},
    "configs": [
        # measured: passes 4 and 8, misses at 16 -> 300 tok/s; 40 s boot, 5 s per rung, 15 s of warm-ups and stop
        {"max_num_seqs": 8, "max_num_batched_tokens": 64, "status": "measured", "precheck": None, "boot_s": 40.0,
         "wall_s": 70.0, "levels": [rung(4, True, 200.0), rung(8, True, 300.0),
                                    rung(16, False, 350.0, {"ttft_p95_ms": 1.4})]},
        # misses at the lowest rung: infeasible by latency (worst miss 1.8 -> constraint 0.8)
        {"max_num_seqs": 1, "max_num_batched_tokens": 64, "status": "measured", "precheck": None, "boot_s": 40.0,
         "wall_s": 50.0, "levels": [rung(4, False, 100.0, {"ttft_p95_ms": 1.8, "tpot_p95_ms": 1.1})]},
        # rejected by vLLM (and by autotune before boot)
        {"max_num_seqs": 128, "max_num_batched_tokens": 64, "status": "boot_failed", "boot_s": 12.0,
         "wall_s": 14.0, "precheck": "max_num_batched_tokens (64) must be >= max_num_seqs (128)"},
        # passes everything: the best
        {"max_num_seqs": 8, "max_num_batched_tokens": 512, "status": "measured", "precheck": None, "boot_s": 40.0,
         "wall_s": 65.0, "levels": [rung(4, True, 210.0), rung(8, True, 320.0), rung(16, True, 400.0)]},
    ],
}


@pytest.fixture
def surface(tmp_path: Path) -> sf.Surface:
    path = tmp_path / "surface.json"
    path.write_text(json.dumps(SURFACE))
    return sf.load_surface(path)


def at(surface: sf.Surface, seqs: float, tokens: float) -> sf.Point:
    return surface.nearest({"max_num_seqs": seqs, "max_num_batched_tokens": tokens})


def test_surface_values_costs_and_snapping(surface):
    p = at(surface, 8, 64)
    assert (p.value, p.feasible) == (300.0, True)
    # (70 - 40 - 15) / 3 = 5 s of warm-up and stop per rung; it failed at 16 after passing 8: two bisection
    # levels follow, each the mean of the two rungs (5 s) plus 5 s
    assert p.schedule() == [(200.0, 10.0), (300.0, 10.0), (300.0, 10.0), (300.0, 10.0), (300.0, 10.0)]
    assert p.cost_s() == 90.0 and p.cost_s(1) == pytest.approx(40 + 5 + 5)
    assert (at(surface, 1, 64).value, at(surface, 1, 64).feasible) == (0.0, False)
    assert not at(surface, 128, 64).feasible
    assert surface.best == 400.0
    assert at(surface, 6, 100).params["max_num_batched_tokens"] == 64  # log2: 100 is nearer 64 than 512
    assert at(surface, 6, 181).params["max_num_batched_tokens"] == 64  # sqrt(64 * 512) = 181.02: the middle in log2
    assert at(surface, 6, 182).params["max_num_batched_tokens"] == 512
    seqs = lambda s: at(surface, s, 64).params["max_num_seqs"]  # noqa: E731
    assert seqs(2.83) == 8 and seqs(2.82) == 1  # sqrt(8) = 2.828
    assert seqs(31) == 8 and seqs(33) == 128  # sqrt(8 * 128) = 32


def test_the_recorded_surface_judged_again_under_tighter_limits():
    """Re-judging each rung from its per-request records reproduces every recorded verdict under the recorded
    limits; a tighter TTFT limit ends ladders earlier (never later) and a looser one is refused."""
    doc = json.loads(se.SURFACE.read_text())
    recorded = read_limits(doc["provenance"]["limits"])  # recorded under the old names
    levels = [lv for c in doc["configs"] for lv in c.get("levels", [])]
    assert len(levels) > 50
    for lv in levels:  # the records' times are rounded to 0.1 ms: the ratios agree to well within 1%
        passed, misses = sf.rejudge(lv, recorded)
        assert passed == lv["passed"] and misses == pytest.approx(lv["misses"], rel=0.01)
    as_recorded = sf.load_surface(se.SURFACE)
    tight = sf.load_surface(se.SURFACE, Limits(p95_ttft_ms=150.0, p95_tpot_ms=50.0))
    assert tight.provenance["limits"] == {"p95_ttft_ms": 150.0, "p95_tpot_ms": 50.0}
    for p, q in zip(as_recorded.points, tight.points, strict=True):
        assert len(q.rungs) <= len(p.rungs) and q.value <= p.value
        assert all(r.passed for r in q.rungs[:-1])
    assert tight.best < as_recorded.best
    with pytest.raises(ValueError, match="looser"):
        sf.load_surface(se.SURFACE, Limits(p95_ttft_ms=900.0, p95_tpot_ms=50.0))


def told(surface, key, method=None, pruner=None):
    """One replayed trial on a fresh study: (step, frozen trial)."""
    m = method or rp.Method("t", lambda s: optuna.samplers.RandomSampler(seed=s), pruner=pruner)
    study = optuna.create_study(direction="maximize", pruner=pruner() if pruner else optuna.pruners.NopPruner())
    trial = study.ask()
    step = rp.tell(study, trial, at(surface, *key), m)
    return step, study.trials[-1]


def test_replayed_outcomes_are_outcome_py_outcomes(surface):
    step, t = told(surface, (8, 64))
    assert (t.state, t.value, t.constraints, step.cost_s) == (TrialState.COMPLETE, 300.0, {
        tell.MEMORY: 0.0, tell.LATENCY: 0.0, tell.BOOTS: 0.0}, 90.0)
    assert t.intermediate_values == {0: 200.0, 1: 300.0, 2: 300.0, 3: 300.0, 4: 300.0}  # best passing so far
    step, t = told(surface, (1, 64))
    assert (t.value, t.constraints[tell.LATENCY], step.found) == (0.0, pytest.approx(0.8), 0.0)
    step, t = told(surface, (128, 64))
    assert step is None and t.constraints[tell.BOOTS] == 1.0 and t.value == 0.0  # refused before boot: free
    plain = rp.Method("plain", lambda s: optuna.samplers.RandomSampler(seed=s), constraints=False)
    step, t = told(surface, (1, 64), plain)
    assert t.state == TrialState.FAIL and not t.constraints


def test_a_pruned_replay_costs_only_the_rungs_it_measured(surface):
    study = optuna.create_study(direction="maximize",
                                pruner=optuna.pruners.ThresholdPruner(lower=250.0, n_warmup_steps=0))
    m = rp.Method("p", lambda s: optuna.samplers.RandomSampler(seed=s), pruner=lambda: None)
    step = rp.tell(study, study.ask(), at(surface, 8, 64), m)
    t = study.trials[-1]
    assert step.pruned and t.state == TrialState.PRUNED and step.cost_s == pytest.approx(50.0)
    assert t.constraints[tell.LATENCY] == 0.0  # it had passed a rung


def test_replay_runs_until_the_target_and_the_grid_boots_everything(surface):
    target = 0.95 * surface.best
    steps = rp.replay(surface, rp.Method("r", lambda s: optuna.samplers.RandomSampler(seed=s), baselines=False),
                      seed=0, target=target, max_booted=50)
    assert steps[-1].found == 400.0 and all(s.point.refused is None for s in steps)
    f = rf.figures(rp.Run(steps, True), target)
    assert f.trials == len(steps) and f.minutes == pytest.approx(sum(s.cost_s for s in steps) / 60)
    order = surface.auto_tune_order()  # (1, 64), (8, 64), (8, 512), (128, 64)
    g = rf.figures(rp.run(rp.grid(order), target, None), target)
    assert g.trials == 3 and g.minutes == pytest.approx((50 + 90 + 65) / 60)
    assert g.infeasible_share == pytest.approx(50 / (50 + 90 + 65))
    never = rf.figures(rp.run(rp.grid([at(surface, 1, 64), at(surface, 128, 64)]), target, None), target)
    assert math.isinf(never.trials)


def test_run_from_study_queues_the_earlier_best_after_the_baselines(tmp_path):
    from autotune.cli.search import warm_start_from
    from autotune.search.record import BASELINE_ATTR

    study_file = tmp_path / "tiny-cpu.toml"
    study_file.write_text((ROOT / "studies" / "tiny-cpu.toml").read_text()
                          .replace("../objectives/", f"{ROOT}/objectives/"))
    spec = load_study(study_file)
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    earlier = optuna.create_study(study_name="earlier", storage=url, direction="maximize")
    for seqs, tokens, value in ((32, 512, 2500.0), (8, 256, 1500.0)):
        earlier.enqueue_trial({"max_num_seqs": seqs, "max_num_batched_tokens": tokens})
        t = earlier.ask()
        t.suggest_int("max_num_seqs", 1, 64, log=True)
        t.suggest_int("max_num_batched_tokens", 64, 4096, log=True)
        t.set_user_attr("flags", json.dumps({"max_num_seqs": seqs, "max_num_batched_tokens": tokens}))
        tell.set_constraints(t)
        earlier.tell(t, value)
    warm_start_from(spec, url, "earlier", None)
    study = optuna.load_study(study_name=spec.name, storage=url)
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert [t.user_attrs.get(BASELINE_ATTR, {}).get("name") for t in waiting[:2]] == ["vllm-defaults", "recipe"]
    assert [t.user_attrs[WARM_START_ATTR]["trial"] for t in waiting[2:]] == [0, 1]
    # params this study searches and the earlier did not take their declared (vLLM) defaults
    assert waiting[2].system_attrs["fixed_params"] == {"max_num_seqs": 32, "max_num_batched_tokens": 512,
                                                       "enable_chunked_prefill": True, "enable_prefix_caching": True,
                                                       "max_model_len": 8192}
    from autotune.errors import SpecError
    with pytest.raises(SpecError):
        warm_start_from(spec, url, spec.name, None)


def test_every_sampler_name_a_study_file_accepts_builds_a_sampler():
    """The names live in study_file.SAMPLERS; sampler_for has a branch for each and refuses any other."""
    from autotune.config.study_file import SAMPLERS
    from autotune.search.samplers import sampler_for

    built = {name: type(sampler_for(name, seed=0)).__name__ for name in SAMPLERS}
    assert built == {"tpe": "TPESampler", "gp": "GPSampler", "random": "RandomSampler"}
    with pytest.raises(ValueError, match="one of tpe, gp, random"):
        sampler_for("cmaes", seed=0)
