"""The long-context answer (show/longest_context.py): for 1, 2 and 4 users, the longest max_model_len that booted and
met the limits, with its trial and flags, the same at the end of `autotune run`, in `status` and in the report. On a
real SQLite study recorded through the real study/outcome code, with hand-made results (no engine)."""

from __future__ import annotations

import html
from pathlib import Path

import optuna
from click.testing import CliRunner
from conftest import ROOT, _study_copy, recorded_level

from autotune.cli import main
from autotune.config.study_file import load_study
from autotune.engine.logs import BootInfo, Failure, FailureKind
from autotune.measure.memory import MemoryPeak
from autotune.measure.trial import TrialResult
from autotune.search import record as search_record
from autotune.search import tell
from autotune.search.space import engine_config, suggest
from autotune.search.study import open_study
from autotune.show import page as report_page
from autotune.show.longest_context import LongestContext, clips_to_context, context_lines, longest_contexts

OBJECTIVE = ROOT / "tests" / "data" / "workloads" / "long-context-objective.toml"

SPACE = """
[space.max_model_len]
type = "categorical"
choices = [1024, 2048, 4096, 8192]

[space.max_num_seqs]
type = "int"
low = 1
high = 4
"""


def long_context_study(tmp_path: Path):
    """The tiny CPU study searching contexts of 1k-8k tokens for the scaled-down long-context objective, with
    no baselines: every trial is a sampled configuration."""
    text = _study_copy(tmp_path).read_text()
    text = text.replace(f'objective = "{ROOT}/objectives/tiny-cpu.toml"', f'objective = "{OBJECTIVE}"')
    text = text.split("[[baselines]]")[0] + SPACE
    path = tmp_path / "tiny-cpu.toml"
    path.write_text(text)
    spec = load_study(path)
    url = f"sqlite:///{tmp_path / 'tiny-cpu.db'}"
    return spec, url, open_study(spec, url)


def served(*levels: tuple[float, bool]) -> TrialResult:
    """Booted and measured: each (concurrency, met the limits)."""
    lv = tuple(recorded_level(c, 100 * c, 200 if ok else 900) for c, ok in levels)
    best = max((c for c, ok in levels if ok), default=None)
    return TrialResult("ok" if best else "infeasible", 100.0 * (best or 0), best, lv, BootInfo(40.0, 524_288),
                       memory=MemoryPeak(3 << 30, "rss", 0, 50), duration_s=90.0)


def died_of_memory(*levels: tuple[float, bool]) -> TrialResult:
    """Met the limits at the levels given, then ran out of memory mid-prefill at the next one."""
    lv = tuple(recorded_level(c, 100 * c, 200 if ok else 900) for c, ok in levels)
    oom = Failure(FailureKind.OUT_OF_MEMORY, "out of memory while serving at concurrency 4: CUDA out of memory")
    return TrialResult("infeasible", levels=lv, boot=BootInfo(40.0, 524_288), failure=oom, duration_s=90.0)


def record(study: optuna.Study, spec, params: dict[str, object], result: TrialResult) -> None:
    study.enqueue_trial(params)
    trial = study.ask()
    config = engine_config(spec, suggest(trial, spec.space))
    for key, value in search_record.config_attrs(config.model, config.flags).items():
        trial.set_user_attr(key, value)
    tell.tell_result(study, trial, result)


def test_the_longest_context_served_at_1_2_and_4_users_with_its_trial_and_flags(tmp_path: Path) -> None:
    spec, url, study = long_context_study(tmp_path)
    record(study, spec, {"max_model_len": 8192, "max_num_seqs": 1}, served((1, True), (2, False)))   # trial 0
    record(study, spec, {"max_model_len": 4096, "max_num_seqs": 4}, served((2, True), (4, True)))   # trial 1
    # Served 1 and 2 users at 8k, then ran out of memory at 4: those flags die once the long prompts come.
    record(study, spec, {"max_model_len": 8192, "max_num_seqs": 4}, died_of_memory((1, True), (2, True)))
    record(study, spec, {"max_model_len": 2048, "max_num_seqs": 4}, served((4, True)))   # trial 3: shorter
    record(study, spec, {"max_model_len": 8192, "max_num_seqs": 2}, served((1, False)))  # trial 4: missed them

    assert clips_to_context(study)
    answers = longest_contexts(search_record.views(study))
    assert [(a.users, a.max_model_len, a.trial, a.level) for a in answers] == [
        (1, 8192, 0, 1), (2, 4096, 1, 4), (4, 4096, 1, 4)]
    assert "--max-model-len 8192" in answers[0].text and "--max-num-seqs 1" in answers[0].text
    lines = context_lines(study)
    assert lines[0] == "longest context served within the limits:"
    assert lines[2].startswith("  2 users: 4,096 tokens (trial 1, met the limits up to concurrency 4): ")

    runner = CliRunner()
    status = runner.invoke(main, ["status", "--study", "tiny-cpu", "--storage", url])
    assert status.exit_code == 0, status.output
    page = html.unescape(report_page.write_report(study, tmp_path / "report", png=False).html.read_text())
    # The end of a run, through the real `autotune run`: 80 s is less than a trial (90 s), so none boots.
    run = runner.invoke(main, ["run", str(spec.path), "--budget", "80s", "--storage", url])
    assert run.exit_code == 0, run.output
    for where, text in (("status", status.output), ("report", page), ("run", run.output.split("this run:")[1])):
        flat = " ".join(text.split())
        for answer in answers:
            assert " ".join(answer.text.split()) in flat, f"{where}: {text}"


def test_no_trial_that_served_4_users_is_not_found_and_a_chat_study_asks_nothing(tmp_path: Path) -> None:
    spec, url, study = long_context_study(tmp_path / "long")
    record(study, spec, {"max_model_len": 8192, "max_num_seqs": 1}, served((1, True), (2, False)))
    assert [a.text for a in longest_contexts(search_record.views(study))][1:] == ["2 users: not found",
                                                                                  "4 users: not found"]
    assert LongestContext(4).text == "4 users: not found"
    chat = open_study(load_study(_study_copy(tmp_path / "chat")), f"sqlite:///{tmp_path / 'chat.db'}")
    assert not clips_to_context(chat) and context_lines(chat) == []
