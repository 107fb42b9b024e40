"""Where a study lives and what may touch it: study names that stay inside their directories, storage URLs as the
README writes them (against a real PostgreSQL server), passwords never printed, a changed study refused on
resume, and read-only commands that never create or alter a database. Real SQLite files, real Optuna."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner
from optuna.trial import TrialState

from autotune.cli import main
from autotune.config.study_file import load_study, stored_texts, study_digest
from autotune.errors import SpecError
from autotune.search.sqlite_file import ensure_schema, table_names
from autotune.search.storage import open_storage, spec_from_storage, stored_files
from autotune.search.study import export_command, open_study

ROOT = Path(__file__).resolve().parents[3]


def files_under(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every file under root with its size, mtime and content hash: what "nothing written" is checked against."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns,
                                       hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(root.rglob("*")) if p.is_file()}


def one_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    return lines[0]


@pytest.fixture()
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp/a/b (the working directory) holding studies/tiny-cpu.toml and objectives/tiny-cpu.toml, copied."""
    cwd = tmp_path / "a" / "b"
    (cwd / "studies").mkdir(parents=True)
    (cwd / "objectives").mkdir()
    (cwd / "objectives" / "tiny-cpu.toml").write_text((ROOT / "objectives" / "tiny-cpu.toml").read_text())
    (cwd / "studies" / "tiny-cpu.toml").write_text((ROOT / "studies" / "tiny-cpu.toml").read_text())
    monkeypatch.chdir(cwd)
    return cwd


def set_name(study_file: Path, name: str) -> None:
    text = study_file.read_text()
    study_file.write_text(text.replace('name = "tiny-cpu"', f"name = {name!r}", 1))


# --- 5. study names ----------------------------------------------------------------------------------------

