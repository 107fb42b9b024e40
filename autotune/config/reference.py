"""The study and objective file reference (docs/study-file.md, docs/objective-file.md), written from the parsers.

Which keys a file takes is read from the parsers themselves: while probe files (and the shipped ones) are loaded, every
key a table asks for is recorded, with the default the parser gives it. A key a parser starts to read shows up here; it
needs a line in STUDY_KEYS or OBJECTIVE_KEYS before the reference can be written, and
tests/unit/config/test_reference.py fails until it has one, so the reference cannot fall behind the code. Regenerate
with

    python -m autotune.config.reference docs
"""

from __future__ import annotations

import dataclasses
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, get_args, get_type_hints

from autotune.config import toml
from autotune.config.objective import load_objective
from autotune.config.params import PARAM_TYPES
from autotune.config.study_file import SAMPLERS, load_study
from autotune.engine.env import ALLOWED_PREFIXES, REFUSED
from autotune.engine.flag_checks import HOST_EXPOSING, UNMEASURABLE
from autotune.fit.hardware import PROFILES
from autotune.measure.ladder import LoadSearch
from autotune.measure.stats import MAXIMIZE, PERCENTILES, Limits, limit_key
from autotune.measure.workload import LengthDist, Workload

REPO = Path(__file__).resolve().parents[2]
REQUIRED = "required"

# Tables filled from a dataclass: their defaults are the dataclass's.
DATACLASS_TABLES: dict[str, type] = {"workload": Workload, "workload.input_len": LengthDist,
                                     "workload.output_len": LengthDist, "limits": Limits, "load": LoadSearch}

PROBE_OBJECTIVE = """
name = "probe"
[workload]
input_len = { kind = "normal", mean = 64, std = 8, min = 8, max = 128 }
output_len = { kind = "uniform", mean = 32, std = 4, min = 8, max = 64 }
[limits]
p95_ttft_ms = 500
[load]
mode = "concurrency"
"""

PROBE_STUDY = """
objective = "probe-objective.toml"
memory_cap_gib = 24
[model]
path = "tiny:dense"
[engine]
enforce_eager = true
[engine.env]
VLLM_CPU_KVCACHE_SPACE = "1"
[space.max_num_seqs]
type = "int"
low = 1
high = 64
[space.gpu_memory_utilization]
type = "float"
low = 0.8
high = 0.95
[space.kv_cache_dtype]
type = "categorical"
choices = ["auto", "fp8"]
[space.enable_prefix_caching]
type = "bool"
when = { kv_cache_dtype = "auto" }
[[baselines]]
name = "defaults"
flags = {}
"""


@dataclasses.dataclass(frozen=True)
class Key:
    """One key a file takes: the table it sits in ("" for the top level), its name, and its default."""

    table: str
    name: str
    default: object

    @property
    def dotted(self) -> str:
        return f"{self.table}.{self.name}" if self.table else self.name


def _table_name(prefix: str) -> str:
    """A table's name in the reference: every searched parameter is space.NAME, every baseline baselines[]."""
    prefix = re.sub(r"^space\.[^.]+", "space.NAME", prefix)
    return re.sub(r"\[\d+\]", "[]", prefix)


def _default(table: str, name: str, asked: object) -> object:
    """A key's default: its dataclass field's where a dataclass fills the table, else what the parser asked with."""
    cls = DATACLASS_TABLES.get(table)
    field = {f.name: f for f in dataclasses.fields(cls)}.get(name) if cls else None
    if field is None:
        return asked
    if field.default is not dataclasses.MISSING:
        return field.default
    return field.default_factory() if field.default_factory is not dataclasses.MISSING else REQUIRED


@contextmanager
def _recording() -> Iterator[dict[str, Key]]:
    """Every key a TomlTable is asked for (get) or knows when it is done, while the block runs, in the order asked."""
    keys: dict[str, Key] = {}
    get, done = toml.TomlTable.get, toml.TomlTable.done

    def note(table: toml.TomlTable, name: str, default: object) -> None:
        prefix = _table_name(table.prefix)
        key = Key(prefix, name, _default(prefix, name, default))
        keys.setdefault(key.dotted, key)

    def recording_get(self: toml.TomlTable, name: str, default: Any = toml.UNSET) -> Any:
        note(self, name, REQUIRED if default is toml.UNSET else default)
        return get(self, name, default)

    def recording_done(self: toml.TomlTable) -> None:
        for name in sorted(self.known):
            note(self, name, REQUIRED)
        done(self)

    toml.TomlTable.get, toml.TomlTable.done = recording_get, recording_done  # type: ignore[method-assign]
    try:
        yield keys
    finally:
        toml.TomlTable.get, toml.TomlTable.done = get, done  # type: ignore[method-assign]


