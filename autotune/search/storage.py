"""Where a study lives: storage URLs, which study the user means, opening with heartbeats, the study file stored
with it (for remote workers, and to refuse a resumed study whose definition changed), and the artifact store for
server logs."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import json
import re
import threading
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, cast
from urllib.parse import quote

import optuna
from optuna.artifacts import (
    FileSystemArtifactStore,
    upload_artifact,
)
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import SQLAlchemyError

from autotune.config.study_file import StudySpec, check_study_name, load_study, study_digest
from autotune.errors import SpecError, StorageError
from autotune.measure.stats import current_names, read_limits
from autotune.search.space import enqueue_baseline
from autotune.search.sqlite_file import ensure_schema

STORE_DIR = "store"  # inside the study's artifacts directory, beside the log files


class WholeFileStore(FileSystemArtifactStore):
    """Optuna's file store, but an artifact it cannot write whole (a full disk) leaves no partial file behind."""

    def write(self, artifact_id: str, content_body: BinaryIO) -> None:
        try:
            super().write(artifact_id, content_body)
        except OSError:
            self._get_filepath(artifact_id).unlink(missing_ok=True)
            raise


def open_artifact_store(artifacts_dir: Path) -> FileSystemArtifactStore:
    """The store for a study whose logs are written to `artifacts_dir` (study.py's artifacts_dir)."""
    path = Path(artifacts_dir) / STORE_DIR
    path.mkdir(parents=True, exist_ok=True)
    return WholeFileStore(str(path))


LOG_NOT_KEPT_ATTR = "log_not_kept"  # why a trial's server log is not in the artifact store


def attach_log(study: optuna.Study, trial: optuna.Trial, log_path: Path, artifact_store: FileSystemArtifactStore,
               warn: Callable[[str], object] = lambda line: None) -> str | None:
    """Attach a trial's server log; returns the artifact id, or None when the server never wrote one or it could
    not be copied (a full disk: said through `warn` and recorded on the trial, whose measurement is still told).

    Optuna refuses to change a finished trial, so call this before the trial is told."""
    log_path = Path(log_path)
    if not log_path.is_file():
        return None
    try:
        return upload_artifact(artifact_store=artifact_store, file_path=str(log_path), study_or_trial=trial,
                               mimetype="text/plain", encoding="utf-8")
    except OSError as e:
        why = f"{e.strerror or e}"
        trial.set_user_attr(LOG_NOT_KEPT_ATTR, why)
        warn(f"warning: trial {trial.number}'s server log was not copied into the artifact store ({why}); it stays "
             f"at {log_path} if that could be written")
        return None


def find_artifact_store(study: optuna.Study, storage_url: str) -> FileSystemArtifactStore | None:
    """Where a study's logs were attached: beside the trials' log files, else beside a SQLite database."""
    candidates = [Path(t.user_attrs["log_path"]).parent / STORE_DIR
                  for t in study.get_trials(deepcopy=False) if "log_path" in t.user_attrs]
    if storage_url.startswith("sqlite:///"):
        db = Path(storage_url.removeprefix("sqlite:///"))
        candidates.append(db.parent / f"{study.study_name}-artifacts" / STORE_DIR)
    for path in candidates:
        if path.is_dir():
            return FileSystemArtifactStore(str(path))
    return None


HEARTBEAT_S = 5


GRACE_S = 30  # a RUNNING trial without a heartbeat for this long belongs to a dead worker: marked FAIL, retried once


def default_storage(spec: StudySpec) -> str:
    return f"sqlite:///{spec.path.parent / (spec.name + '.db')}"


def retry_stale_trial(study: optuna.Study, trial: FrozenTrial) -> None:
    """Queue a trial whose worker died once more, as it was (Optuna's RetryHeartbeatStaleTrialCallback with
    max_retry=1, and the same system attributes). It queues the params as fixed params, as enqueue_trial does:
    a baseline's values may lie outside the space's ranges, which Optuna's callback cannot re-create."""
    retry_trial(study, trial, trial.user_attrs)


def retry_trial(study: optuna.Study, trial: FrozenTrial, user_attrs: dict[str, object]) -> bool:
    """Queue `trial`'s configuration once more, unless it is itself a retry (each is retried once); whether it was.
    The queued trial names the one it retries (system attr failed_trial), as Optuna's retry callbacks do."""
    history = [*trial.system_attrs.get("retry_history", []), trial.number]
    if len(history) > 1:
        return False
    system_attrs = {**trial.system_attrs, "failed_trial": trial.system_attrs.get("failed_trial", trial.number),
                    "retry_history": history, "fixed_params": dict(trial.params)}
    study.add_trial(optuna.create_trial(state=TrialState.WAITING, user_attrs=user_attrs, system_attrs=system_attrs))
    return True


