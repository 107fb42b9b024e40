"""`autotune dashboard --host`: where it listens, and a warning when other machines can reach it."""

from __future__ import annotations

import threading
import urllib.request

from show_checks import load

from autotune.show.dashboard import exposure_warning, make_dashboard


def test_only_loopback_is_served_without_a_warning() -> None:
    assert exposure_warning("127.0.0.1") is None and exposure_warning("localhost") is None
    assert exposure_warning("::1") is None and exposure_warning("127.0.0.2") is None
    for host in ("0.0.0.0", "192.0.2.7", "myhost.example"):
        warning = exposure_warning(host)
        assert warning is not None and warning.startswith(f"warning: the dashboard on {host} can be reached")


def test_the_dashboard_listens_on_the_host_given(demo_study_db) -> None:
    study = load(*demo_study_db)
    board = make_dashboard(study, f"sqlite:///{demo_study_db[0]}", port=0, host="127.0.0.2")
    try:
        assert board.url.startswith("http://127.0.0.2:")
        threading.Thread(target=board.serve_forever, daemon=True).start()
        with urllib.request.urlopen(board.url.split("/dashboard")[0] + "/api/meta", timeout=30) as reply:
            assert reply.status == 200
    finally:
        board.close()
