"""The server watchdog, with real processes and no vLLM: a server group never outlives its tuner."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from processes import group_gone, within


def test_the_watchdog_kills_a_server_group_that_outlives_its_tuner(tmp_path: Path) -> None:
    """Real processes, no vLLM: a stand-in tuner starts a process group that ignores SIGTERM (as a server caught
    mid-spawn does) and its watchdog, as Server.start does; kill -9 of the tuner; the group and its record go."""
    record = tmp_path / "servers" / "record.json"
    record.parent.mkdir()
    record.write_text("{}")
    stand_in = (
        "import os, subprocess, sys, time\n"
        "group = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(600)'], "
        "start_new_session=True, stdout=subprocess.PIPE)\n"
        "group.stdout.readline()\n"
        "subprocess.Popen([sys.executable, '-m', 'autotune.engine.server', 'watch', str(os.getpid()), str(group.pid), "
        "sys.argv[1]], start_new_session=True)\n"
        "print(group.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    stand_in_tuner = subprocess.Popen([sys.executable, "-c", stand_in, str(record)], stdout=subprocess.PIPE, text=True)
    assert stand_in_tuner.stdout is not None
    pgid = int(stand_in_tuner.stdout.readline())
    time.sleep(1)  # the watchdog is watching
    os.kill(stand_in_tuner.pid, signal.SIGKILL)
    stand_in_tuner.wait()
    gone = group_gone(pgid)
    if not gone:
        os.killpg(pgid, signal.SIGKILL)  # what the test started, it ends
    survived = gone and within(10, lambda: not record.exists())
    assert survived
