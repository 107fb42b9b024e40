"""Fault injection: each fault is made for real (signals to real processes, a real port conflict, real bad
files, a log on a full device) inside real runs, and the outcome is asserted. The last test prints the count:
faults injected, survived, trials lost (must be 0).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import psutil
import pytest
from optuna.artifacts import FileSystemArtifactStore
from optuna.trial import TrialState
from processes import group_gone, vllm_processes, within

from autotune.config.study_file import load_study
from autotune.engine import server
from autotune.search.budget import Budget
from autotune.search.one_trial import NoProgress
from autotune.search.study import run_study
from autotune.search.tell import INTERRUPTED

ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "tests" / "data" / "quick"
LEDGER: list[tuple[str, bool, int]] = []  # (fault, survived, trials lost)
# Set in this module's environment, so inherited by its tuners and servers: other engineers' servers on the same
# machine are not this suite's (a server orphaned by a kill is found by it too, unlike by parentage).
RUN_MARK = ("AUTOTUNE_FAULT_SUITE", str(os.getpid()))


@pytest.fixture(scope="module", autouse=True)
def marked_environment():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(*RUN_MARK)
        yield


GROUPS: set[int] = set()  # process groups of this suite's API servers, remembered after they are gone


def ours() -> list[psutil.Process]:
    """The vLLM processes this suite started, alive or orphaned. An API server carries the suite's mark in its
    environment; its engine core does not show it (vLLM's setproctitle overwrites the environment block that
    /proc/PID/environ reads), so a core is ours by its process group, which autotune gives each server."""
    candidates, found = vllm_processes(), []
    for p in candidates:
        with contextlib.suppress(psutil.Error):
            if p.environ().get(RUN_MARK[0]) == RUN_MARK[1]:
                GROUPS.add(os.getpgid(p.pid))
    for p in candidates:
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(p.pid) in GROUPS:
                found.append(p)
    return found


def engine_core() -> psutil.Process:
    cores = [p for p in ours() if (p.info["name"] or "").startswith("VLLM::EngineCore")]
    assert len(cores) == 1, cores
    return cores[0]


def api_server() -> psutil.Process:
    servers = [p for p in ours() if "vllm.entrypoints" in " ".join(p.info["cmdline"] or [])]
    assert len(servers) == 1, servers
    return servers[0]


def lost(study: optuna.Study) -> int:
    return sum(1 for t in study.trials if t.state in (TrialState.RUNNING,))


@pytest.fixture()
def quick(tmp_path: Path) -> Path:
    for f in QUICK.iterdir():
        shutil.copy(f, tmp_path / f.name)
    return tmp_path / "quick.toml"


class Inject(NoProgress):
    """Does something to the server when a given trial reaches its first load level: {trial: action}. An action
    whose target is not found at once (a busy machine) is tried again for 5 s; `done` holds the trials whose
    action ran, `missed` why an action never did (it runs in a thread, where an error would go unseen)."""

    def __init__(self, actions):
        self.actions, self.done, self.scheduled = dict(actions), set(), set()
        self.missed: dict[int, str] = {}
        self.stages: list[tuple[int, str]] = []

    def stage(self, number: int, text: str) -> None:
        self.stages.append((number, text))
        if number in self.actions and text.startswith("level 1") and number not in self.scheduled:
            self.scheduled.add(number)
            threading.Timer(0.3, self._act, [number]).start()  # once requests are in flight

    def _act(self, number: int) -> None:
        deadline = time.monotonic() + 5  # far less than the next trial's boot: no other server is hit
        while True:
            try:
                self.actions[number]()
            except (AssertionError, psutil.Error, ProcessLookupError) as e:
                if time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                self.missed[number] = f"{type(e).__name__}: {e}"
                return
            self.done.add(number)
            return

    def seen(self, number: int) -> tuple[object, ...]:
        """What a failed assertion shows about trial `number`'s injection."""
        return (self.missed.get(number), [text for n, text in self.stages if n == number])


def run_with(quick: Path, progress, trials: int = 2, say=lambda line: None) -> optuna.Study:
    spec = load_study(quick)
    run_study(spec, Budget(trials=trials), progress=progress, say=say)
    return optuna.load_study(study_name=spec.name, storage=f"sqlite:///{quick.parent / 'quick.db'}")


