"""Several trials at once, several workers on one PostgreSQL study, and kill -9 of the tuner, for real.

Real vLLM CPU servers, a real PostgreSQL server (a private cluster started here from Debian's binaries) and
real signals. Marked `engine`: several boots each.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from processes import vllm_processes

from autotune.config.study_file import load_study
from autotune.search.storage import GRACE_S, open_storage
from autotune.search.study import open_study

ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "tests" / "data" / "quick"
AUTOTUNE = [sys.executable, "-m", "autotune.cli"]



@pytest.fixture()
def study_dir(tmp_path: Path) -> Path:
    for f in QUICK.iterdir():
        shutil.copy(f, tmp_path / f.name)
    return tmp_path


def autotune(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*AUTOTUNE, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_two_workers_on_one_postgresql_study_account_for_every_trial(study_dir: Path, postgres_url: str) -> None:
    # The study as `autotune run quick.toml --storage URL` makes it before its first trial (its files stored, its
    # baseline queued): open_study is that step, with no trial of its own to boot (`--n-trials 0` is refused).
    open_study(load_study(study_dir / "quick.toml"), postgres_url)
    hosts = [study_dir / "host-a", study_dir / "host-b"]  # each worker in a directory without the study file
    for host in hosts:
        host.mkdir()
    workers = [
        subprocess.Popen([*AUTOTUNE, "worker", "--study", "quick", "--storage", postgres_url, "--n-trials", "1",
                          "--study-file", str(study_dir / "quick.toml")],
                         cwd=host, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for host in hosts
    ]
    outputs = [w.communicate(timeout=900)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs
    study = optuna.load_study(study_name="quick", storage=open_storage(postgres_url))
    trials = study.trials
    booted = [t for t in trials if t.user_attrs.get("booted", True) and "duration_s" in t.user_attrs]
    assert len(booted) == 2  # one from each worker: the queued baseline, and one sampled
    assert sorted((t.user_attrs.get("baseline") or {}).get("name", "sampled") for t in booted) == [
        "sampled", "vllm-defaults"]
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    for t in booted:
        assert t.state in (TrialState.COMPLETE, TrialState.PRUNED), (t.number, t.state, t.user_attrs.get("reason"))
        assert t.user_attrs["kv_cache_tokens"] == 262_144
    # The workers ran their servers at the same time (each its own port), not one after the other.
    starts = sorted(t.datetime_start for t in booted)
    ends = sorted(t.datetime_complete for t in booted)
    assert starts[1] < ends[0]


def test_workers_option_runs_trials_side_by_side_on_sqlite(study_dir: Path) -> None:
    out = autotune("run", "quick.toml", "--workers", "2", "--n-trials", "2", cwd=study_dir)
    assert out.returncode == 0, out.stdout + out.stderr
    study = optuna.load_study(study_name="quick", storage=f"sqlite:///{study_dir / 'quick.db'}")
    booted = [t for t in study.trials if "duration_s" in t.user_attrs]
    assert len(booted) == 2
    assert booted[0].datetime_start < booted[1].datetime_complete
    assert booted[1].datetime_start < booted[0].datetime_complete
    assert vllm_processes() == []


def test_kill_9_of_the_tuner_leaves_no_server_and_the_next_run_resumes(study_dir: Path) -> None:
    storage = f"sqlite:///{study_dir / 'quick.db'}"
    tuner = subprocess.Popen([*AUTOTUNE, "run", "quick.toml", "--n-trials", "1"], cwd=study_dir,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = study_dir / "quick-artifacts" / "trial-0000.log"
    deadline = time.monotonic() + 300
    while not (log.exists() and "KV cache size" in log.read_text()):
        assert time.monotonic() < deadline, "the trial's server never booted"
        assert tuner.poll() is None
        time.sleep(1)
    assert vllm_processes(), "the server should be running now"
    os.kill(tuner.pid, signal.SIGKILL)
    tuner.wait()
    deadline = time.monotonic() + 20
    while vllm_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert vllm_processes() == [], "the server outlived its tuner by 20 s"

    time.sleep(GRACE_S + 1)  # the dead trial's heartbeat is now stale
    resumed = autotune("run", "quick.toml", "--n-trials", "1", cwd=study_dir)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    trials = optuna.load_study(study_name="quick", storage=storage).trials
    assert trials[0].state == TrialState.FAIL  # the trial in flight at the kill: marked, not left RUNNING
    retried = [t for t in trials[1:] if t.system_attrs.get("failed_trial") == 0]
    assert retried and retried[0].params == trials[0].params and retried[0].state.is_finished()
    assert retried[0].user_attrs["kv_cache_tokens"] == 262_144  # booted and measured this time