# user:password@ up to the URL's last @: a password holding an unescaped @ or : is masked whole
_USER_PASSWORD = re.compile(r"^(?P<head>[^:/]+://[^:/@]*:)(?P<password>.*)@(?=[^@]*$)", re.DOTALL)
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&]password=)(?P<password>[^&]*)")


def shown_url(url: str) -> str:
    """A storage URL as autotune prints it: its password masked, also in a URL that SQLAlchemy cannot parse (whose
    text its errors would echo) or parses otherwise than the user meant (an unescaped @ in the password)."""
    return _QUERY_PASSWORD.sub(r"\g<head>***", _USER_PASSWORD.sub(r"\g<head>***@", url))


def _passwords(url: str) -> list[str]:
    """Every text of `url` that may be its password, the longest first (what error messages must not echo)."""
    found = [m.group("password") for m in (_USER_PASSWORD.search(url), *_QUERY_PASSWORD.finditer(url)) if m]
    with contextlib.suppress(Exception):
        found.append(make_url(url).password or "")
    return sorted({p for p in found if p}, key=len, reverse=True)


def _masked(text: str, url: str) -> str:
    for password in _passwords(url):
        text = text.replace(password, "***")
    return text


def _database_url(url: str, read_only: bool) -> URL:
    """The URL SQLAlchemy is given. A bare postgresql:// means psycopg 3 to SQLAlchemy 2.1; the project installs
    psycopg2, so that is the driver unless psycopg is present. A read-only SQLite open uses SQLite's mode=ro, so
    that it can neither create the file nor write to it."""
    written = _USER_PASSWORD.search(url)
    if written and "@" in written.group("password"):  # SQLAlchemy would read part of it as the host
        raise StorageError(f"--storage {shown_url(url)}: the password holds an @ that is not escaped; write it as %40")
    parsed = make_url(url)
    if parsed.drivername == "postgresql" and importlib.util.find_spec("psycopg") is None:
        parsed = parsed.set(drivername="postgresql+psycopg2")
    if parsed.get_backend_name() == "sqlite":
        in_memory = (parsed.database or ":memory:").startswith((":memory:", "file::memory:"))
        if in_memory or parsed.query.get("mode") == "memory":
            raise StorageError(f"--storage {shown_url(url)}: an in-memory database would lose the study when the "
                               "run ends; give a file, e.g. sqlite:///studies/NAME.db")
        path = Path(parsed.database or "")
        if read_only and not path.is_file():
            raise StorageError(f"--storage {shown_url(url)}: no database file at {path}")
        if read_only:
            parsed = parsed.set(database=f"file:{quote(str(path.resolve()))}", query={"mode": "ro", "uri": "true"})
    return parsed


def open_storage(url: str, read_only: bool = False) -> optuna.storages.BaseStorage:
    """An RDB storage with heartbeats, so a trial whose worker died is found and marked, not left RUNNING.
    Read-only (status, export, report, a worker looking its study up) creates no schema and no file. A new SQLite
    file is made whole or not at all, and a SQLite file of another program's is refused (search/sqlite_file.py)."""
    shown = shown_url(url)
    try:
        database = _database_url(url, read_only)
        if database.get_backend_name() == "sqlite" and not read_only:
            ensure_schema(Path(database.database or ""), functools.partial(_make_schema, database), shown)
        return optuna.storages.RDBStorage(database.render_as_string(hide_password=False),
                                          heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S,
                                          heartbeat_stale_trial_callback=retry_stale_trial,
                                          skip_table_creation=read_only)
    except StorageError:
        raise
    except Exception as e:  # sqlalchemy/driver errors vary by backend; all mean the same thing to a user
        while (e.__cause__ or e.__context__) is not None:  # the driver's own words, not a wrapper's
            e = e.__cause__ or e.__context__  # type: ignore[assignment]
        reason = (str(e).splitlines() or [type(e).__name__])[0]
        if read_only and "version_info" in reason:  # the first table Optuna reads is missing
            reason = "holds no Optuna study"
        raise StorageError(f"--storage {shown}: cannot open: {_masked(reason, url)}") from None


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite storage URL; None for another database."""
    parsed = make_url(url)
    return Path(parsed.database) if parsed.get_backend_name() == "sqlite" and parsed.database else None


def unwritable(error: BaseException) -> StorageError | None:
    """The one line a run stops with when its database cannot be written (a full disk, a lost server): Optuna
    wraps the driver's error, which is what a user needs to read. None for any other error."""
    if not isinstance(error, optuna.exceptions.StorageInternalError | SQLAlchemyError):
        return None
    cause: BaseException = error
    while (cause.__cause__ or cause.__context__) is not None:
        cause = cause.__cause__ or cause.__context__  # type: ignore[assignment]
    reason = (str(cause).splitlines() or [type(cause).__name__])[0]
    return StorageError(f"cannot write the study's database: {reason} (what it recorded before is kept; a trial "
                        "in flight is measured again when the run resumes)")


