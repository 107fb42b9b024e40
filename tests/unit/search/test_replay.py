"""The search-efficiency replay's bookkeeping (benchmarks/search_efficiency.py on benchmarks/surface.py), on a small
surface written here whose best and costs are known: trials and minutes until within 5% of the best, the anytime
curve, what a configuration that does not fit costs, and the vLLM auto_tune grid order."""

from __future__ import annotations

import json
import math
from pathlib import Path

import optuna
import pytest

from benchmarks import search_efficiency as se
from benchmarks.surface import load_surface

BOOT_S, RUNG_S, FAIL_WALL_S = 10.0, 5.0, 30.0


def _measured(seqs: int, tokens: int, tok_s: float) -> dict:
    """One configuration measured at one rung that passed: costs BOOT_S + RUNG_S."""
    level = {"concurrency": 4, "passed": tok_s > 0, "misses": {} if tok_s > 0 else {"ttft_p95_ms": 2.0},
             "duration_s": RUNG_S, "output_tok_s": tok_s, "records": []}
    return {"params": {"max_num_seqs": seqs, "max_num_batched_tokens": tokens}, "status": "measured",
            "refused": None, "boot_s": BOOT_S, "wall_s": BOOT_S + RUNG_S, "levels": [level]}


def _surface(tmp_path: Path) -> Path:
    """max_num_seqs 1..8 x max_num_batched_tokens 64, 128. The best is (4, 128) at 400 tok/s; (8, 128) is within 5%
    (390); (8, 64) does not fit (refused before boot by the estimator; booted, it fails after FAIL_WALL_S); (1, 64)
    meets no limit. Baseline: (2, 64)."""
    configs = [_measured(1, 64, 0.0), _measured(1, 128, 100.0), _measured(2, 64, 150.0), _measured(2, 128, 200.0),
               _measured(4, 64, 300.0), _measured(4, 128, 400.0), _measured(8, 128, 390.0),
               {"params": {"max_num_seqs": 8, "max_num_batched_tokens": 64}, "status": "boot_failed",
                "refused": "KV cache does not fit", "failure_kind": "oom", "boot_s": FAIL_WALL_S,
                "wall_s": FAIL_WALL_S, "levels": []}]
    configs[2]["baseline"] = "recipe"
    space = [{"name": "max_num_seqs", "type": "int", "low": 1, "high": 8, "log": True},
             {"name": "max_num_batched_tokens", "type": "int", "low": 64, "high": 128, "log": True}]
    doc = {"format": 2, "provenance": {"limits": {"ttft_p95_ms": 500.0}, "space": space}, "configs": configs}
    path = tmp_path / "surface.json"
    path.write_text(json.dumps(doc))
    return path


def test_auto_tune_order_counts_trials_minutes_and_the_infeasible_share(tmp_path: Path) -> None:
    surface = load_surface(_surface(tmp_path))
    order = [(p.params["max_num_seqs"], p.params["max_num_batched_tokens"]) for p in surface.auto_tune_order()]
    assert order == [(1, 64), (1, 128), (2, 64), (2, 128), (4, 64), (4, 128), (8, 64), (8, 128)]
    fig = se.figures(se.grid(surface.auto_tune_order()), 0.95 * surface.best, surface.best, (1, 2, 5, 6))
    assert surface.best == 400.0
    assert fig.trials == 6  # (4, 128) is the sixth booted
    assert fig.minutes == pytest.approx(6 * (BOOT_S + RUNG_S) / 60)
    assert fig.infeasible_share == pytest.approx(1 / 6)  # only (1, 64) met no limit before the target
    assert fig.anytime == pytest.approx((0.0, 100 / 400, 300 / 400, 1.0))
    # the run's first 6 trials: the same; a failed boot after the target does not count towards it
    assert fig.infeasible_share_all == pytest.approx(1 / 6)


