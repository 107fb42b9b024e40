"""One vLLM server: argv, launch in its own process group, health, log watch, failure classification, stop.

The server's output is read line by line as it is written, both into the trial's log file and through the
failure patterns, so an out-of-memory or KV-cache error ends a boot the moment its line appears instead of at
the boot timeout.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psutil

from autotune.engine.compile_cache import cache_env, keep_triton_cache
from autotune.engine.flags import CACHE_DIR, HOST, Build, detect_build, to_argv
from autotune.engine.logs import (
    ENGINE_DIED,
    BootInfo,
    Failure,
    FailureKind,
    classify_log,
    failure_reason,
    log_excerpt,
    parse_boot_info,
    watch_line,
)
from autotune.errors import EngineError

STOPPED = (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)  # process states that only a signal or a debugger end


@dataclass(frozen=True)
class EngineSpec:
    """Everything needed to start one server. `flags` use vLLM's dest names (max_num_seqs, ...)."""

    model: str
    flags: Mapping[str, object] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    served_model_name: str = "autotune"
    boot_timeout_s: float = 900.0
    cuda_visible_devices: str | None = None


class BootFailed(Exception):
    """The server did not become healthy; `failure` says why. A configuration's outcome, not a tool error."""

    def __init__(self, failure: Failure, boot_s: float):
        super().__init__(failure.reason)
        self.failure, self.boot_s = failure, boot_s


def server_env(spec: EngineSpec, base: Mapping[str, str]) -> dict[str, str]:
    """The server's environment. vLLM's caches go to the one autotune cache (compile_cache.cache_env: a boot that
    finds its compiled graphs there is warm) unless the shell or [engine.env] names its own. A slot's GPUs are
    named by NVML index (what autotune samples and nvidia-smi shows); CUDA numbers devices fastest first unless
    told PCI bus order, so it is told."""
    env = keep_triton_cache({**cache_env(), **base, **spec.env, "PYTHONUNBUFFERED": "1"})
    if spec.cuda_visible_devices is not None:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = spec.cuda_visible_devices
    return env


