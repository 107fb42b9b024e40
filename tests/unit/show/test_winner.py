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
from show_checks import check_one_answer, what_a_person_reads

from autotune.cli import main
from autotune.config.study_file import load_study
from autotune.engine.logs import BootInfo
from autotune.measure.memory import MemoryPeak
from autotune.measure.soak import Soak
from autotune.measure.trial import TrialResult
from autotune.search import paired, tell
from autotune.search import record as search_record
from autotune.search.budget import Budget, spent
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
    assert doc["metrics"]["trial"] == 0 and doc["metrics"]["output_throughput"] == 181
    assert doc["metrics"]["best"] == WINNER
    assert doc["metrics"]["measurements"] == [{"trial": 0, "output_throughput": 181.0, "met_limits": True},
                                              {"trial": 3, "output_throughput": None, "met_limits": False}]
    as_yaml = runner.invoke(main, ["export", "--study", "tiny-cpu", "--storage", url, "--format", "yaml"])
    assert as_yaml.stdout.splitlines()[0] == f"# {WINNER}"
    as_flags = runner.invoke(main, ["export", "--study", "tiny-cpu", "--storage", url, "--format", "flags"])
    # the winner's own command, as the export writes its launcher (vllm serve, or python -m where no vllm is on PATH)
    assert as_flags.stdout.strip() == search_record.view(study.trials[0]).command and f"# {WINNER}" in as_flags.stderr

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
    recorded = spent(optuna.load_study(study_name="tiny-cpu", storage=url))  # the run's budget, for the report
    assert recorded is not None and (recorded.seconds, recorded.runs) == (80.0, 1) and recorded.used_s >= 0
    assert WINNER in run.output.split("this run:")[1]  # the summary's own best: line
    export_line = f"export it: autotune export --study {spec.path} --storage {url} --format flags"
    assert export_line in run.output.replace("\n", "")


def test_the_report_draws_a_re_measurement_as_a_point_of_its_configuration(remeasured_study):
    _spec, _url, study = remeasured_study
    fig = report.latency_figure(study, "p95_ttft_ms")
    by_name = {t.name: t for t in fig.data}
    best = by_name["best: trial 0"]
    assert list(best.y) == [181]  # the ring sits on the configuration's figure
    again = by_name["re-measurement (joined to its trial)"]
    assert any("re-measure of trial 0" in h for h in again.hovertext)
    for name in ("feasible trial", "baseline"):  # not drawn as a configuration of its own
        assert not any("<b>trial 3</b>" in h for h in by_name[name].hovertext or ())
    assert [v.number for v in search_record.views(study)] == [0, 1, 2]
    assert [g.baseline for g in report.gains(study)] == ["vllm-defaults", "recipe"]


def _ok_at(tok_s: float, ttft: float) -> TrialResult:
    """A measurement whose latencies differ with each boot (p95 TTFT `ttft` ms at its best level)."""
    lv = (recorded_level(1, tok_s / 3, ttft / 3), recorded_level(4, tok_s, ttft))
    return TrialResult("ok", tok_s, 4, lv, BootInfo(40.0, 524_288), memory=MemoryPeak(3 << 30, "rss", 0, 50),
                       duration_s=90.0)


def compared_study(tmp_path: Path, winner: list[tuple[float, float]], recipe: list[tuple[float, float]]):
    """Trial 0 (vllm-defaults): 100 tok/s; 1 (recipe): recipe[0]; 2 (sampled): winner[0]; then the final paired
    comparison of trial 2 against the recipe (paired.measure_pairs, through the run loop's own recording), each
    boot measuring the next (tok/s, p95 TTFT ms) of its list."""
    spec = load_study(_study_copy(tmp_path))
    url = f"sqlite:///{tmp_path / 'tiny-cpu.db'}"
    study = open_study(spec, url)
    record(study, spec, _ok_at(100, 200))
    record(study, spec, _ok_at(*recipe[0]))
    record(study, spec, _ok_at(*winner[0]))
    figures = {1: list(recipe[1:]), 2: list(winner[1:])}

    def run_one() -> TrialResult:
        of = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))[0].user_attrs[REMEASURE_ATTR]
        result = _ok_at(*figures[of].pop(0))
        record(study, spec, result)
        return result

    said = paired.measure_pairs(study, Budget(seconds=100_000), run_one).comparison
    if paired.soak_due(said):  # and the soak the run's end gives a proven winner, held up
        assert said is not None
        held_up = Soak(30.0, "concurrency 4", 120, 0, 0, "rss", 3 << 30, 3 << 30)
        study.set_user_attr(paired.COMPARISON_ATTR, paired.with_soak(said, held_up).to_attr())
    return spec, url, study