def asked_keys(load: Callable[[Path], object], paths: list[Path]) -> list[Key]:
    """The keys `load` asks for while it reads each of `paths`, in the order asked; a dataclass's in its fields'."""
    with _recording() as recorded:
        for path in paths:
            load(path)
    keys = list(recorded.values())
    for table, cls in DATACLASS_TABLES.items():
        at = [i for i, k in enumerate(keys) if k.table == table]
        order = [f.name for f in dataclasses.fields(cls)]
        ranked = sorted((keys[i] for i in at), key=lambda k: order.index(k.name) if k.name in order else len(order))
        for i, key in zip(at, ranked, strict=True):
            keys[i] = key
    return keys


def _shipped(folder: str) -> list[Path]:
    return sorted((REPO / folder).glob("*.toml"))


def study_keys() -> list[Key]:
    """The study file's keys: of a probe that reaches every branch, and of the shipped studies."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "probe-objective.toml").write_text(PROBE_OBJECTIVE)
        probe = Path(tmp) / "probe.toml"
        probe.write_text(PROBE_STUDY)
        keys = asked_keys(load_study, [probe, *_shipped("studies")])
    objective_tables = {"workload", "limits", "load"}  # and the objective's own top-level key, read through it
    return [k for k in keys if k.table.split(".")[0] not in objective_tables
            and not (k.table == "" and k.name in objective_tables | {"maximize"})]


def objective_keys() -> list[Key]:
    """The objective file's keys: of a probe that reaches every branch, and of the shipped objectives."""
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.toml"
        probe.write_text(PROBE_OBJECTIVE)
        return asked_keys(load_objective, [probe, *_shipped("objectives")])


def _choices(cls: type, name: str) -> str:
    """A Literal field's values, as the reference lists them."""
    return ", ".join(f'"{v}"' for v in get_args(get_type_hints(cls)[name]))


FACTS = {
    "profiles": ", ".join(f'"{p}"' for p in PROFILES),
    "samplers": ", ".join(f'"{s}"' for s in SAMPLERS),
    "param_types": ", ".join(f'"{t}"' for t in PARAM_TYPES),
    "length_kinds": _choices(LengthDist, "kind"),
    "load_modes": _choices(LoadSearch, "mode"),
    "prompt_kinds": _choices(Workload, "prompt"),
    "env_families": ", ".join(f"{p}*" for p in ALLOWED_PREFIXES),
    "env_refused": ", ".join(REFUSED),
    "host_exposing": ", ".join(HOST_EXPOSING),
    "unmeasurable": ", ".join(UNMEASURABLE),
    "api_kinds": _choices(Workload, "api"),
    "maximize": ", ".join(f'"{m}"' for m in MAXIMIZE),
}

