"""Study and objective files (TOML) -> validated frozen dataclasses.

Every error names the file and the dotted key ("studies/x.toml: space.max_num_seqs.low: must be an
integer, got 'abc'"); unknown keys are refused with the nearest known key as a suggestion, because a
misspelt flag silently ignored would cost a night of searching the wrong thing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path

from autotune.config.objective import load_objective
from autotune.config.params import Baseline, Param, in_dependency_order, is_scalar, read_param
from autotune.config.toml import TomlTable, did_you_mean, parse_duration, read_toml, shown_value
from autotune.engine.env import check_env
from autotune.engine.flag_checks import check_exposure, exposure_problem
from autotune.engine.flags import (
    MODEL,
    PSEUDO_PARAMS,
    RESERVED_REASONS,
    SPEC_TOKENS,
    invalid_reason,
    pseudo_param_problem,
    spec_tokens_problem,
    to_engine_flags,
)
from autotune.engine.models import KINDS as TINY_KINDS
from autotune.errors import SpecError
from autotune.fit.hardware import PROFILES
from autotune.fit.memcap import MemoryCap, parse_cap
from autotune.fit.vllm_version import parse_vllm_version
from autotune.measure.plan import Objective

DEFAULT_TOP = 3  # [budget] remeasure: how many configurations to re-measure (0: none)


SOAK_S = {"cpu": 30.0, "gpu": 120.0}  # [budget] soak's default: a CPU boot and level take minutes, not seconds


SAMPLERS = ("tpe", "gp", "random")
DEFAULT_START_PICKS = 10  # [sampler] start_picks: search/start.py says why 10


MODEL_FLAGS = ("load_format", "quantization", "revision")


_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


# A study's name names its files (studies/NAME.db, NAME-artifacts/, reports/NAME.html, a worker's NAME.toml), so
# it must be one plain file name: no separators, no leading dot or dash, nothing a shell or a URL reads specially.
STUDY_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}")


@dataclass(frozen=True)
class ModelSpec:
    """The checkpoint: "tiny:dense" / "tiny:hybrid" (generated), a directory, or a hub id.
    `extra` ([model.extra]) is for whoever resolves the model (e.g. tiny model sizes), not vLLM."""

    path: str
    load_format: str | None = None
    quantization: str | None = None
    revision: str | None = None
    extra: dict[str, object] = field(default_factory=dict)


def model_flags(model: ModelSpec) -> dict[str, object]:
    """The vLLM flags a [model] table sets (load_format, quantization, revision)."""
    return {k: getattr(model, k) for k in MODEL_FLAGS if getattr(model, k) is not None}


@dataclass(frozen=True)
class SamplerSpec:
    name: str = "random"  # search/samplers.py says why
    seed: int | None = None
    start_picks: int = DEFAULT_START_PICKS  # search/start.py: sampled trials picked by what they run at once (0: none)


@dataclass(frozen=True)
class StudySpec:
    name: str
    path: Path
    objective: Objective
    hardware: str
    model: ModelSpec
    engine: dict[str, object]  # fixed vLLM flags (dest names) for every trial
    env: dict[str, str]  # extra environment for the server
    space: tuple[Param, ...]  # in dependency order: a `when` condition's params come first
    baselines: tuple[Baseline, ...]
    sampler: SamplerSpec
    boot_timeout_s: float
    storage: str | None
    time_budget_s: float | None = None  # [budget] time: the default for `autotune run --budget`
    max_trials: int | None = None  # [budget] trials
    remeasure: int = DEFAULT_TOP  # [budget] remeasure: configurations re-measured before the budget ends
    soak_s: float = SOAK_S["gpu"]  # [budget] soak: how long a proven winner serves its load before it is final
    description: str = ""
    memory_cap: MemoryCap | None = None  # memory_cap_gib: plan and boot as on a card of this size (fit/memcap.py)
    vllm_version: str | None = None  # the vLLM the GPU machine runs, predicted for (fit/vllm_version.py)

    def fixed_flags(self) -> dict[str, object]:
        """Flags every trial gets: the model's load_format/quantization/revision, then [engine]."""
        return model_flags(self.model) | self.engine


def check_study_name(name: str, source: str, key: str | None) -> str:
    """The one definition of a valid study name, for names from a study file, the command line and storage."""
    if not STUDY_NAME.fullmatch(name):
        raise SpecError(source, key, f"{name!r} is not a plain study name (letters, digits, '.', '_', '-', "
                                     "beginning with a letter, digit or '_'; at most 100): it names the study's files")
    return name


