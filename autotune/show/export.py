"""The winner of a study as a `vllm serve` command, a `--config` YAML, JSON, or a `docker run` of vLLM's image.

Each command is one that runs where autotune is installed (flags.serve_program: on the CPU build, whose `vllm`
command fails, the API server module autotune boots), and the docker line is vLLM's GPU image of that version.

Flags become arguments in one place (`engine/flags.to_argv`): the engine boots with it and the exports print
it, so what a user copies is what was measured. The server's environment ([engine.env]) is part of what was
measured too, so every format carries it: `VAR=value vllm serve ...`, a comment header in the YAML (vLLM's
`--config` loader turns every key into a flag and refuses an `env:` key), an `env` key in the JSON.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path

import optuna
import yaml

from autotune.engine.flags import (
    HOST,
    STORE_TRUE_ONLY,
    config_command,
    env_words,
    installed_vllm,
    option,
    rounded_value,
    serve_command,
    serve_program,
    served_argv,
    to_argv,
)
from autotune.errors import AutotuneError, SpecError
from autotune.search import paired, remeasure
from autotune.search.record import over_cap, over_cap_text, view
from autotune.search.remeasure import best_trial


def to_yaml(flags: Mapping[str, object], model: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """A file for `vllm serve --config FILE` (keys with dashes; false -> --no-KEY; tables -> JSON), on the host
    the server was measured on.
    Store-true-only flags set to false are left out, as vLLM's loader would skip them anyway. The environment
    goes in a comment header: vLLM's loader makes a flag of every key, and has none for the environment."""
    doc: dict[str, object] = {"model": model} if model is not None else {}
    doc["host"] = HOST  # as measured (engine/flags.HOST)
    for dest, value in flags.items():
        if value is None or (value is False and dest in STORE_TRUE_ONLY):
            continue
        doc[option(dest)[2:]] = rounded_value(value)
    serve = f"# serve it: {config_command()}\n"  # the command that runs where autotune is installed
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    if not env:
        return serve + body
    header = ["The server was measured with this environment; vLLM's --config file has no place for it, so set it",
              "in the shell that runs the server (e.g. `export NAME=value`):", *env_words(env)]
    return serve + "".join(f"# {text}\n" for line in header for text in line.split("\n")) + body


DOCKER_IMAGE = "vllm/vllm-openai"


def docker_command(model: str, flags: Mapping[str, object], env: Mapping[str, str] | None = None) -> str:
    """`docker run` of vLLM's OpenAI server image at the installed vLLM's version, on every GPU, with the hub cache
    (or a local model's folder) mounted, the server's environment as -e, then the flags as `vllm serve` takes them.
    Inside the container the server listens on every interface (else the published port reaches nothing); the port
    is published on this host's loopback only, as autotune measured it."""
    mounts = ["-v", f"{Path.home() / '.cache' / 'huggingface'}:/root/.cache/huggingface"]
    if Path(model).is_absolute():
        mounts = ["-v", f"{model}:{model}:ro"]
    env_args = [word for pair in (env or {}).items() for word in ("-e", f"{pair[0]}={pair[1]}")]
    image = f"{DOCKER_IMAGE}:v{installed_vllm()[1]}"
    return shlex.join(["docker", "run", "--gpus", "all", "--ipc=host", "-p", f"{HOST}:8000:8000", *mounts, *env_args,
                       image, "--model", model, *to_argv(flags)])


def to_json(model: str, flags: Mapping[str, object], metrics: Mapping[str, object],
            env: Mapping[str, str] | None = None) -> str:
    """Everything about one configuration, for scripts: flags, environment, argv (with the measured host), the
    command where autotune runs, the docker line and its measurements."""
    doc = {"model": model, "flags": rounded_value(dict(flags)), "env": dict(env or {}), "argv": served_argv(flags),
           "command": serve_command(model, flags, env, serve_program()), "docker": docker_command(model, flags, env),
           "metrics": dict(metrics)}
    return json.dumps(doc, indent=2, sort_keys=False)


