"""optuna-dashboard on the study's storage, each trial with its server log attached and a note in words.

The logs live as files beside the study (`<study dir>/<name>-artifacts/trial-NNNN.log`); attaching them to the
trial through an Optuna artifact store (`<name>-artifacts/store`) is what lets the dashboard offer them on the
trial's page. The note says the result (or why the trial is not feasible) and the command it booted.
"""

from __future__ import annotations

import ipaddress
import socketserver
import sys
from collections.abc import Callable
from dataclasses import dataclass
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import optuna

from autotune.errors import AutotuneError
from autotune.search.paired import save_answer_note
from autotune.search.record import add_missing_notes
from autotune.search.storage import find_artifact_store


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


def exposure_warning(host: str) -> str | None:
    """What serving the dashboard on `host` exposes, when that is not this machine's loopback only."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return None
    return (f"warning: the dashboard on {host} can be reached from other machines, without a password: it shows "
            "every trial's flags, environment and server log, and lets a visitor write notes")


def make_dashboard(study: optuna.Study, storage_url: str, port: int = 8080, host: str = "127.0.0.1") -> Dashboard:
    """An optuna-dashboard WSGI app on `host` (port 0: any free port), opened at the study's page."""
    from optuna_dashboard import wsgi

    from autotune.search.storage import open_storage

    storage = open_storage(storage_url)
    app = wsgi(storage, artifact_store=find_artifact_store(study, storage_url))
    try:
        httpd = make_server(host, port, app, server_class=_Server, handler_class=_QuietHandler)
    except OSError as e:
        raise AutotuneError(f"cannot listen on {host}:{port} ({e.strerror}): choose another --host or --port") from e
    study_id = storage.get_study_id_from_name(study.study_name)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{httpd.server_port}/dashboard/studies/{study_id}"
    return Dashboard(url, httpd.serve_forever, httpd.server_close)


def serve(study: optuna.Study, storage_url: str, port: int, announce: Callable[[str], None],
          host: str = "127.0.0.1") -> None:
    """Serve until Ctrl-C (or SIGTERM). Finished trials without a note get one first."""
    import signal

    from sqlalchemy.exc import OperationalError

    board = make_dashboard(study, storage_url, port, host)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        try:
            add_missing_notes(study)
            save_answer_note(study)  # the study's own page: the winner and the answer, as every output says them
        except (optuna.exceptions.StorageInternalError, OperationalError) as e:  # SQLite busy under a live run
            announce(f"(trial notes not written now: {str(e).splitlines()[0]})")
        announce(board.url)
        board.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        board.close()
