"""`autotune trial`: one server, one configuration, measured as a study's trial would be."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from autotune.cli.console import console
from autotune.cli.options import (
    allow_env_option,
    allow_flag_option,
    configured_model_option,
    parse_env,
    renamed_option,
    warn_slow_dtype,
)


@click.command("trial")
@click.option("--model", required=True, help="Model directory, hub id, or tiny:dense / tiny:hybrid (random weights).")
@click.option("--objective", "objective_path", required=True, type=click.Path(path_type=Path),
              help="Objective file (workload and p95 limits), e.g. objectives/tiny-cpu.toml.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="A vLLM flag by its dest name; repeatable.")
@click.option("--env", "envs", multiple=True, metavar="NAME=VALUE", help="Environment for the server; repeatable.")
@click.option("--log", "log_path", type=click.Path(path_type=Path), default=None,
              help="Where the server log goes (default runs/trial-<time>.log).")
@click.option("--boot-timeout", default="15m", show_default=True, help="Give up on a boot after this long.")
@click.option("--gpus", "gpus", default="", help="GPU indices to use and sample, e.g. 0 (CUDA build only).")
@click.option("--gpu", "old_gpus", default=None, hidden=True)
@click.option("--memory-cap", default=None, metavar="GIB|PROFILE",
              help="Behave as a card with this much memory, e.g. 24 or rtx3090 (flags translated for the GPU present).")
@allow_flag_option
@allow_env_option
def trial_command(model: str, objective_path: Path, sets: tuple[str, ...], envs: tuple[str, ...],
                  log_path: Path | None, boot_timeout: str, gpus: str, old_gpus: str | None, memory_cap: str | None,
                  allow_flags: tuple[str, ...], allow_env: tuple[str, ...]) -> None:
    """Boot one vLLM server with the given flags and find the highest load it sustains within the limits.

    \b
      autotune trial --model tiny:dense --objective objectives/tiny-cpu.toml \\
          --set max_num_seqs=16 --set max_num_batched_tokens=2048
    """
    import time

    from autotune.config.objective import load_objective
    from autotune.config.toml import parse_duration
    from autotune.config.workload_checks import check_prompt_tokenizer, check_workload_fits
    from autotune.engine import defaults as engine_defaults
    from autotune.engine import flag_checks
    from autotune.engine.env import check_env
    from autotune.engine.weights import fetch_named
    from autotune.fit import memcap
    from autotune.measure.plan import plan_trial
    from autotune.measure.trial import run_trial
    from autotune.search.slots import Slot, check_slots_fit, gpu_indices
    from autotune.show.tables import print_trial

    gpus = renamed_option(old_gpus, gpus, "--gpu", "--gpus") or ""
    objective = load_objective(objective_path)
    path, flags = configured_model_option(model, sets)
    check_prompt_tokenizer(objective, [path])
    check_workload_fits(objective, [path])
    flag_checks.check_given("--set", flags, allow_flags)  # as `run` checks a study's (check_inputs)
    env = parse_env(envs)
    check_env(env, "--env", None, allow_env)
    boot_timeout_s = parse_duration(boot_timeout, "--boot-timeout")
    indices = gpu_indices(gpus, "--gpus") if gpus.strip() else ()
    if indices:
        check_slots_fit((Slot("trial", indices),), "--gpus")
    warn_slow_dtype(path, flags)
    cap, real = None, None
    if memory_cap is not None:  # the estimator's card is the capped one; the flags are translated for the real one
        cap, real = memcap.parse_cap(memory_cap), memcap.present_gpu(indices[0] if indices else 0)
        util = float(flags.get("gpu_memory_utilization") or engine_defaults.DEFAULT_UTILIZATION)  # type: ignore[arg-type]
        console.print(memcap.describe(real, cap, util))
    plan = plan_trial(path, flags, objective,
                      log_path or Path("runs") / f"trial-{time.strftime('%Y%m%d-%H%M%S')}.log",
                      env=env, boot_timeout_s=boot_timeout_s, gpu_indices=indices, memory_cap=cap, real_gpu=real)
    fetch_named(path, flags, lambda line: console.print(line, markup=False), "--model", None)
    with console.status("booting") as status:
        result = run_trial(plan, on_stage=lambda s: status.update(s))
    print_trial(console, result, objective, None if cap is None else cap.cuda_total_gib)
    sys.exit(0 if result.status == "ok" else 1)