def _make_schema(database: URL, path: Path) -> None:
    """Optuna's schema, written into a new SQLite file at `path`."""
    storage = optuna.storages.RDBStorage(database.set(database=str(path)).render_as_string(hide_password=False))
    storage.engine.dispose()


def load_existing_study(name: str, url: str) -> optuna.Study:
    """A study that must exist already, opened read-only: a missing file or study is an error, never created."""
    check_study_name(name, "--study", None)
    storage = open_storage(url, read_only=True)
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        raise StorageError(f"--study {name}: no such study in {shown_url(url)}") from None


def study_ref(study: str | None, storage: str | None) -> tuple[str, str]:
    """Which study the user means: (study name, storage URL) from --study (a name or a study file) and --storage;
    by default the most recently used SQLite study under studies/."""
    if study and not study.endswith(".toml"):
        check_study_name(study, "--study", None)
    if study and study.endswith(".toml"):
        spec = load_study(study)
        return spec.name, storage or spec.storage or default_storage(spec)
    if storage:
        if not study:
            raise SpecError("--study", None, "give the study's name with --storage")
        return study, storage
    if study:
        toml = Path("studies") / f"{study}.toml"
        if toml.is_file():
            spec = load_study(toml)
            return spec.name, spec.storage or default_storage(spec)
        db = Path("studies") / f"{study}.db"
        if not db.is_file():
            raise SpecError("--study", study, f"no study file {toml} and no database {db}")
        return study, f"sqlite:///{db}"
    dbs = sorted(Path("studies").glob("*.db"), key=lambda p: p.stat().st_mtime)
    if not dbs:
        raise SpecError("--study", None, "no study database under studies/ yet: run `autotune run STUDY.toml` first")
    return check_study_name(dbs[-1].stem, str(dbs[-1]), None), f"sqlite:///{dbs[-1]}"


def load_study_ref(study: str | None, storage: str | None) -> optuna.Study:
    """The study a read-only command (status, export, report, dashboard, a warm start) reads: it must exist, and
    nothing is created or changed to find out."""
    return load_existing_study(*study_ref(study, storage))


# The study and objective texts a study keeps (what `autotune worker` on another host rebuilds from, what a resumed
# run is compared with): a system attribute, out of the user attributes `optuna studies` prints in its table (four
# thousand characters wide with them). A study begun before keeps them as a user attribute: still read.
FILES_ATTR = "files"


def stored_files(study: optuna.Study) -> dict[str, str] | None:
    """The files stored with a study, or None (a study made before studies kept them)."""
    system = study._storage.get_study_system_attrs(study._study_id)
    return system.get(FILES_ATTR) or study.user_attrs.get(FILES_ATTR)


def store_files(study: optuna.Study, files: dict[str, str]) -> None:
    study._storage.set_study_system_attr(study._study_id, FILES_ATTR, files)


def spec_from_storage(name: str, url: str, root: Path, trust: Callable[[str], None]) -> StudySpec:
    """Rebuild a study's spec from the files `autotune run` stored with it (for workers on other hosts). `trust`
    raises unless the stored files' digest (study_digest) is the one this worker was given: whoever can write the
    database must not choose what runs on this host. Nothing is written before."""
    files = stored_files(load_existing_study(name, url))
    if not files:
        raise StorageError(f"--study {name}: the study holds no study file; create it with `autotune run`")
    trust(study_digest(files["study"], files["objective"]))
    ref = files["objective_ref"]
    base = root.joinpath(*["study"] * ref.count("..")) if not Path(ref).is_absolute() else root
    objective = base / ref if not Path(ref).is_absolute() else Path(ref)
    objective.parent.mkdir(parents=True, exist_ok=True)
    if not Path(ref).is_absolute():
        objective.write_text(files["objective"])
    study_file = base / f"{name}.toml"
    study_file.write_text(files["study"])
    spec = load_study(study_file)
    if files.get("limits"):  # the limits the run judges by (`run --goodput` replaces the objective's)
        spec = dataclasses.replace(spec, objective=dataclasses.replace(spec.objective,
                                                                       limits=read_limits(json.loads(files["limits"]))))
    return spec


