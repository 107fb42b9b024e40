"""The product's main job end to end on the CPU build: `autotune run` on the embedded default study, then
`autotune export`, then a second run that adds to the same study."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import optuna
from optuna.trial import TrialState

AUTOTUNE = [sys.executable, "-m", "autotune.cli"]


def booted(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.trials if "duration_s" in t.user_attrs]


def test_run_export_and_resume(cpu_study_db: tuple[Path, str], tmp_path: Path) -> None:
    db, name = cpu_study_db
    work = tmp_path / "copy"
    shutil.copytree(db.parent, work)  # the session's database stays as the other tests expect it
    storage = f"sqlite:///{work / db.name}"
    first = optuna.load_study(study_name=name, storage=storage)
    trials = booted(first)
    assert len(trials) >= 3
    for t in trials:
        a = t.user_attrs
        assert t.state in (TrialState.COMPLETE, TrialState.PRUNED)
        for key in ("status", "duration_s", "boot_s", "kv_cache_tokens", "peak_memory_gib", "levels", "flags",
                    "vllm_command", "predicted_kv_tokens"):
            assert key in a, (t.number, key)
    assert [t.user_attrs["baseline"]["name"] for t in first.trials[:2]] == ["vllm-defaults", "recipe"]

    exported = subprocess.run([*AUTOTUNE, "export", "--study", name, "--storage", storage, "--format", "flags"],
                              capture_output=True, text=True, cwd=work, check=True).stdout
    words = shlex.split(exported)
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(words[3:])  # vLLM's own parser accepts it
    assert words[:3] == ["VLLM_CPU_KVCACHE_SPACE=1", "vllm", "serve"]  # the study's [engine.env], as booted
    assert args.model_tag == trials[0].user_attrs["model"] and args.load_format == "dummy"

    again = subprocess.run([*AUTOTUNE, "run", str(work / f"{name}.toml"), "--n-trials", "1", "--storage", storage],
                           capture_output=True, text=True, cwd=work, timeout=1200)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    second = optuna.load_study(study_name=name, storage=storage)
    assert len(booted(second)) == len(trials) + 1
    for before, after in zip(first.trials, second.trials, strict=False):  # nothing lost, nothing repeated
        assert (before.number, before.state, before.value, before.params) == (
            after.number, after.state, after.value, after.params)
