"""Option parsing the commands share: `--set` and `--env` pairs, `--model` as a trial boots it, the study a
read-only command means, and the click options several commands take."""

from __future__ import annotations

import json
from pathlib import Path

import click

from autotune.cli.console import console
from autotune.errors import SpecError
from autotune.notices import notice


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


def renamed_option(old_value: str | None, new_value: str | None, old: str, new: str) -> str | None:
    """The value of an option given under its old spelling (a hidden alias), said in a notice; both at once: refused.
    One name per meaning across commands: --gpus for GPU indices, --hardware for a hardware profile."""
    if not old_value:
        return new_value
    if new_value:
        raise SpecError(old, old_value, f"give {new} only ({old} is its old spelling)")
    notice(f"{old} is now {new} (the name every command gives it); {old} is still read")
    return old_value


def configured_model_option(model: str, sets: tuple[str, ...]) -> tuple[str, dict[str, object]]:
    """--model and --set as a trial boots them (measure/plan.configured), with a bad tiny:KIND or an
    unresolvable hub id as a one-line error naming the flag (said before a bad --set, as it always was)."""
    from autotune.errors import ModelUnavailable
    from autotune.fit import feasibility
    from autotune.measure.plan import configured

    try:
        configured(model, {})
        if not model.startswith("tiny:") and not Path(model).is_dir():
            feasibility.model_shape(model)
    except (ValueError, ModelUnavailable) as e:
        raise SpecError("--model", model, str(e)) from None
    return configured(model, parse_set(sets))


def stored_study(study: str | None, storage: str | None):
    """The study a read-only command reads (search/storage.py's load_study_ref)."""
    from autotune.search.storage import load_study_ref

    return load_study_ref(study, storage)


def warn_slow_dtype(model: str, flags: dict[str, object]) -> None:
    from autotune.engine.flags import Build, detect_build
    from autotune.fit.feasibility import slow_dtype_warning

    if warning := slow_dtype_warning(model, flags, detect_build() is Build.CPU):
        console.print(warning, markup=False, soft_wrap=True)


study_option = click.option("--study", default=None,
                            help="Study name or study file (default: the latest under studies/).")
storage_option = click.option("--storage", default=None, help="Optuna storage URL (default: sqlite:///studies/NAME.db).")
budget_option = click.option("--budget", default=None,
                             help="Wall-clock budget: 4h, 90m, 1h30m (default: the study file's).")
n_trials_option = click.option("--n-trials", type=int, default=None,
                               help="Stop after this many booted trials (this run).")
workers_option = click.option("--workers", type=int, default=None,
                              help="Trials at a time, each its own server (CPU build).")
gpus_option = click.option("--gpus", default=None, help="One trial at a time on each of these GPUs, e.g. 0,1,2,3.")
allow_flag_option = click.option("--allow-flag", "allow_flags", multiple=True, metavar="FLAG",
                                 help="Let the study set this vLLM flag though it runs code or exposes this host "
                                      "(e.g. trust_remote_code); repeatable.")
allow_env_option = click.option("--allow-env", "allow_env", multiple=True, metavar="NAME",
                                help="Let the study set this variable for the server though it may load code "
                                     "(e.g. PYTHONPATH); repeatable.")