# What each key means, with its unit and the values it takes ({profiles} and the like: FACTS, read from the code).
STUDY_KEYS: dict[str, str] = {
    "name": "The study's name: it names its files (NAME.db beside the study file, reports/NAME.html). Letters, "
            "digits, `.`, `_`, `-`; at most 100.",
    "description": "Free text shown in the report.",
    "objective": "The objective file (workload and latency limits), relative to the study file.",
    "hardware": "The GPU profile the memory estimator plans for: \"auto\" (the first GPU NVML finds; the CPU "
                "profile on vLLM's CPU build) or one of {profiles}.",
    "storage": "Where trials are kept: an SQLAlchemy URL (`sqlite:///path.db`, `postgresql://...`). None: "
               "`sqlite:///NAME.db` beside the study file.",
    "memory_cap_gib": "Plan and boot as on a smaller card: a size in GiB (24, \"24GiB\") or a profile name "
                      "(\"rtx3090\"). vLLM is given a gpu_memory_utilization that leaves it what the smaller card "
                      "would.",
    "vllm_version": "The vLLM version the GPU machine runs (\"0.25.0\"): the memory estimate before each boot and "
                    "`autotune estimate` predict for it instead of the installed one. A version the estimator does not "
                    "model is predicted with the nearest one it models, with a wider range.",
    "model": "The checkpoint every trial serves.",
    "model.path": "\"tiny:dense\" or \"tiny:hybrid\" (a tiny model with random weights, written by autotune), a "
                  "directory with a config.json (relative to the study file), or a Hugging Face hub id.",
    "model.load_format": "vLLM's --load-format (\"dummy\": random weights, nothing downloaded).",
    "model.quantization": "vLLM's --quantization (awq, gptq, fp8, ...). None: what the checkpoint says.",
    "model.revision": "The hub revision (branch, tag or commit) to serve.",
    "model.extra": "A table for whoever resolves the model (the tiny models' sizes), not passed to vLLM.",
    "engine": "Fixed vLLM flags for every trial, by vLLM's dest name (`max_model_len = 8192`, "
              "`enforce_eager = true`). `model`, `host` and `port` are autotune's; the [model] keys go in [model]. "
              "Refused, as the tuner's client could not measure the server: {unmeasurable}. Flags that run code or "
              "read files of the host, or widen who may call the server ({host_exposing}), need "
              "`--allow-flag NAME` from whoever runs autotune. The same holds in [space] and [[baselines]].",
    "engine.env": "Environment variables for the server (`VLLM_CPU_KVCACHE_SPACE = \"1\"`; numbers become "
                  "strings): those vLLM and its libraries read to tune themselves ({env_families} and a few "
                  "others). A path the server may load code from, or any other name, needs `--allow-env NAME` "
                  "from whoever runs autotune; {env_refused} never.",
    "space": "The searched flags: one table [space.NAME] per vLLM flag (dest name), or the pseudo-parameters "
             "`model`, `speculative_method` and `num_speculative_tokens`.",
    "space.NAME.type": "One of {param_types}.",
    "space.NAME.low": "int and float: the lowest value searched (inclusive).",
    "space.NAME.high": "int and float: the highest value searched (inclusive).",
    "space.NAME.log": "int and float: draw on a log scale (needs low > 0; no step).",
    "space.NAME.step": "int and float: the grid spacing (> 0, at most high - low). None: any int, any float.",
    "space.NAME.choices": "categorical: a non-empty list of strings, numbers or booleans, each once.",
    "space.NAME.when": "Search this flag only where other parameters have these values: "
                       "`when = { enable_chunked_prefill = true }` or a list of allowed values.",
    "space.NAME.default": "The value vLLM uses when the flag is absent; baselines that leave it unset are recorded "
                          "at it. May lie outside [low, high].",
    "baselines": "An array of tables ([[baselines]]): configurations booted exactly as written, before the search.",
    "baselines[].name": "The baseline's name, unique in the file.",
    "baselines[].flags": "Its vLLM flags by dest name (`{ max_num_seqs = 48 }`; `{}` is vLLM's defaults), on top "
                         "of [engine]. Checked against the rules vLLM enforces at startup.",
    "sampler": "How configurations are proposed.",
    "sampler.name": "One of {samplers} (Optuna's TPE, Gaussian-process and random samplers). Random by default, "
                    "after the start picks: autotune/search/samplers.py says why.",
    "sampler.start_picks": "How many of the first sampled trials are each, of 64 random configurations, the one the "
                           "estimator says runs the most requests at once, whichever the sampler (0: none).",
    "sampler.seed": "An integer seed in [0, 2**32), so a study proposes the same configurations again.",
    "budget": "How long the search runs.",
    "budget.boot_timeout": "A duration (\"45s\", \"3m\", \"1h30m\"): a server not ready by then fails its trial.",
    "budget.time": "A duration: the default for `autotune run --budget`.",
    "budget.trials": "The default number of trials (>= 1): `autotune run --n-trials`.",
    "budget.remeasure": "How many of the best configurations are measured again before the budget ends "
                        "(0: none, and no final pairs or soak).",
    "budget.soak": "A duration: how long a winner that beat the best baseline in the final pairs serves the "
                   "objective's load on a fresh boot before it is final (no request error, no empty reply, no "
                   "memory growth past what vLLM reserved). Default 2m, 30s with hardware = \"cpu\".",
}