def test_a_configuration_that_does_not_fit_costs_its_boot_unless_the_estimator_refuses_it(tmp_path: Path) -> None:
    surface = load_surface(_surface(tmp_path))
    oom = surface.nearest({"max_num_seqs": 8, "max_num_batched_tokens": 64})
    assert oom.refused is not None and not oom.feasible
    booted = se.Method("boots it", lambda s: optuna.samplers.RandomSampler(s), estimator=False, constraints=False)
    refused = se.Method("estimator", lambda s: optuna.samplers.RandomSampler(s))
    for method, cost in ((booted, FAIL_WALL_S), (refused, None)):
        study = optuna.create_study(direction="maximize")
        step = se.tell(study, study.ask(), oom, method)
        assert (step.cost_s if step else None) == cost
    # a booted failure counts as a trial and as infeasible time
    fig = se.figures([se.Step(oom, oom.cost_s(), 0.0, False), *se.grid([surface.points[5]])], 380.0, 400.0, (1, 2))
    assert (fig.trials, fig.minutes, fig.anytime) == (2, pytest.approx((FAIL_WALL_S + BOOT_S + RUNG_S) / 60),
                                                      (0.0, 1.0))
    assert fig.infeasible_share == pytest.approx(FAIL_WALL_S / (FAIL_WALL_S + BOOT_S + RUNG_S))


def test_a_replayed_study_stops_at_the_first_trial_within_5_percent(tmp_path: Path) -> None:
    surface = load_surface(_surface(tmp_path))
    target = 0.95 * surface.best
    random_search = se.Method("random", lambda s: optuna.samplers.RandomSampler(s), baselines=False,
                              constraints=False, estimator=False)
    for seed in range(5):
        steps = se.replay(surface, random_search, seed, target)
        fig = se.figures(steps, target, surface.best, (len(steps),))
        assert steps[-1].found >= target and all(s.found < target for s in steps[:-1])
        assert fig.trials == len(steps) and fig.anytime == (steps[-1].point.value / 400,)
        assert fig.minutes == pytest.approx(sum(s.cost_s for s in steps) / 60)


def test_baselines_are_booted_first_and_refusals_are_no_trials(tmp_path: Path) -> None:
    surface = load_surface(_surface(tmp_path))
    default = se.Method("default", lambda s: optuna.samplers.RandomSampler(s), pruner=None)
    steps = se.replay(surface, default, 0, math.inf, max_booted=12)
    assert steps[0].point.baseline == "recipe"
    assert len(steps) == 12 and all(s.point.refused is None for s in steps)


def test_nearest_snaps_in_log_scale(tmp_path: Path) -> None:
    surface = load_surface(_surface(tmp_path))
    assert surface.nearest({"max_num_seqs": 3, "max_num_batched_tokens": 100}).params == {
        "max_num_seqs": 4, "max_num_batched_tokens": 128}  # log2: 3 is nearer to 4, 100 to 128
    assert surface.nearest({"max_num_seqs": 1, "max_num_batched_tokens": 80}).params == {
        "max_num_seqs": 1, "max_num_batched_tokens": 64}



def test_a_configuration_booted_cold_then_warm_costs_both_boots(tmp_path: Path) -> None:
    cold_s = 115.0
    warm = _measured(4, 128, 400.0)
    missed = {**warm["levels"][0], "concurrency": 8, "passed": False, "misses": {"ttft_p95_ms": 2.0}}
    doc = json.loads(_surface(tmp_path).read_text())
    doc["configs"] = [{**warm, "levels": [*warm["levels"], missed], "cold_boot": {"status": "booted",
                       "boot_s": cold_s}, "wall_s": cold_s + BOOT_S + 2 * RUNG_S}]
    path = tmp_path / "cold.json"
    path.write_text(json.dumps(doc))
    (point,) = load_surface(path).points
    assert point.boot_s == cold_s + BOOT_S
    # the first level costs both boots and itself: the cold boot is not spread over the levels as overhead
    assert point.cost_s(1) == pytest.approx(cold_s + BOOT_S + RUNG_S)
