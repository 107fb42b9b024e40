"""What the run bought, the report's first panel: the gain over each baseline (paired where the comparison measured
it), the best figure against the study's elapsed time, and what more time would add. On real Optuna studies in
SQLite, with trials added at known times (no engine)."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from autotune.search import paired
from autotune.search.budget import Budget, Spent, record_spent, spent
from autotune.search.record import BASELINE_ATTR, REMEASURE_ATTR
from autotune.show import bought, page, report

T0 = datetime(2026, 1, 5, 9, 0)


def _add(study: optuna.Study, tok_s: float | None, start: float, end: float, **attrs: object) -> None:
    """One trial that ran from `start` to `end` minutes into the study; tok_s None: refused before boot."""
    booted = tok_s is not None
    study.add_trial(FrozenTrial(
        number=0, trial_id=0, state=TrialState.COMPLETE if booted else TrialState.PRUNED, value=tok_s,
        datetime_start=T0 + timedelta(minutes=start), datetime_complete=T0 + timedelta(minutes=end), params={},
        distributions={}, user_attrs=attrs if booted else {"booted": False, **attrs},
        system_attrs={"constraints": [0.0]} if booted else {}, intermediate_values={}))


def _pair(study: optuna.Study, of: int, tok_s: float, index: int, start: float, **attrs: object) -> None:
    _add(study, tok_s, start, start + 10, **{REMEASURE_ATTR: of, paired.PAIR_ATTR:
                                              {"winner": 5, "baseline": 1, "index": index}, **attrs})


@pytest.fixture()
def study(tmp_path: Path) -> optuna.Study:
    """0 vllm-defaults 900, 1 recipe 1,100, 2: 1,000, 3: 1,300, 4 refused before boot, 5: 1,500 (the winner),
    6: 1,400; then two pairs of trial 5 against the recipe, the comparison stored, and a third pair after it."""
    s = optuna.create_study(storage=f"sqlite:///{tmp_path / 'bought.db'}", direction="maximize")
    s.set_user_attr("limits", {"p95_ttft_ms": 500.0})
    defaults, recipe = {BASELINE_ATTR: {"name": "vllm-defaults"}}, {BASELINE_ATTR: {"name": "recipe"}}
    _add(s, 900, 0, 10, **defaults)
    _add(s, 1100, 10, 20, **recipe)
    _add(s, 1000, 20, 30)
    _add(s, 1300, 30, 40)
    _add(s, None, 40, 41)
    _add(s, 1500, 41, 60)
    _add(s, 1400, 60, 80)
    _pair(s, 5, 1500, 0, 80)
    _pair(s, 1, 1100, 0, 90, **recipe)
    _pair(s, 1, 1085, 1, 100, **recipe)
    _pair(s, 5, 1480, 1, 110)
    stored = paired.current(s.get_trials(), {"p95_ttft_ms": 500.0})
    assert stored is not None and stored.proven
    s.set_user_attr(paired.COMPARISON_ATTR, stored.to_attr())
    _pair(s, 5, 1200, 2, 120)  # after the run's end: the stored comparison stays the answer
    _pair(s, 1, 1150, 2, 130, **recipe)
    return s


def test_the_paired_gain_is_the_stored_comparisons_sentence(study: optuna.Study) -> None:
    said = paired.answer(study)
    assert said is not None and said.baseline == "recipe"
    gain = {g.baseline: g for g in bought.baseline_gains(study)}["recipe"]
    assert (gain.mid, gain.low, gain.high) == pytest.approx((said.interval.mid, said.interval.low,  # type: ignore
                                                            said.interval.high))  # type: ignore[union-attr]
    text = gain.text()
    mid, interval = text.split(": ", 1)[1].split(" (", 1)
    assert mid in said.sentence  # "+36% output tok/s"
    assert interval.removesuffix(", paired)") in said.sentence  # "90% interval +22% to +49%"
    # the report's summary and its best-trial note say the same gain as the panel, not the first measurements' ratio
    summary = {g.baseline: g for g in report.gains(study)}["recipe"]
    assert summary.gain_pct == pytest.approx(gain.mid * 100)  # type: ignore[operator]


def test_a_baseline_without_pairs_gets_the_unpaired_ratio_of_figures_labelled_so(study: optuna.Study) -> None:
    gain = {g.baseline: g for g in bought.baseline_gains(study)}["vllm-defaults"]
    # the winner's figure: the lower median of its 1,500, 1,480 and 1,200, the one figure every output gives
    assert gain.mid == pytest.approx(1480 / 900 - 1) and gain.low is None and gain.high is None
    assert gain.text() == "vllm-defaults (trial 0): +64% output tok/s (unpaired ratio of figures, no interval)"


def test_best_against_time_counts_booted_trials_only_at_their_finish(study: optuna.Study) -> None:
    curve = bought.best_over_time(study.get_trials())
    assert 4 not in [p.trial for p in curve]  # refused before boot
    assert [(p.minutes, p.figure) for p in curve[:6]] == [(10, 900), (20, 1100), (30, 1100), (40, 1300),
                                                            (60, 1500), (80, 1500)]
    assert curve[-1].minutes == 140 and curve[-1].figure == 1480  # lower median of 1,500, 1,480 and 1,200


def test_more_time_from_the_studys_own_rate_of_improvement(study: optuna.Study) -> None:
    trials = study.get_trials()
    rising = bought.more_time(bought.best_over_time(trials[:4]))  # 1,100 at 20 min, 1,300 at 40 min
    assert rising.startswith("what as long again would add: at most about +36% in 40 min, the gain of the run's last "
                             "20 min carried on (1,100 to 1,300 output tok/s)")
    flat = bought.more_time(bought.best_over_time(trials))
    assert flat.startswith("what as long again would add: likely little")
    assert "last improved 60 min into the 140 min run (trial 5)" in flat
    assert bought.more_time(bought.best_over_time(trials[:3])).startswith("what more time would add: unknown")
    assert "(1,100 to 1,300 output tok/s)" in rising
    # An energy objective's figures are output tokens per joule, said as such
    energy = [bought.BestSoFar(p.minutes, p.figure / 400, p.trial) for p in bought.best_over_time(trials[:4])]
    assert "(2.75 to 3.25 output tokens/J)" in bought.more_time(energy, "output tokens/J")


def test_what_the_rest_of_the_recorded_budget_would_add(study: optuna.Study) -> None:
    curve = bought.best_over_time(study.get_trials()[:4])  # 900 at 10 min, 1,100 at 20, 1,100 at 30, 1,300 at 40
    # 20 min left: the gain of the last 20 min (1,100 to 1,300), no more
    assert bought.more_time(curve, budget=Spent(60 * 60, 40 * 60, 1)) == (
        "budget: 60 min over 1 run(s), 40 min used; what the 20 min left would add: at most about +18% in 20 min, "
        "the gain of the run's last 20 min carried on (1,100 to 1,300 output tok/s); the best was last improved 40 "
        "min into the 40 min run (trial 3); 0 booted trial(s) since")
    # 5 min left, where a trial took ~10 min (4 booted in 40 min)
    spent_out = bought.more_time(curve, budget=Spent(45 * 60, 40 * 60, 2))
    assert spent_out.startswith("budget: 45 min over 2 run(s), 40 min used; the 5 min left is less than a trial "
                                "(~10 min): it would add nothing; as long again: at most about +36%")
    # no time limit recorded (a run with --n-trials only): as long again
    assert bought.more_time(curve, budget=Spent(None, 40 * 60, 1)).startswith("what as long again would add: ")


def test_each_run_adds_its_budget_and_the_time_it_ran(tmp_path: Path) -> None:
    s = optuna.create_study(storage=f"sqlite:///{tmp_path / 'spent.db'}")
    assert spent(s) is None
    clock = [0.0]
    for seconds, ran in ((600.0, 590.0), (1200.0, 300.0)):
        b = Budget(seconds=seconds, clock=lambda: clock[0])
        clock[0] += ran
        record_spent(s, b)
    assert spent(optuna.load_study(study_name=s.study_name, storage=f"sqlite:///{tmp_path / 'spent.db'}")) == Spent(
        1800.0, 890.0, 2)
    assert Spent(1800.0, 890.0, 2).left_s == 910.0
    record_spent(s, Budget(trials=3, clock=lambda: clock[0]))  # a run with no time limit: the budget is unknown
    assert spent(s) == Spent(None, 890.0, 3) and spent(s).left_s is None  # type: ignore[union-attr]


def test_the_panel_is_the_reports_first(study: optuna.Study, tmp_path: Path) -> None:
    html = page.write_report(study, tmp_path / "report", png=False).html.read_text()
    first = html.index("What the run bought")
    assert first < html.index("best: trial 5") and first < html.index("id=\"pareto_ttft\"")
    assert "gain over recipe (trial 1): +" in html and "paired)" in html
    fig = bought.bought_figure(study)
    assert list(fig.data[0].x) == ["vllm-defaults", "recipe"]
