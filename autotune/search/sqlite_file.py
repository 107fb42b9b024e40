"""A study's SQLite file: made whole or not at all, and never another program's database.

Optuna creates its schema one table at a time. Two runs of a new study started at once then race (one fails with
"table studies already exists"), and a run interrupted in its first second leaves a file with half the tables. So a
new file's schema is written to a private file beside it and moved into place in one step (a hard link, which
fails if the name is taken): the file either does not exist or holds the whole schema."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

from autotune.errors import StorageError

# The tables every Optuna schema has; a file holding other tables and none of these is not Optuna's.
OPTUNA_TABLES = frozenset({"studies", "version_info"})


def ensure_schema(path: Path, make_schema: Callable[[Path], None], shown: str) -> None:
    """Give the database at `path` Optuna's schema: a new file is made whole (by `make_schema`, which writes it at
    the path it is given) and moved into place; an existing one must be Optuna's."""
    if path.exists():
        check_optuna_file(path, shown)
        return
    private = path.with_name(f".{path.name}.{os.getpid()}.new")
    try:
        make_schema(private)
        move_into_place(private, path)
    finally:
        for leftover in (private, private.with_name(private.name + "-journal")):
            leftover.unlink(missing_ok=True)


def move_into_place(private: Path, path: Path) -> None:
    """`private` at `path`, unless a file is there already (another run made it first: the same schema)."""
    try:
        os.link(private, path)
    except FileExistsError:
        pass
    except OSError:  # a filesystem without hard links: a rename, which a file made in between would replace
        if not path.exists():
            os.replace(private, path)


@contextlib.contextmanager
def held(path: Path | None) -> Iterator[None]:
    """The study's database to this process alone while the block runs (a flock on the file itself, which SQLite's
    own byte-range locks do not see): runs started at once then set up a new study, and queue its baselines, one
    after another, not each once. None (not a SQLite file): no lock."""
    if path is None:
        yield
        return
    with open(path, "rb") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def check_optuna_file(path: Path, shown: str) -> None:
    """Refuse a SQLite file that holds another program's tables (Optuna would add its own beside them)."""
    tables = table_names(path, shown)
    if tables and not tables & OPTUNA_TABLES:
        raise StorageError(f"--storage {shown}: {path} is not an Optuna study database (it holds "
                           f"{', '.join(sorted(tables)[:5])}{', ...' if len(tables) > 5 else ''}): "
                           "give a new file or an autotune study's")


def table_names(path: Path, shown: str) -> set[str]:
    """The tables of a SQLite file, read without writing (mode=ro)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True)) as db:
            return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as e:
        raise StorageError(f"--storage {shown}: cannot open: {e}") from None