BAD_NAMES = ["../../evil", "/ABS/evil-abs", ".hidden", "a/b", "..", "with space", "-dash-first"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_study_file_whose_name_is_not_a_plain_name_is_refused(work: Path, tmp_path: Path, name: str) -> None:
    name = name.replace("/ABS", str(tmp_path))
    study_file = work / "studies" / "tiny-cpu.toml"
    set_name(study_file, name)
    with pytest.raises(SpecError) as e:
        load_study(study_file)
    assert e.value.key == "name" and e.value.source == str(study_file)
    before = files_under(tmp_path)
    for argv in (["status", "--study", str(study_file)], ["report", "--study", str(study_file), "--no-png"],
                 ["run", str(study_file), "--n-trials", "1"]):
        out = CliRunner().invoke(main, argv)
        line = one_line(out.output)
        assert out.exit_code == 2 and str(study_file) in line and ": name:" in line, (argv, out.output)
    assert files_under(tmp_path) == before


def test_good_study_names_are_accepted(work: Path) -> None:
    original = (work / "studies" / "tiny-cpu.toml").read_text()
    for name in ("tiny-cpu", "Qwen3.5-27B_rtx3090", "7b", "_scratch"):
        study_file = work / "studies" / f"{name}.toml"
        study_file.write_text(original)
        set_name(study_file, name)
        assert load_study(study_file).name == name


@pytest.mark.parametrize("command", ["status", "export", "report", "dashboard"])
def test_a_study_name_given_with_study_is_refused_before_anything_is_written(work: Path, tmp_path: Path,
                                                                             command: str) -> None:
    db = work / "studies" / "x.db"
    before = files_under(tmp_path)
    out = CliRunner().invoke(main, [command, "--study", "../../evil", "--storage", f"sqlite:///{db}"])
    line = one_line(out.output)
    assert out.exit_code == 2 and "--study" in line and "../../evil" in line, out.output
    assert files_under(tmp_path) == before


def test_a_worker_refuses_a_study_name_from_storage_that_would_write_outside_its_directory(work: Path,
                                                                                           tmp_path: Path) -> None:
    """The stored name decides where `autotune worker` writes the study file it rebuilds."""
    db = tmp_path / "shared.db"
    evil = optuna.create_study(study_name="../../evil", storage=open_storage(f"sqlite:///{db}"))
    evil.set_user_attr("files", {"study": 'name = "../../evil"\nobjective = "../objectives/o.toml"\n',
                                 "objective": "not toml [", "objective_ref": "../objectives/o.toml"})
    before = files_under(tmp_path)
    out = CliRunner().invoke(main, ["worker", "--study", "../../evil", "--storage", f"sqlite:///{db}",
                                    "--n-trials", "1", "--sha256", "0" * 64])
    line = one_line(out.output)
    assert out.exit_code == 2 and "--study" in line and "../../evil" in line, out.output
    assert files_under(tmp_path) == before


# --- 6. PostgreSQL as the README writes it, and no password in any message ----------------------------------

def test_the_readmes_postgresql_url_opens_a_study_and_status_reads_it(work: Path, postgres_url: str) -> None:
    assert postgres_url.startswith("postgresql://")  # no +driver: as the README writes it
    spec = load_study(work / "studies" / "tiny-cpu.toml")
    study = open_study(spec, postgres_url)
    assert [t.state for t in study.trials] == [TrialState.WAITING, TrialState.WAITING]  # the two baselines
    out = CliRunner().invoke(main, ["status", "--study", "tiny-cpu", "--storage", postgres_url])
    assert out.exit_code == 0, out.output
    assert "study tiny-cpu: 2 trial(s)" in out.output and "vllm-defaults" in out.output
    digests: list[str] = []
    rebuilt = spec_from_storage("tiny-cpu", postgres_url, work / "worker", digests.append)  # `autotune worker`'s
    assert digests == [study_digest(*stored_texts(spec))]  # the digest `autotune run` prints for workers
    assert rebuilt.path == work / "worker" / "study" / "tiny-cpu.toml" and rebuilt.space == spec.space
    assert len(open_study(rebuilt, postgres_url).trials) == 2  # the same study: no change seen, nothing queued
    with_password = postgres_url.replace("postgres@", "postgres:pg-s3cret@")  # trust auth: accepted, unused
    missing = CliRunner().invoke(main, ["status", "--study", "no-such-study", "--storage", with_password])
    line = one_line(missing.output)
    assert missing.exit_code == 2 and "no such study" in line and "pg-s3cret" not in line and "***" in line


def test_run_on_a_shared_database_prints_the_digest_its_workers_are_given(work: Path, postgres_url: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """`autotune run` on PostgreSQL says the digest a worker needs (--sha256), and a worker given it rebuilds the
    study; the storage URL (which may hold a password) is not repeated."""
    from autotune.cli.search import trusted_digest
    from autotune.search import study as study_module

    def no_search(*args, **kwargs):
        raise SystemExit(0)  # the database and its files are made: nothing to boot for this test

    monkeypatch.setattr(study_module, "run_study", no_search)
    out = CliRunner().invoke(main, ["run", "studies/tiny-cpu.toml", "--n-trials", "1", "--storage", postgres_url])
    digest = study_digest(*stored_texts(load_study(work / "studies" / "tiny-cpu.toml")))
    assert out.exit_code == 0 and f"autotune worker --study tiny-cpu --storage URL --sha256 {digest}" in out.output
    assert postgres_url not in out.output
    rebuilt = spec_from_storage("tiny-cpu", postgres_url, work / "worker", trusted_digest(digest, None))
    assert rebuilt.name == "tiny-cpu"


@pytest.mark.parametrize("url", [
    "postgresql://tuner:pg-s3cret@127.0.0.1:9/autotune",  # nothing listens on the discard port
    "postgresql+psycopg2://tuner:pg-s3cret@127.0.0.1:9/autotune",
    "postgresql://tuner:pg-s3cret@127.0.0.1:notaport/autotune",  # does not even parse
    "nosuchdb://tuner:pg-s3cret@127.0.0.1/autotune",
])
@pytest.mark.parametrize("command", ["status", "run", "worker"])
def test_a_storage_password_is_never_printed(work: Path, url: str, command: str) -> None:
    argv = {"status": ["status", "--study", "tiny-cpu", "--storage", url],
            "run": ["run", "studies/tiny-cpu.toml", "--n-trials", "1", "--storage", url],
            "worker": ["worker", "--study", "tiny-cpu", "--storage", url, "--n-trials", "1", "--sha256", "0" * 64]
            }[command]
    before = files_under(work)
    out = CliRunner().invoke(main, argv)
    line = one_line(out.output)
    assert out.exit_code == 2 and "--storage" in line and "pg-s3cret" not in line, out.output
    assert files_under(work) == before


@pytest.mark.parametrize("url", [
    "postgresql://tuner:p@ss:w0rd-s3cret@127.0.0.1/autotune",  # an unescaped @: SQLAlchemy cannot parse it
    "postgresql://tuner:p@ss-s3cret@127.0.0.1:9/autotune",  # parses, with part of the password as the host
    "postgresql://tuner@127.0.0.1:9/autotune?password=p-s3cret",
])
def test_a_password_sqlalchemy_cannot_parse_is_masked_whole(work: Path, url: str) -> None:
    out = CliRunner().invoke(main, ["status", "--study", "tiny-cpu", "--storage", url])
    line = one_line(out.output)
    assert out.exit_code == 2 and "s3cret" not in line and "***" in line, out.output


def test_the_export_command_a_run_prints_holds_no_password(work: Path) -> None:
    spec = load_study(work / "studies" / "tiny-cpu.toml")
    line = export_command(spec, "postgresql://tuner:pg-s3cret@db.example/autotune")
    assert "pg-s3cret" not in line and "postgresql://tuner:***@db.example/autotune" in line, line


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_an_in_memory_sqlite_storage_is_refused_in_one_line(work: Path, url: str) -> None:
    before = files_under(work)
    out = CliRunner().invoke(main, ["run", "studies/tiny-cpu.toml", "--n-trials", "1", "--storage", url])
    line = one_line(out.output)
    assert out.exit_code == 2 and line.startswith(f"error: --storage {url}: ") and "in-memory" in line, out.output
    assert files_under(work) == before


def test_a_sqlite_file_of_another_program_is_refused_and_left_as_it_was(work: Path) -> None:
    db = work / "notes.db"
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    before = files_under(work)
    out = CliRunner().invoke(main, ["run", "studies/tiny-cpu.toml", "--n-trials", "1", "--storage", f"sqlite:///{db}"])
    line = one_line(out.output)
    assert out.exit_code == 2 and "not an Optuna study database" in line and "notes" in line, out.output
    assert files_under(work) == before


OPEN_AT_ONCE = """
import sys, time
from pathlib import Path
from autotune.config.study_file import load_study
from autotune.search.sqlite_file import ensure_schema, table_names
from autotune.search.study import export_command, open_study
go = Path(sys.argv[1])
while not go.exists():
    time.sleep(0.001)
open_study(load_study("studies/tiny-cpu.toml"))
"""


def test_runs_of_a_new_sqlite_study_started_at_once_all_open_it(work: Path) -> None:
    """Real processes, released together, each creating the same new study's database as `autotune run` does."""
    for attempt in range(3):  # the race is not won every time: three rounds of four
        db, go = work / "studies" / "tiny-cpu.db", work / f"go-{attempt}"
        db.unlink(missing_ok=True)
        procs = [subprocess.Popen([sys.executable, "-c", OPEN_AT_ONCE, str(go)], cwd=work,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for _ in range(4)]
        time.sleep(3)  # each has imported autotune and waits for the signal to go
        go.touch()
        outputs = [p.communicate(timeout=120)[0] for p in procs]
        assert [p.returncode for p in procs] == [0] * 4, "\n".join(outputs)
        study = optuna.load_study(study_name="tiny-cpu", storage=f"sqlite:///{db}")
        assert len(study.trials) == 2, [t.user_attrs.get("baseline") for t in study.trials]  # baselines once
        assert [p.name for p in db.parent.iterdir() if p.name.startswith(".")] == []  # no private file left


def test_a_new_database_interrupted_while_its_schema_is_made_is_not_left_half_made(tmp_path: Path) -> None:
    db = tmp_path / "new.db"

    def interrupted(path: Path) -> None:
        with contextlib.closing(sqlite3.connect(path)) as conn, conn:
            conn.execute("CREATE TABLE studies (study_id INTEGER)")  # the first of Optuna's tables
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ensure_schema(db, interrupted, "sqlite:///new.db")
    assert list(tmp_path.iterdir()) == []
    open_storage(f"sqlite:///{db}")
    assert {"studies", "trials", "version_info", "alembic_version"} <= table_names(db, "")


# No file may grow past one byte (a full disk, as SQLite meets it), and SIGXFSZ is ignored so that writes fail
# with EFBIG instead of killing the process: no mount needed, so it holds on any machine.
FULL_DISK_RUN = "import os, resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); " \
                "resource.setrlimit(resource.RLIMIT_FSIZE, (1, 1)); " \
                "os.execv(sys.executable, [sys.executable, '-m', 'autotune.cli', *sys.argv[1:]])"


def test_a_run_that_cannot_write_its_database_stops_with_one_line_and_leaves_it_whole(work: Path) -> None:
    started(work)
    db = work / "studies" / "tiny-cpu.db"
    before = [(t.number, t.state) for t in optuna.load_study(study_name="tiny-cpu", storage=f"sqlite:///{db}").trials]
    out = subprocess.run([sys.executable, "-c", FULL_DISK_RUN, "run", "studies/tiny-cpu.toml", "--n-trials", "1"],
                         cwd=work, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    errors = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(errors) == 1, out.stdout[-2000:] + out.stderr[-3000:]
    assert errors[0].startswith("error: cannot write the study's database: "), errors
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    after = optuna.load_study(study_name="tiny-cpu", storage=f"sqlite:///{db}").trials
    assert [(t.number, t.state) for t in after] == before


# --- 7. a changed study is refused on resume; new baselines are queued and said --------------------------------

def started(work: Path) -> optuna.Study:
    """The study as `autotune run` began it, with one trial told."""
    study = open_study(load_study(work / "studies" / "tiny-cpu.toml"))
    trial = study.ask()
    study.tell(trial, 100.0)
    return study


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


CHANGES = {
    "a changed range": ("studies", "low = 1\nhigh = 64", "low = 1\nhigh = 128",
                        "[space.max_num_seqs] changed since the study began (high 64 -> 128)"),
    "a renamed parameter": ("studies", "[space.enable_prefix_caching]", "[space.async_scheduling]",
                            "[space.enable_prefix_caching] removed since the study began; "
                            "[space.async_scheduling] added since the study began"),
    "other limits": ("objectives", "p95_ttft_ms = 500", "p95_ttft_ms = 250",
                     "[limits.p95_ttft_ms] changed since the study began (500 -> 250)"),
    "another workload": ("objectives", "input_len = 256", "input_len = 512",
                         "[workload.input_len] changed since the study began (256 -> 512)"),
    "another fixed flag": ("studies", "enforce_eager = true", "enforce_eager = false",
                           "[engine.enforce_eager] changed since the study began (true -> false)"),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_resuming_a_changed_study_is_refused_in_one_line_and_nothing_is_written(work: Path, change: str) -> None:
    where, old, new, said = CHANGES[change]
    started(work)
    edit(work / where / "tiny-cpu.toml", old, new)
    with pytest.raises(SpecError) as e:
        open_study(load_study(work / "studies" / "tiny-cpu.toml"))
    assert said in str(e.value) and "new study" in str(e.value)
    before = files_under(work)
    out = CliRunner().invoke(main, ["run", "studies/tiny-cpu.toml", "--n-trials", "1"])
    line = one_line(out.output)
    assert out.exit_code == 2 and said in line and line.startswith("error: studies/tiny-cpu.toml: "), out.output
    assert files_under(work) == before


def test_resuming_queues_new_baselines_says_so_and_stores_the_study_file_workers_rebuild_from(work: Path) -> None:
    study_file = work / "studies" / "tiny-cpu.toml"
    started(work)
    edit(study_file, 'time = "45m"', 'time = "4h"')  # a longer budget: allowed, nothing to say
    said: list[str] = []
    study = open_study(load_study(study_file), say=said.append)
    assert said == [] and len(study.trials) == 2  # trial 0 told, the second baseline waiting
    files = stored_files(study)
    assert files is not None and files["study"] == study_file.read_text()  # what `autotune worker` rebuilds from
    assert "files" not in study.user_attrs  # out of the table `optuna studies` prints
    assert len(json.dumps(study.user_attrs)) < 400, study.user_attrs
    study_file.write_text(study_file.read_text() + '\n[[baselines]]\nname = "small"\nflags = { max_num_seqs = 4 }\n')
    study = open_study(load_study(study_file), say=said.append)
    waiting = [t.user_attrs["baseline"]["name"] for t in study.trials if t.state == TrialState.WAITING]
    assert waiting == ["recipe", "small"] and len(study.trials) == 3
    assert len(said) == 1 and "small" in said[0] and "queued" in said[0]
    assert stored_files(study)["study"] == study_file.read_text()
    again = open_study(load_study(study_file), say=said.append)  # the next resume: queued once, said once
    assert len(again.trials) == 3 and len(said) == 1


# --- 10. read-only commands never create or alter a database -----------------------------------------------

READ_ONLY = [["status"], ["export"], ["report", "--no-png", "--out", "reports"]]


@pytest.mark.parametrize("argv", READ_ONLY, ids=lambda a: a[0])
@pytest.mark.parametrize("database", ["missing", "empty", "another study"])
def test_read_only_commands_never_create_or_alter_a_database(work: Path, argv: list[str], database: str) -> None:
    db = work / "studies" / "new.db"
    if database == "empty":
        db.touch()
    elif database == "another study":
        optuna.create_study(study_name="other", storage=f"sqlite:///{db}")
    before = files_under(work)
    out = CliRunner().invoke(main, [*argv, "--study", "new", "--storage", f"sqlite:///{db}"])
    line = one_line(out.output)
    assert out.exit_code == 2 and "new" in line, out.output
    assert files_under(work) == before
    assert db.exists() == (database != "missing")
    bare = CliRunner().invoke(main, ["status"])  # the next bare status finds no study (and creates none)
    assert bare.exit_code == 2 and files_under(work) == before, bare.output


def test_read_only_commands_leave_a_real_study_database_as_it_was(work: Path) -> None:
    started(work)
    before = files_under(work)
    for argv in (["status"], ["status", "--study", "tiny-cpu"], ["export", "--study", "studies/tiny-cpu.toml"]):
        out = CliRunner().invoke(main, argv)
        assert out.exit_code in (0, 1), out.output  # export: no feasible trial yet (exit 1)
        assert files_under(work) == before
