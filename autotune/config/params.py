"""The searched parameters of a study file: what one is, the one rule for which values it can take, and how a
[space.NAME] table is read into one. The search side (space, samplers) imports these without the file reader."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from autotune.config.toml import TomlTable, did_you_mean, shown_value

ParamType = Literal["int", "float", "categorical", "bool"]


@dataclass(frozen=True)
class Param:
    """One searched flag (a vLLM dest name or a pseudo-parameter). `when` gates it on other params."""

    name: str
    type: ParamType
    low: int | float | None = None
    high: int | float | None = None
    log: bool = False
    step: int | float | None = None
    choices: tuple[object, ...] = ()
    when: dict[str, object] = field(default_factory=dict)  # {param: value or [values]}
    default: object = None  # the value vLLM uses when the flag is absent; fills baselines' params

    def holds(self, v: object, *, in_range: bool = True) -> bool:
        """Can this parameter take value v? The one rule for a file's `when`/`default`, a baseline's
        values and a warm start's: a bool by type, a categorical by membership (True apart from 1), a
        number when it is one (an int parameter's must be integral) and, with in_range, in [low, high].
        in_range=False is for values Optuna records out of range with a warning (vLLM's own defaults); a log-scale
        parameter's must be > 0 even then."""
        if self.type == "bool":
            return isinstance(v, bool)
        if self.type == "categorical":
            return any(same_value(v, c) for c in self.choices)
        if not isinstance(v, int | float) or isinstance(v, bool):
            return False
        if self.type == "int" and not float(v).is_integer():
            return False
        if self.log and v <= 0:  # not even out of range: a log scale has no place for it (Optuna raises)
            return False
        return not in_range or self.low <= v <= self.high  # type: ignore[operator]


@dataclass(frozen=True)
class Baseline:
    """A configuration booted exactly as written (on top of the study's fixed flags)."""

    name: str
    flags: dict[str, object] = field(default_factory=dict)


def same_value(a: object, b: object) -> bool:
    """Equality that keeps True apart from 1 (TOML and Optuna both distinguish them)."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b


PARAM_TYPES = ("int", "float", "categorical", "bool")


def is_scalar(v: object) -> bool:
    """What a TOML value for one vLLM flag can be: a string, a number or a boolean."""
    return isinstance(v, str | int | float | bool)


def read_param(t: TomlTable, name: str) -> Param:
    """One [space.NAME] table: its type, range or choices, `when` and `default`, each checked."""
    kind = t.get("type")
    if kind not in PARAM_TYPES:
        raise t.error("type", f"unknown type {shown_value(kind)}{did_you_mean(str(kind), PARAM_TYPES)} "
                              f"(one of {', '.join(PARAM_TYPES)})")
    fields: dict[str, Any] = {"name": name, "type": kind}
    if kind in ("int", "float"):
        read = t.integer if kind == "int" else t.number
        low, high = read("low"), read("high")
        log, step = t.boolean("log", False), read("step", None)
        if low > high:
            raise t.error("low", f"low ({low}) must be <= high ({high})")
        if log and low <= 0:
            raise t.error("log", f"log = true needs low > 0, got low = {low}")
        if step is not None and step <= 0:
            raise t.error("step", f"must be > 0, got {step}")
        if log and step not in (None, 1):
            raise t.error("step", "step cannot be combined with log = true")
        if step is not None and step > high - low and low != high:
            raise t.error("step", f"{step} is wider than the range [{low}, {high}]: {name} could only be {low}")
        fields |= {"low": low, "high": high, "log": log, "step": step}
    elif kind == "categorical":
        choices = t.get("choices")
        t.expect("choices", isinstance(choices, list) and len(choices) > 0, "a non-empty list", choices)
        for c in choices:
            t.expect("choices", is_scalar(c), "a list of strings, numbers or booleans", choices)
        for i, c in enumerate(choices):
            if any(same_value(c, d) for d in choices[:i]):
                raise t.error("choices", f"{c!r} appears twice")
        fields["choices"] = tuple(choices)
    when = t.table("when")
    fields["when"] = {k: (list(v) if isinstance(v, list) else v) for k, v in when.data.items()}
    when.known.update(when.data)
    fields["default"] = t.get("default", None)
    t.done()
    return Param(**fields)


def in_dependency_order(params: dict[str, Param], st: TomlTable) -> tuple[Param, ...]:
    """Declaration order, except that a param comes after the params its `when` reads."""
    done: dict[str, Param] = {}
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in done:
            return
        if name in visiting:
            raise st.error(f"{name}.when", "conditions form a cycle")
        visiting.add(name)
        for other in params[name].when:
            visit(other)
        done[name] = params[name]

    for name in params:
        visit(name)
    return tuple(done.values())
