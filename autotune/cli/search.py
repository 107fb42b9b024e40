"""`autotune run` and `autotune worker`: the search loop, started from a study file or joined from a shared
database."""

from __future__ import annotations

import re
import sys
from dataclasses import replace
from pathlib import Path

import click

from autotune.cli.console import console
from autotune.cli.options import (
    allow_env_option,
    allow_flag_option,
    budget_option,
    gpus_option,
    n_trials_option,
    storage_option,
    stored_study,
    warn_slow_dtype,
    workers_option,
)
from autotune.errors import SpecError


class GoodputCommand(click.Command):
    """`--goodput ttft:2000 tpot:100` as vLLM's bench takes it (several values after one flag): each further value
    is given its own --goodput before click reads them."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, spread_goodput(args))


def spread_goodput(args: list[str]) -> list[str]:
    """["--goodput", "ttft:2000", "tpot:100"] -> ["--goodput", "ttft:2000", "--goodput", "tpot:100"]: the words after
    --goodput's value that are neither options nor a study file."""
    out: list[str] = []
    taking = False  # inside the values of a --goodput
    for word in args:
        if taking and not word.startswith("-") and not word.endswith(".toml"):
            out += ["--goodput", word]
            continue
        taking = bool(out) and out[-1] == "--goodput"
        out.append(word)
    return out


@click.command("run", cls=GoodputCommand)
@click.argument("study_file", type=click.Path(path_type=Path))
@budget_option
@n_trials_option
@storage_option
@workers_option
@gpus_option
@click.option("--from-study", default=None, metavar="NAME",
              help="Begin with the best configurations of an earlier study (re-measured here, not copied).")
@click.option("--from-storage", default=None, metavar="URL",
              help="Where --from-study lives (default: this study's storage).")
@allow_flag_option
@allow_env_option
@click.option("--goodput", multiple=True, metavar="KEY:MS",
              help="The limits instead of the objective's, as vLLM's bench takes them: --goodput ttft:2000 tpot:100 "
                   "(KEY ttft, tpot, itl, e2el, each judged at p95; pNN_KEY at another percentile, e.g. p99_tpot:100).")
def run_command(study_file: Path, budget: str | None, n_trials: int | None, storage: str | None,
                workers: int | None, gpus: str | None, from_study: str | None, from_storage: str | None,
                allow_flags: tuple[str, ...], allow_env: tuple[str, ...], goodput: tuple[str, ...]) -> None:
    """Search the study's space: boot, measure and record trials until the budget is spent.

    Running the same command again resumes the same study.

    \b
      autotune run studies/tiny-cpu.toml --budget 10m
      autotune run studies/qwen3.5-27b-rtx3090.toml --budget 4h
      autotune run studies/qwen3.5-27b-rtx3090.toml --budget 4h --gpus 0,1
      autotune run studies/tiny-cpu.toml --budget 10m --goodput ttft:500 p99_tpot:60
      autotune run studies/tiny-cpu.toml --storage postgresql://tuner@db/autotune --budget 1h
      autotune run studies/tiny-hybrid-cpu.toml --budget 30m --from-study tiny-cpu \\
          --from-storage sqlite:///studies/tiny-cpu.db
    """
    from autotune.config.objective import goodput_limits
    from autotune.config.study_file import check_host_trust, load_study, study_models
    from autotune.config.workload_checks import check_prompt_tokenizer, check_workload_fits
    from autotune.engine.models import resolve_model
    from autotune.search.budget import budget_for
    from autotune.search.slots import check_slots_fit, slots_for
    from autotune.search.study import check_inputs

    limits = goodput_limits(goodput) if goodput else None  # a malformed one is said before the study is read
    spec = load_study(study_file)
    if limits is not None:
        spec = replace(spec, objective=replace(spec.objective, limits=limits))
    check_prompt_tokenizer(spec.objective, study_models(spec))
    check_workload_fits(spec.objective, study_models(spec))
    slots = check_slots_fit(slots_for(workers, gpus))
    plan = budget_for(budget, n_trials, spec)
    check_inputs(spec, slots)
    check_host_trust(spec, allow_flags, allow_env)
    warn_slow_dtype(resolve_model(spec.model.path)[0], spec.fixed_flags())
    if from_study is not None:
        warm_start_from(spec, storage, from_study, from_storage)
    _search(spec, plan, storage, slots)


@click.command("worker")
@click.option("--study", "name", required=True, help="The study's name (as `autotune run` created it).")
@click.option("--storage", required=True, help="The shared storage URL, e.g. postgresql://tuner@db/autotune.")
@budget_option
@n_trials_option
@workers_option
@gpus_option
@click.option("--sha256", "digest", default=None, metavar="HEX",
              help="Run the study only if its stored files have this digest (`autotune run` prints it).")
@click.option("--study-file", type=click.Path(path_type=Path), default=None,
              help="Run the study only if its stored files are this study file and its objective.")
