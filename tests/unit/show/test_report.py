"""The report: figures read from a study's trials, the Pareto front, gains over the baselines, and one offline HTML
file with PNGs. On a study recorded through the real study code (fast) and on one made by a real CPU run (engine)."""

from __future__ import annotations

import shutil
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner
from show_checks import check_report, load

from autotune.cli import main
from autotune.search import record
from autotune.show import report

ROOT = Path(__file__).resolve().parents[3]
needs_chromium = pytest.mark.skipif(shutil.which("chromium") is None, reason="PNG export needs Debian's chromium")


def trace(fig, name: str):
    return next(t for t in fig.data if t.name == name)


def test_pareto_front_keeps_only_undominated_points() -> None:
    # (latency, throughput): lower latency and higher throughput are better.
    points = [(120, 700), (300, 900), (350, 1100), (420, 1500), (450, 1300), (100, 500), (300, 800), (500, 1500)]
    # (450, 1300) is beaten by (420, 1500); (300, 800) by (300, 900); (500, 1500) by (420, 1500).
    assert report.pareto_front(points) == [5, 0, 1, 2, 3]
    assert report.pareto_front([]) == []


def test_views_place_each_trial_where_it_was_measured(demo_study_db) -> None:
    vs = {v.number: v for v in record.views(load(*demo_study_db))}
    assert [vs[n].kind for n in range(8)] == ["feasible"] * 4 + ["infeasible"] * 3 + ["feasible"]
    assert (vs[0].baseline, vs[1].baseline, vs[2].baseline) == ("vllm-defaults", "recipe", None)
    assert (vs[2].throughput, vs[2].level, vs[2].p95_ttft_ms, vs[2].peak_memory_gib) == (1500, 16, 420, 3.6)
    assert (vs[4].throughput, vs[4].level, vs[4].p95_ttft_ms) == (150, 1, 900)  # missed: at its lowest level
    assert vs[5].throughput is None and "KV cache" in vs[5].reason  # out of memory: nothing measured
    assert vs[6].reason.startswith("predicted not to fit")


def test_gains_over_the_baselines(demo_study_db) -> None:
    gains = {g.baseline: g for g in report.gains(load(*demo_study_db))}
    assert gains["vllm-defaults"].gain_pct == pytest.approx((1500 / 900 - 1) * 100)  # +66.7%
    assert gains["recipe"].gain_pct == pytest.approx((1500 / 1100 - 1) * 100)  # +36.4%


def test_latency_figure_draws_the_front_the_limit_and_the_infeasible_apart(demo_study_db) -> None:
    fig = report.latency_figure(load(*demo_study_db), "p95_ttft_ms")
    front = trace(fig, "Pareto front")
    # Feasible (p95 TTFT, tok/s): 0 (300, 900), 1 (350, 1100), 2 (420, 1500), 3 (120, 700), 7 (450, 1300).
    assert list(front.x) == [120, 300, 350, 420] and list(front.y) == [700, 900, 1100, 1500]
    assert [s.x0 for s in fig.layout.shapes] == [500]  # the objective's limit
    missed = trace(fig, "missed the limits (at its lowest load level)")
    assert list(missed.x) == [900] and "trial 4" in missed.hovertext[0] and "+80%" in missed.hovertext[0]
    assert sorted(trace(fig, "baseline").y) == [900, 1100]
    assert trace(fig, "best: trial 2").y == (1500,)
    assert any("+67% vs vllm-defaults" in a.text for a in fig.layout.annotations)
    assert any("2 trial(s) without a measurement" in a.text for a in fig.layout.annotations)


def test_memory_figure_front_prefers_less_memory(demo_study_db) -> None:
    fig = report.memory_figure(load(*demo_study_db))
    front = trace(fig, "Pareto front")
    # Feasible (GiB, tok/s): (3.2, 900), (3.0, 1100), (3.6, 1500), (2.9, 700), (3.4, 1300).
    assert list(front.x) == [2.9, 3.0, 3.4, 3.6] and list(front.y) == [700, 1100, 1300, 1500]
    assert "RSS" in fig.layout.xaxis.title.text


def test_history_levels_and_infeasible_figures(demo_study_db) -> None:
    study = load(*demo_study_db)
    best_so_far = trace(report.history_figure(study), "best feasible so far")
    assert list(best_so_far.y) == [900, 1100, 1500, 1500, 1500, 1500, 1500, 1500]
    levels = report.levels_figure(study)
    names = [t.name for t in levels.data if t.showlegend]
    assert names == ["trial 2", "trial 7", "trial 1 (recipe)", "trial 0 (vllm-defaults)"]
    assert list(trace(levels, "trial 2").x) == [1, 4, 16, 64]
    why = report.infeasible_figure(study).data[0]
    assert list(why.x) == [4, 5, 6]
    assert list(why.y) == ["missed the limits", "out of memory", "refused before boot"]


def test_importances_need_enough_trials(tmp_path: Path, demo_study_db) -> None:
    few = optuna.create_study(direction="maximize")
    few.optimize(lambda t: t.suggest_int("x", 1, 4), n_trials=2)
    assert report.param_importances(few) == {}
    assert "Not enough trials" in report.importance_figure(few).layout.annotations[0].text
    imp = report.param_importances(load(*demo_study_db))
    assert set(imp) <= {"max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill",
                        "enable_prefix_caching", "max_model_len"} and sum(imp.values()) == pytest.approx(1.0)


@needs_chromium
def test_report_is_one_offline_file_with_pngs(demo_study_db, tmp_path: Path) -> None:
    page = check_report(load(*demo_study_db), tmp_path / "out")
    assert "best is <b>+67%</b>" in page


def test_report_command(demo_study_db, tmp_path: Path) -> None:
    db, name = demo_study_db
    result = CliRunner().invoke(main, ["report", "--storage", f"sqlite:///{db}", "--study", name,
                                       "--out", str(tmp_path / "r"), "--no-png"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "r" / f"{name}.html").is_file() and f"{name}.html" in result.output
    missing = CliRunner().invoke(main, ["report", "--storage", f"sqlite:///{db}", "--study", "nope"])
    assert missing.exit_code == 2 and "no such study" in missing.output


def test_report_without_chromium_writes_the_html_and_says_why_there_are_no_pngs(
        demo_study_db, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db, name = demo_study_db
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-chromium-here"))  # where the PNG export looks first
    args = ["report", "--storage", f"sqlite:///{db}", "--study", name, "--out", str(tmp_path / "r")]
    optional = CliRunner().invoke(main, args)
    assert optional.exit_code == 0, optional.output
    assert (tmp_path / "r" / f"{name}.html").is_file() and not list((tmp_path / "r").glob("*.png"))
    notes = [line for line in optional.output.splitlines() if line.startswith("no PNGs:")]
    assert len(notes) == 1 and "Chromium" in notes[0], optional.output
    asked = CliRunner().invoke(main, [*args, "--png"])
    lines = [line for line in asked.output.splitlines() if line.strip()]
    assert asked.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: PNG export failed"), asked.output
    assert "Chromium" in lines[0]


def test_report_to_an_unwritable_place_is_one_line_naming_out(demo_study_db, tmp_path: Path) -> None:
    db, name = demo_study_db
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = CliRunner().invoke(main, ["report", "--storage", f"sqlite:///{db}", "--study", name,
                                    "--out", str(blocker / "r"), "--no-png"])
    lines = [line for line in out.output.splitlines() if line.strip()]
    assert out.exit_code == 2 and len(lines) == 1, out.output
    assert lines[0].startswith(f"error: --out: {blocker / 'r'}: "), out.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "demo"]
