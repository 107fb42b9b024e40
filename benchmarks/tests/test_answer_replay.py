"""The answer replayed on the recorded GPU surface (benchmarks/answer_replay.py), on a few seeds: each study ends
with the product's paired comparison, and what it exports is the winner only where the pairs showed it better."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import answer_replay as ar
from benchmarks.replay import judges
from benchmarks.replay_noise import rung_spread
from benchmarks.surface import load_surface


@pytest.fixture(scope="module")
def replayed():
    surface = load_surface(ar.SURFACE)
    sd = rung_spread(json.loads(ar.SURFACE.read_text()))
    judge = judges(surface)
    return surface, sd, [ar.one_study(surface, sd, seed, judge) for seed in range(3)]


def test_each_replayed_study_ends_with_the_paired_answer_and_exports_accordingly(replayed):
    surface, sd, outcomes = replayed
    assert 0.05 < sd < 0.10  # the surface's spread of one measurement at a fixed rung (7.2%)
    recipe = surface.points.index(ar.best_baseline(surface))
    assert surface.points[recipe].baseline == "recipe"
    for o in outcomes:
        assert o.booted > 10  # the search ran for the budget's share, not a handful of trials
        if o.proven:  # shown better: the winner is exported, with an interval above 0
            assert o.exported == o.winner and o.interval is not None and o.interval[1] > 0
            assert o.sentence.startswith("trial ") and "over the recipe (90% interval" in o.sentence
        else:  # not shown better: the best baseline is exported, and the sentence says keep it
            assert o.exported == recipe and o.sentence.endswith("keep it")
        assert o.pairs <= ar.paired.MAX_PAIRS


def test_the_counts_follow_from_the_recorded_throughputs(replayed, tmp_path: Path):
    surface, sd, outcomes = replayed
    counts = ar.count(surface, outcomes)
    assert counts["seeds"] == 3 and 0 <= counts["good"] <= 3
    base = ar.best_baseline(surface)
    for o, row in zip(outcomes, counts["rows"], strict=True):
        value = surface.points[o.exported].value
        assert row["good"] == (value >= 0.95 * surface.best or o.exported == surface.points.index(base))
        assert row["true_gain"] == pytest.approx(value / base.value - 1)
    text = ar.report(surface, sd, outcomes, counts)
    assert "of 3 seeds" in text and "exported worse than the best baseline by more than its interval" in text
    ar.write(tmp_path / "out", text, outcomes, 3)
    assert (tmp_path / "out" / "answer-replay.txt").read_text().startswith("# python -m benchmarks.answer_replay")
    assert len(json.loads((tmp_path / "out" / "outcomes.json").read_text())) == 3


def test_the_command_prints_the_figures_and_writes_the_dataset(tmp_path: Path, capsys) -> None:
    ar.main(["--seeds", "1", "--out", str(tmp_path / "dataset")])
    printed = capsys.readouterr().out
    assert "exported within 5% of the best or the best baseline: " in printed and " of 1 seeds" in printed
    written = (tmp_path / "dataset" / "answer-replay.txt").read_text()
    assert written.splitlines()[0].startswith("# python -m benchmarks.answer_replay --seeds 1 --out ")
    assert printed.strip() in written