def resume(spec: StudySpec, study: optuna.Study, files: dict[str, str], say: Callable[[str], None]) -> None:
    """Refuse a study whose shared definition changed since it began (its files are stored with it); queue and say
    the baselines added since; keep the stored files current."""
    began = stored_files(study)
    if not began:  # made before studies kept their files: nothing to compare with
        store_files(study, files)
        return
    changes = _changes(_definition(began["study"], began["objective"], began.get("limits")),
                       _definition(files["study"], files["objective"], files.get("limits")))
    if changes:
        raise SpecError(str(spec.path), None, "; ".join(changes) + ": start a new study (another `name`; "
                        "`--from-study` begins it with this one's best) or restore the file")
    queued = tomllib.loads(began["study"]).get("baselines", [])
    # strict=False: files["study"] is the file read again after spec was loaded from it, not the same read
    new = [b for raw, b in zip(tomllib.loads(files["study"]).get("baselines", []), spec.baselines, strict=False)
           if raw not in queued]
    for baseline in new:
        enqueue_baseline(study, baseline, spec.space)
    if new:
        say(f"{len(new)} new baseline(s) queued: {', '.join(b.name for b in new)}")
    if files != began:
        store_files(study, files)


def _definition(study_text: str, objective_text: str, limits_json: str | None = None) -> dict[str, object]:
    """What every trial of a study shares, keyed as the files name it: the searched space, the fixed flags and
    environment, the hardware, and the objective's workload and limits. The budget, the sampler, the load search
    and the baselines may change between runs."""
    study, objective = tomllib.loads(study_text), tomllib.loads(objective_text)
    engine = dict(study.get("engine", {}))
    tables = {"space": study.get("space", {}), "model": study.get("model", {}), "engine.env": engine.pop("env", {}),
              "engine": engine}
    out: dict[str, object] = {f"[{table}.{k}]": v for table, items in tables.items() for k, v in items.items()}
    out |= {"hardware": study.get("hardware", "auto"), "memory_cap_gib": study.get("memory_cap_gib")}
    # The limits judged (the objective's, or `run --goodput`'s where stored); an old name for a limit is the same limit
    limits = current_names(objective.get("limits", {}))[0]
    if limits_json:  # as the file would write them: 500, not 500.0
        limits = {k: int(v) if float(v).is_integer() else v for k, v in json.loads(limits_json).items()}
    out |= {f"the objective's [workload.{k}]": v for k, v in objective.get("workload", {}).items()}
    out |= {f"the objective's [limits.{k}]": v for k, v in limits.items()}
    return out


def _changes(began: dict[str, object], now: dict[str, object]) -> list[str]:
    """One phrase per key that differs: "[space.max_num_seqs] changed since the study began (high 64 -> 128)"."""

    def show(v: object) -> str:
        return "(unset)" if v is None else json.dumps(v)

    out = []
    for key in [*began, *(k for k in now if k not in began)]:
        old, new = began.get(key), now.get(key)
        if key not in now:
            out.append(f"{key} removed since the study began")
        elif key not in began:
            out.append(f"{key} added since the study began")
        elif isinstance(old, dict) and isinstance(new, dict) and old != new:
            inner = [f"{k} {show(old.get(k))} -> {show(new.get(k))}" for k in [*old, *(k for k in new if k not in old)]
                     if old.get(k) != new.get(k)]
            out.append(f"{key} changed since the study began ({', '.join(inner)})")
        elif old != new:
            out.append(f"{key} changed since the study began ({show(old)} -> {show(new)})")
    return out


@contextlib.contextmanager
def heartbeat(study: optuna.Study, trial: optuna.Trial) -> Iterator[None]:
    """Beat while the trial runs, so other workers (and the next run) can tell a live trial from a dead one."""
    # the storage the study was opened with (RDBStorage, heartbeat-enabled); optuna types the attribute as the base
    storage = cast(BaseHeartbeat, study._storage)
    stop = threading.Event()

    def beat() -> None:
        while True:
            storage.record_heartbeat(trial._trial_id)
            if stop.wait(HEARTBEAT_S):
                return

    thread = threading.Thread(target=beat, name="trial-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
