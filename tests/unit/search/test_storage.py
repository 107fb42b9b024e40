"""Where a study lives and what may touch it: study names that stay inside their directories, storage URLs as the
README writes them (against a real PostgreSQL server), passwords never printed, a changed study refused on
resume, and read-only commands that never create or alter a database. Real SQLite files, real Optuna."""

from __future__ import annotations

import hashlib
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner
from optuna.trial import TrialState

from autotune.cli import main
from autotune.config.study_file import load_study, stored_texts, study_digest
from autotune.errors import SpecError
from autotune.search.storage import open_storage, spec_from_storage
from autotune.search.study import open_study

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
    "other limits": ("objectives", "ttft_p95_ms = 500", "ttft_p95_ms = 250",
                     "[limits.ttft_p95_ms] changed since the study began (500 -> 250)"),
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
    assert study.user_attrs["files"]["study"] == study_file.read_text()  # what `autotune worker` rebuilds from
    study_file.write_text(study_file.read_text() + '\n[[baselines]]\nname = "small"\nflags = { max_num_seqs = 4 }\n')
    study = open_study(load_study(study_file), say=said.append)
    waiting = [t.user_attrs["baseline"]["name"] for t in study.trials if t.state == TrialState.WAITING]
    assert waiting == ["recipe", "small"] and len(study.trials) == 3
    assert len(said) == 1 and "small" in said[0] and "queued" in said[0]
    assert study.user_attrs["files"]["study"] == study_file.read_text()
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
