"""The product's main job end to end on the CPU build: `autotune run` on the embedded default study, then
`autotune export`, then a second run that adds to the same study."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import optuna
from conftest import FIRST_RUN
from optuna.trial import TrialState

AUTOTUNE = [sys.executable, "-m", "autotune.cli"]


def booted(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.trials if "duration_s" in t.user_attrs]


def test_run_export_and_resume(cpu_study_db: tuple[Path, str]) -> None:
    db, name = cpu_study_db
    work = db.parent
    storage = f"sqlite:///{db}"
    final = optuna.load_study(study_name=name, storage=storage)
    trials = booted(final)
    assert len(trials) == 3
    for t in trials:
        a = t.user_attrs
        assert t.state in (TrialState.COMPLETE, TrialState.PRUNED)
        for key in ("status", "duration_s", "boot_s", "kv_cache_tokens", "peak_memory_gib", "levels", "flags",
                    "vllm_command", "predicted_kv_tokens"):
            assert key in a, (t.number, key)
    assert [t.user_attrs["baseline"]["name"] for t in final.trials[:2]] == ["vllm-defaults", "recipe"]

    # The second `autotune run` (--n-trials 1) added one booted trial to the first run's two: nothing lost, nothing
    # repeated, and said so.
    first = optuna.load_study(study_name=name, storage=f"sqlite:///{work / FIRST_RUN / db.name}")
    assert len(booted(first)) == 2
    for before, after in zip(first.trials, final.trials, strict=False):
        assert (before.number, before.state, before.value, before.params) == (
            after.number, after.state, after.value, after.params)
    assert "this run: 1 booted" in (work / "run-again.log").read_text()

    exported = subprocess.run([*AUTOTUNE, "export", "--study", name, "--storage", storage, "--format", "flags"],
                              capture_output=True, text=True, cwd=work, check=True).stdout
    words = shlex.split(exported)
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # the study's [engine.env] as booted, then what serves where autotune runs: the CPU build's API server module
    assert words[:4] == ["VLLM_CPU_KVCACHE_SPACE=1", "python", "-m", "vllm.entrypoints.openai.api_server"]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(words[4:])  # vLLM's own parser accepts it
    assert args.model == trials[0].user_attrs["model"] and args.load_format == "dummy"
    assert args.dtype == "float32"