OBJECTIVE_KEYS: dict[str, str] = {
    "name": "The objective's name, shown in reports.",
    "description": "Free text shown in reports.",
    "maximize": "What the study maximises, at each trial's best load level within the limits: one of {maximize}: "
                "output tokens per second, as `vllm bench serve` names it, or output tokens per joule of GPU energy "
                "(NVML's energy counter, or power, over the level's steady window). Energy is measured on CUDA GPUs "
                "only: refused on the CPU build.",
    "workload": "What each load level sends.",
    "workload.input_len": "Prompt length in tokens: an integer (fixed), or a table "
                          "`{ kind, mean, std, min, max }` (below).",
    "workload.output_len": "Answer length in tokens, exact (`ignore_eos`): an integer or a table as for input_len.",
    "workload.input_len.kind": "One of {length_kinds}: `fixed` sends `mean`; the others draw with that mean and "
                               "std, clipped to [min, max].",
    "workload.input_len.mean": "Tokens (>= 1, within [min, max]).",
    "workload.input_len.std": "Tokens (>= 0).",
    "workload.input_len.min": "Tokens (>= 1).",
    "workload.input_len.max": "Tokens (>= min).",
    "workload.shared_prefix_len": "Tokens every prompt starts with (>= 0): exercises prefix caching.",
    "workload.dataset": "A file of prompts, relative to the objective file: JSONL (each line "
                        "`{\"prompt_token_ids\": [...]}` or `{\"prompt\": \"text\"}`, with an optional "
                        "`\"output_len\"`) or ShareGPT JSON (below). It replaces input_len (and output_len where "
                        "the file gives one); read and checked when the objective loads.",
    "workload.replay": "A request log to replay, relative to the objective file (JSONL, below): its lengths, shared "
                       "prefixes and arrival times, scaled to each level's rate (needs `load.mode = \"rate\"`; the "
                       "level at the log's own mean rate replays it as recorded).",
    "workload.api": "One of {api_kinds}: /v1/completions, or /v1/chat/completions (text as chat messages, which the "
                    "server renders with the model's chat template).",
    "workload.turns": "Turns per conversation (>= 1): turn k resends the turns before it and their answers, a "
                      "prefix the server may have cached, and is sent once the answer to turn k-1 came.",
    "workload.clip_to_context": "Cut each drawn prompt to the trial's max_model_len, less its answer (and 64 "
                                "tokens of chat template): an agent compacts its context to the window the server "
                                "offers, so a trial with a longer context is sent longer prompts. Not with "
                                "dataset, replay or turns > 1.",
    "workload.seed": "Seed of the drawn prompts and lengths (>= 0): every trial is sent the same requests.",
    "workload.prompt": "One of {prompt_kinds}: on /v1/completions, send token ids (exact lengths, no tokenizer), "
                       "or the same ids decoded to text with the model's tokenizer.json (the server then tokenizes, "
                       "as for real clients; the shipped objectives send text). Chat always sends text.",
    "limits": "The limits a load level must meet, at least one: latencies in milliseconds, each at a percentile "
              "(p50, p90, p95 or p99) and named as `vllm bench serve` names the figure, and energy per token. The "
              "names before these (ttft_p95_ms, tpot_p95_ms, itl_p95_ms, e2e_p95_ms) are still read, with a notice. "
              "Latencies are timed as `vllm bench serve` times them: replaying one request log, the two clients' "
              "median TTFT agree within 3%, each a few ms above vLLM's own /metrics figure (dataset "
              "`cpu-client-vs-vllm-bench`).",
    "limits.joules_per_token": "GPU energy per output token, joules (> 0): NVML's energy counter (or power) over "
                               "the level's steady window, over the output tokens in it. CUDA GPUs only: refused on "
                               "the CPU build, where energy is not measured.",
    "load": "How load levels are searched in each trial.",
    "load.mode": "One of {load_modes}: requests in flight at once (closed loop), or requests per second "
                 "(Poisson arrivals).",
    "load.start": "The lowest level measured (> 0).",
    "load.max": "The highest level measured (>= start).",
    "load.factor": "Each step up or down multiplies the level by this (> 1) before bisecting.",
    "load.tolerance": "Bisection stops when fail - pass <= tolerance x pass (> 0; at least 1 in concurrency mode).",
    "load.min_requests": "Requests per exact level at least (>= 1; in concurrency mode at least 3 x the level).",
    "load.warmup_requests": "Requests per level sent first and not counted (>= 0).",
    "load.p95_margin": "An exact level runs until each limited p95 is known to +- this (relative), or is clearly "
                       "on one side of its limit (>= 0; 0: exactly min_requests).",
    "load.p95_confidence": "The confidence of that margin (between 0 and 1).",
    "load.max_requests": "Requests per level at most (>= 1; raised to the level's minimum where that is more).",
    "load.verdict_error": "Each error rate of the early verdict on a level clearly inside or outside its limits "
                          "(in [0, 0.5); 0: every level measured in full).",
}
LATENCIES = {"ttft": "Time to first token", "tpot": "Time per output token after the first",
             "itl": "Inter-token latency", "e2el": "Whole-request (end-to-end) latency"}