@pytest.fixture(scope="module")
def faulted(tmp_path_factory: pytest.TempPathFactory) -> tuple[optuna.Study, Inject]:
    """One real three-trial study with four faults (three boots, not seven): trial 0's first port is taken by
    another program and its engine is killed during load, trial 1's engine is stopped (SIGSTOP: alive, but no
    token ever again), trial 2 boots (the study went on) and its API server is killed from outside (kill -9)
    during load."""
    work = tmp_path_factory.mktemp("faulted")
    for f in QUICK.iterdir():
        shutil.copy(f, work / f.name)
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    ports = iter([squatter.getsockname()[1]])
    real_free_port = server.free_port
    inject = Inject({0: lambda: os.kill(engine_core().pid, signal.SIGKILL),
                     1: lambda: os.kill(engine_core().pid, signal.SIGSTOP),
                     2: lambda: os.kill(api_server().pid, signal.SIGKILL)})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(server, "free_port", lambda: next(ports, None) or real_free_port())
        patch.setattr(server, "SERVERS_DIR", work / "servers")  # not the real ~/.cache
        try:
            study = run_with(work / "quick.toml", inject, trials=3)
        finally:
            squatter.close()
    return study, inject


def test_a_taken_port_is_retried_on_another(faulted) -> None:
    study, inject = faulted
    first = study.trials[0]
    retried = (0, "booting (the port was taken; on another one)") in inject.stages
    survived = retried and first.user_attrs.get("kv_cache_tokens") == 262_144 and ours() == []
    LEDGER.append(("port already taken", survived, lost(study)))
    assert survived, first.user_attrs


def test_engine_killed_during_load_is_recorded_and_the_study_goes_on(faulted) -> None:
    study, inject = faulted
    first, last = study.trials[0], study.trials[2]
    survived = (0 in inject.done and first.state == TrialState.COMPLETE and first.constraints["boots"] == 1.0
                and last.user_attrs.get("kv_cache_tokens") == 262_144 and ours() == [])
    LEDGER.append(("engine process killed during load", survived, lost(study)))
    assert survived, (first.user_attrs.get("reason"), last.user_attrs.get("status"), inject.seen(0))
    assert first.user_attrs["failure_kind"] in ("crash", "unresponsive")


def test_a_server_frozen_from_outside_is_not_the_configurations_fault(faulted) -> None:
    """An engine stopped with SIGSTOP by someone else: the server goes silent, which says nothing about its flags:
    FAIL (the sampler ignores it, and a baseline is queued again on resume) with the reason, and the study goes
    on; not COMPLETE and unresponsive, as a configuration that hangs its own server is."""
    study, inject = faulted
    hung, last = study.trials[1], study.trials[2]
    survived = (1 in inject.done and hung.state == TrialState.FAIL
                and hung.user_attrs.get("failure_kind") == "frozen_from_outside"
                and "stopped by a signal autotune did not send" in hung.user_attrs.get("reason", "")
                and last.user_attrs.get("kv_cache_tokens") == 262_144 and ours() == [])
    LEDGER.append(("server frozen from outside (engine stopped with SIGSTOP)", survived, lost(study)))
    assert survived, (hung.state, hung.user_attrs, inject.seen(1))


def test_an_outside_kill_9_of_the_server_is_not_the_configurations_fault(faulted) -> None:
    """A server killed by a signal autotune did not send says nothing about its configuration: FAIL (the sampler
    ignores it) with the reason, not COMPLETE with the boots constraint violated."""
    study, inject = faulted
    killed = study.trials[2]
    survived = (2 in inject.done and killed.state == TrialState.FAIL
                and killed.user_attrs.get("failure_kind") == "killed_from_outside"
                and "killed by SIGKILL" in killed.user_attrs.get("reason", "") and ours() == [])
    LEDGER.append(("vLLM server killed from outside (kill -9) during load", survived, lost(study)))
    assert survived, (killed.state, killed.user_attrs.get("reason"), inject.seen(2))


