"""Engine flags (vLLM dest names) -> command-line arguments, a shell command, a `--config` YAML, JSON.

`to_argv` is the one place a flag becomes arguments: the engine boots with it and the exports print
it, so what a user copies is what was measured. The server's environment ([engine.env]) is part of what was
measured too, so every format carries it: `VAR=value vllm serve ...`, a comment header in the YAML (vLLM's
`--config` loader turns every key into a flag and refuses an `env:` key), an `env` key in the JSON.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence

import yaml

# Flags vLLM declares with action="store_true" (no --no-X form): False means "leave the flag out".
# Every other boolean is an argparse BooleanOptionalAction, so False is written as --no-X (explicit,
# because several defaults, e.g. enable_chunked_prefill, depend on the model). Checked against the
# installed parser by tests/test_export.py.
STORE_TRUE_ONLY = frozenset(
    {"headless", "grpc", "data_parallel_multi_port_external_lb", "disable_log_stats", "aggregate_engine_logging"}
)

_DEST = re.compile(r"^[a-z][a-z0-9_]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # what a shell accepts before a command as NAME=value


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
        return json.dumps(_rounded(value), separators=(",", ":"))
    if isinstance(value, float):
        return float_text(value)
    return str(value)


def _rounded(value: object) -> object:
    """The same value with its floats as value_text prints them (for YAML and JSON)."""
    if isinstance(value, float):
        return float(float_text(value))
    if isinstance(value, Mapping):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [_rounded(v) for v in value]
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
        if not _ENV_NAME.match(name):
            raise ValueError(f"not an environment variable name a shell accepts: {name!r}")
    return [f"{name}={shlex.quote(str(value))}" for name, value in env.items()]


def serve_command(model: str, flags: Mapping[str, object], env: Mapping[str, str] | None = None,
                  program: Sequence[str] = ("vllm", "serve")) -> str:
    """A shell-quoted command line a user can paste, prefixed with the server's environment."""
    return " ".join([*env_words(env or {}), shlex.join([*program, model, *to_argv(flags)])])


def to_yaml(flags: Mapping[str, object], model: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """A file for `vllm serve --config FILE` (keys with dashes; false -> --no-KEY; tables -> JSON).
    Store-true-only flags set to false are left out, as vLLM's loader would skip them anyway. The environment
    goes in a comment header: vLLM's loader makes a flag of every key, and has none for the environment."""
    doc: dict[str, object] = {"model": model} if model is not None else {}
    for dest, value in flags.items():
        if value is None or (value is False and dest in STORE_TRUE_ONLY):
            continue
        doc[option(dest)[2:]] = _rounded(value)
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    if not env:
        return body
    header = ["The server was measured with this environment; vLLM's --config file has no place for it, so set it",
              "in the shell that runs `vllm serve --config` (e.g. `export NAME=value`):", *env_words(env)]
    return "".join(f"# {text}\n" for line in header for text in line.split("\n")) + body


def to_json(model: str, flags: Mapping[str, object], metrics: Mapping[str, object],
            env: Mapping[str, str] | None = None) -> str:
    """Everything about one configuration, for scripts: flags, environment, argv, the command and its measurements."""
    doc = {"model": model, "flags": _rounded(dict(flags)), "env": dict(env or {}), "argv": to_argv(flags),
           "command": serve_command(model, flags, env), "metrics": dict(metrics)}
    return json.dumps(doc, indent=2, sort_keys=False)
