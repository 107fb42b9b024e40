"""The trial record: the attribute names a trial is stored under, and the one read model (TrialView) that
every reader (tables, report, dashboard notes, export, notebook) uses."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import optuna
from optuna.artifacts import (
    get_all_artifact_meta,
)
from optuna.trial import FrozenTrial, TrialState

from autotune.engine.flags import serve_command, serve_program
from autotune.fit.hardware import MEMORY_SOURCE_NAMES, MEMORY_SOURCE_SHORT
from autotune.measure.stats import ENERGY_FIGURE, MAXIMIZE, OLD_NAMES, current_names
from autotune.measure.trial import TrialResult
from autotune.notices import old_names_notice
from autotune.units import GiB

if TYPE_CHECKING:
    import optuna

from autotune.engine.flags import value_text


def trial_note(t: FrozenTrial, has_log: bool = False) -> str:
    """What the trial's page should say first, in words: its result (or why it is not feasible) and the command
    it booted, one flag a line. The user attributes panel shows the numbers but cuts long values off."""

    v = view(t)
    if v.kind == "feasible":
        head = (f"**{v.ending.capitalize()}**: {v.throughput:,.0f} output tok/s {at_level(v)} (p95 TTFT "
                f"{v.p95_ttft_ms or 0:,.0f} ms, p95 TPOT {v.p95_tpot_ms or 0:,.1f} ms)")
    else:
        head = f"**{v.ending.capitalize()}**" + (f". {v.reason}" if v.reason else "")
    if v.peak_memory_gib is not None:
        head += "; " + peak_text(v.peak_memory_gib, v.boot_peak_memory_gib, v.memory_source, v.cap_gib)
    what = f"Baseline **{v.baseline}**" if v.baseline else "Configuration"
    body = f"{head}\n\n{what}, booted as:\n\n```\n{_one_flag_a_line(v.command)}\n```\n" if v.command else head
    return body + ("\nThe server log is attached below (Artifacts).\n" if has_log else "")


def save_trial_note(study: optuna.Study, trial: optuna.Trial | FrozenTrial) -> None:
    """Write (or rewrite) the note of a told trial. Notes live in the study's attributes, so unlike artifacts
    this works after the tell, when the trial's result and reason are known."""
    from optuna_dashboard import save_note

    live = optuna.Trial(study, trial._trial_id)  # save_note takes a Trial; this one is a handle on the stored trial
    frozen = live.storage.get_trial(trial._trial_id)
    save_note(live, trial_note(frozen, has_log=bool(get_all_artifact_meta(live))))


def add_missing_notes(study: optuna.Study) -> int:
    """Notes for the finished trials that have none (a study recorded before notes existed); returns how many."""
    from optuna_dashboard import get_note

    written = 0
    for t in study.get_trials(deepcopy=False):
        if t.state.is_finished() and not get_note(optuna.Trial(study, t._trial_id)):
            save_trial_note(study, t)
            written += 1
    return written


def _one_flag_a_line(command: str) -> str:
    """`vllm serve M --a 1 --b` as a shell command with one flag a line (a long line scrolls out of sight)."""
    lines: list[list[str]] = [[]]
    for word in shlex.split(command):
        if word.startswith("--"):
            lines.append([])
        lines[-1].append(shlex.quote(word))
    return " \\\n  ".join(" ".join(line) for line in lines if line)


