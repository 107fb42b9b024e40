"""`autotune estimate`: the memory estimate of a study's configurations, or of one model and its flags, without a
GPU."""

from __future__ import annotations

from pathlib import Path

import click

from autotune.cli.console import console
from autotune.cli.options import configured_model_option, renamed_option, storage_option
from autotune.errors import SpecError

MAX_SAMPLES = 1000  # sampled configurations `estimate -n` shows: a table, not a search


@click.command("estimate")
@click.argument("study_file", required=False, type=click.Path(path_type=Path))
@click.option("--model", default=None, help="Instead of a study: a model directory, hub id or tiny:KIND.")
@click.option("--hardware", "hardware", default=None, help="Hardware profile (rtx3090, h100-80gb, cpu, ...).")
@click.option("--gpu", "old_hardware", default=None, hidden=True)
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="A vLLM flag by its dest name; repeatable.")
@click.option("--vllm-version", "vllm_version", default=None, metavar="X.Y.Z",
              help="Predict for this vLLM version (the GPU machine's) instead of the installed one, or the study's.")
@click.option("-n", "samples", default=10, show_default=True, help="Sampled configurations to show (study mode).")
@storage_option
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="json: one JSON document (for scripts).")
def estimate_command(study_file: Path | None, model: str | None, hardware: str | None, old_hardware: str | None,
                     sets: tuple[str, ...], vllm_version: str | None, samples: int, storage: str | None,
                     fmt: str) -> None:
    """Predict, without a GPU, whether configurations fit in memory and how many KV-cache tokens they leave.

    \b
      autotune estimate studies/qwen3.5-27b-rtx3090.toml          # baselines and sampled configurations
      autotune estimate --model Qwen/Qwen3.5-27B --hardware rtx3090    # one configuration, line by line
      autotune estimate --model Qwen/Qwen3.5-27B-GPTQ-Int4 --hardware rtx3090 --set max_model_len=8192
      autotune estimate --model Qwen/Qwen3.5-27B-GPTQ-Int4 --hardware rtx3090 --vllm-version 0.25.0
    """
    from autotune.config.study_file import load_study
    from autotune.engine.flag_checks import check_given
    from autotune.fit import feasibility
    from autotune.fit.vllm_version import parse_vllm_version
    from autotune.search.preview import estimate_profile, preview_estimates
    from autotune.show.tables import breakdown_table, calibration_text, estimates_json, estimates_table

    hardware = renamed_option(old_hardware, hardware, "--gpu", "--hardware")
    if (study_file is None) == (model is None):
        raise SpecError("estimate", None, "give either a study file or --model")
    if study_file is not None and sets:
        raise SpecError("--set", sets[0], "goes with --model; a study's flags are in its file")
    if not 0 <= samples <= MAX_SAMPLES:
        raise SpecError("-n", str(samples), f"must be between 0 and {MAX_SAMPLES}")
    version = parse_vllm_version(vllm_version) if vllm_version is not None else None
    if study_file is not None:
        spec = load_study(study_file)
        profile, rows = preview_estimates(spec, hardware, samples, storage, version)
        title = f"{spec.name} on {profile.label}: predicted before any boot"
    else:
        assert model is not None  # exactly one of study_file and model, checked above
        profile = estimate_profile(hardware, "auto", None)
        path, flags = configured_model_option(model, sets)
        check_given("--set", flags, None)
        rows = [(model, model, flags, feasibility.judge(path, profile, flags, {}, vllm_version=version))]
        title = f"{model} on {profile.label}"
    modelled = rows[0][3].estimate if rows else None
    if modelled is not None:
        title += f", {modelled.vllm_version}"
        if modelled.version_note and fmt != "json":
            click.echo(f"note: {modelled.version_note}", err=True)
    if fmt == "json":
        click.echo(estimates_json(rows, profile_name=profile.name))
    elif study_file is not None:
        console.print(estimates_table(rows, title=title))
    else:
        verdict = rows[0][3]
        console.print(breakdown_table(verdict.estimate, title=f"{title} ({calibration_text(verdict)})"))
