"""One vLLM server at a time on a small machine: benchmarks that boot servers take this lock around each boot,
so their figures are not measured beside another server (tests/conftest.py takes the same lock)."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator

LOCK = "/tmp/autotune-engine.lock"


@contextlib.contextmanager
def engine_lock() -> Iterator[None]:
    with open(LOCK, "a") as f:
        print(f"waiting for {LOCK} ...", flush=True)
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
