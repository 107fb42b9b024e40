"""The server's environment as a study file or `--env` gives it: which variables may be set, and each value checked
the way its reader will read it, so that a bad one fails in a second, before anything is written.

The trust model: a study file describes a configuration, not a program. It may set the variables vLLM reads to tune
itself (VLLM_*, CUDA_*, a few others), never one that makes the server load code from somewhere (PYTHONPATH,
LD_PRELOAD, a cache or plugin folder, ...): a study stored in a shared database would otherwise run code on every
host that joins it. The local user may let a named variable through (`--allow-env NAME`)."""

from __future__ import annotations

import ast
import functools
import importlib.util
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from autotune.errors import SpecError

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # what a shell accepts before a command as NAME=value

# Families of variables vLLM and its libraries read to tune themselves, and a few single names.
ALLOWED_PREFIXES = ("VLLM_", "CUDA_", "NCCL_", "OMP_", "MKL_", "KMP_")
ALLOWED_NAMES = frozenset({"TOKENIZERS_PARALLELISM", "PYTORCH_CUDA_ALLOC_CONF", "HF_HUB_OFFLINE",
                           "TRANSFORMERS_OFFLINE", "MAX_JOBS", "NVCC_THREADS"})

# Names that say a path (read as text): a folder or file the server may load code or compiled kernels from.
PATH_SUFFIXES = ("PATH", "PATHS", "_HOME", "_DIR", "_ROOT", "_FILE", "_CACHE", "_LIB", "_PLUGINS", "PRELOAD")

# Allowed by family, refused for what they do to the tuner's own client or the host.
REFUSED = {"VLLM_API_KEY": "the server would refuse the tuner's own requests (and a secret is never stored)",
           "VLLM_HOST_IP": "the engine picks the address", "VLLM_PORT": "the engine picks the port",
           "VLLM_ALLOW_INSECURE_SERIALIZATION": "it lets the server unpickle what it is sent"}

# Values autotune reads itself, on top of vLLM's reading: (check, what it must be).
OWN_READERS = {"VLLM_CPU_KVCACHE_SPACE": (lambda v: int(v) >= 1, "a whole number of GiB, at least 1")}


@dataclass(frozen=True)
class EnvKind:
    """How vLLM's envs.py reads one variable: through int(), float(), against a list of choices, or as text."""

    kind: str  # "int", "float", "choices", "text"
    choices: tuple[str, ...] = ()
    case_sensitive: bool = True


def trust_problem(name: str, allowed: Iterable[str] = ()) -> str | None:
    """Why a study may not set this variable on this host (None: it may). `allowed`: names the local user let
    through with --allow-env."""
    if name in REFUSED:
        return f"cannot be set: {REFUSED[name]}"
    if name in set(allowed):
        return None
    if name.endswith(PATH_SUFFIXES) and vllm_env_kinds().get(name, EnvKind("text")).kind == "text":
        return ("names a path the server may load code from; a study file cannot set it "
                f"(pass --allow-env {name} to let it through on this host)")
    if not (name.startswith(ALLOWED_PREFIXES) or name in ALLOWED_NAMES):
        return ("is not a variable vLLM reads to tune itself (VLLM_*, CUDA_*, NCCL_*, OMP_*, ...); a study file "
                f"cannot set it (pass --allow-env {name} to let it through on this host)")
    return None


def value_problem(name: str, value: str) -> str | None:
    """Why the server (or autotune's own estimate) could not read this variable (None: it can)."""
    if not NAME.fullmatch(name):
        return "is not an environment variable name (letters, digits and '_', not beginning with a digit)"
    if "\0" in value:
        return "contains a NUL byte, which no environment can hold"
    kind = vllm_env_kinds().get(name, EnvKind("text"))
    try:
        if kind.kind == "int":
            int(value)
        elif kind.kind == "float" and not math.isfinite(float(value)):
            return f"must be a finite number, got {value!r}"
    except ValueError:
        return f"vLLM reads it as {'an integer' if kind.kind == 'int' else 'a number'}, got {value!r}"
    if kind.kind == "choices":
        seen, options = (value, kind.choices) if kind.case_sensitive else (value.lower(), [c.lower() for c in
                                                                                           kind.choices])
        if seen not in options:
            return f"must be one of {', '.join(kind.choices)}, got {value!r}"
    if name in OWN_READERS:
        check, what = OWN_READERS[name]
        try:
            ok = check(value)
        except ValueError:
            ok = False
        if not ok:
            return f"must be {what}, got {value!r}"
    return None


def check_env(env: Mapping[str, str], source: str, prefix: str | None, allowed: Iterable[str] | None) -> None:
    """Raise a SpecError naming the first variable whose value cannot be read and, unless `allowed` is None (a
    study only read, not run), the first one a study may not set on this host."""
    for name, value in env.items():
        problem = value_problem(name, value) or (trust_problem(name, allowed) if allowed is not None else None)
        if problem:
            raise SpecError(source, f"{prefix}.{name}" if prefix else name or "''", problem)


@functools.cache
def vllm_env_kinds() -> dict[str, EnvKind]:
    """Each variable of vLLM's envs.py with how it is read, found in its source (importing vllm takes seconds)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return {}
    source = Path(next(iter(spec.submodule_search_locations))) / "envs.py"
    if not source.is_file():
        return {}
    tree = ast.parse(source.read_text())
    table = next((node.value for node in ast.walk(tree)
                  if isinstance(node, ast.AnnAssign | ast.Assign) and isinstance(node.value, ast.Dict)
                  and _target_name(node) == "environment_variables"), None)
    if not isinstance(table, ast.Dict):
        return {}
    # A reader is a lambda, or the name of a function of the module (def disable_compile_cache(): ...)
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    return {key.value: _kind(functions.get(value.id, value) if isinstance(value, ast.Name) else value)
            for key, value in zip(table.keys, table.values, strict=True)
            if isinstance(key, ast.Constant) and isinstance(key.value, str)}


def _target_name(node: ast.AnnAssign | ast.Assign) -> str | None:
    target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
    return target.id if isinstance(target, ast.Name) else None


def _kind(reader: ast.AST) -> EnvKind:
    """int(os.getenv(...)) is an int, float(...) a float, env_with_choices(NAME, default, [...]) a choice."""
    for node in ast.walk(reader):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        if node.func.id == "env_with_choices" and len(node.args) >= 3 and isinstance(node.args[2], ast.List):
            choices = tuple(c.value for c in node.args[2].elts if isinstance(c, ast.Constant))
            sensitive = next((k.value.value for k in node.keywords if k.arg == "case_sensitive"
                              and isinstance(k.value, ast.Constant)), True)
            return EnvKind("choices", tuple(map(str, choices)), bool(sensitive))
        if node.func.id in ("int", "float"):
            return EnvKind(node.func.id)
    return EnvKind("text")
