"""`autotune compare`: the winner of a study that has run against its best baseline, on fresh boots in pairs."""

from __future__ import annotations

from pathlib import Path

import click

from autotune.cli.console import console
from autotune.cli.options import budget_option, storage_option, stored_study


@click.command("compare")
@click.argument("study_file", type=click.Path(path_type=Path))
@budget_option
@storage_option
def compare_command(study_file: Path, budget: str | None, storage: str | None) -> None:
    """Boot the study's winner and its best baseline again, in pairs (A B, then B A), until the difference is
    resolved at 90% confidence, eight pairs were measured, or the budget has no room for another pair; then say
    the answer, as `status`, `export` and the report will.

    \b
      autotune compare studies/tiny-cpu.toml
      autotune compare studies/qwen3.5-27b-rtx3090.toml --budget 1h
    """
    from autotune.config.study_file import load_study
    from autotune.config.toml import parse_duration
    from autotune.search import paired
    from autotune.search.budget import Budget
    from autotune.search.remeasure import best_trial, figure_line
    from autotune.search.study import compare_study
    from autotune.show.tables import LiveProgress

    spec = load_study(study_file)
    plan = Budget(seconds=parse_duration(budget, "--budget") if budget is not None else None)
    with LiveProgress(console, plan) as progress:
        ran = compare_study(spec, plan, storage_url=storage, progress=progress,
                            say=lambda line: console.print(line, markup=False))
    study = stored_study(spec.name, storage) if storage else stored_study(str(spec.path), None)
    best = best_trial(study)
    console.print(f"compared: {len(ran.done)} boot(s)" + (f"; stopped: {ran.stopped_because}"
                                                           if ran.stopped_because else ""), markup=False)
    if best is not None:
        console.print(f"best: {best.text}", markup=False, soft_wrap=True)
        console.print(figure_line(best, study.get_trials(deepcopy=False)), markup=False, soft_wrap=True)
    if ran.comparison is not None:
        console.print(f"answer: {ran.comparison.sentence}", markup=False, soft_wrap=True)
    for line in paired.noise_lines(study):
        console.print(line, markup=False, soft_wrap=True)