def result_attrs(result: TrialResult) -> dict[str, object]:
    """User attributes of a measured trial: figures under `vllm bench serve`'s names, others with their units."""
    attrs: dict[str, object] = {
        "status": result.status,
        "duration_s": round(result.duration_s, 1),
        "output_throughput": round(result.throughput_tok_s, 1),
    }
    if result.maximized is not None:  # an energy objective's figure at the best level
        attrs[ENERGY_FIGURE] = round(result.maximized, 4)
    if result.reason:
        attrs["reason"] = result.reason
    if result.failure is not None:
        attrs["failure_kind"] = result.failure.kind.value
        attrs["failure_excerpt"] = result.failure.excerpt[-1500:]
    if result.compile_cache is not None:  # read by the estimator under this name: "cold" | "warm"
        attrs["compile_cache"] = result.compile_cache
    if result.cold_boot is not None:  # booted again warm after it: the trial's verdict is the warm boot's
        attrs["cold_boot_s"] = round(result.cold_boot.boot_s, 1)
        if result.cold_boot.failure is not None:
            attrs["cold_boot_failure"] = result.cold_boot.failure.reason
        attrs["cold_boot_log_path"] = str(result.cold_boot.log_path)
    if result.boot is not None:
        attrs["boot_s"] = round(result.boot.boot_s, 1)
        if result.boot.kv_cache_tokens is not None:
            attrs["kv_cache_tokens"] = result.boot.kv_cache_tokens
        if result.boot.weights_gib is not None:
            attrs["weights_gib"] = result.boot.weights_gib
        if result.boot.profiled_blocks is not None:
            attrs["kv_blocks_profiled"] = result.boot.profiled_blocks
    if result.kv_blocks_set is not None:  # its KV cache is the estimate's, not vLLM's: not an observation of it
        attrs["kv_blocks_set"] = result.kv_blocks_set
    if result.memory is not None:
        attrs["peak_memory_gib"] = round(result.memory.peak_bytes / GiB, 3)
        attrs["memory_source"] = result.memory.source
        if result.memory.boot_peak_bytes is not None:
            attrs["boot_peak_memory_gib"] = round(result.memory.boot_peak_bytes / GiB, 3)
    best = result.best
    if best is not None:
        s = best.stats
        attrs.update({
            "best_level": result.best_level,
            "request_throughput": round(s.request_throughput, 3),
            "p95_ttft_ms": round(s.ttft.p95_ms, 1),
            "p95_tpot_ms": round(s.tpot.p95_ms, 2),
            "p95_itl_ms": round(s.itl.p95_ms, 2),
            "p95_e2el_ms": round(s.e2el.p95_ms, 1),
        })
        if s.joules_per_token is not None:
            attrs["joules_per_output_token"] = round(s.joules_per_token, 4)
    attrs["levels"] = [
        {**o.stats.to_dict(), "passed": o.verdict.passed} for _, o in sorted(result.levels, key=lambda lv: lv[0])
    ]
    if result.log_path is not None:
        attrs["log_path"] = str(result.log_path)
    if result.log_error:
        attrs["log_error"] = result.log_error
    return attrs


def config_attrs(model: str, flags: Mapping[str, object], env: Mapping[str, str] | None = None) -> dict[str, object]:
    """What the trial boots with, recorded with it: `export` reads these, not a study file edited since."""
    env = dict(sorted((env or {}).items()))
    stored = json.dumps(dict(flags), sort_keys=True)
    # the command from the flags as export reads them back (keys sorted), so both print one text
    return {"model": model, "flags": stored, "env": json.dumps(env),
            "vllm_command": serve_command(model, json.loads(stored), env, serve_program())}


REMEASURE_ATTR = "remeasure_of"  # trial user attr: the number of the trial whose configuration it re-measures
PAIR_ATTR = "pair"  # trial user attr of a paired measurement: {"winner": n, "baseline": n, "index": i}
CAP_ATTR = "memory_cap_cuda_gib"  # trial user attr under a memory cap: the GiB CUDA has on the capped card


def pair_marks(trials: Sequence[FrozenTrial]) -> list[dict]:
    """Every paired measurement's mark (PAIR_ATTR), finished or not, in trial order."""
    return [m for t in trials if isinstance(m := t.user_attrs.get(PAIR_ATTR), dict)]


def feasible(t: FrozenTrial) -> bool:
    return t.state == TrialState.COMPLETE and bool(t.constraints) and all(c <= 0 for c in t.constraints.values())


@dataclass(frozen=True)
class TrialView:
    """One trial as the figures draw it: at its best level within the limits, else at its lowest level."""

    number: int
    kind: str  # feasible | infeasible | pruned | failed | running
    ending: str  # how it ended, in words (`ending`): what every output prints
    remeasure_of: int | None  # a re-measurement: the trial whose configuration it measured again
    label: str  # "baseline: NAME" or the sampled parameters
    baseline: str | None
    throughput: float | None  # output tok/s
    level: float | None
    level_unit: str  # concurrency | req/s
    p95_ttft_ms: float | None
    p95_tpot_ms: float | None
    joules_per_token: float | None  # GPU energy per output token at that level (NVML); None: not measured
    peak_memory_gib: float | None
    memory_source: str | None  # "nvml" (GPU) or "rss" (host): what peak_memory_gib measured
    # The peak until the server was ready, where recorded (then peak_memory_gib is the peak while it served)
    boot_peak_memory_gib: float | None
    cap_gib: float | None  # under a memory cap: what CUDA has on the capped card (CAP_ATTR), else None
    reason: str
    completed: datetime | None
    command: str
    levels: tuple[dict, ...]
    duration_s: float | None  # how long its measurement took (a re-measurement's budget is sized on it)
    cold_boot_s: float | None  # of those, a first cold boot thrown away before it booted again warm
    status: str  # the recorded status ("ok", "boot_failed", ...), else the trial state's name
    # What the trial told Optuna (0 for a trial that is not feasible); None for a PRUNED one, whose stored value is
    # Optuna's copy of its last intermediate value (a screened trial's goodput), not a figure of its own.
    objective_value: float | None
    best_level: float | None  # the best level within the limits, as recorded (None: no level met them)
    figures_recorded: bool  # ttft/tpot are the recorded best level's, not read off the levels
    figures: Mapping[str, float]  # every number recorded with it (units in their names), for `export`
    why_not: str  # the category of a trial that is not feasible ("" when feasible)
    booted: bool  # False: refused before boot
    config_key: str  # the booted flags (JSON), else the sampled parameters: one configuration, one key
    model: str | None
    flags: dict | None  # as booted (config_attrs); None for a trial recorded without them
    env: dict[str, str]


