"""One winner, one figure: the run's summary, `status`, the report and `export` name the same trial with the same
throughput, taken from all of its measurements (remeasure.best). On a real SQLite study recorded through the real
study/outcome code, with hand-made results (no engine)."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner
from conftest import _study_copy, recorded_level

from autotune.cli import main
from autotune.config.study_file import load_study
from autotune.engine.logs import BootInfo
from autotune.measure.memory import MemoryPeak
from autotune.measure.trial import TrialResult
from autotune.search import record as search_record
from autotune.search import tell
from autotune.search.record import BASELINE_ATTR, REMEASURE_ATTR, trial_baseline
from autotune.search.space import engine_config, suggest
from autotune.search.study import open_study
from autotune.show import page as report_page
from autotune.show import report

# The first figure (181) held its limits; the one re-measurement missed them by noise (p95 TTFT 520 ms > 500).
WINNER = "best: trial 0, 181 output tok/s (1 of 2 measurements met the limits)"


def _ok(tok_s: float, ttft: float) -> TrialResult:
    lv = (recorded_level(1, tok_s / 3, ttft / 3), recorded_level(4, tok_s, ttft))
    return TrialResult("ok", tok_s, 4, lv, BootInfo(40.0, 524_288), memory=MemoryPeak(3 << 30, "rss", 0, 50),
                       duration_s=90.0)


def _missed(tok_s: float, ttft: float) -> TrialResult:
    return TrialResult("infeasible", levels=(recorded_level(1, tok_s, ttft),), boot=BootInfo(40.0, 524_288),
                       miss_ratio=ttft / 500, memory=MemoryPeak(3 << 30, "rss", 0, 50), duration_s=90.0)


def record(study: optuna.Study, spec, result: TrialResult) -> optuna.trial.FrozenTrial:
    """One trial as the run loop records it: ask, the configuration's attributes, tell the result."""
    trial = study.ask()
    config = engine_config(spec, suggest(trial, spec.space), baseline=trial_baseline(trial))
    for key, value in search_record.config_attrs(config.model, config.flags).items():
        trial.set_user_attr(key, value)
    tell.tell_result(study, trial, result)
    return study.trials[trial.number]


@pytest.fixture()
def remeasured_study(tmp_path: Path):
    """Trial 0 (baseline vllm-defaults): 181 tok/s; 1 (recipe): 150; 2 (sampled): 120; 3 re-measures trial 0
    as remeasure_top queues it and misses the latency limit."""
    spec = load_study(_study_copy(tmp_path))
    url = f"sqlite:///{tmp_path / 'tiny-cpu.db'}"
    study = open_study(spec, url)
    first = record(study, spec, _ok(181, 300))
    record(study, spec, _ok(150, 250))
    record(study, spec, _ok(120, 200))
    study.enqueue_trial(first.params, user_attrs={REMEASURE_ATTR: 0, BASELINE_ATTR: first.user_attrs[BASELINE_ATTR]})
    again = record(study, spec, _missed(170, 520))
    assert again.user_attrs[REMEASURE_ATTR] == 0 and again.number == 3
    return spec, url, study


def test_summary_status_report_and_export_give_one_winner_and_one_figure(remeasured_study, tmp_path: Path):
    spec, url, study = remeasured_study
    runner = CliRunner()

    files = report_page.write_report(study, tmp_path / "report", png=False)
    page = files.html.read_text()
    assert WINNER in page

    exported = runner.invoke(main, ["export", "--study", "tiny-cpu", "--storage", url, "--format", "json"])
    assert exported.exit_code == 0, exported.output
    doc = json.loads(exported.stdout)
    assert doc["metrics"]["trial"] == 0 and doc["metrics"]["output_tok_s"] == 181
    assert doc["metrics"]["best"] == WINNER
    assert doc["metrics"]["measurements"] == [{"trial": 0, "output_tok_s": 181.0, "met_limits": True},
                                              {"trial": 3, "output_tok_s": None, "met_limits": False}]
    as_yaml = runner.invoke(main, ["export", "--study", "tiny-cpu", "--storage", url, "--format", "yaml"])
    assert as_yaml.stdout.splitlines()[0] == f"# {WINNER}"
    as_flags = runner.invoke(main, ["export", "--study", "tiny-cpu", "--storage", url, "--format", "flags"])
    assert as_flags.stdout.startswith("vllm serve ") and f"# {WINNER}" in as_flags.stderr

    status = runner.invoke(main, ["status", "--study", "tiny-cpu", "--storage", url])
    assert status.exit_code == 0, status.output
    assert WINNER in status.output

    # The run's summary, through the real `autotune run`: 80 s is less than a trial (90 s); and nothing is
    # re-measured, as nothing can change the answer: trial 0 has had its confirmation, and the runner-up (150) is
    # far below it.
    run = runner.invoke(main, ["run", str(spec.path), "--budget", "80s", "--storage", url])
    assert run.exit_code == 0, run.output
    assert WINNER in run.output
    assert "this run: 0 booted, 0 refused before boot, 0 re-measured; stopped: " in run.output
    assert "s left, less than one trial (~90 s)" in run.output
    assert WINNER in run.output.split("this run:")[1]  # the summary's own best: line
    export_line = f"export it: autotune export --study {spec.path} --storage {url} --format flags"
    assert export_line in run.output.replace("\n", "")


def test_the_report_draws_a_re_measurement_as_a_point_of_its_configuration(remeasured_study):
    _spec, _url, study = remeasured_study
    fig = report.latency_figure(study, "ttft_p95_ms")
    by_name = {t.name: t for t in fig.data}
    best = by_name["best: trial 0"]
    assert list(best.y) == [181]  # the ring sits on the configuration's figure
    again = by_name["re-measurement (joined to its trial)"]
    assert any("re-measure of trial 0" in h for h in again.hovertext)
    for name in ("feasible trial", "baseline"):  # not drawn as a configuration of its own
        assert not any("<b>trial 3</b>" in h for h in by_name[name].hovertext or ())
    assert [v.number for v in search_record.views(study)] == [0, 1, 2]
    assert [g.baseline for g in report.gains(study)] == ["vllm-defaults", "recipe"]
