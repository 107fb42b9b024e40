"""The command line. The one place where autotune's errors become messages and exit codes."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape

from autotune.errors import AutotuneError, SpecError

console = Console(highlight=False)
if not console.is_terminal:  # piped or captured: wide enough that tables stay readable in a log
    console = Console(highlight=False, width=160)
err_console = Console(stderr=True, highlight=False)


class _Group(click.Group):
    """Turns autotune's errors into one clear line and their exit code (2 for bad input)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except AutotuneError as e:
            err_console.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)  # paths, TOML [tables]
            sys.exit(e.exit_code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="autotune")
def main() -> None:
    """Find the vLLM serving configuration that gives the most throughput within your latency limits.

    \b
      autotune run studies/tiny-cpu.toml --budget 10m     # the embedded default: no GPU needed
      autotune status                                      # trials so far, best first
      autotune export --format flags                       # the best configuration as `vllm serve` flags
    """
    _quiet_optuna()


def _quiet_optuna() -> None:
    """Optuna's experimental-feature and per-trial log lines drown the progress display; autotune says it all."""
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    warnings.filterwarnings("ignore", message="Fixed parameter .* is out of range")


def parse_set(values: tuple[str, ...], flag: str = "--set") -> dict[str, object]:
    """`--set key=value` pairs; values are read as JSON where they parse (16, 0.9, true, {...}), else strings."""
    out: dict[str, object] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise SpecError(flag, item, "expected key=value, e.g. max_num_seqs=16")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def parse_env(values: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise SpecError("--env", item, "expected NAME=value")
        out[key] = raw
    return out


@main.command()
@click.option("--model", required=True, help="Model directory, hub id, or tiny:dense / tiny:hybrid (random weights).")
@click.option("--objective", "objective_path", required=True, type=click.Path(path_type=Path),
              help="Objective file (workload and p95 limits), e.g. objectives/tiny-cpu.toml.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="A vLLM flag by its dest name; repeatable.")
@click.option("--env", "envs", multiple=True, metavar="NAME=VALUE", help="Environment for the server; repeatable.")
@click.option("--log", "log_path", type=click.Path(path_type=Path), default=None,
              help="Where the server log goes (default runs/trial-<time>.log).")
@click.option("--boot-timeout", default="15m", show_default=True, help="Give up on a boot after this long.")
@click.option("--gpu", "gpus", default="", help="GPU indices to use and sample, e.g. 0 (CUDA build only).")
@click.option("--memory-cap", default=None, metavar="GIB|PROFILE",
              help="Behave as a card with this much memory, e.g. 24 or rtx3090 (flags translated for the GPU present).")
def trial(model: str, objective_path: Path, sets: tuple[str, ...], envs: tuple[str, ...], log_path: Path | None,
          boot_timeout: str, gpus: str, memory_cap: str | None) -> None:
    """Boot one vLLM server with the given flags and find the highest load it sustains within the limits.

    \b
      autotune trial --model tiny:dense --objective objectives/tiny-cpu.toml \\
          --set max_num_seqs=16 --set max_num_batched_tokens=2048
    """
    import time

    from autotune.config.objective import load_objective
    from autotune.config.study_file import check_prompt_tokenizer
    from autotune.config.toml import parse_duration
    from autotune.engine import defaults as engine_defaults
    from autotune.engine import flags as engine_flags
    from autotune.engine.weights import fetch_named
    from autotune.fit import memcap
    from autotune.measure.trial import plan_trial, run_trial
    from autotune.show.tables import print_trial

    objective = load_objective(objective_path)
    path, flags = _configured_model_option(model, sets)
    check_prompt_tokenizer(objective, [path])
    engine_flags.check(("--set", k) for k in flags)
    engine_flags.check_values(("--set", k, k, v) for k, v in flags.items())
    _warn_slow_dtype(path, flags)
    gpu_indices = tuple(int(g) for g in gpus.split(",") if g.strip())
    cap, real = None, None
    if memory_cap is not None:  # the estimator's card is the capped one; the flags are translated for the real one
        cap, real = memcap.parse_cap(memory_cap), memcap.present_gpu(gpu_indices[0] if gpu_indices else 0)
        util = float(flags.get("gpu_memory_utilization") or engine_defaults.DEFAULT_UTILIZATION)  # type: ignore[arg-type]
        console.print(memcap.describe(real, cap, util))
    plan = plan_trial(path, flags, objective,
                      log_path or Path("runs") / f"trial-{time.strftime('%Y%m%d-%H%M%S')}.log",
                      env=parse_env(envs), boot_timeout_s=parse_duration(boot_timeout, "--boot-timeout"),
                      gpu_indices=gpu_indices, memory_cap=cap, real_gpu=real)
    fetch_named(path, flags, lambda line: console.print(line, markup=False), "--model", None)
    with console.status("booting") as status:
        result = run_trial(plan, on_stage=lambda s: status.update(s))
    print_trial(console, result, objective, None if cap is None else cap.cuda_total_gib)
    sys.exit(0 if result.status == "ok" else 1)


def _configured_model_option(model: str, sets: tuple[str, ...]) -> tuple[str, dict[str, object]]:
    """--model and --set as a trial boots them (measure/trial.configured), with a bad tiny:KIND or an
    unresolvable hub id as a one-line error naming the flag (said before a bad --set, as it always was)."""
    from autotune.errors import ModelUnavailable
    from autotune.fit import feasibility
    from autotune.measure.trial import configured

    try:
        configured(model, {})
        if not model.startswith("tiny:") and not Path(model).is_dir():
            feasibility.model_shape(model)
    except (ValueError, ModelUnavailable) as e:
        raise SpecError("--model", model, str(e)) from None
    return configured(model, parse_set(sets))


def _load_study(study: str | None, storage: str | None):
    """The study a read-only command reads (search/storage.py's load_study_ref)."""
    from autotune.search.storage import load_study_ref

    return load_study_ref(study, storage)


study_option = click.option("--study", default=None,
                            help="Study name or study file (default: the latest under studies/).")
storage_option = click.option("--storage", default=None, help="Optuna storage URL (default: sqlite:///studies/NAME.db).")


def _run(spec, plan, storage: str | None, slots) -> None:
    from autotune.search.record import view
    from autotune.search.study import fetch_checkpoints, open_study, run_study
    from autotune.show.tables import LiveProgress, study_table

    # Started in the background by a script, a process inherits SIGINT ignored and Python never raises
    # KeyboardInterrupt: then `kill -INT` (the signal Ctrl-C sends) was lost and the run went on (seen: the fault
    # suite under `make test &`). A run stops cleanly on it however it was started.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        fetch_checkpoints(spec, say=lambda line: console.print(line, markup=False))
    except KeyboardInterrupt:
        console.print("interrupted while fetching the weights; the files fetched are kept, and the same command "
                      "fetches the rest")
        sys.exit(130)
    open_study(spec, storage, say=console.print)  # a changed study is refused here; new baselines are said
    try:
        with LiveProgress(console, plan) as progress:
            summary = run_study(spec, plan, storage_url=storage, progress=progress, slots=slots,
                                say=lambda line: console.print(line, markup=False))
    except KeyboardInterrupt:  # while no trial runs: during one, Ctrl-C stops the study cleanly and raises nothing
        console.print("interrupted (no trial was running)")
        sys.exit(130)
    study = _load_study(spec.name, storage) if storage else _load_study(str(spec.path), None)
    console.print(study_table(study.trials))
    for line in summary.lines():
        console.print(line, markup=False, soft_wrap=True)
    if summary.best is not None:
        console.print(view(summary.best.trial).command, markup=False, soft_wrap=True)
    if summary.stopped_because == "interrupted":
        sys.exit(130)


budget_option = click.option("--budget", default=None,
                             help="Wall-clock budget: 4h, 90m, 1h30m (default: the study file's).")
n_trials_option = click.option("--n-trials", type=int, default=None,
                               help="Stop after this many booted trials (this run).")
workers_option = click.option("--workers", type=int, default=None,
                              help="Trials at a time, each its own server (CPU build).")
gpus_option = click.option("--gpus", default=None, help="One trial at a time on each of these GPUs, e.g. 0,1,2,3.")


@main.command()
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
def run(study_file: Path, budget: str | None, n_trials: int | None, storage: str | None, workers: int | None,
        gpus: str | None, from_study: str | None, from_storage: str | None) -> None:
    """Search the study's space: boot, measure and record trials until the budget is spent.

    Running the same command again resumes the same study.

    \b
      autotune run studies/tiny-cpu.toml --budget 10m
      autotune run studies/qwen3.5-27b-rtx3090.toml --budget 4h
      autotune run studies/qwen3.5-27b-rtx3090.toml --budget 4h --gpus 0,1
      autotune run studies/tiny-cpu.toml --storage postgresql://tuner@db/autotune --budget 1h
      autotune run studies/tiny-hybrid-cpu.toml --budget 30m --from-study tiny-cpu \\
          --from-storage sqlite:///studies/tiny-cpu.db
    """
    from autotune.config.study_file import check_prompt_tokenizer, load_study, study_models
    from autotune.engine.models import resolve_model
    from autotune.search.budget import budget_for
    from autotune.search.slots import check_slots_fit, slots_for
    from autotune.search.study import check_inputs

    spec = load_study(study_file)
    check_prompt_tokenizer(spec.objective, study_models(spec))
    slots = check_slots_fit(slots_for(workers, gpus))
    plan = budget_for(budget, n_trials, spec)
    check_inputs(spec, slots)
    _warn_slow_dtype(resolve_model(spec.model.path)[0], spec.fixed_flags())
    if from_study is not None:
        _warm_start(spec, storage, from_study, from_storage)
    _run(spec, plan, storage, slots)


def _warn_slow_dtype(model: str, flags: dict[str, object]) -> None:
    from autotune.engine.flags import Build, detect_build
    from autotune.fit.feasibility import slow_dtype_warning

    if warning := slow_dtype_warning(model, flags, detect_build() is Build.CPU):
        console.print(warning, markup=False, soft_wrap=True)


def _warm_start(spec, storage: str | None, name: str, from_storage: str | None) -> None:
    from autotune.search.samplers import warm_start
    from autotune.search.storage import default_storage
    from autotune.search.study import open_study

    here = storage or spec.storage or default_storage(spec)
    source = _load_study(name, from_storage or here)
    if source.study_name == spec.name and (from_storage or here) == here:
        raise SpecError("--from-study", name, "is this study itself; name an earlier one")
    queued = warm_start(open_study(spec, storage, say=console.print), source, spec.space)
    console.print(f"warm start: {len(queued)} configuration(s) of study {source.study_name} queued after the baselines",
                  markup=False)


@main.command()
@click.option("--study", "name", required=True, help="The study's name (as `autotune run` created it).")
@click.option("--storage", required=True, help="The shared storage URL, e.g. postgresql://tuner@db/autotune.")
@budget_option
@n_trials_option
@workers_option
@gpus_option
def worker(name: str, storage: str, budget: str | None, n_trials: int | None, workers: int | None,
           gpus: str | None) -> None:
    """Join a study that lives in a shared database (PostgreSQL) from another machine or GPU.

    The study file travels in the database: a worker needs only the storage URL and the study's name.

    \b
      autotune worker --study qwen3.5-27b-rtx3090 --storage postgresql://tuner@db/autotune --budget 4h
    """
    from autotune.config.study_file import check_prompt_tokenizer, study_models
    from autotune.search.budget import budget_for
    from autotune.search.slots import check_slots_fit, slots_for
    from autotune.search.storage import spec_from_storage
    from autotune.search.study import check_inputs

    slots = check_slots_fit(slots_for(workers, gpus))
    spec = spec_from_storage(name, storage, Path(".autotune-worker") / name)
    check_prompt_tokenizer(spec.objective, study_models(spec))
    plan = budget_for(budget, n_trials, spec)
    check_inputs(spec, slots)
    _run(spec, plan, storage, slots)


@main.command()
@study_option
@storage_option
@click.option("--limit", default=15, show_default=True, help="How many trials to show.")
def status(study: str | None, storage: str | None, limit: int) -> None:
    """A table of the study's trials, best feasible first, baselines always shown.

    \b
      autotune status --study tiny-cpu
    """
    from autotune.search.remeasure import best_trial
    from autotune.show.tables import study_table

    s = _load_study(study, storage)
    console.print(study_table(s.trials, limit=limit, title=f"study {s.study_name}: {len(s.trials)} trial(s)"))
    best = best_trial(s)
    console.print(f"best: {best.text}" if best is not None else "no feasible configuration yet", markup=False,
                  soft_wrap=True)


@main.command()
@study_option
@storage_option
@click.option("--format", "fmt", type=click.Choice(["flags", "yaml", "json"]), default="flags", show_default=True)
@click.option("--max-vram", type=float, default=None,
              help="Only trials whose peak GPU memory (NVML) was at most this (GiB).")
@click.option("--max-p95-ttft-ms", type=float, default=None, help="Only trials whose p95 TTFT was at most this.")
def export(study: str | None, storage: str | None, fmt: str, max_vram: float | None,
           max_p95_ttft_ms: float | None) -> None:
    """Print the best feasible configuration as `vllm serve` flags, a `--config` YAML file, or JSON, with the
    environment its server booted with (NAME=value before the command; a comment atop the YAML, which vLLM's
    --config has no place for; an "env" key in JSON).

    \b
      autotune export --format flags
      autotune export --study tiny-cpu --format yaml > best.yaml && vllm serve --config best.yaml
    """
    from autotune.show.export import export_winner

    text, notes = export_winner(_load_study(study, storage), fmt, max_vram, max_p95_ttft_ms)
    if fmt == "flags":
        for note in notes:
            click.echo(f"# {note}", err=True)  # stdout stays a command to paste or capture
    click.echo(text, nl=False)


@main.command()
@click.argument("study_file", required=False, type=click.Path(path_type=Path))
@click.option("--model", default=None, help="Instead of a study: a model directory, hub id or tiny:KIND.")
@click.option("--gpu", "hardware", default=None, help="Hardware profile (rtx3090, h100-80gb, cpu, ...).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="A vLLM flag by its dest name; repeatable.")
@click.option("-n", "samples", default=10, show_default=True, help="Sampled configurations to show (study mode).")
@storage_option
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="json: one JSON document (for scripts).")
def estimate(study_file: Path | None, model: str | None, hardware: str | None, sets: tuple[str, ...],
             samples: int, storage: str | None, fmt: str) -> None:
    """Predict, without a GPU, whether configurations fit in memory and how many KV-cache tokens they leave.

    \b
      autotune estimate studies/qwen3.5-27b-rtx3090.toml          # baselines and sampled configurations
      autotune estimate --model Qwen/Qwen3.5-27B --gpu rtx3090    # one configuration, line by line
      autotune estimate --model Qwen/Qwen3.5-27B-GPTQ-Int4 --gpu rtx3090 --set max_model_len=8192
    """
    from autotune.config.study_file import load_study
    from autotune.fit import feasibility
    from autotune.search.study import estimate_profile, preview_estimates
    from autotune.show.tables import breakdown_table, calibration_text, estimates_json, estimates_table

    if (study_file is None) == (model is None):
        raise SpecError("estimate", None, "give either a study file or --model")
    if study_file is not None:
        spec = load_study(study_file)
        profile, rows = preview_estimates(spec, hardware, samples, storage)
        title = f"{spec.name} on {profile.label}: predicted before any boot"
    else:
        assert model is not None  # exactly one of study_file and model, checked above
        profile = estimate_profile(hardware, "auto", None)
        path, flags = _configured_model_option(model, sets)
        rows = [(model, model, flags, feasibility.judge(path, profile, flags, {}))]
        title = f"{model} on {profile.label}"
    if fmt == "json":
        click.echo(estimates_json(rows, profile_name=profile.name))
    elif study_file is not None:
        console.print(estimates_table(rows, title=title))
    else:
        verdict = rows[0][3]
        console.print(breakdown_table(verdict.estimate, title=f"{title} ({calibration_text(verdict)})"))


@main.command()
@study_option
@storage_option
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("reports"), show_default=True,
              help="Directory for the HTML report and the PNGs.")
@click.option("--png/--no-png", default=None,
              help="PNGs of the two Pareto plots (a headless Chromium renders them). Default: when Chromium is "
                   "there; --png: fail without it.")
def report(study: str | None, storage: str | None, out_dir: Path, png: bool | None) -> None:
    """Write one offline HTML report of a study (Pareto plots, history, importances, load curves, top trials
    with their flags) and PNGs of the two Pareto plots.

    \b
      autotune report --study tiny-cpu --out reports/
    """
    from autotune.show.page import write_report

    loaded = _load_study(study, storage)
    try:
        files = write_report(loaded, out_dir, png=png)
    except OSError as e:
        raise SpecError("--out", str(out_dir), f"cannot write the report there: {e.strerror or e}") from None
    console.print(f"report: {files.html}", soft_wrap=True, markup=False)
    for path in files.pngs:
        console.print(f"image:  {path}", soft_wrap=True, markup=False)
    if files.png_error:  # the HTML is the report; the PNGs are extras that need Chromium
        err_console.print(f"no PNGs: {files.png_error}", soft_wrap=True, markup=False)


@main.command()
@study_option
@storage_option
@click.option("--port", default=8080, show_default=True, help="Port on 127.0.0.1 (0: any free port).")
def dashboard(study: str | None, storage: str | None, port: int) -> None:
    """Serve optuna-dashboard on 127.0.0.1 for the study: its trials, their flags, the reasons of infeasible ones
    and each trial's server log. Runs until Ctrl-C.

    \b
      autotune dashboard --study tiny-cpu --port 8080
    """
    from autotune.show.dashboard import serve

    if not 0 <= port <= 65535:
        raise SpecError("--port", str(port), "must be a TCP port, 0 to 65535 (0: any free port)")
    from autotune.search.storage import study_ref

    name, url = study_ref(study, storage)

    def announce(address: str) -> None:
        click.echo(f"optuna-dashboard for study {name}: {address}  (Ctrl-C to stop)")
        sys.stdout.flush()

    import optuna

    from autotune.search.storage import open_storage

    _load_study(study, storage)  # it exists: found without creating anything
    serve(optuna.load_study(study_name=name, storage=open_storage(url)), url, port, announce)  # writes trial notes


if __name__ == "__main__":
    main()
