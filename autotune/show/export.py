"""The winner of a study as a `vllm serve` command, a `--config` YAML or JSON.

Flags become arguments in one place (`engine/flags.to_argv`): the engine boots with it and the exports print
it, so what a user copies is what was measured. The server's environment ([engine.env]) is part of what was
measured too, so every format carries it: `VAR=value vllm serve ...`, a comment header in the YAML (vLLM's
`--config` loader turns every key into a flag and refuses an `env:` key), an `env` key in the JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import optuna
import yaml

from autotune.engine.flags import (
    STORE_TRUE_ONLY,
    _rounded,
    env_words,
    option,
    serve_command,
    to_argv,
)
from autotune.errors import AutotuneError, SpecError
from autotune.measure.memory import over_cap, over_cap_text
from autotune.search.record import view
from autotune.search.remeasure import best_trial


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


def export_winner(study: optuna.Study, fmt: str, max_vram: float | None = None,
                  max_p95_ttft_ms: float | None = None) -> tuple[str, list[str]]:
    """(what `autotune export` prints, its comment lines: the `best:` line, then a caution when a capped study's
    winner served above the capped card's CUDA memory). The winner and its figure are remeasure.best's, as in
    every other output; the filters keep trials whose GPU peak (NVML) and p95 TTFT are within them."""
    if max_vram is not None and not any(v.memory_source == "nvml" for v in map(view, study.trials)):
        raise SpecError("--max-vram", None, "this study's peaks are host memory (RSS of the server's processes, the "
                        "CPU build), not GPU memory: nothing to filter on")

    def keep(t: optuna.trial.FrozenTrial) -> bool:
        v = view(t)
        vram = v.peak_memory_gib if v.memory_source == "nvml" and v.peak_memory_gib is not None else float("inf")
        ttft = v.ttft_p95_ms if v.figures_recorded and v.ttft_p95_ms is not None else float("inf")
        return (max_vram is None or vram <= max_vram) and (max_p95_ttft_ms is None or ttft <= max_p95_ttft_ms)

    best = best_trial(study, keep)
    if best is None:
        raise AutotuneError(f"study {study.study_name}: no feasible trial" + (" within the filters" if
                            max_vram is not None or max_p95_ttft_ms is not None else ""))
    winner = view(best.trial)
    model, flags, env = winner.model, winner.flags, winner.env
    assert model is not None and flags is not None, "a measured trial records its model and flags (config_attrs)"
    line = f"best: {best.text}"
    notes = [line]
    cap = winner.cap_gib
    if cap is not None and over_cap(winner.peak_memory_gib, cap):  # the card the flags are for may not hold them
        notes.append(f"caution: it served at {winner.peak_memory_gib:.2f} GiB, {over_cap_text(cap)}; "
                     f"`--max-vram {cap:.2f}` exports the best that stayed under it")
    if fmt == "flags":
        return serve_command(model, flags, env) + "\n", notes
    if fmt == "yaml":
        return "".join(f"# {n}\n" for n in notes) + to_yaml(flags, model=model, env=env), notes
    # The first measurement's figures (latencies, memory, ...), with the throughput every reader gives.
    metrics: dict[str, object] = dict(winner.figures)
    metrics["output_tok_s"] = round(best.figure, 1)
    metrics["best"] = line
    if len(notes) > 1:
        metrics["caution"] = notes[1]
    metrics["measurements"] = [{"trial": m.trial, "output_tok_s": m.output_tok_s,
                                "met_limits": m.output_tok_s is not None} for m in best.measurements]
    return to_json(model, flags, {"trial": winner.number, **metrics}, env) + "\n", notes