# How a trial ended, one word or phrase each, the same in every output (the run's table, `status`, the report's
# summary, table and legends, the dashboard's notes).
MEASURED = "measured"  # met the limits at some load level: it has a figure
MISSED_LIMITS = "missed the limits"  # booted and measured, no load level met the limits
OUT_OF_MEMORY = "out of memory"
REFUSED = "refused before boot"  # vLLM would reject its flags, or predicted not to fit: cost nothing
NO_BOOT = "failed to boot"  # for its flags (not memory): a crash, a hang, an unresponsive server
SCREENED_OUT = "screened out"  # could not sustain the incumbent's level (measured there, or judged before boot)
BUDGET_END = "stopped by the budget"
INTERRUPTED = "interrupted"  # Ctrl-C, SIGTERM, or another slot's failure: measured again when the study resumes
STALE = "stale"  # its worker stopped sending heartbeats (killed, lost): queued again once
FAILED = "failed"  # not the configuration's fault: a busy GPU, the machine or the setup
RUNNING = "running"
QUEUED = "queued"


def ending(t: FrozenTrial) -> str:
    """How the trial ended, in the one vocabulary above."""
    a, c = t.user_attrs, t.constraints or {}
    if t.state == TrialState.WAITING:
        return QUEUED
    if t.state == TrialState.RUNNING:
        return RUNNING
    if t.state == TrialState.PRUNED:
        return SCREENED_OUT
    if t.state == TrialState.FAIL:
        if "status" not in a:  # never told: Optuna's stale-trial check marked it (search/storage.py)
            return STALE
        if a["status"] == "stopped":
            return BUDGET_END
        reason = str(a.get("reason", ""))
        return INTERRUPTED if reason.startswith(("interrupted", "stopped when slot")) else FAILED
    if feasible(t):
        return MEASURED
    if a.get("booted") is False:
        return REFUSED
    if c.get("memory", 0) > 0:
        return OUT_OF_MEMORY
    return MISSED_LIMITS if c.get("latency", 0) > 0 else NO_BOOT


def ending_reason(t: FrozenTrial) -> str:
    """Why it ended so, where the trial says (a stale one never could)."""
    if ending(t) == STALE:
        return "its worker stopped sending heartbeats (killed or lost); queued again once"
    return str(t.user_attrs.get("reason", ""))


def _kind(t: FrozenTrial) -> str:
    if feasible(t):
        return "feasible"
    states = {TrialState.PRUNED: "pruned", TrialState.FAIL: "failed", TrialState.COMPLETE: "infeasible"}
    return states.get(t.state, "running")


def figures_of(t: FrozenTrial) -> tuple[dict, tuple[dict, ...]]:
    """The trial's user attributes and its levels under `vllm bench serve`'s names, also when it was recorded under
    the old ones (said once, in a notice)."""
    a, old = current_names(t.user_attrs)
    levels = []
    for level in a.get("levels") or ():
        level, old_in_level = current_names(level)
        levels.append(level)
        old += old_in_level
    old_names_notice("a trial recorded before vLLM's metric names", sorted(set(old)), OLD_NAMES)
    return a, tuple(levels)


def figure_unit(t: FrozenTrial) -> str:
    """What a trial's value counts: "output tok/s", or "output tokens/J" where its objective maximised energy
    efficiency (the trial then records that figure beside its throughput)."""
    return MAXIMIZE[ENERGY_FIGURE if ENERGY_FIGURE in t.user_attrs else "output_throughput"]