def study_models(spec: StudySpec) -> list[str]:
    """Every model a study may boot: its [model], the choices of a searched `model`, the baselines' own."""
    return list(dict.fromkeys(model for _, model in study_model_keys(spec)))


def study_model_keys(spec: StudySpec) -> list[tuple[str, str]]:
    """Every model a study may boot, with the key that names it (for errors)."""
    # str(): the study file takes only strings for a model (choices and baselines' flags are typed object)
    return [("model.path", spec.model.path),
            *(("space.model.choices", str(c)) for p in spec.space if p.name == MODEL for c in p.choices),
            *((f"baselines[{i}].flags.model", str(b.flags[MODEL]))
              for i, b in enumerate(spec.baselines) if MODEL in b.flags)]


def _resolve_model(t: TomlTable, key: str, value: str, base: Path) -> str:
    """tiny:KIND stays, ./ ../ / ~ paths resolve against the study file, anything else is a hub id."""
    if value.startswith("tiny:"):
        kind = value.removeprefix("tiny:")
        if kind not in TINY_KINDS:
            known = [f"tiny:{k}" for k in TINY_KINDS]
            raise t.error(key, f"unknown tiny model '{value}'{did_you_mean(value, known)} (known: {', '.join(known)})")
        return value
    if value.startswith((".", "/", "~")):
        path = (base / Path(value).expanduser()).resolve()
        if not (path / "config.json").is_file():
            raise t.error(key, f"no model directory (with a config.json) at {path}")
        return str(path)
    return value


def _flag_name(t: TomlTable, name: str) -> None:
    if not _NAME.match(name):
        fixed = name.replace("-", "_").lower()
        hint = f"; did you mean '{fixed}'?" if _NAME.match(fixed) else ""
        raise t.error(name, f"flag names are vLLM dest names (lowercase, underscores){hint}")


def _space(top: TomlTable, engine: dict[str, object], base: Path, model_path: str) -> tuple[Param, ...]:
    st = top.table("space")
    params: dict[str, Param] = {}
    for name in st.data:
        _flag_name(st, name)
        st.expect(name, isinstance(st.data[name], dict), "a table with a type", st.data[name])
        st.known.add(name)
        pt = TomlTable(st.data[name], st.source, st.key(name))
        p = read_param(pt, name)
        if name in engine:
            raise st.error(name, "is both fixed in [engine] and searched in [space]; keep one")
        if name in RESERVED_REASONS and name != MODEL:
            raise st.error(name, f"cannot be searched: {RESERVED_REASONS[name]}")
        if name in MODEL_FLAGS:
            raise st.error(name, "cannot be searched: it belongs to one model; search `model` instead")
        if problem := pseudo_param_problem(name, p.type, p.choices):
            raise pt.error("type", problem)
        if name == MODEL:
            p = dataclasses.replace(p, choices=tuple(_resolve_model(pt, "choices", str(c), base) for c in p.choices))
            if model_path not in p.choices:  # baselines boot [model] path: it must be a point of the space
                raise pt.error("choices", f"must include the [model] path {model_path!r}")
            p = dataclasses.replace(p, default=model_path)
        params[name] = p
    if problem := spec_tokens_problem(set(params), engine):
        raise st.error(SPEC_TOKENS, problem)
    for p in params.values():
        wt = TomlTable(p.when, st.source, st.key(f"{p.name}.when"))
        for other, wanted in p.when.items():
            if other == p.name or other not in params:
                hint = did_you_mean(other, set(params) - {p.name})
                raise wt.error(other, f"names no other parameter of [space]{hint}")
            options = wanted if isinstance(wanted, list) else [wanted]
            if not options or not all(is_scalar(w) for w in options):
                raise wt.error(other, f"must be a value or a non-empty list of values, got {shown_value(wanted)}")
            if not any(params[other].holds(w) for w in options):
                raise wt.error(other, f"{other} can never be {wanted!r}, so {p.name} would never be searched")
        # A numeric default may lie outside [low, high] (vLLM's own default often does): Optuna records it.
        if p.default is not None and not p.holds(p.default, in_range=False):
            raise st.error(f"{p.name}.default", f"{p.default!r} is not a value {p.name} can take")
    return in_dependency_order(params, st)


def _flags_table(t: TomlTable, base: Path, allow_model: bool) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, v in t.data.items():
        _flag_name(t, name)
        t.known.add(name)
        if name in RESERVED_REASONS and not (allow_model and name == MODEL):
            raise t.error(name, f"cannot be set here: {RESERVED_REASONS[name]}")
        if name == MODEL:
            t.expect(name, isinstance(v, str), "a model path or hub id", v)
            v = _resolve_model(t, name, v, base)
        out[name] = v
    return out