@allow_flag_option
@allow_env_option
def worker_command(name: str, storage: str, budget: str | None, n_trials: int | None, workers: int | None,
                   gpus: str | None, digest: str | None, study_file: Path | None, allow_flags: tuple[str, ...],
                   allow_env: tuple[str, ...]) -> None:
    """Join a study that lives in a shared database (PostgreSQL) from another machine or GPU.

    The study file travels in the database; a worker runs it only if it is the one this host was given: by its
    digest (--sha256, printed by `autotune run`) or as a file (--study-file).

    \b
      autotune worker --study qwen3.5-27b-rtx3090 --storage postgresql://tuner@db/autotune --budget 4h \\
          --sha256 3f1c...
    """
    from autotune.config.study_file import check_host_trust, study_models
    from autotune.config.workload_checks import check_prompt_tokenizer, check_workload_fits
    from autotune.search.budget import budget_for, check_budget_options
    from autotune.search.slots import check_slots_fit, slots_for
    from autotune.search.storage import spec_from_storage
    from autotune.search.study import check_inputs

    check_budget_options(budget, n_trials)  # before the study's files are written under .autotune-worker
    slots = check_slots_fit(slots_for(workers, gpus))
    trust = trusted_digest(digest, study_file)
    spec = spec_from_storage(name, storage, Path(".autotune-worker") / name, trust)
    check_prompt_tokenizer(spec.objective, study_models(spec))
    check_workload_fits(spec.objective, study_models(spec))
    plan = budget_for(budget, n_trials, spec)
    check_inputs(spec, slots)
    check_host_trust(spec, allow_flags, allow_env)
    _search(spec, plan, storage, slots)


def trusted_digest(digest: str | None, study_file: Path | None):
    """The check a worker makes of a stored study's digest before it writes or runs anything of it."""
    from autotune.config.study_file import load_study, stored_texts, study_digest

    if (digest is None) == (study_file is None):
        raise SpecError("--sha256", None, "give the study's digest (printed by `autotune run`) or --study-file, "
                                          "one of them: a worker runs only a study this host was given")
    if digest is not None:
        flag, wanted = "--sha256", digest.strip().lower()
        if not re.fullmatch(r"[0-9a-f]{12,64}", wanted):
            raise SpecError(flag, digest, "expected the study's sha256 in hex (at least its first 12 digits)")
    else:
        assert study_file is not None
        flag, wanted = "--study-file", study_digest(*stored_texts(load_study(study_file)))

    def trust(stored: str) -> None:
        if not stored.startswith(wanted):
            raise SpecError(flag, digest or str(study_file), f"the stored study (sha256 {stored[:16]}...) is not "
                                                             "the one this worker was given; nothing was run")
    return trust


def warm_start_from(spec, storage: str | None, name: str, from_storage: str | None) -> None:
    """`--from-study`: queue the best configurations of an earlier study after this one's baselines."""
    from autotune.search.samplers import warm_start
    from autotune.search.storage import default_storage
    from autotune.search.study import open_study

    here = storage or spec.storage or default_storage(spec)
    source = stored_study(name, from_storage or here)
    if source.study_name == spec.name and (from_storage or here) == here:
        raise SpecError("--from-study", name, "is this study itself; name an earlier one")
    queued = warm_start(open_study(spec, storage, say=console.print), source, spec.space)
    console.print(f"warm start: {len(queued)} configuration(s) of study {source.study_name} queued after the baselines",
                  markup=False)


def _search(spec, plan, storage: str | None, slots) -> None:
    from autotune.config.study_file import stored_texts, study_digest
    from autotune.search.study import fetch_checkpoints, open_study, run_study
    from autotune.show.export import export_winner
    from autotune.show.longest_context import context_lines
    from autotune.show.tables import LiveProgress, study_table

    try:
        fetch_checkpoints(spec, say=lambda line: console.print(line, markup=False))
    except KeyboardInterrupt:
        console.print("interrupted while fetching the weights; the files fetched are kept, and the same command "
                      "fetches the rest")
        sys.exit(130)
    open_study(spec, storage, say=console.print)  # a changed study is refused here; new baselines are said
    if not (storage or spec.storage or "sqlite").startswith("sqlite"):  # a shared database: workers may join
        console.print(f"workers join with: autotune worker --study {spec.name} --storage URL "
                      f"--sha256 {study_digest(*stored_texts(spec))}", markup=False, soft_wrap=True)
    try:
        with LiveProgress(console, plan) as progress:
            summary = run_study(spec, plan, storage_url=storage, progress=progress, slots=slots,
                                say=lambda line: console.print(line, markup=False))
    except KeyboardInterrupt:  # while no trial runs: during one, Ctrl-C stops the study cleanly and raises nothing
        console.print("interrupted (no trial was running)")
        sys.exit(130)
    study = stored_study(spec.name, storage) if storage else stored_study(str(spec.path), None)
    console.print(study_table(study.trials))
    for line in summary.lines():
        console.print(line, markup=False, soft_wrap=True)
    if summary.best is not None:  # what `export` gives: the winner only where it was shown better
        command, notes = export_winner(study, "flags")
        for note in notes[2 if summary.comparison is not None else 1:]:  # past the best and answer lines above
            console.print(note, markup=False, soft_wrap=True)
        console.print(command.rstrip("\n"), markup=False, soft_wrap=True)
    for line in context_lines(study):
        console.print(line, markup=False, soft_wrap=True)
    if summary.stopped_because == "interrupted":
        sys.exit(130)