def server_argv(build: Build, spec: EngineSpec, port: int) -> list[str]:
    # The CPU build's `vllm` script fails (it looks up a distribution named vllm); its module entry point works.
    if build is Build.CPU:
        head = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", spec.model]
    else:
        head = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", spec.model]
    return head + ["--host", HOST, "--port", str(port), "--served-model-name", spec.served_model_name,
                   *to_argv(spec.flags)]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class Server:
    """A running (or booting) vLLM server. Use `launch()`; always stopped on exit, also when the caller raises."""

    def __init__(self, spec: EngineSpec, log_path: Path, build: Build | None = None, port: int | None = None):
        self.spec, self.log_path = spec, Path(log_path)
        self.build = build or detect_build()
        self.port = port or free_port()
        self.base_url = f"http://{HOST}:{self.port}"
        self.lines: deque[str] = deque(maxlen=4000)
        self.failure: Failure | None = None  # set by the log reader the moment a failure line appears
        self.failure_seen_at: float | None = None  # time.monotonic() of that moment
        self.log_error: str | None = None
        self._failure_event = threading.Event()
        self._proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._stopping = False  # autotune signals the group from here on: an exit by signal is ours

    @property
    def model(self) -> str:
        return self.spec.served_model_name

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> None:
        env = server_env(self.spec, os.environ)
        argv = server_argv(self.build, self.spec, self.port)
        try:  # a log that cannot be written is the machine's problem, not the configuration's: say so first
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = open(self.log_path, "w", encoding="utf-8")
            log.write("$ " + " ".join(argv) + "\n")
            log.flush()
        except OSError as e:
            raise EngineError(f"cannot write the server log {self.log_path}: {e.strerror or e}") from e
        self._proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
            errors="replace", env=env, start_new_session=True, preexec_fn=die_with_parent,
        )
        self._reader = threading.Thread(target=self._read_log, args=(log,), daemon=True)
        self._reader.start()
        record = _register(self._proc.pid)
        # The parent-death signal alone is not enough: a SIGTERM that lands while vLLM spawns its engine core
        # leaves both running. The watchdog kills the whole group once this process is gone, however it died.
        self._watchdog = subprocess.Popen(
            [sys.executable, "-m", "autotune.engine.server", "watch",
             str(os.getpid()), str(self._proc.pid), str(record)],
            stdin=subprocess.DEVNULL, start_new_session=True,
        )

    def wait_ready(self, cancel: threading.Event | None = None) -> BootInfo:
        """Block until /health answers 200; raise BootFailed as soon as a failure line or an exit is seen."""
        assert self._proc is not None
        t0 = time.monotonic()
        deadline = t0 + self.spec.boot_timeout_s
        while True:
            if self._failure_event.wait(0.25):
                raise BootFailed(self.failure, time.monotonic() - t0)  # type: ignore[arg-type]
            if cancel is not None and cancel.is_set():
                raise BootFailed(Failure(FailureKind.CANCELLED, "cancelled while booting"), time.monotonic() - t0)
            if self._proc.poll() is not None:
                raise BootFailed(self._exit_failure(), time.monotonic() - t0)
            if self.healthy():
                return parse_boot_info(list(self.lines), time.monotonic() - t0)
            if time.monotonic() > deadline:
                failure = Failure(FailureKind.BOOT_TIMEOUT, f"not healthy after {self.spec.boot_timeout_s:.0f} s",
                                  "\n".join(list(self.lines)[-12:]))
                raise BootFailed(failure, time.monotonic() - t0)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.base_url + "/health", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def died(self, grace_s: float = 0.0) -> Failure | None:
        """After boot: a failure seen in the log, or the process gone (e.g. killed or out of memory under load).
        `grace_s`: how long a process that may be on its way out is given to exit (its sockets close before the
        kernel reports it gone: a level that ends on the first refused connection can ask too soon)."""
        if grace_s > 0 and self.failure is None and self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=grace_s)
        if self.failure is not None and self.failure.kind is FailureKind.CRASH and self._proc is not None:
            # "engine died" comes before the traceback that names its cause: let the server finish writing it.
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=10)
            if self._reader is not None:
                self._reader.join(timeout=5)
        if self.failure is not None:
            return self.failure
        if self._proc is not None and self._proc.poll() is not None:
            return self._exit_failure()
        return None

    def frozen(self) -> Failure | None:
        """Why a silent server is silent when it is not its configuration's doing: a process of its group stopped by
        a signal autotune never sends (SIGSTOP, a debugger): a server frozen from outside says nothing about its
        flags. None when every process runs (then silence is the server's own: unresponsive)."""
        if self._proc is None:
            return None
        for p in psutil.process_iter(["name", "status"]):
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                if os.getpgid(p.pid) == self._proc.pid and p.info["status"] in STOPPED:
                    return Failure(FailureKind.FROZEN, f"the server's process {p.info['name']} (pid {p.pid}) was "
                                   "stopped by a signal autotune did not send: says nothing about the configuration")
        return None

    def _exit_failure(self) -> Failure:
        """Why the exited server ended. Killed by a signal autotune did not send, with no failure in its log
        (an outside `kill -9`), it says nothing about the configuration; an engine crash or an out-of-memory
        error in the log does."""
        assert self._proc is not None and self._reader is not None
        self._reader.join(timeout=5)
        if self.failure is not None:
            return self.failure
        lines, code = list(self.lines), self._proc.returncode
        if (code is not None and code < 0 and not self._stopping and classify_log(lines, exited=False) is None
                and not any(ENGINE_DIED.search(line) for line in lines)):
            return Failure(FailureKind.KILLED, f"the server was killed by {_signal_name(-code)}, a signal autotune "
                           "did not send: says nothing about the configuration", "\n".join(lines[-12:]))
        return classify_log(lines)

    def stop(self, grace_s: float = 15.0) -> None:
        """Stop the whole process group (API server, engine core, workers): SIGTERM, then SIGKILL."""
        if self._proc is None:
            return
        pgid = self._proc.pid  # start_new_session: the group id is the leader's pid
        self._stopping = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
            os.killpg(pgid, signal.SIGCONT)  # a process stopped from outside acts on SIGTERM only once it runs
        try:
            self._proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        # The leader may be gone while workers linger in the group: make sure nothing of it survives.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5)
        _wait_group_gone(pgid, timeout_s=10)
        _unregister(pgid)
        if self._watchdog is not None:  # the group is gone: nothing left to watch
            self._watchdog.kill()
            self._watchdog.wait()
        if self._reader is not None:
            self._reader.join(timeout=5)

    def _read_log(self, log: IO[str]) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        with log:
            for line in self._proc.stdout:
                if self.log_error is None:
                    try:
                        log.write(line)
                        log.flush()
                    except OSError as e:  # e.g. the disk filled up: keep watching the server, stop writing
                        self.log_error = f"server log incomplete: {e.strerror or e}"
                line = line.rstrip("\n")
                self.lines.append(line)
                # The engine dying under load is a failure too, even while the API process lives on; its
                # traceback's cause (out of memory, ...) replaces the generic "engine died" line before it.
                kind = watch_line(self.failure.kind if self.failure else None, line)
                if kind is not None:
                    self.failure = Failure(kind, failure_reason(kind, line),
                                           log_excerpt(list(self.lines), len(self.lines) - 1))
                    if self.failure_seen_at is None:
                        self.failure_seen_at = time.monotonic()
                    self._failure_event.set()


