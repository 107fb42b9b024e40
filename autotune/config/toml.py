"""A typed TOML reader: tables read into dataclasses, with errors that name the file and the key."""

from __future__ import annotations

import dataclasses
import difflib
import re
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal

from autotune.errors import SpecError

_MISSING: Any = object()


def _show(value: object) -> str:
    return repr(value) if not isinstance(value, dict) else "a table"


def _suggest(key: str, known: typing.Iterable[str]) -> str:
    near = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f"; did you mean '{near[0]}'?" if near else ""


class _Table:
    """One TOML table being read: typed accessors that remember which keys are known."""

    def __init__(self, data: dict[str, Any], source: str, prefix: str = ""):
        self.data, self.source, self.prefix = data, source, prefix
        self.known: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def error(self, name: str | None, message: str) -> SpecError:
        return SpecError(self.source, self.key(name) if name else (self.prefix or None), message)

    def get(self, name: str, default: Any = _MISSING) -> Any:
        self.known.add(name)
        if name in self.data:
            return self.data[name]
        if default is _MISSING:
            for k in self.data:  # a misspelling of this key is the likelier story
                if k not in self.known and difflib.get_close_matches(name, [k], cutoff=0.6):
                    raise self.error(k, f"unknown key; did you mean '{name}'?")
            raise self.error(name, "required key is missing")
        return default

    def expect(self, name: str, ok: bool, what: str, value: object) -> None:
        if not ok:
            raise self.error(name, f"must be {what}, got {_show(value)}")

    def text(self, name: str, default: Any = _MISSING) -> Any:
        v = self.get(name, default)
        self.expect(name, v is default or (isinstance(v, str) and v != ""), "a non-empty string", v)
        return v

    def integer(self, name: str, default: Any = _MISSING, minimum: int | None = None) -> Any:
        v = self.get(name, default)
        if v is default:
            return v
        self.expect(name, isinstance(v, int) and not isinstance(v, bool), "an integer", v)
        if minimum is not None and v < minimum:
            raise self.error(name, f"must be >= {minimum}, got {v}")
        return v

    def number(self, name: str, default: Any = _MISSING) -> Any:
        v = self.get(name, default)
        self.expect(name, v is default or (isinstance(v, int | float) and not isinstance(v, bool)), "a number", v)
        return v

    def boolean(self, name: str, default: Any = _MISSING) -> Any:
        v = self.get(name, default)
        self.expect(name, v is default or isinstance(v, bool), "true or false", v)
        return v

    def table(self, name: str, required: bool = False) -> _Table:
        v = self.get(name, _MISSING if required else {})
        self.expect(name, isinstance(v, dict), "a table", v)
        return _Table(v, self.source, self.key(name))

    def done(self) -> None:
        """Refuse keys nobody asked for."""
        for k in self.data:
            if k not in self.known:
                raise self.error(k, f"unknown key{_suggest(k, self.known)}")


def _read(path: Path, source: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise SpecError(source, None, "file not found") from None
    except OSError as e:
        raise SpecError(source, None, f"cannot read: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise SpecError(source, None, f"invalid TOML: {e}") from None
    except UnicodeDecodeError as e:  # TOML is UTF-8 by definition
        raise SpecError(source, None, f"not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 1]!r}); "
                                      "save it as UTF-8") from None


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
    if seconds <= 0:
        raise SpecError(source, key, f"must be a positive duration, got {text!r}")
    return seconds


def _hint_value(t: _Table, name: str, hint: Any) -> Any:
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
            raise t.error(name, f"must be one of {', '.join(map(repr, args))}, got {_show(v)}"
                          + (_suggest(v, map(str, args)) if isinstance(v, str) else ""))
        return v
    readers = {bool: t.boolean, int: t.integer, float: t.number, str: t.text}
    if hint in readers:
        v = readers[hint](name)
        return float(v) if hint is float else v
    raise t.error(name, f"cannot be set from a file (type {hint})")


def _build(cls: type, t: _Table, special: dict[str, Any] | None = None) -> Any:
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
