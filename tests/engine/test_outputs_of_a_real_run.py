"""The dashboard, the report and the notebook on a study made by a real `autotune run` on the vLLM CPU build."""

from __future__ import annotations

from pathlib import Path

from show_checks import (
    ARTIFACTS,
    check_dashboard,
    check_one_answer,
    check_report,
    embedded_figures,
    load,
    needs_chromium,
    outputs_text,
    run_notebook,
    what_a_person_reads,
)

from autotune.show import report

ROOT = Path(__file__).resolve().parents[2]


@needs_chromium
def test_dashboard_on_a_real_cpu_study(cpu_study_db) -> None:
    db, name = cpu_study_db
    check_dashboard(db, name, ARTIFACTS / "dashboard.png")


@needs_chromium
def test_report_from_a_real_cpu_run(cpu_study_db) -> None:
    study = load(*cpu_study_db)
    page = check_report(study, ROOT / "tests" / "artifacts" / "report-cpu")  # kept to be looked at
    assert "vllm-defaults" in page and "recipe" in page
    levels = {h for tr in embedded_figures(page)["levels"] for h in tr["hovertext"]}
    measured = [t for t in study.trials
                if t.user_attrs.get("levels") and (report.feasible(t) or "baseline" in t.user_attrs)]
    assert measured, "the real run measured no trial"
    for t in measured:  # each level of the best trials and the baselines is in the load-level figure
        for lv in t.user_attrs["levels"]:
            figure = f"{lv['output_throughput']:,.0f} tok/s"
            assert any(h.startswith(f"trial {t.number}") and figure in h for h in levels)


def test_notebook_runs_on_a_real_cpu_study(cpu_study_db, monkeypatch) -> None:
    db, name = cpu_study_db
    text = outputs_text(run_notebook(db, name, monkeypatch))
    assert f"study {name}:" in text
    # every baseline has its row, also when it is the best trial itself ("best = baseline ...")
    assert "baseline vllm-defaults" in text and "baseline recipe" in text


def test_every_output_of_a_real_run_gives_the_same_winner_figure_latencies_and_answer(cpu_study_db, tmp_path) -> None:
    db, name = cpu_study_db
    study = load(db, name)
    texts = what_a_person_reads(study, f"sqlite:///{db}", tmp_path / "report")
    # the summary the second (resuming) run printed as it ended: nothing ran on the study since
    summary = (db.parent / "run-again.log").read_text()
    assert "this run:" in summary, summary[-3000:]
    texts["run summary"] = summary.split("this run:")[1]
    best, figure, answer = check_one_answer(study, texts)
    assert best.startswith("best: trial ") and " output tok/s (" in best
    assert "(p95 TTFT " in figure and answer
