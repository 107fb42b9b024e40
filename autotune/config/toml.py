"""A typed TOML reader: tables read into dataclasses, with errors that name the file and the key."""

from __future__ import annotations

import codecs
import dataclasses
import difflib
import math
import os
import re
import stat
import tomllib
import types
import typing
import unicodedata
from pathlib import Path
from typing import Any, Literal

from autotune.errors import SpecError

UNSET: Any = object()

MAX_FILE_BYTES = 1 << 20  # a study or objective file is a few KiB: more is not one (or is /dev/zero)

LONGEST_S = 366 * 86400.0  # a duration beyond a year is a slip (and overflows the clocks that wait on it)


def shown_value(value: object) -> str:
    return repr(value) if not isinstance(value, dict) else "a table"


def did_you_mean(key: str, known: typing.Iterable[str]) -> str:
    near = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f"; did you mean '{near[0]}'?" if near else ""


class TomlTable:
    """One TOML table being read: typed accessors that remember which keys are known."""

    def __init__(self, data: dict[str, Any], source: str, prefix: str = ""):
        self.data, self.source, self.prefix = data, source, prefix
        self.known: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def error(self, name: str | None, message: str) -> SpecError:
        return SpecError(self.source, self.key(name) if name else (self.prefix or None), message)

    def get(self, name: str, default: Any = UNSET) -> Any:
        self.known.add(name)
        if name in self.data:
            return self.data[name]
        if default is UNSET:
            for k in self.data:  # a misspelling of this key is the likelier story
                if k not in self.known and difflib.get_close_matches(name, [k], cutoff=0.6):
                    raise self.error(k, f"unknown key; did you mean '{name}'?")
            raise self.error(name, "required key is missing")
        return default

    def expect(self, name: str, ok: bool, what: str, value: object) -> None:
        if not ok:
            raise self.error(name, f"must be {what}, got {shown_value(value)}")

    def text(self, name: str, default: Any = UNSET) -> Any:
        v = self.get(name, default)
        self.expect(name, v is default or (isinstance(v, str) and v != ""), "a non-empty string", v)
        return v

    def label(self, name: str, default: Any = UNSET, lines: bool = False) -> Any:
        """A name or description people read on a terminal: no control characters (an escape sequence would
        retitle or redraw their terminal); a description (`lines`) may hold line breaks and tabs."""
        v = self.get(name, default)
        self.expect(name, v is default or isinstance(v, str) and (v != "" or lines), "a string" if lines
                    else "a non-empty string", v)
        if v is not default and (bad := next((c for c in v if is_control(c) and not (lines and c in "\n\t")), None)):
            raise self.error(name, f"contains the control character {bad!r}; names are printed on terminals")
        return v

    def integer(self, name: str, default: Any = UNSET, minimum: int | None = None,
                maximum: int | None = None) -> Any:
        v = self.get(name, default)
        if v is default:
            return v
        self.expect(name, isinstance(v, int) and not isinstance(v, bool), "an integer", v)
        if minimum is not None and v < minimum:
            raise self.error(name, f"must be >= {minimum}, got {v}")
        if maximum is not None and v > maximum:
            raise self.error(name, f"must be <= {maximum}, got {v}")
        return v

    def number(self, name: str, default: Any = UNSET) -> Any:
        """A finite number: TOML's nan and inf are numbers no limit, range or length can mean."""
        v = self.get(name, default)
        self.expect(name, v is default or (isinstance(v, int | float) and not isinstance(v, bool)), "a number", v)
        self.expect(name, v is default or math.isfinite(v), "a finite number", v)
        return v

    def boolean(self, name: str, default: Any = UNSET) -> Any:
        v = self.get(name, default)
        self.expect(name, v is default or isinstance(v, bool), "true or false", v)
        return v

    def table(self, name: str, required: bool = False) -> TomlTable:
        v = self.get(name, UNSET if required else {})
        self.expect(name, isinstance(v, dict), "a table", v)
        return TomlTable(v, self.source, self.key(name))

    def done(self) -> None:
        """Refuse keys nobody asked for."""
        for k in self.data:
            if k not in self.known:
                raise self.error(k, f"unknown key{did_you_mean(k, self.known)}")


def is_control(c: str) -> bool:
    """A character a terminal acts on instead of showing (C0, DEL, C1: ESC begins every escape sequence)."""
    return unicodedata.category(c) == "Cc"


def read_toml(path: Path, source: str) -> dict[str, Any]:
    data = _read_bytes(path, source)
    if data.startswith(codecs.BOM_UTF8):  # TOML has no place for one: tomllib says only "Invalid statement"
        raise SpecError(source, None, "begins with a byte-order mark (BOM); save it as UTF-8 without BOM")
    try:
        return tomllib.loads(data.decode())
    except tomllib.TOMLDecodeError as e:
        raise SpecError(source, None, f"invalid TOML: {e}") from None
    except UnicodeDecodeError as e:  # TOML is UTF-8 by definition
        raise SpecError(source, None, f"not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 1]!r}); "
                                      "save it as UTF-8") from None


def _read_bytes(path: Path, source: str) -> bytes:
    """A regular file's bytes, at most MAX_FILE_BYTES: a FIFO would block, /dev/zero never end."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise SpecError(source, None, "not a regular file")
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise SpecError(source, None, "file not found") from None
    except OSError as e:
        raise SpecError(source, None, f"cannot read: {e.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise SpecError(source, None, f"larger than {MAX_FILE_BYTES >> 20} MiB: not a study or objective file")
    return data


def parse_duration(text: object, key: str = "duration", source: str = "command line") -> float:
    """Seconds from "4h", "90m", "1h30m", "45s", "2d" or a plain number of seconds; must be > 0."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        seconds = float(text)
    else:
        m = re.fullmatch(r"(?:(\d+(?:\.\d+)?)d)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?",
                         text.strip().lower()) if isinstance(text, str) else None
        if not m or not any(m.groups()):
            raise SpecError(source, key, f"must be a duration like '4h', '90m', '1h30m' or '45s', got {text!r}")
        seconds = sum(float(g) * u for g, u in zip(m.groups(), (86400, 3600, 60, 1), strict=True) if g)
    if not seconds > 0:  # also nan
        raise SpecError(source, key, f"must be a positive duration, got {text!r}")
    if seconds > LONGEST_S:  # also inf
        raise SpecError(source, key, f"must be at most a year, got {text!r}")
    return seconds


def _hint_value(t: TomlTable, name: str, hint: Any) -> Any:
    """Read a field by its type hint (for fields the owning module may add later)."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if t.data.get(name) is None:
            t.get(name, None)
            return None
        return _hint_value(t, name, next(a for a in args if a is not type(None)))
    if typing.get_origin(hint) is Literal:
        v = t.get(name)
        if v not in args:
            raise t.error(name, f"must be one of {', '.join(map(repr, args))}, got {shown_value(v)}"
                          + (did_you_mean(v, map(str, args)) if isinstance(v, str) else ""))
        return v
    readers = {bool: t.boolean, int: t.integer, float: t.number, str: t.text}
    if hint in readers:
        v = readers[hint](name)
        return float(v) if hint is float else v
    raise t.error(name, f"cannot be set from a file (type {hint})")


def build_dataclass(cls: type, t: TomlTable, special: dict[str, Any] | None = None) -> Any:
    """A dataclass from a table: `special` readers for some fields, type hints for the rest."""
    special = special or {}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        t.known.add(f.name)
        if f.name in t.data:
            kwargs[f.name] = special[f.name](f.name) if f.name in special else _hint_value(t, f.name, hints[f.name])
    t.done()
    return cls(**kwargs)