def format_figure(value: float, unit: str) -> str:
    """A figure as printed: "1,319" output tok/s, "3.12" output tokens/J."""
    return f"{value:.3g}" if unit == MAXIMIZE[ENERGY_FIGURE] else f"{value:,.0f}"


def figure_number(value: float, t: FrozenTrial) -> str:
    return format_figure(value, figure_unit(t))


def figure_text(value: float, t: FrozenTrial) -> str:
    """A trial's value with its unit: "1,319 output tok/s" or "3.12 output tokens/J"."""
    return f"{figure_number(value, t)} {figure_unit(t)}"


def study_limits(study: optuna.Study) -> dict[str, float]:
    """The objective's limits recorded with the study, keyed as vLLM names the figures (p95_ttft_ms)."""
    limits, old = current_names(study.user_attrs.get("limits") or {})
    old_names_notice(f"study {study.study_name}'s limits", old, OLD_NAMES)
    return limits


def view(t: FrozenTrial) -> TrialView:
    a, levels = figures_of(t)
    passed = [lv for lv in levels if lv.get("passed")]
    if "p95_ttft_ms" in a:  # measured, with a best level (result_attrs)
        at, level = a, a.get("best_level")
    elif passed:  # pruned: its best passing level before the cut
        at = max(passed, key=lambda lv: lv.get("output_throughput", 0.0))
        level = level_value(at)
    elif levels:  # no level met the limits: the lowest one, the closest it came
        at, level = levels[0], level_value(levels[0])
    else:
        at, level = {}, None
    kind = _kind(t)
    baseline = a.get("baseline")
    of = a.get(REMEASURE_ATTR)
    return TrialView(
        number=t.number, kind=kind, ending=ending(t), remeasure_of=of,
        label=trial_label(t) if of is None else f"re-measure of trial {of}: {trial_label(t)}",
        baseline=baseline.get("name") if isinstance(baseline, dict) else None,
        # A feasible trial's value is its throughput, unless its study maximised energy efficiency
        throughput=t.value if kind == "feasible" and ENERGY_FIGURE not in a else at.get("output_throughput"),
        level=level,
        level_unit="req/s" if any("rate_req_s" in lv for lv in levels) else "concurrency",
        p95_ttft_ms=at.get("p95_ttft_ms"), p95_tpot_ms=at.get("p95_tpot_ms"),
        joules_per_token=at.get("joules_per_output_token"),
        peak_memory_gib=a.get("peak_memory_gib"), memory_source=a.get("memory_source"),
        boot_peak_memory_gib=a.get("boot_peak_memory_gib"), cap_gib=a.get(CAP_ATTR), reason=ending_reason(t),
        completed=t.datetime_complete, command=a.get("vllm_command", ""), levels=levels,
        duration_s=a.get("duration_s"), cold_boot_s=a.get("cold_boot_s"),
        status=a.get("status") or t.state.name.lower(),
        objective_value=t.value if t.state == TrialState.COMPLETE else None,
        best_level=a.get("best_level"),
        figures_recorded="p95_ttft_ms" in a,
        figures={k: v for k, v in a.items() if isinstance(v, (int, float)) and not isinstance(v, bool)},
        why_not="" if kind == "feasible" else why_not(t), booted=a.get("booted") is not False,
        config_key=str(a.get("flags", str(t.params))), model=a.get("model"),
        flags=json.loads(a["flags"]) if "flags" in a else None,
        env=json.loads(a.get("env", "{}")),  # as booted (older trials: none recorded)
    )


def at_level(v: TrialView) -> str:
    if v.level is None:
        return ""
    return f"at {v.level:g} req/s" if v.level_unit == "req/s" else f"at concurrency {v.level:g}"


def remeasure_views(study: optuna.Study) -> list[TrialView]:
    """The finished re-measurements, each pointing (remeasure_of) at the configuration it measured again."""
    return [view(t) for t in study.get_trials(deepcopy=False)
            if t.state.is_finished() and REMEASURE_ATTR in t.user_attrs]


def views(study: optuna.Study) -> list[TrialView]:
    """One view per configuration tried: re-measurements are points of their configuration (remeasure_views),
    not configurations of their own."""
    return [view(t) for t in study.get_trials(deepcopy=False)
            if t.state != TrialState.WAITING and REMEASURE_ATTR not in t.user_attrs]


def level_value(level: dict) -> float | None:
    return level.get("concurrency", level.get("rate_req_s"))


