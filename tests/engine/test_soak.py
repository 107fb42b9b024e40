"""The soak on the vLLM CPU build: a study whose winner beat the recipe in its final pairs is soaked by a real
`autotune compare` (a fresh boot of the winner serving its load level), and the record, `status` and `export` say
so. The study is recorded through the real study code with hand-made figures (conftest.build_demo_study and two
pairs told as the loop tells them); the soak is real."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import optuna
from conftest import build_demo_study

from autotune.engine.logs import BootInfo
from autotune.measure.memory import MemoryPeak
from autotune.measure.trial import TrialResult
from autotune.search import paired, tell
from autotune.search.budget import Budget
from autotune.search.paired import COMPARISON_ATTR
from benchmarks.engine_lock import engine_lock

AUTOTUNE = [sys.executable, "-m", "autotune.cli"]


def prove_winner(db: Path, name: str) -> None:
    """Two pairs of the demo's winner (trial 2, 1,500 tok/s at concurrency 16) and the recipe (trial 1, 1,100),
    told as the loop tells a re-measurement: the winner is proven, its soak due."""
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{db}")
    figures = {2: iter([1510.0, 1490.0]), 1: iter([1105.0, 1095.0])}

    def run_one() -> object:
        trial = study.ask()
        of = int(trial.user_attrs["remeasure_of"])
        for key, value in study.trials[of].user_attrs.items():
            if key in ("model", "flags", "env", "vllm_command"):
                trial.set_user_attr(key, value)
        level = study.trials[of].user_attrs["best_level"]
        tok_s = next(figures[of])
        result = TrialResult("ok", tok_s, level, _levels(study.trials[of], tok_s), BootInfo(40.0, 524_288),
                             memory=MemoryPeak(3 * 2**30, "rss", 0, 50), duration_s=90.0)
        tell.tell_result(study, trial, result)
        return result

    said = paired.measure_pairs(study, Budget(seconds=10_000), run_one).comparison
    assert said is not None and said.proven and said.winner == 2 and paired.soak_due(said), said


def _levels(t: optuna.trial.FrozenTrial, tok_s: float) -> tuple:
    from conftest import recorded_level

    return (recorded_level(t.user_attrs["best_level"], tok_s, 300),)


def test_a_proven_winner_is_soaked_on_a_fresh_boot_and_the_record_says_so(tmp_path: Path) -> None:
    db, name = build_demo_study(tmp_path)
    prove_winner(db, name)
    study_file = tmp_path / f"{name}.toml"
    study_file.write_text(study_file.read_text().replace('time = "45m"', 'time = "45m"\nsoak = "15s"'))
    storage = f"sqlite:///{db}"
    with engine_lock():
        out = subprocess.run([*AUTOTUNE, "compare", str(study_file), "--storage", storage, "--budget", "10m"],
                             capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    study = optuna.load_study(study_name=name, storage=storage)
    record = study.user_attrs[COMPARISON_ATTR]
    soak = record["soak"]
    assert soak is not None, record
    assert soak["level"] == "concurrency 16" and soak["source"] == "rss"
    assert soak["seconds"] >= 15 and soak["requests"] > 0, soak
    assert soak["errors"] == 0 and soak["empty"] == 0 and not soak["failure"], soak
    assert record["proven"] is True
    assert record["sentence"].startswith("trial 2: +")
    said = f"soaked {soak['seconds']:.0f} s at concurrency 16: {soak['requests']} requests, no error"
    assert said in record["sentence"]
    assert (tmp_path / f"{name}-artifacts" / "soak-trial-0002.log").is_file()  # the soak's own server log
    assert f"answer: {record['sentence']}" in " ".join(out.stdout.split())

    status = subprocess.run([*AUTOTUNE, "status", "--study", name, "--storage", storage], capture_output=True,
                            text=True, cwd=tmp_path, check=True).stdout
    assert f"soaked {soak['seconds']:.0f} s at concurrency 16" in " ".join(status.split())
    exported = json.loads(subprocess.run([*AUTOTUNE, "export", "--study", name, "--storage", storage, "--format",
                                          "json"], capture_output=True, text=True, cwd=tmp_path, check=True).stdout)
    assert exported["metrics"]["soak"] == soak and exported["metrics"]["trial"] == 2