def _model(top: TomlTable, base: Path) -> ModelSpec:
    mt = top.table("model", required=True)
    model = ModelSpec(path=_resolve_model(mt, "path", mt.text("path"), base), load_format=mt.text("load_format", None),
                      quantization=mt.text("quantization", None), revision=mt.text("revision", None),
                      extra=dict(mt.table("extra").data))
    mt.done()
    return model


def _engine(top: TomlTable, base: Path) -> tuple[dict[str, object], dict[str, str]]:
    """[engine] fixed flags and [engine.env] (values become strings: `X = 1` is natural in TOML)."""
    et = top.table("engine")
    env_table = et.table("env")
    env: dict[str, str] = {}
    for k, v in env_table.data.items():
        env_table.expect(k, is_scalar(v) and not isinstance(v, bool), "a string or a number", v)
        env[k] = str(v)
    check_env(env, et.source, env_table.prefix, allowed=None)  # whether this host lets them through: check_inputs
    engine = _flags_table(TomlTable({k: v for k, v in et.data.items() if k != "env"}, et.source, "engine"), base,
                          allow_model=False)
    for k in MODEL_FLAGS:
        if k in engine:
            raise et.error(k, "set it in [model]")
    return engine, env


def _baselines(top: TomlTable, base: Path, fixed: dict[str, object]) -> tuple[Baseline, ...]:
    """[[baselines]], each checked against the rules vLLM enforces before booting."""
    items = top.get("baselines", [])
    top.expect("baselines", isinstance(items, list), "an array of tables ([[baselines]])", items)
    baselines: list[Baseline] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise SpecError(top.source, f"baselines[{i}]", "must be a table with a name and flags")
        t = TomlTable(item, top.source, f"baselines[{i}]")
        name = t.label("name")
        if any(b.name == name for b in baselines):
            raise t.error("name", f"baseline '{name}' is defined twice")
        flags = _flags_table(t.table("flags"), base, allow_model=True)
        t.done()
        try:
            reason = invalid_reason(to_engine_flags({}, fixed, baseline=flags))
        except ValueError as e:
            raise t.error("flags", str(e)) from None
        if reason:
            raise t.error("flags", f"vLLM would refuse this baseline: {reason}")
        baselines.append(Baseline(name=name, flags=flags))
    return tuple(baselines)


def _sampler(top: TomlTable) -> SamplerSpec:
    st = top.table("sampler")
    name = st.text("name", "random")
    if name not in SAMPLERS:
        raise st.error("name", f"unknown sampler '{name}'{did_you_mean(name, SAMPLERS)} (one of {', '.join(SAMPLERS)})")
    # numpy's generators (TPE, random) take seeds in [0, 2**32)
    sampler = SamplerSpec(name=name, seed=st.integer("seed", None, minimum=0, maximum=2**32 - 1),
                          start_picks=st.integer("start_picks", DEFAULT_START_PICKS, minimum=0))
    st.done()
    return sampler


def _budget(top: TomlTable, hardware: str) -> tuple[float, float | None, int | None, int, float]:
    """[budget]: boot timeout (default 10m), run time, trial count, configurations re-measured, the winner's soak."""
    bu = top.table("budget")
    boot_timeout = parse_duration(bu.get("boot_timeout", "10m"), bu.key("boot_timeout"), bu.source)
    time_raw = bu.get("time", None)
    time_budget = parse_duration(time_raw, bu.key("time"), bu.source) if time_raw is not None else None
    max_trials = bu.integer("trials", None, minimum=1)
    remeasure = bu.integer("remeasure", DEFAULT_TOP, minimum=0)
    soak = bu.get("soak", None)
    soak = SOAK_S.get(hardware, SOAK_S["gpu"]) if soak is None else parse_duration(soak, bu.key("soak"), bu.source)
    bu.done()
    return boot_timeout, time_budget, max_trials, remeasure, soak