def why_not(t: FrozenTrial) -> str:
    """How a trial that is not feasible ended (`ending`), with the detail the infeasible figure sorts by."""
    if t.state == TrialState.PRUNED and t.user_attrs.get("booted") is False:  # measure/queueing.py
        return f"{SCREENED_OUT} before boot"
    return ending(t)


WARM_START_ATTR = "warm_start"  # {"study": name, "trial": number, "output_throughput": value}


# The trial user attribute that marks a baseline: {"name": ..., "flags": {...}}.
BASELINE_ATTR = "baseline"


def searched_trial(trial: optuna.Trial | optuna.trial.FrozenTrial) -> bool:
    """One of the search's own (sampled) trials: not a baseline or a re-measurement, which search in full."""
    return BASELINE_ATTR not in trial.user_attrs and REMEASURE_ATTR not in trial.user_attrs


def trial_baseline(trial: optuna.Trial | optuna.trial.FrozenTrial) -> Mapping[str, object] | None:
    """The baseline flags a trial must boot with, or None for an ordinary sampled trial."""
    mark = trial.user_attrs.get(BASELINE_ATTR)
    return mark["flags"] if isinstance(mark, Mapping) else None


def trial_label(t) -> str:
    mark = t.user_attrs.get("baseline")
    if isinstance(mark, dict):
        return f"baseline: {mark.get('name')}"
    return ", ".join(f"{k}={value_text(v)}" for k, v in t.params.items())


# How a recorded figure reads, in every output: a memory peak with what measured it, a peak over a capped card, the
# energy per token.
def memory_source_name(source: str | None) -> str:
    return MEMORY_SOURCE_NAMES.get(source or "", "memory (source not recorded)")


def over_cap(gib: float | None, cap_gib: float | None) -> bool:
    """A peak on a card capped to behave as a smaller one (memcap.py) above what CUDA has on the smaller card: the big
    card held it, the small one may not (h200-as-rtx3090-awq: 22.1-24.3 GiB while serving on the H200 capped as a 3090,
    whose CUDA has 23.62; vLLM's own budget was 0.8-1.8 GiB below each peak). "May": much of that excess is memory
    PyTorch keeps because the big card has it. Held down to 23.62 GiB (h100-as-rtx3090-awq-machete), four configurations
    that had peaked at 23.78-24.89 GiB capped served within it (22.90-23.58), though a cold boot given the warm KV cache
    once ran out."""
    return gib is not None and cap_gib is not None and gib > cap_gib


def over_cap_text(cap_gib: float) -> str:
    """What every view says beside a peak over the capped card's CUDA memory (over_cap)."""
    return f"above the {cap_gib:.2f} GiB CUDA has on the capped card: it may not fit there"


def memory_text(gib: float | None, source: str | None, short: bool = False, cap_gib: float | None = None) -> str:
    """'20.57 GiB GPU memory (NVML)', '3.40 GiB host RSS' (short): a peak with what it measured; '> cap' (short)
    where it is over the capped card's CUDA memory `cap_gib`."""
    if gib is None:
        return "-"
    if short:
        return f"{gib:.2f} GiB {MEMORY_SOURCE_SHORT.get(source or '', '(source?)')}" + (
            " > cap" if over_cap(gib, cap_gib) else "")
    return f"{gib:.2f} GiB {memory_source_name(source)}"


def peak_text(gib: float | None, boot_gib: float | None, source: str | None, cap_gib: float | None = None) -> str:
    """A trial's memory figure as every view writes it: 'peak 23.05 GiB GPU memory (NVML) while serving (31.36 GiB
    while booting)'. The peak while serving is the configuration's; a boot's own (compiling, which
    gpu_memory_utilization does not govern) is named beside it when higher. No boot figure: a whole-run peak.
    Under a memory cap, a peak over the capped card's CUDA memory (`cap_gib`) says so."""
    text = f"peak {memory_text(gib, source)}"
    if gib is not None and boot_gib is not None:
        text += " while serving" + (f" ({boot_gib:.2f} GiB while booting)" if boot_gib > gib else "")
    if cap_gib is not None and over_cap(gib, cap_gib):
        text += ", " + over_cap_text(cap_gib)
    return text


def energy_text(joules_per_output_token: float | None) -> str:
    """How a figure (or its absence) is shown: never a number where none was measured."""
    if joules_per_output_token is None:
        return "energy per token: not measured (NVML, on a CUDA GPU only)"
    return f"energy per token: {joules_per_output_token:.3g} J per output token (GPU, NVML)"
