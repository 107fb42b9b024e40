"""Engine flags (vLLM dest names) -> command-line arguments, a shell command, a `--config` YAML, JSON.

`to_argv` is the one place a flag becomes arguments: the engine boots with it and the exports print
it, so what a user copies is what was measured. The server's environment ([engine.env]) is part of what was
measured too, so every format carries it: `VAR=value vllm serve ...`, a comment header in the YAML (vLLM's
`--config` loader turns every key into a flag and refuses an `env:` key), an `env` key in the JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import yaml

from autotune.engine.flags import (
    STORE_TRUE_ONLY,
    _rounded,
    env_words,
    option,
    serve_command,
    to_argv,
)


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
