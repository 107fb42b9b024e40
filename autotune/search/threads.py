"""The threads a run's slots work in, and Ctrl-C while they do: a signal stops every slot cleanly, each recording
its trial as interrupted, and raises nothing in the main thread (SIGTERM likewise)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

from autotune.search import tell


@contextlib.contextmanager
def ctrl_c_stops(halt: Callable[[str], None]) -> Iterator[threading.Event]:
    """While the study runs, Ctrl-C (SIGINT) or SIGTERM (systemd, `docker stop`) calls `halt` and sets the event
    it yields, and raises nothing: each slot stops its server and records its trial as interrupted by the user.
    A KeyboardInterrupt could land anywhere in the main thread, even between two waits, and escape with the trials
    RUNNING (seen in CI: exit 1, "Aborted!").
    Only the main thread may set a handler; elsewhere no signal reaches this code anyway."""
    pressed = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield pressed
        return

    def handler(signum: int, frame: object) -> None:
        pressed.set()
        halt(tell.INTERRUPTED)

    before = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield pressed
    finally:
        for s, previous in before.items():
            signal.signal(s, previous)


def until_done(targets: list[tuple[str, Callable[[], None]]]) -> None:
    """Run each target in a thread of its own until all have ended.

    Waits on events, never on Thread.join: on CPython 3.11 a join interrupted by a signal marks the live thread
    as stopped, so the next join returns at once and the thread dies at exit with its trial RUNNING."""
    ended = [threading.Event() for _ in targets]

    def run(target: Callable[[], None], done: threading.Event) -> None:
        try:
            target()
        finally:
            done.set()

    for (name, target), done in zip(targets, ended, strict=True):  # one event per target
        threading.Thread(target=run, args=(target, done), name=name, daemon=True).start()
    for done in ended:
        done.wait()  # a signal's handler runs during the wait (Ctrl-C's: ctrl_c_stops), and the wait goes on
