"""The analysis notebook runs top to bottom (nbclient, a real kernel) against a study database."""

from __future__ import annotations

from pathlib import Path

from show_checks import outputs_text, run_notebook

ROOT = Path(__file__).resolve().parents[3]


def test_notebook_runs_on_a_recorded_study(demo_study_db, monkeypatch) -> None:
    db, name = demo_study_db
    text = outputs_text(run_notebook(db, name, monkeypatch))
    assert f"study {name}: 8 trials" in text
    assert "+67%" in text and "+36%" in text  # best (1,500 tok/s) against vllm-defaults (900) and recipe (1,100)
    assert "max_num_seqs" in text  # the importances


