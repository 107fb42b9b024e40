"""Ctrl-C and SIGTERM end every command the same way: whatever it was doing is stopped as Ctrl-C stops it, then
one line and exit 130 (the shell's code for Ctrl-C), never click's "Aborted!" with exit 1.

SIGTERM is what systemd and `docker stop` send: it is a request to stop, as Ctrl-C is, not a hard kill. A process
started in the background by a script inherits SIGINT ignored, and Python then never raises KeyboardInterrupt
(`kill -INT` was lost and a run or a dashboard went on): both signals are set here, however it was started."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_INTERRUPTED = 130


@contextlib.contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """While the block runs, SIGINT and SIGTERM raise KeyboardInterrupt in the main thread (a study in progress
    replaces this with its own handler: search/threads.py's ctrl_c_stops)."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    before = {s: signal.signal(s, signal.default_int_handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
