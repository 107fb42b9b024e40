"""The soak on the vLLM CPU build: a study whose winner beat the recipe in its final pairs is soaked by a real
`autotune compare` (a fresh boot of the winner serving its load level), and the record, `status` and `export` say
so. The study is recorded through the real study code with hand-made figures (proven_study); the soak is real."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import optuna
from conftest import _study_copy, recorded_level

from autotune.config.study_file import load_study
from autotune.engine.logs import BootInfo
from autotune.measure.memory import MemoryPeak
from autotune.measure.plan import configured
from autotune.measure.trial import TrialResult
from autotune.search import paired, record, tell
from autotune.search.budget import Budget
from autotune.search.paired import COMPARISON_ATTR
from autotune.search.record import trial_baseline
from autotune.search.space import engine_config, suggest
from autotune.search.study import open_study
from benchmarks.engine_lock import engine_lock

AUTOTUNE = [sys.executable, "-m", "autotune.cli"]


WINNER = {"max_num_seqs": 32, "max_num_batched_tokens": 1024, "enable_chunked_prefill": True,
          "enable_prefix_caching": True, "max_model_len": 1024}


def proven_study(dest: Path) -> tuple[Path, str]:
    """The shipped tiny-cpu study recorded through the real study code with hand-made figures: vllm-defaults 900
    tok/s, the recipe 1,100, a sampled configuration (WINNER) 1,500 at concurrency 16; then three pairs of it
    against the recipe (1,510, 1,490 and 1,500 against 1,105, 1,095 and 1,100), told as the loop tells a
    re-measurement: the winner is proven, its soak due."""
    spec = load_study(_study_copy(dest))
    db = dest / f"{spec.name}.db"
    study = open_study(spec, f"sqlite:///{db}")  # the baselines queued
    study.enqueue_trial(WINNER)
    figures = iter([900.0, 1100.0, 1500.0, 1510.0, 1105.0, 1095.0, 1490.0, 1500.0, 1100.0])

    def run_one() -> TrialResult:
        trial = study.ask()
        config = engine_config(spec, suggest(trial, spec.space), baseline=trial_baseline(trial))
        for key, value in record.config_attrs(*configured(config.model, config.flags)).items():
            trial.set_user_attr(key, value)
        tok_s = next(figures)
        result = TrialResult("ok", tok_s, 16, (recorded_level(16, tok_s, 300),), BootInfo(40.0, 524_288),
                             memory=MemoryPeak(3 * 2**30, "rss", 0, 50), duration_s=90.0)
        tell.tell_result(study, trial, result)
        return result

    for _ in range(3):
        run_one()
    said = paired.measure_pairs(study, Budget(seconds=10_000), run_one).comparison
    assert said is not None and said.proven and said.winner == 2 and paired.soak_due(said), said
    return db, spec.name


def test_a_proven_winner_is_soaked_on_a_fresh_boot_and_the_record_says_so(tmp_path: Path) -> None:
    db, name = proven_study(tmp_path)
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
    assert not soak["failure"] and soak["seconds"] >= 15 and soak["requests"] > 0, soak
    assert soak["errors"] == 0 and soak["empty"] == 0, soak
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
