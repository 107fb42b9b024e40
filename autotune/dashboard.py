"""optuna-dashboard on the study's storage, each trial with its server log attached and a note in words.

The logs live as files beside the study (`<study dir>/<name>-artifacts/trial-NNNN.log`); attaching them to the
trial through an Optuna artifact store (`<name>-artifacts/store`) is what lets the dashboard offer them on the
trial's page. The note says the result (or why the trial is not feasible) and the command it booted.
"""

from __future__ import annotations

import shlex
import socketserver
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import optuna
from optuna.artifacts import FileSystemArtifactStore, get_all_artifact_meta, upload_artifact
from optuna.trial import FrozenTrial

from autotune.errors import AutotuneError

STORE_DIR = "store"  # inside the study's artifacts directory, beside the log files


def open_artifact_store(artifacts_dir: Path) -> FileSystemArtifactStore:
    """The store for a study whose logs are written to `artifacts_dir` (study.py's artifacts_dir)."""
    path = Path(artifacts_dir) / STORE_DIR
    path.mkdir(parents=True, exist_ok=True)
    return FileSystemArtifactStore(str(path))


def attach_log(study: optuna.Study, trial: optuna.Trial, log_path: Path,
               artifact_store: FileSystemArtifactStore) -> str | None:
    """Attach a trial's server log; returns the artifact id, or None when the server never wrote one.

    Optuna refuses to change a finished trial, so call this before the trial is told."""
    log_path = Path(log_path)
    if not log_path.is_file():
        return None
    return upload_artifact(artifact_store=artifact_store, file_path=str(log_path), study_or_trial=trial,
                           mimetype="text/plain", encoding="utf-8")


def trial_note(t: FrozenTrial, has_log: bool = False) -> str:
    """What the trial's page should say first, in words: its result (or why it is not feasible) and the command
    it booted, one flag a line. The user attributes panel shows the numbers but cuts long values off."""
    from autotune.hardware import memory_text
    from autotune.report import at_level, view, why_not

    v = view(t)
    if v.kind == "feasible":
        head = (f"**Feasible**: {v.throughput:,.0f} output tok/s {at_level(v)} (p95 TTFT "
                f"{v.ttft_p95_ms or 0:,.0f} ms, p95 TPOT {v.tpot_p95_ms or 0:,.1f} ms)")
    else:
        kind = {"pruned": "Pruned (stopped early)", "failed": "Failed (not the configuration's fault)"}
        head = f"**{kind.get(v.kind) or 'Not feasible: ' + why_not(t)}**" + (f". {v.reason}" if v.reason else "")
    if v.peak_memory_gib is not None:
        head += f"; peak {memory_text(v.peak_memory_gib, v.memory_source)}"
    what = f"Baseline **{v.baseline}**" if v.baseline else "Configuration"
    body = f"{head}\n\n{what}, booted as:\n\n```\n{_one_flag_a_line(v.command)}\n```\n" if v.command else head
    return body + ("\nThe server log is attached below (Artifacts).\n" if has_log else "")


def save_trial_note(study: optuna.Study, trial: optuna.Trial | FrozenTrial) -> None:
    """Write (or rewrite) the note of a told trial. Notes live in the study's attributes, so unlike artifacts
    this works after the tell, when the trial's result and reason are known."""
    from optuna_dashboard import save_note

    live = optuna.Trial(study, trial._trial_id)  # save_note takes a Trial; this one is a handle on the stored trial
    frozen = live.storage.get_trial(trial._trial_id)
    save_note(live, trial_note(frozen, has_log=bool(get_all_artifact_meta(live))))


def add_missing_notes(study: optuna.Study) -> int:
    """Notes for the finished trials that have none (a study recorded before notes existed); returns how many."""
    from optuna_dashboard import get_note

    written = 0
    for t in study.get_trials(deepcopy=False):
        if t.state.is_finished() and not get_note(optuna.Trial(study, t._trial_id)):
            save_trial_note(study, t)
            written += 1
    return written


def _one_flag_a_line(command: str) -> str:
    """`vllm serve M --a 1 --b` as a shell command with one flag a line (a long line scrolls out of sight)."""
    lines: list[list[str]] = [[]]
    for word in shlex.split(command):
        if word.startswith("--"):
            lines.append([])
        lines[-1].append(shlex.quote(word))
    return " \\\n  ".join(" ".join(line) for line in lines if line)


def find_artifact_store(study: optuna.Study, storage_url: str) -> FileSystemArtifactStore | None:
    """Where a study's logs were attached: beside the trials' log files, else beside a SQLite database."""
    candidates = [Path(t.user_attrs["log_path"]).parent / STORE_DIR
                  for t in study.get_trials(deepcopy=False) if "log_path" in t.user_attrs]
    if storage_url.startswith("sqlite:///"):
        db = Path(storage_url.removeprefix("sqlite:///"))
        candidates.append(db.parent / f"{study.study_name}-artifacts" / STORE_DIR)
    for path in candidates:
        if path.is_dir():
            return FileSystemArtifactStore(str(path))
    return None


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True  # the single-page app fetches in parallel; a slow request must not block the rest


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # one line per request drowns the address
        pass


@dataclass(frozen=True)
class Dashboard:
    url: str
    serve_forever: Callable[[], None]
    close: Callable[[], None]


def make_dashboard(study: optuna.Study, storage_url: str, port: int = 8080) -> Dashboard:
    """An optuna-dashboard WSGI app on 127.0.0.1 (port 0: any free port), opened at the study's page."""
    from optuna_dashboard import wsgi

    from autotune.study import open_storage

    storage = open_storage(storage_url)
    app = wsgi(storage, artifact_store=find_artifact_store(study, storage_url))
    try:
        httpd = make_server("127.0.0.1", port, app, server_class=_Server, handler_class=_QuietHandler)
    except OSError as e:
        raise AutotuneError(f"cannot listen on 127.0.0.1:{port} ({e.strerror}): choose another --port") from e
    study_id = storage.get_study_id_from_name(study.study_name)
    url = f"http://127.0.0.1:{httpd.server_port}/dashboard/studies/{study_id}"
    return Dashboard(url, httpd.serve_forever, httpd.server_close)


def serve(study: optuna.Study, storage_url: str, port: int, announce: Callable[[str], None]) -> None:
    """Serve until Ctrl-C (or SIGTERM). Finished trials without a note get one first."""
    import signal

    from sqlalchemy.exc import OperationalError

    board = make_dashboard(study, storage_url, port)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        try:
            add_missing_notes(study)
        except (optuna.exceptions.StorageInternalError, OperationalError) as e:  # SQLite busy under a live run
            announce(f"(trial notes not written now: {str(e).splitlines()[0]})")
        announce(board.url)
        board.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        board.close()