def load_study(path: str | Path) -> StudySpec:
    """Read and validate a study file and the objective file it names (relative to the study file)."""
    source = str(path)
    path = Path(path)
    base = path.parent
    top = TomlTable(read_toml(path, source), source)
    name = check_study_name(top.text("name", path.stem), source, "name")
    description = top.label("description", "", lines=True)
    objective_path = base / top.text("objective")
    if not objective_path.is_file():
        raise top.error("objective", f"file not found: {objective_path}")
    objective = load_objective(objective_path)
    hardware = top.text("hardware", "auto")
    if hardware != "auto" and hardware.strip().lower() not in PROFILES:
        raise top.error("hardware", f"unknown GPU profile {hardware!r}{did_you_mean(hardware.lower(), PROFILES)} "
                                    f"(known: auto, {', '.join(sorted(PROFILES))})")
    storage = top.text("storage", None)
    model = _model(top, base)
    engine, env = _engine(top, base)
    space = _space(top, engine, base, model.path)
    baselines = _baselines(top, base, model_flags(model) | engine)
    sampler = _sampler(top)
    boot_timeout, time_budget, max_trials, remeasure, soak = _budget(top, hardware)
    cap_raw = top.get("memory_cap_gib", None)
    memory_cap = parse_cap(cap_raw, source, "memory_cap_gib") if cap_raw is not None else None
    version_raw = top.text("vllm_version", None)
    vllm_version = parse_vllm_version(version_raw, source, "vllm_version") if version_raw is not None else None
    top.done()
    return StudySpec(name=name, path=path, objective=objective, hardware=hardware, model=model, engine=engine,
                     env=env, space=space, baselines=baselines, sampler=sampler, boot_timeout_s=boot_timeout,
                     storage=storage, time_budget_s=time_budget, max_trials=max_trials, remeasure=remeasure,
                     soak_s=soak, description=description, memory_cap=memory_cap, vllm_version=vllm_version)


def study_flag_names(spec) -> list[tuple[str, str]]:
    """Every vLLM flag a study file names: fixed flags, searched parameters, baselines' flags."""

    src = str(spec.path)
    names = [(src, k) for k in spec.fixed_flags()]
    names += [(src, p.name) for p in spec.space if p.name not in PSEUDO_PARAMS]
    names += [(src, k) for b in spec.baselines for k in b.flags if k not in PSEUDO_PARAMS]
    return names


def study_flag_values(spec) -> list[tuple[str, str, str, object]]:
    """Every value a study file gives a vLLM flag, with its dotted key: [model] and [engine] flags, the values
    searched parameters can take, baselines' flags."""

    src = str(spec.path)
    values = [(src, f"model.{k}", k, v) for k, v in model_flags(spec.model).items()]
    values += [(src, f"engine.{k}", k, v) for k, v in spec.engine.items()]
    for p in spec.space:
        if p.name in PSEUDO_PARAMS:
            continue
        key = f"space.{p.name}"
        if p.type == "categorical":
            values += [(src, f"{key}.choices", p.name, c) for c in p.choices]
        elif p.type == "int":
            values += [(src, f"{key}.low", p.name, p.low), (src, f"{key}.high", p.name, p.high)]
        else:  # a float or bool parameter: one value of the kind it draws
            values.append((src, f"{key}.type", p.name, True if p.type == "bool" else float(p.low)))
    values += [(src, f"baselines[{i}].flags.{k}", k, v) for i, b in enumerate(spec.baselines)
               for k, v in b.flags.items() if k not in PSEUDO_PARAMS]
    return values


def check_host_trust(spec: StudySpec, allow_flags: typing.Iterable[str] = (),
                     allow_env: typing.Iterable[str] = ()) -> None:
    """What a study may do to the host that runs it (engine/env.py, engine/flag_checks.exposure_problem): no flag that
    breaks the tuner's client or exposes the host, no variable that loads code, unless this host's user allows
    it. Checked before anything is written: a study file may come from a shared database."""
    check_exposure(study_flag_values(spec), allow_flags)
    check_env(spec.env, str(spec.path), "engine.env", allow_env)


def foreign_config_problem(spec: StudySpec, model: str, flags: typing.Mapping[str, object]) -> str | None:
    """Why a configuration a stored trial asks to boot goes beyond what the study file sets, or None. A shared
    database holds trials anyone who can write it may add; the study file is what this host was given (and
    checked with check_host_trust): a model it does not name, or a flag that runs code or exposes the host that it
    does not set, is not booted."""
    if model not in study_models(spec):
        return f"the model {model!r} is not one the study file names"
    own = {name for _, name in study_flag_names(spec)}
    for dest, value in flags.items():
        if problem := exposure_problem(dest, value, own):
            return f"{dest} {problem}"
    return None


def study_digest(study_text: str, objective_text: str) -> str:
    """The sha256 of a study as stored for workers (its file and its objective's): what a worker is told to trust."""
    return hashlib.sha256(f"{study_text}\0{objective_text}".encode()).hexdigest()


def stored_texts(spec: StudySpec) -> tuple[str, str]:
    """The study file's and its objective's texts, as `autotune run` stores them for workers."""
    return spec.path.read_text(), spec.objective.path.read_text()