def tuner(study_dir: Path, home: Path, *args: str) -> subprocess.Popen[str]:
    """`autotune run quick.toml` in a subprocess, its server records under home/.cache (not the real one)."""
    return subprocess.Popen([sys.executable, "-m", "autotune.cli", "run", "quick.toml", *args], cwd=study_dir,
                            env={**os.environ, "HOME": str(home), "COLUMNS": "200"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def engine_spawning(proc: subprocess.Popen[str], servers: Path) -> int:
    """Wait for the tuner's server to start spawning its engine core (the moment a signal used to leave both
    running); returns the server's process group."""
    deadline = time.monotonic() + 300
    while True:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.monotonic() < deadline, "no server spawned an engine core"
        records = list(servers.glob("*.json")) if servers.is_dir() else []
        if records:
            pgid = int(records[0].stem)
            with contextlib.suppress(psutil.NoSuchProcess):
                if psutil.Process(pgid).children():
                    return pgid
        time.sleep(0.05)


def test_ctrl_c_and_kill_9_during_boots_leave_no_server_and_no_running_trial(quick: Path, tmp_path: Path) -> None:
    """Ctrl-C while the server spawns its engine core: exit 130, the trial recorded as interrupted (not left
    RUNNING, in the database or the printed table), no server process, no server record. Then the run resumes
    (the interrupted baseline is queued again) and the tuner is killed with -9 at the same moment: nothing of
    its server is left a few seconds later. Two partial boots, no full one."""
    home, storage = tmp_path / "home", f"sqlite:///{quick.parent / 'quick.db'}"
    servers = home / ".cache" / "autotune" / "servers"
    run = tuner(quick.parent, home, "--n-trials", "2")
    pgid = engine_spawning(run, servers)
    run.send_signal(signal.SIGINT)
    printed = run.communicate(timeout=300)[0]
    study = optuna.load_study(study_name="quick", storage=storage)
    first = study.trials[0]
    survived = (run.returncode == 130 and first.state == TrialState.FAIL
                and first.user_attrs.get("reason") == INTERRUPTED and group_gone(pgid)
                and within(60, lambda: ours() == [])
                and within(10, lambda: list(servers.glob("*.json")) == []) and "running" not in printed.lower())
    LEDGER.append(("Ctrl-C during a boot", survived, lost(study)))
    assert survived, (run.returncode, first.state, first.user_attrs.get("reason"), printed[-3000:])

    run = tuner(quick.parent, home, "--n-trials", "1")
    pgid = engine_spawning(run, servers)
    os.kill(run.pid, signal.SIGKILL)
    run.communicate(timeout=60)
    study = optuna.load_study(study_name="quick", storage=storage)
    resumed = study.trials[-1]
    gone = group_gone(pgid) and within(60, lambda: ours() == [])
    survived = (gone and within(10, lambda: list(servers.glob("*.json")) == [])
                and resumed.user_attrs.get("baseline", {}).get("name") == "vllm-defaults")
    LEDGER.append(("kill -9 of the tuner while its server spawns the engine core", survived, 0))
    assert survived, (gone, list(servers.glob("*.json")), resumed.number, resumed.user_attrs.get("baseline"))


def test_sigterm_during_a_boot_stops_the_run_as_ctrl_c_does(quick: Path, tmp_path: Path) -> None:
    """SIGTERM (systemd, `docker stop`) while the server spawns its engine core: as Ctrl-C, the trial recorded as
    interrupted, the summary printed, exit 130, no server left."""
    home, storage = tmp_path / "home", f"sqlite:///{quick.parent / 'quick.db'}"
    servers = home / ".cache" / "autotune" / "servers"
    run = tuner(quick.parent, home, "--n-trials", "1")
    pgid = engine_spawning(run, servers)
    run.send_signal(signal.SIGTERM)
    printed = run.communicate(timeout=300)[0]
    study = optuna.load_study(study_name="quick", storage=storage)
    first = study.trials[0]
    survived = (run.returncode == 130 and first.state == TrialState.FAIL
                and first.user_attrs.get("reason") == INTERRUPTED and "this run: " in printed
                and group_gone(pgid) and within(60, lambda: ours() == []))
    LEDGER.append(("SIGTERM during a boot", survived, lost(study)))
    assert survived, (run.returncode, first.state, first.user_attrs.get("reason"), printed[-3000:])


OPTUNA_TABLES = {"studies", "trials", "version_info", "alembic_version", "trial_values", "trial_params"}


def test_ctrl_c_while_a_new_study_database_is_made_leaves_none_or_a_whole_one(quick: Path, tmp_path: Path) -> None:
    """Ctrl-C the moment the new study's database begins to be written (within the run's first seconds): exit 130
    with one line (not click's "Aborted!" and exit 1), and either no database or one with Optuna's whole schema
    (a half-made one held two tables), which the next run opens."""
    made = [quick.parent / "quick.db"]
    run = tuner(quick.parent, tmp_path / "home", "--n-trials", "1")
    while not any(p.exists() for p in made) and run.poll() is None:
        made = [quick.parent / "quick.db", *quick.parent.glob(".quick.db.*")]
        time.sleep(0.001)
    run.send_signal(signal.SIGINT)
    printed = run.communicate(timeout=300)[0]
    db = quick.parent / "quick.db"
    tables = set()
    if db.exists():
        with contextlib.closing(sqlite3.connect(db)) as conn:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    leftovers = list(quick.parent.glob(".quick.db*"))
    survived = (run.returncode == 130 and "Aborted" not in printed and "Traceback" not in printed
                and (not db.exists() or OPTUNA_TABLES <= tables) and leftovers == [])
    LEDGER.append(("Ctrl-C while a new study's database is made", survived, 0))
    assert survived, (run.returncode, sorted(tables), leftovers, printed[-3000:])


def test_a_server_answering_errors_is_recorded_with_the_reason(quick: Path) -> None:
    # max_model_len 64 with 128-token prompts: the real server answers every request with HTTP 400.
    text = quick.read_text().replace("enforce_eager = true", "enforce_eager = true\nmax_model_len = 64")
    quick.write_text(text)
    study = run_with(quick, NoProgress(), trials=1)
    t = study.trials[0]
    survived = t.state == TrialState.COMPLETE and "400" in t.user_attrs.get("reason", "") and ours() == []
    LEDGER.append(("server answering errors (HTTP 400)", survived, lost(study)))
    assert survived, t.user_attrs.get("reason")


def test_a_full_disk_for_logs_stops_the_run_cleanly(quick: Path) -> None:
    artifacts = quick.parent / "quick-artifacts"
    artifacts.mkdir()
    (artifacts / "trial-0000.log").symlink_to("/dev/full")  # every write: ENOSPC
    out = subprocess.run([sys.executable, "-m", "autotune.cli", "run", str(quick), "--n-trials", "1"],
                         capture_output=True, text=True, timeout=600)
    study = optuna.load_study(study_name="quick", storage=f"sqlite:///{quick.parent / 'quick.db'}")
    t = study.trials[0]
    survived = (out.returncode == 1 and "No space left on device" in out.stderr and t.state == TrialState.FAIL
                and ours() == [])
    LEDGER.append(("disk full for server logs", survived, lost(study)))
    assert survived, out.stderr[-2000:]
    assert len([line for line in out.stderr.splitlines() if line.startswith("error:")]) == 1


@contextlib.contextmanager
def full_filesystem(path: Path):
    """`path` on a small tmpfs filled to the last byte, where this machine allows a mount (root); else None, and
    the caller fills the disk through the artifact store's own error path."""
    path.mkdir(parents=True)
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)], check=True,
                       capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        yield False
        return
    try:
        with contextlib.suppress(OSError), open(path / "filler", "wb") as f:
            while True:
                f.write(b"x" * 4096)
                f.flush()
        yield True
    finally:
        subprocess.run(["umount", str(path)], check=False)