def export_winner(study: optuna.Study, fmt: str, max_vram: float | None = None,
                  max_p95_ttft_ms: float | None = None, unproven: bool = False) -> tuple[str, list[str]]:
    """(what `autotune export` prints, its comment lines: the `best:` line, the `answer:` line (paired.answer),
    why a baseline is exported instead of the winner when it is, then a caution when a capped study's winner
    served above the capped card's CUDA memory). The winner and its figure are remeasure.best's, as in every other
    output; the filters keep trials whose GPU peak (NVML) and p95 TTFT are within them. Only a winner shown better
    than the best baseline (paired.Comparison.proven) is exported; otherwise that baseline, unless `unproven`."""
    if max_vram is not None and not any(v.memory_source == "nvml" for v in map(view, study.trials)):
        raise SpecError("--max-vram", None, "this study's peaks are host memory (RSS of the server's processes, the "
                        "CPU build), not GPU memory: nothing to filter on")

    def keep(t: optuna.trial.FrozenTrial) -> bool:
        v = view(t)
        vram = v.peak_memory_gib if v.memory_source == "nvml" and v.peak_memory_gib is not None else float("inf")
        ttft = v.p95_ttft_ms if v.figures_recorded and v.p95_ttft_ms is not None else float("inf")
        return (max_vram is None or vram <= max_vram) and (max_p95_ttft_ms is None or ttft <= max_p95_ttft_ms)

    winner = best_trial(study, keep)
    if winner is None:
        raise AutotuneError(f"study {study.study_name}: no feasible trial" + (" within the filters" if
                            max_vram is not None or max_p95_ttft_ms is not None else ""))
    answer = paired.answer(study)
    chosen, why = exported(study, winner, answer, keep, unproven)
    shown = view(chosen.trial)
    model, flags, env = shown.model, shown.flags, shown.env
    assert model is not None and flags is not None, "a measured trial records its model and flags (config_attrs)"
    line = f"best: {winner.text}"
    notes = [line] + ([f"answer: {answer.sentence}"] if answer is not None else []) + ([why] if why else [])
    cap = shown.cap_gib
    if cap is not None and over_cap(shown.peak_memory_gib, cap):  # the card the flags are for may not hold them
        notes.append(f"caution: it served at {shown.peak_memory_gib:.2f} GiB, {over_cap_text(cap)}; "
                     f"`--max-vram {cap:.2f}` exports the best that stayed under it")
    if fmt == "flags":
        return serve_command(model, flags, env, serve_program()) + "\n", notes
    if fmt == "docker":
        return docker_command(model, flags, env) + "\n", notes
    if fmt == "yaml":
        return "".join(f"# {n}\n" for n in notes) + to_yaml(flags, model=model, env=env), notes
    metrics = figure_metrics(study, chosen)
    metrics["best"] = line
    if answer is not None:
        metrics["answer"] = answer.sentence
        metrics["proven"] = answer.proven
        if answer.soak is not None:
            metrics["soak"] = answer.soak.as_attr()
    if why:
        metrics["exported_instead"] = why
    if cap is not None and over_cap(shown.peak_memory_gib, cap):
        metrics["caution"] = notes[-1]
    return to_json(model, flags, {"trial": shown.number, **metrics}, env) + "\n", notes


def exported(study: optuna.Study, winner: remeasure.Best, answer: paired.Comparison | None,
             keep: Callable[[optuna.trial.FrozenTrial], bool], unproven: bool) -> tuple[remeasure.Best, str]:
    """What to export and, when it is not the winner, why: the winner when the paired comparison showed it
    better than the best baseline (or there was no baseline to beat), else that baseline. `unproven`: the winner."""
    proven = answer is not None and answer.proven and answer.winner == winner.trial.number
    if proven or unproven or answer is None or answer.baseline_trial is None:
        return winner, ""
    base = remeasure.best(study.get_trials(deepcopy=False), lambda t: t.number == answer.baseline_trial and keep(t))
    if base is None or base.trial.number == winner.trial.number:
        return winner, ""
    because = (f"it {answer.soak.text}" if answer.soak is not None and answer.soak.verdict
               else f"it was not shown better than the {answer.baseline}")
    return base, (f"exported the {answer.baseline} (trial {base.trial.number}), not trial {winner.trial.number}: "
                  f"{because}; `--unproven` exports trial {winner.trial.number}")


def figure_metrics(study: optuna.Study, b: remeasure.Best) -> dict[str, object]:
    """The configuration's figures as every output gives them: the throughput is its figure (remeasure.Best),
    and every other figure (latencies, memory, ...) is that one measurement's (Best.figure_trial)."""
    at = view(study.trials[b.figure_trial])
    metrics: dict[str, object] = dict(at.figures)
    metrics["output_throughput"] = round(b.figure, 1)
    metrics["figure_trial"] = b.figure_trial
    metrics["measurements"] = [{"trial": m.trial, "output_throughput": m.output_tok_s,
                                "met_limits": m.output_tok_s is not None} for m in b.measurements]
    return metrics
