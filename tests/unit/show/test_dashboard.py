"""The dashboard for real: `autotune dashboard` serving optuna-dashboard, loaded in headless Chromium (driven through
the DevTools protocol), on a study recorded through the real study code and on one made by a real CPU run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import optuna
from optuna_dashboard import get_note
from show_checks import ARTIFACTS, check_dashboard, needs_chromium

from autotune.search.record import add_missing_notes, trial_note
from autotune.search.storage import attach_log, find_artifact_store, open_artifact_store

ROOT = Path(__file__).resolve().parents[3]


@needs_chromium
def test_dashboard_shows_trials_attrs_notes_and_log(demo_study_db, tmp_path: Path) -> None:
    db, name = demo_study_db
    detail = check_dashboard(db, name, ARTIFACTS / "dashboard-demo.png")
    assert "trial-0002.log" in detail  # trial 2 (the best) has its server log attached as an artifact
    assert "Measured: 1,500 output tok/s at concurrency 16" in detail  # its note, written when the dashboard started
    assert "--max-num-seqs 7" in detail


def test_trial_notes_say_the_result_in_words(demo_study_db) -> None:
    db, name = demo_study_db
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{db}")
    assert add_missing_notes(study) == 8 and add_missing_notes(study) == 0  # written once, not rewritten
    t = {t.number: t for t in study.trials}
    assert get_note(optuna.Trial(study, t[0]._trial_id)).startswith(
        "**Measured**: 900 output tok/s at concurrency 4 (p95 TTFT 300 ms, p95 TPOT 20.0 ms); "
        "peak 3.20 GiB host memory (RSS of the server's processes)"
        "\n\nBaseline **vllm-defaults**, booted as:\n\n```\n")
    assert "  --host 127.0.0.1 \\\n  --dtype float32 \\\n  --enforce-eager \\\n  --load-format dummy" in get_note(
        optuna.Trial(study, t[0]._trial_id))
    assert trial_note(t[4]).startswith("**Missed the limits**. no load level met the limits")
    assert trial_note(t[6]).startswith("**Refused before boot**. predicted not to fit")
    assert "attached below" in get_note(optuna.Trial(study, t[2]._trial_id))
    assert "attached below" not in get_note(optuna.Trial(study, t[6]._trial_id))  # never booted: no log


def test_attach_log_before_tell_and_found_again(tmp_path: Path) -> None:
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="s")
    store = open_artifact_store(tmp_path / "s-artifacts")
    log = tmp_path / "s-artifacts" / "trial-0000.log"
    log.write_text("INFO ready\n")
    trial = study.ask()
    trial.set_user_attr("log_path", str(log))
    artifact_id = attach_log(study, trial, log, store)
    assert attach_log(study, trial, tmp_path / "missing.log", store) is None  # a server that never wrote a log
    study.tell(trial, 1.0)
    metas = optuna.artifacts.get_all_artifact_meta(study.trials[0], storage=study._storage)
    assert [(m.artifact_id, m.filename, m.mimetype) for m in metas] == [(artifact_id, "trial-0000.log", "text/plain")]
    found = find_artifact_store(study, f"sqlite:///{tmp_path / 's.db'}")
    assert found is not None
    with found.open_reader(artifact_id) as f:
        assert f.read() == b"INFO ready\n"




# Started by a script in the background, a process inherits SIGINT ignored (the shell does it for `cmd &`).
IGNORING_SIGINT = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); os.execv(sys.executable, " \
                  "[sys.executable, '-m', 'autotune.cli', *sys.argv[1:]])"


def test_a_dashboard_started_in_the_background_stops_on_sigint(demo_study_db) -> None:
    """`autotune dashboard &` from a script: SIGINT ignored on entry, yet `kill -INT` (what Ctrl-C sends) stops it."""
    db, name = demo_study_db
    board = subprocess.Popen([sys.executable, "-c", IGNORING_SIGINT, "dashboard", "--study", name,
                              "--storage", f"sqlite:///{db}", "--port", "0"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert board.stdout is not None
        announced = ""
        while "http://127.0.0.1:" not in announced and board.poll() is None:
            announced = board.stdout.readline()
        assert board.poll() is None, announced
        board.send_signal(signal.SIGINT)
        board.wait(timeout=120)  # a generous bound: before, it served on until killed
    finally:
        if board.poll() is None:
            board.kill()
            board.wait()
    assert board.returncode == 0, board.returncode