def test_a_full_disk_for_the_log_copy_after_a_trial_was_measured_keeps_the_measurement(
        quick: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The artifact store (where the server log is copied before the tell) on a full filesystem: the trial's
    measurement is told all the same, the log that could not be copied is a warning and a note on the trial, and
    no partial copy is left in the store."""
    store = quick.parent / "quick-artifacts" / "store"
    said: list[str] = []
    with full_filesystem(store) as mounted:
        if not mounted:
            def no_space(self, artifact_id: str, content_body) -> None:
                (store / artifact_id).write_bytes(content_body.read(100))  # a partial copy, then the disk is full
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            monkeypatch.setattr(FileSystemArtifactStore, "write", no_space)
        before = sorted(p.name for p in store.iterdir())
        study = run_with(quick, NoProgress(), trials=1, say=said.append)
        after = sorted(p.name for p in store.iterdir())
    t = study.trials[0]
    survived = (t.state == TrialState.COMPLETE and t.user_attrs.get("kv_cache_tokens") == 262_144
                and "No space left on device" in t.user_attrs.get("log_not_kept", "")
                and any(line.startswith("warning: trial 0's server log") for line in said)
                and after == before and ours() == [])
    LEDGER.append(("disk full when the server log is copied after a measured trial", survived, lost(study)))
    assert survived, (t.state, t.user_attrs, said, before, after)


def test_zz_fault_count(capsys: pytest.CaptureFixture[str]) -> None:
    injected = len(LEDGER)
    survived = sum(ok for _, ok, _ in LEDGER)
    trials_lost = sum(n for _, _, n in LEDGER)
    with capsys.disabled():
        print(f"\nfault injection: {injected} faults injected, {survived} survived, {trials_lost} trials lost")
        for fault, ok, n in LEDGER:
            print(f"  {'ok  ' if ok else 'FAIL'} {fault}" + (f" ({n} trials lost)" if n else ""))
    assert injected > 0 and survived == injected and trials_lost == 0
