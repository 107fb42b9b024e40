"""The commands that read a study's results: `status`, `export`, `report` and `dashboard`."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import click

from autotune.cli.console import console, err_console, shown
from autotune.cli.options import storage_option, stored_study, study_option
from autotune.errors import SpecError


@click.command("status")
@study_option
@storage_option
@click.option("--limit", default=15, show_default=True, help="How many trials to show.")
def status_command(study: str | None, storage: str | None, limit: int) -> None:
    """A table of the study's trials, best feasible first, baselines always shown.

    \b
      autotune status --study tiny-cpu
    """
    from autotune.search import paired
    from autotune.search.remeasure import best_trial, figure_line
    from autotune.show.longest_context import context_lines
    from autotune.show.tables import study_table

    if limit < 1:
        raise SpecError("--limit", str(limit), "must be at least 1")
    s = stored_study(study, storage)
    console.print(study_table(s.trials, limit=limit, title=f"study {s.study_name}: {len(s.trials)} trial(s)"))
    best = best_trial(s)
    console.print(f"best: {best.text}" if best is not None else "no feasible configuration yet", markup=False,
                  soft_wrap=True)
    if best is not None:
        console.print(figure_line(best, s.get_trials(deepcopy=False)), markup=False, soft_wrap=True)
    if (answer := paired.answer(s)) is not None:
        console.print(f"answer: {answer.sentence}", markup=False, soft_wrap=True)
    for line in paired.noise_lines(s):
        console.print(line, markup=False, soft_wrap=True)
    for line in context_lines(s):
        console.print(line, markup=False, soft_wrap=True)


@click.command("export")
@study_option
@storage_option
@click.option("--format", "fmt", type=click.Choice(["flags", "yaml", "json", "docker"]), default="flags",
              show_default=True)
@click.option("--max-vram", type=float, default=None,
              help="Only trials whose peak GPU memory (NVML) was at most this (GiB).")
@click.option("--max-p95-ttft-ms", type=float, default=None, help="Only trials whose p95 TTFT was at most this.")
@click.option("--unproven", is_flag=True,
              help="Export the winner even when the final paired comparison did not show it better than the best "
                   "baseline (by default that baseline is exported, and stderr says why).")
def export_command(study: str | None, storage: str | None, fmt: str, max_vram: float | None,
                   max_p95_ttft_ms: float | None, unproven: bool) -> None:
    """Print the best feasible configuration as a command that starts vLLM's server with its flags where autotune
    is installed (`vllm serve ...`; on vLLM's CPU build, whose `vllm` command fails, `python -m
    vllm.entrypoints.openai.api_server --model ...`), a `--config` YAML file, JSON, or a `docker run` of vLLM's
    image, with the environment its server booted with (NAME=value before the command; a comment atop the YAML,
    which vLLM's --config has no place for; an "env" key in JSON; -e in docker).

    \b
      autotune export --format flags
      autotune export --study tiny-cpu --format yaml > best.yaml && vllm serve --config best.yaml
      autotune export --format docker
    """
    from autotune.show.export import export_winner

    for flag, bound in (("--max-vram", max_vram), ("--max-p95-ttft-ms", max_p95_ttft_ms)):
        if bound is not None and not (math.isfinite(bound) and bound > 0):  # nan filtered out every trial silently
            raise SpecError(flag, str(bound), "must be a positive number")
    text, notes = export_winner(stored_study(study, storage), fmt, max_vram, max_p95_ttft_ms, unproven)
    for note in notes if fmt == "flags" else [n for n in notes if n.startswith("exported the ")]:
        click.echo(f"# {shown(note)}", err=True)  # stdout stays a command to paste or capture; why a baseline, always
    click.echo(text, nl=False)


@click.command("report")
@study_option
@storage_option
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("reports"), show_default=True,
              help="Directory for the HTML report and the PNGs.")
@click.option("--png/--no-png", default=None,
              help="PNGs of the two Pareto plots (a headless Chromium renders them). Default: when Chromium is "
                   "there; --png: fail without it.")
def report_command(study: str | None, storage: str | None, out_dir: Path, png: bool | None) -> None:
    """Write one offline HTML report of a study (Pareto plots, history, importances, load curves, top trials
    with their flags) and PNGs of the two Pareto plots.

    \b
      autotune report --study tiny-cpu --out reports/
    """
    from autotune.show.page import write_report

    loaded = stored_study(study, storage)
    try:
        files = write_report(loaded, out_dir, png=png)
    except OSError as e:
        raise SpecError("--out", str(out_dir), f"cannot write the report there: {e.strerror or e}") from None
    console.print(f"report: {files.html}", soft_wrap=True, markup=False)
    for path in files.pngs:
        console.print(f"image:  {path}", soft_wrap=True, markup=False)
    if files.png_error:  # the HTML is the report; the PNGs are extras that need Chromium
        err_console.print(f"no PNGs: {files.png_error}", soft_wrap=True, markup=False)


@click.command("dashboard")
@study_option
@storage_option
@click.option("--port", default=8080, show_default=True, help="Port (0: any free port).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; another than loopback lets other machines read the study (warned).")
def dashboard_command(study: str | None, storage: str | None, port: int, host: str) -> None:
    """Serve optuna-dashboard on 127.0.0.1 for the study: its trials, their flags, the reasons of infeasible ones
    and each trial's server log. Runs until Ctrl-C.

    \b
      autotune dashboard --study tiny-cpu --port 8080
    """
    import optuna

    from autotune.search.storage import open_storage, study_ref
    from autotune.show.dashboard import exposure_warning, serve

    if not 0 <= port <= 65535:
        raise SpecError("--port", str(port), "must be a TCP port, 0 to 65535 (0: any free port)")
    name, url = study_ref(study, storage)

    def announce(address: str) -> None:
        click.echo(f"optuna-dashboard for study {name}: {address}  (Ctrl-C to stop)")
        sys.stdout.flush()

    stored_study(study, storage)  # it exists: found without creating anything
    if warning := exposure_warning(host):
        err_console.print(warning, soft_wrap=True, markup=False)
    study_read = optuna.load_study(study_name=name, storage=open_storage(url))
    serve(study_read, url, port, announce, host)  # writes trial notes