def outputs(spec, url: str, study: optuna.Study, tmp_path: Path) -> dict[str, str]:
    """What a person reads of one study (show_checks.what_a_person_reads) and the run's summary."""
    texts = what_a_person_reads(study, url, tmp_path / "report")
    run = CliRunner().invoke(main, ["run", str(spec.path), "--budget", "80s", "--storage", url])  # no trial fits
    assert run.exit_code == 0, run.output
    texts["run summary"] = run.output.split("this run:")[1]
    return texts


def test_every_output_of_one_study_gives_the_same_winner_figure_latencies_and_answer(tmp_path: Path):
    # the winner measures 200 (TTFT 300), then in pairs 190 (310), 196 (330) and 198 (320): its figure is the lower
    # median, 196, with that measurement's TTFT (330 ms), not the first one's; the recipe 150, 149, 151, 150
    spec, url, study = compared_study(tmp_path, winner=[(200, 300), (190, 310), (196, 330), (198, 320)],
                                      recipe=[(150, 250), (149, 260), (151, 240), (150, 250)])
    answer = paired.answer(study)
    assert answer is not None and answer.proven and answer.winner == 2
    assert answer.sentence.startswith("trial 2: +30% output tok/s over the recipe (90% interval +23% to +37%)")
    assert answer.sentence.endswith("within p95 TTFT 500 ms and TPOT 50 ms; soaked 30 s at concurrency 4: 120 "
                                    "requests, no error, no empty reply, memory within what vLLM reserved (+0.00 GiB)")
    best = "best: trial 2, 196 output tok/s (lower median of 4 measurements, 190-200)"
    figure = ("its figure is trial 6's measurement: 196 output tok/s at concurrency 4 (p95 TTFT 330 ms, "
              "p95 TPOT 20.0 ms)")
    texts = outputs(spec, url, study, tmp_path)
    assert check_one_answer(study, texts) == (best, figure, answer.sentence)
    doc = json.loads(CliRunner().invoke(main, ["export", "--study", "tiny-cpu", "--storage", url,
                                               "--format", "json"]).stdout)
    m = doc["metrics"]
    assert (m["trial"], m["output_throughput"], m["figure_trial"], m["p95_ttft_ms"]) == (2, 196.0, 6, 330.0)
    assert m["proven"] is True and m["answer"] == answer.sentence
    assert "exported the recipe" not in texts["export flags"]


def test_export_gives_the_baseline_when_the_winner_was_not_shown_better(tmp_path: Path):
    # 160, then in pairs 158 and 148 in turn against the recipe's 149 and 152: +6% and -3% in turn, +2% on
    # average, and eight pairs never resolve it: inside the noise
    spec, url, study = compared_study(tmp_path, winner=[(160, 300), *[(158, 300), (148, 300)] * 4],
                                      recipe=[(150, 250), *[(149, 250), (152, 250)] * 4])
    answer = paired.answer(study)
    assert answer is not None and not answer.proven and len(answer.pairs) == paired.MAX_PAIRS
    assert answer.sentence.startswith("no configuration beat the recipe beyond the noise of this machine (+2%")
    runner = CliRunner()
    ref = ["--study", "tiny-cpu", "--storage", url]
    flags = runner.invoke(main, ["export", *ref, "--format", "flags"])
    recipe_command = search_record.view(study.trials[1]).command
    assert flags.exit_code == 0 and flags.stdout.strip() == recipe_command
    assert ("# exported the recipe (trial 1), not trial 2: it was not shown better than the recipe; `--unproven` "
            "exports trial 2") in flags.stderr
    yaml_out = runner.invoke(main, ["export", *ref, "--format", "yaml"])
    assert "exported the recipe (trial 1)" in yaml_out.stderr and "max-num-seqs: 16" in yaml_out.stdout
    as_json = json.loads(runner.invoke(main, ["export", *ref, "--format", "json"]).stdout)
    assert as_json["metrics"]["trial"] == 1 and as_json["metrics"]["proven"] is False
    status = " ".join(runner.invoke(main, ["status", *ref]).output.split())
    assert "noise: one measurement on this machine spreads by ±" in status
    assert "this machine's noise is too large to separate these configurations" in status
    unproven = runner.invoke(main, ["export", *ref, "--format", "flags", "--unproven"])
    assert unproven.stdout.strip() == search_record.view(study.trials[2]).command
    assert "exported the recipe" not in unproven.stderr
    run = runner.invoke(main, ["run", str(spec.path), "--budget", "80s", "--storage", url])  # no trial fits
    assert run.exit_code == 0, run.output
    assert run.output.rstrip().splitlines()[-1] == recipe_command  # the run ends with what export gives
    assert "exported the recipe (trial 1), not trial 2" in run.output


def test_compare_refuses_a_study_whose_baselines_are_not_measured_yet(tmp_path: Path):
    spec_path = _study_copy(tmp_path)
    got = CliRunner().invoke(main, ["compare", str(spec_path), "--storage", f"sqlite:///{tmp_path / 'new.db'}"])
    assert got.exit_code != 0
    assert "queued trials" in got.output and "finish them with `autotune run` before comparing" in got.output
