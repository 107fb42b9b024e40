"""Fault injection: each fault is made for real (signals to real processes, a real port conflict, real bad
files, a log on a full device) inside real runs, and the outcome is asserted. The last test prints the count:
faults injected, survived, trials lost (must be 0).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import optuna
import psutil
import pytest
from processes import vllm_processes
from click.testing import CliRunner
from optuna.trial import TrialState

from autotune import engine
from autotune.budget import Budget
from autotune.cli import main
from autotune.spec import load_study
from autotune.study import NoProgress, run_study

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "tests" / "data" / "quick"
LEDGER: list[tuple[str, bool, int]] = []  # (fault, survived, trials lost)



def engine_core() -> psutil.Process:
    cores = [p for p in vllm_processes() if (p.info["name"] or "").startswith("VLLM::EngineCore")]
    assert len(cores) == 1, cores
    return cores[0]


def lost(study: optuna.Study) -> int:
    return sum(1 for t in study.trials if t.state in (TrialState.RUNNING,))


@pytest.fixture()
def quick(tmp_path: Path) -> Path:
    for f in QUICK.iterdir():
        shutil.copy(f, tmp_path / f.name)
    return tmp_path / "quick.toml"


class Inject(NoProgress):
    """Does something to the server when a given trial reaches its first load level: {trial: action}."""

    def __init__(self, actions):
        self.actions, self.done = dict(actions), set()
        self.stages: list[tuple[int, str]] = []

    def stage(self, number: int, text: str) -> None:
        self.stages.append((number, text))
        if number in self.actions and text.startswith("level 1") and number not in self.done:
            self.done.add(number)
            threading.Timer(0.3, self.actions[number]).start()  # once requests are in flight


def run_with(quick: Path, progress, trials: int = 2) -> optuna.Study:
    spec = load_study(quick)
    run_study(spec, Budget(trials=trials), progress=progress)
    return optuna.load_study(study_name=spec.name, storage=f"sqlite:///{quick.parent / 'quick.db'}")


@pytest.fixture(scope="module")
def faulted(tmp_path_factory: pytest.TempPathFactory) -> tuple[optuna.Study, Inject]:
    """One real three-trial study with three faults (three boots, not six): trial 0's first port is taken by
    another program and its engine is killed during load, trial 1's engine is stopped (SIGSTOP: alive, but no
    token ever again), trial 2 runs untouched and shows the study went on."""
    work = tmp_path_factory.mktemp("faulted")
    for f in QUICK.iterdir():
        shutil.copy(f, work / f.name)
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    ports = iter([squatter.getsockname()[1]])
    real_free_port = engine.free_port
    inject = Inject({0: lambda: os.kill(engine_core().pid, signal.SIGKILL),
                     1: lambda: os.kill(engine_core().pid, signal.SIGSTOP)})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine, "free_port", lambda: next(ports, None) or real_free_port())
        try:
            study = run_with(work / "quick.toml", inject, trials=3)
        finally:
            squatter.close()
    return study, inject


@pytest.mark.engine
def test_a_taken_port_is_retried_on_another(faulted) -> None:
    study, inject = faulted
    first = study.trials[0]
    retried = (0, "booting (the port was taken; on another one)") in inject.stages
    survived = retried and first.user_attrs.get("kv_cache_tokens") == 524_288 and vllm_processes() == []
    LEDGER.append(("port already taken", survived, lost(study)))
    assert survived, first.user_attrs


@pytest.mark.engine
def test_engine_killed_during_load_is_recorded_and_the_study_goes_on(faulted) -> None:
    study, inject = faulted
    first, last = study.trials[0], study.trials[2]
    survived = (0 in inject.done and first.state == TrialState.COMPLETE and first.constraints["boots"] == 1.0
                and last.user_attrs.get("kv_cache_tokens") == 524_288 and vllm_processes() == [])
    LEDGER.append(("engine process killed during load", survived, lost(study)))
    assert survived, (first.user_attrs.get("reason"), last.user_attrs.get("status"))
    assert first.user_attrs["failure_kind"] in ("crash", "unresponsive")


@pytest.mark.engine
def test_a_hung_server_is_recorded_and_the_study_goes_on(faulted) -> None:
    study, inject = faulted
    hung, last = study.trials[1], study.trials[2]
    survived = (1 in inject.done and hung.user_attrs.get("failure_kind") == "unresponsive"
                and "no data for" in hung.user_attrs["reason"] and last.state == TrialState.COMPLETE
                and last.user_attrs.get("kv_cache_tokens") == 524_288 and vllm_processes() == [])
    LEDGER.append(("server hung (engine stopped with SIGSTOP)", survived, lost(study)))
    assert survived, hung.user_attrs.get("reason")


@pytest.mark.engine
def test_a_server_answering_errors_is_recorded_with_the_reason(quick: Path) -> None:
    # max_model_len 64 with 128-token prompts: the real server answers every request with HTTP 400.
    text = quick.read_text().replace("enforce_eager = true", "enforce_eager = true\nmax_model_len = 64")
    quick.write_text(text)
    study = run_with(quick, NoProgress(), trials=1)
    t = study.trials[0]
    survived = t.state == TrialState.COMPLETE and "400" in t.user_attrs.get("reason", "") and vllm_processes() == []
    LEDGER.append(("server answering errors (HTTP 400)", survived, lost(study)))
    assert survived, t.user_attrs.get("reason")


@pytest.mark.engine
def test_a_full_disk_for_logs_stops_the_run_cleanly(quick: Path) -> None:
    artifacts = quick.parent / "quick-artifacts"
    artifacts.mkdir()
    (artifacts / "trial-0000.log").symlink_to("/dev/full")  # every write: ENOSPC
    out = subprocess.run([sys.executable, "-m", "autotune.cli", "run", str(quick), "--n-trials", "1"],
                         capture_output=True, text=True, timeout=600)
    study = optuna.load_study(study_name="quick", storage=f"sqlite:///{quick.parent / 'quick.db'}")
    t = study.trials[0]
    survived = (out.returncode == 1 and "No space left on device" in out.stderr and t.state == TrialState.FAIL
                and vllm_processes() == [])
    LEDGER.append(("disk full for server logs", survived, lost(study)))
    assert survived, out.stderr[-2000:]
    assert len([line for line in out.stderr.splitlines() if line.startswith("error:")]) == 1


QUICK_HEAD = "name = 'quick'\nobjective = 'quick-objective.toml'\n[model]\npath = 'tiny:dense'\n"
BAD_STUDIES: dict[str, tuple[str | bytes, str]] = {
    "malformed TOML": ("name = 'x'\n[model\n", "quick.toml"),
    "unknown key": ("name = 'quick'\nobjective = 'quick-objective.toml'\nmodle = 1\n", "modle"),
    "inverted range": ("name = 'quick'\nobjective = 'quick-objective.toml'\n[model]\npath = 'tiny:dense'\n"
                       "[space.max_num_seqs]\ntype = 'int'\nlow = 64\nhigh = 8\n", "max_num_seqs"),
    "flag vLLM does not know": ("name = 'quick'\nobjective = 'quick-objective.toml'\n[model]\npath = 'tiny:dense'\n"
                                "[engine]\nmax_num_seqz = 4\n", "max_num_seqz"),
    "missing model directory": ("name = 'quick'\nobjective = 'quick-objective.toml'\n[model]\npath = './models/none'\n",
                                "model.path"),
    "string for an integer flag in [engine]": (QUICK_HEAD + "[engine]\nmax_num_seqs = 'lots'\n",
                                               "engine.max_num_seqs: must be an integer"),
    "string for an integer flag in a baseline": (QUICK_HEAD + "[[baselines]]\nname = 'b'\n"
                                                 "flags = { max_num_seqs = 'lots' }\n",
                                                 "baselines[0].flags.max_num_seqs: must be an integer"),
    "word for a switch in [engine]": (QUICK_HEAD + "[engine]\nenforce_eager = 'yes'\n",
                                      "engine.enforce_eager: must be true or false"),
    "value outside a flag's choices": (QUICK_HEAD + "[engine]\nkv_cache_dtype = 'fp7'\n", "engine.kv_cache_dtype"),
    "string among a searched integer flag's choices": (QUICK_HEAD + "[space.max_num_seqs]\ntype = 'categorical'\n"
                                                       "choices = [4, 'many']\n", "space.max_num_seqs.choices"),
    "unknown hardware profile": (QUICK_HEAD.replace("[model]", "hardware = 'rtx9090'\n[model]"),
                                 "quick.toml: hardware: unknown GPU profile 'rtx9090'"),
    # No network here, and a made-up id anywhere: either way one quick line, not 29 s of retries and a traceback.
    "hub id that cannot be resolved": (QUICK_HEAD.replace("tiny:dense", "nobody-xyz/no-such-model-4f1c"),
                                       "quick.toml: model.path: cannot resolve 'nobody-xyz/no-such-model-4f1c'"),
    "not UTF-8": (b"name = 'caf\xe9'\n", "quick.toml: not UTF-8"),
    # Our own messages name TOML tables in brackets: printed as text, not read as markup.
    "fixed and searched": (QUICK_HEAD + "[engine]\nmax_num_seqs = 4\n[space.max_num_seqs]\ntype = 'int'\n"
                                        "low = 1\nhigh = 8\n", "both fixed in [engine] and searched in [space]"),
}


@pytest.mark.parametrize("fault", sorted(BAD_STUDIES))
def test_bad_study_files_fail_in_one_line_with_exit_2_and_nothing_written(quick: Path, fault: str) -> None:
    text, named = BAD_STUDIES[fault]
    quick.write_bytes(text if isinstance(text, bytes) else text.encode())
    before = sorted(quick.parent.iterdir())
    out = CliRunner().invoke(main, ["run", str(quick), "--n-trials", "1"])
    lines = [line for line in out.output.splitlines() if line.strip()]
    survived = (out.exit_code == 2 and len(lines) == 1 and named in lines[0]
                and sorted(quick.parent.iterdir()) == before)
    LEDGER.append((f"bad input: {fault}", survived, 0))
    assert survived, out.output


@pytest.mark.parametrize(("args", "named"), [
    (["--budget", "4x"], "--budget"),
    (["--n-trials", "1", "--storage", "postgresql+psycopg2://nobody@127.0.0.1:9/none"], "--storage"),
    (["--n-trials", "1", "--gpus", "0,0"], "--gpus"),
    (["--budget", "", "--n-trials", "1"], "--budget"),  # empty is not "the study's budget"
    (["--n-trials", "1", "--gpus", "97,98"], "--gpus: 97,98:"),  # no such GPUs here (none at all on the CPU build)
    (["--n-trials", "1", "--workers", str(len(os.sched_getaffinity(0)) + 1)], "--workers"),
])
def test_bad_command_lines_fail_in_one_line_with_exit_2(quick: Path, args: list[str], named: str) -> None:
    before = sorted(quick.parent.iterdir())
    out = CliRunner().invoke(main, ["run", str(quick), *args])
    lines = [line for line in out.output.splitlines() if line.strip()]
    survived = out.exit_code == 2 and len(lines) == 1 and named in lines[0] and sorted(quick.parent.iterdir()) == before
    LEDGER.append((f"bad input: run {' '.join(args)}", survived, 0))
    assert survived, out.output


@pytest.mark.parametrize(("args", "named"), [
    (["trial", "--model", "tiny:nope", "--objective", str(QUICK / "quick-objective.toml")], "--model: tiny:nope"),
    (["estimate", "--model", "tiny:nope"], "--model: tiny:nope"),
    (["estimate", "--model", "nobody-xyz/no-such-model-4f1c"], "--model: nobody-xyz/no-such-model-4f1c"),
    (["dashboard", "--port", "99999"], "--port"),
    (["dashboard", "--port", "-1"], "--port"),
    (["trial", "--model", "tiny:dense", "--objective", str(QUICK / "quick-objective.toml"), "--set",
      "max_num_seqs=lots"], "--set: max_num_seqs: must be an integer"),
])
def test_bad_values_of_other_commands_fail_in_one_line_with_exit_2(tmp_path: Path, args: list[str], named: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # where `trial` would write its log, and `dashboard` look for studies
    out = CliRunner().invoke(main, args)
    lines = [line for line in out.output.splitlines() if line.strip()]
    survived = out.exit_code == 2 and len(lines) == 1 and named in lines[0] and not list(tmp_path.iterdir())
    LEDGER.append((f"bad input: {' '.join(args[:3])}", survived, 0))
    assert survived, out.output


@pytest.mark.parametrize("folder", ["a[/x]b", "[bold]", "[engine]"])
def test_paths_with_brackets_are_printed_as_they_are(tmp_path: Path, folder: str) -> None:
    """A path (or any text not ours) in an error is text, not rich markup: no crash, no missing characters."""
    missing = tmp_path / folder / "none.toml"
    out = CliRunner().invoke(main, ["run", str(missing), "--n-trials", "1"])
    lines = [line for line in out.output.splitlines() if line.strip()]
    survived = out.exit_code == 2 and lines == [f"error: {missing}: file not found"]
    LEDGER.append((f"bad input: a path containing {folder}", survived, 0))
    assert survived, out.output


def test_zz_fault_count(capsys: pytest.CaptureFixture[str]) -> None:
    injected = len(LEDGER)
    survived = sum(ok for _, ok, _ in LEDGER)
    trials_lost = sum(n for _, _, n in LEDGER)
    with capsys.disabled():
        print(f"\nfault injection: {injected} faults injected, {survived} survived, {trials_lost} trials lost")
        for fault, ok, n in LEDGER:
            print(f"  {'ok  ' if ok else 'FAIL'} {fault}" + (f" ({n} trials lost)" if n else ""))
    assert injected > 0 and survived == injected and trials_lost == 0