@contextlib.contextmanager
def launch(spec: EngineSpec, log_path: Path, *, build: Build | None = None) -> Iterator[tuple[Server, BootInfo]]:
    """Start a server and wait until it is ready; it is stopped when the block ends, however it ends."""
    server = Server(spec, log_path, build)
    try:
        server.start()
        info = server.wait_ready()
        yield server, info
    finally:
        server.stop()


SERVERS_DIR = CACHE_DIR / "servers"


def _register(pgid: int) -> Path:
    # A record per live server: which tuner started which process group, so a later run can reap leftovers.
    SERVERS_DIR.mkdir(parents=True, exist_ok=True)
    record = SERVERS_DIR / f"{pgid}.json"
    record.write_text(json.dumps({"pgid": pgid, "owner": os.getpid()}))
    return record


def _unregister(pgid: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        (SERVERS_DIR / f"{pgid}.json").unlink()


def reap_leftover_servers() -> list[int]:
    """Kill the process groups of servers whose tuner died (kill -9, power loss); returns the groups killed."""
    killed = []
    for record in SERVERS_DIR.glob("*.json") if SERVERS_DIR.is_dir() else ():
        try:
            info = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if _alive(info["owner"]) and info["owner"] != os.getpid():
            continue  # its tuner still runs (another study): not ours to touch
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(info["pgid"], signal.SIGKILL)
            killed.append(info["pgid"])
        _wait_group_gone(info["pgid"], timeout_s=10)
        _unregister(info["pgid"])
    return killed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def die_with_parent() -> None:
    # Runs in the child before exec: if the tuner is killed (even with SIGKILL) the server gets SIGTERM.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def watch(owner: int, pgid: int, record: Path, poll_s: float = 0.2, term_s: float = 3.0) -> None:
    """The watchdog of one server (run as `python -m autotune.engine.server watch OWNER PGID RECORD`, a child of the
    tuner in a session of its own): once the tuner is gone, SIGTERM the server's group again and again, SIGKILL
    after `term_s`, until no process of it is left; then remove its record. Ends as soon as the group is gone."""
    while os.getppid() == owner:
        if not _group_alive(pgid):
            return
        time.sleep(poll_s)
    deadline = time.monotonic() + term_s
    while _group_alive(pgid) and time.monotonic() < deadline + 60:  # (zombies nobody reaps would keep it "alive")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM if time.monotonic() < deadline else signal.SIGKILL)
        time.sleep(poll_s)
    with contextlib.suppress(FileNotFoundError):
        record.unlink()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _group_alive(pgid: int) -> bool:
    """Whether any process of the group is left (a group of another user's is not ours: gone, to us)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _wait_group_gone(pgid: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _group_alive(pgid):
        time.sleep(0.1)


if __name__ == "__main__" and sys.argv[1:2] == ["watch"]:
    watch(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