OBJECTIVE_KEYS |= {f"limits.{limit_key(q, metric)}": f"{what}, p{q}, ms (> 0)."
                   for metric, what in LATENCIES.items() for q in PERCENTILES}
OBJECTIVE_KEYS |= {k.replace("input_len.", "output_len."): v for k, v in OBJECTIVE_KEYS.items()
                   if k.startswith("workload.input_len.")}  # output_len's table takes input_len's keys


def _shown(value: object) -> str:
    """A default as the reference prints it."""
    if value == REQUIRED:
        return "required"
    if value is None or value == {} or value == []:
        return "none" if value is None else "empty"
    if isinstance(value, LengthDist):
        return f"{value.mean}" if value.kind == "fixed" else f"{value.kind} {value.mean}"
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else f"{value}"


def _filled(text: str) -> str:
    """A description with its {name}s replaced by what the code says (FACTS)."""
    for name, value in FACTS.items():
        text = text.replace("{" + name + "}", value)
    return text


def undescribed(keys: list[Key], descriptions: dict[str, str]) -> list[str]:
    """The keys no line of `descriptions` describes."""
    return [k.dotted for k in keys if k.dotted not in descriptions]


SHOWN_DEFAULTS = {"name": "the file's name", "space.NAME.default": "none", "baselines": "none",
                  "workload.input_len": "256", "workload.output_len": "128"}


def _section(key: Key, tables: set[str]) -> str:
    """The section a key is listed under: its top-level table, or "Top level"."""
    top = key.dotted.split(".")[0].removesuffix("[]")
    return top if top in tables else "Top level"


def _page(title: str, intro: str, keys: list[Key], descriptions: dict[str, str]) -> str:
    missing = undescribed(keys, descriptions)
    if missing:
        raise ValueError(f"no description for {', '.join(missing)}: add one in {__name__}")
    tables = {k.table.split(".")[0].removesuffix("[]") for k in keys if k.table}
    sections: dict[str, list[Key]] = {}
    for k in keys:
        sections.setdefault(_section(k, tables), []).append(k)
    lines = [f"# {title}", "", intro]
    for name, members in sections.items():
        heading = name if name == "Top level" else f"[[{name}]]" if name == "baselines" else f"[{name}]"
        lines += ["", f"## {heading}", "", "| Key | Default | Meaning |", "|---|---|---|"]
        for k in members:
            default = SHOWN_DEFAULTS.get(k.dotted, _shown(k.default))
            text = _filled(descriptions[k.dotted]).replace("|", "\\|")
            lines.append(f"| `{k.dotted}` | {default} | {text} |")
    return "\n".join(lines) + "\n"


GENERATED = "<!-- Written by `python -m autotune.config.reference docs` from the parsers; do not edit. -->"


def study_page() -> str:
    intro = (f"{GENERATED}\n\nA study file (TOML) says what to tune: the model, the fixed and the searched vLLM "
             "flags, the baselines, the sampler and the budget; it names an objective file "
             "([objective-file.md](objective-file.md)). Keys are dotted: `model.path` is `path` in the `[model]` "
             "table, `space.NAME.low` is `low` in `[space.max_num_seqs]`. An unknown key is refused with the "
             "nearest known one. Examples: `studies/`.")
    return _page("Study file reference", intro, study_keys(), STUDY_KEYS)


def objective_page() -> str:
    intro = (f"{GENERATED}\n\nAn objective file (TOML) says what a good configuration is: the requests sent "
             "(`[workload]`), the latency limits every measured load level must meet (`[limits]`), and how "
             "load levels are searched (`[load]`). A trial's figure is the highest load that meets every limit. "
             "Examples: `objectives/`.")
    return _page("Objective file reference", intro, objective_keys(), OBJECTIVE_KEYS) + formats_section()


def formats_section() -> str:
    """The dataset and request-log formats, from the module that reads them."""
    from autotune.measure import datasets

    text = (datasets.__doc__ or "").split("\n\n", 1)[1].strip()
    return f"\n## Datasets and request logs\n\n{text}\n"


PAGES: dict[str, Callable[[], str]] = {"study-file.md": study_page, "objective-file.md": objective_page}


def main(argv: list[str]) -> int:
    folder = Path(argv[0] if argv else "docs")
    folder.mkdir(exist_ok=True)
    for name, page in PAGES.items():
        (folder / name).write_text(page())
        print(folder / name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
