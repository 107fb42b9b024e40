"""What a person sees while a study runs: the trial and its stage, the best so far, trials done, time left."""

from __future__ import annotations

import json

from optuna.trial import TrialState
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from autotune.fit.estimate import Estimate
from autotune.measure.plan import Objective
from autotune.measure.trial import TrialResult
from autotune.search.budget import Budget
from autotune.search.record import (
    REMEASURE_ATTR,
    TrialView,
    energy_text,
    figure_text,
    memory_text,
    peak_text,
    view,
)
from autotune.search.remeasure import Best, ranked
from autotune.units import GiB, MiB, format_gib


class LiveProgress:
    """A live status block (one line per running trial) above the finished trials' one-line summaries;
    plain lines when the output is not a terminal."""

    def __init__(self, console: Console, budget: Budget):
        self.console, self.budget = console, budget
        self.running: dict[int, list[str]] = {}  # trial number -> [label, slot, stage]
        self.best: Best | None = None
        self.done = 0
        self._live = Live(console=console, refresh_per_second=4, transient=True, get_renderable=self._render)

    def __enter__(self) -> LiveProgress:
        if self.console.is_terminal:
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.console.is_terminal:
            self._live.__exit__(None, None, None)

    def _render(self) -> Group:
        best = (f"{figure_text(self.best.figure, self.best.trial)} (trial {self.best.trial.number})" if self.best
                else "none feasible yet")
        lines: list[RenderableType] = [
            Text(f"best {best}  ·  {self.done} done  ·  {self.budget.left_text()}", style="bold")]
        for number, (label, slot, stage) in sorted(self.running.items()):
            where = f"[slot {slot}] " if len(self.running) > 1 or slot != "0" else ""
            lines.append(Spinner("dots", text=Text.assemble(f"{where}trial {number}: ", (stage, "cyan"), "  ",
                                                            (label[:80], "dim"))))
        return Group(*lines)

    def trial_started(self, number: int, label: str, slot: str) -> None:
        self.running[number] = [label, slot, "starting"]
        if not self.console.is_terminal:
            self.console.print(f"trial {number}: {label}" + (f"  [slot {slot}]" if slot != "0" else ""), markup=False)

    def stage(self, number: int, text: str) -> None:
        if number in self.running:
            self.running[number][2] = text
        if not self.console.is_terminal:
            self.console.print(f"  trial {number}: {text}", markup=False)

    def trial_ended(self, number: int, state: TrialState, summary: str, best: Best | None) -> None:
        self.running.pop(number, None)
        self.done += 1
        self.best = best
        colour = {TrialState.COMPLETE: "green", TrialState.PRUNED: "yellow"}.get(state, "red")
        # the summary carries flag values and vLLM's own words: text, never markup
        self.console.print(f"[{colour}]trial {number}[/] {escape(summary)}  "
                           f"[dim]({self.budget.left_text()})[/]", soft_wrap=True)


def level_table(result: TrialResult, objective: Objective) -> Table:
    """One row per level. In rate mode the label (req/s asked for) stands next to what was offered (sent per
    second) and achieved (completed per second of the steady window): a Poisson schedule offers its label only
    on average, and a server that falls behind achieves less."""
    rate = objective.load.mode == "rate"
    cols = ("rate", "offered", "ok", "err", "output_throughput", "request_throughput") if rate else (
        "conc.", "ok", "err", "output_throughput", "request_throughput")
    t = Table(title="load levels (tok/s, req/s; latencies in ms: p50 / p95 / p99)",
              title_justify="left")
    for col in (*cols, "TTFT", "TPOT", "ITL", "E2E", "verdict"):
        t.add_column(col, justify="right" if col != "verdict" else "left")
    for value, o in sorted(result.levels, key=lambda lv: lv[0]):
        s = o.stats
        best = value == result.best_level
        t.add_row(
            f"{value:g}" + (" *" if best else ""), *([f"{s.offered_req_s:.2f}"] if rate else []),
            str(s.completed), str(s.failed), f"{s.output_throughput:,.0f}", f"{s.request_throughput:.2f}",
            *(f"{p.p50_ms:.0f} / {p.p95_ms:.0f} / {p.p99_ms:.0f}" for p in (s.ttft, s.tpot, s.itl, s.e2el)),
            "[green]pass[/]" if o.verdict.passed else f"[red]{escape(o.verdict.reason)}[/]",
        )
    return t


def print_trial(console: Console, result: TrialResult, objective: Objective, cap_gib: float | None = None) -> None:
    if result.levels:
        console.print(level_table(result, objective))
        for value, o in result.levels:
            for msg, n in o.stats.errors.items():
                console.print(f"  level {value:g}: {n} request(s) failed: {msg}", markup=False)
    if result.boot is not None:
        b = result.boot
        kv = f"{b.kv_cache_tokens:,} KV-cache tokens" if b.kv_cache_tokens else "KV-cache size not reported"
        cache = f" ({result.compile_cache} compile cache)" if result.compile_cache else ""
        console.print(f"boot {b.boot_s:.0f} s{cache}, {kv}")
        if result.kv_blocks_set is not None:
            own = f"; vLLM sized it at {b.profiled_blocks:,} while compiling" if b.profiled_blocks else ""
            console.print(f"KV cache given the estimate's {result.kv_blocks_set:,} blocks for a warm boot{own}")
    if result.cold_boot is not None:
        c = result.cold_boot
        why = f"failed: {c.failure.reason}" if c.failure is not None else "came up short of KV cache (compiling)"
        console.print(f"booted again after a cold boot ({c.boot_s:.0f} s) {why}", markup=False)
    if result.memory is not None:
        m = result.memory
        boot = None if m.boot_peak_bytes is None else m.boot_peak_bytes / GiB
        console.print(peak_text(m.peak_bytes / GiB, boot, m.source, cap_gib), markup=False)
    if result.status == "ok":
        best = result.best
        assert best is not None
        console.print(
            f"[bold green]result:[/] output_throughput {best.stats.output_throughput:,.0f} tok/s at "
            f"{objective.load.mode} {result.best_level:g} "
            f"(p95_ttft_ms {best.stats.ttft.p95_ms:.0f}, p95_tpot_ms {best.stats.tpot.p95_ms:.1f})"
        )
        console.print(energy_text(best.stats.joules_per_token), markup=False)
    else:
        console.print(f"[bold red]{result.status}:[/] {escape(result.reason)}")
        if result.failure is not None and result.failure.excerpt:
            console.print(result.failure.excerpt, markup=False, soft_wrap=True)
    if result.log_path is not None:
        console.print(f"server log: {result.log_path}", markup=False)


def _best_level(v: TrialView) -> str:
    """The best level's label; in rate mode with the rate it offered, which a Poisson schedule only meets on average."""
    if v.best_level is None:
        return "-"
    best = next((lv for lv in v.levels if lv.get("rate_req_s") == v.best_level), None)
    if best is None or "offered_req_s" not in best:
        return f"{v.best_level:g}"
    return f"{v.best_level:g} req/s (offered {best['offered_req_s']:.2f})"


def study_table(trials, *, limit: int = 15, title: str = "configurations, best figure first") -> Table:
    """One row per configuration tried, with its figure (remeasure.Best: the median of its measurements, and how
    many) and the latencies of the measurement that figure is; measured ones by figure, then the rest by number;
    baselines always shown so gains can be read against them. How each ended is said in one word (record.ending)."""
    trials = list(trials)
    by_number = {t.number: t for t in trials}
    figures = {b.trial.number: b for b in ranked(trials)}
    # queued trials are not shown, save the baselines (queued first, they are what every result reads against)
    ordered = sorted((v for v in map(view, trials) if REMEASURE_ATTR not in by_number[v.number].user_attrs
                      and (by_number[v.number].state != TrialState.WAITING or v.baseline is not None)),
                     key=lambda v: (v.number not in figures, -(figures[v.number].figure if v.number in figures
                                                               else 0.0), v.number))
    shown = ordered[:limit] + [v for v in ordered[limit:] if v.baseline is not None]
    table = Table(title=escape(title), title_justify="left")
    # A GPU's memory (NVML) and a process tree's host memory (RSS) are different figures: each says which it is.
    for col in ("#", "ended", "output_throughput", "runs", "level", "p95_ttft_ms", "p95_tpot_ms", "peak memory",
                "configuration / reason"):
        table.add_column(col, justify="left" if col in ("ended", "configuration / reason") else "right",
                         overflow="fold")
    for v in shown:
        b = figures.get(v.number)
        at = view(by_number[b.figure_trial]) if b is not None else v  # the measurement the figure is
        detail = escape(v.label)  # flag values and vLLM's words are text, never markup
        if b is None and v.reason:
            detail += f"\n[dim]{escape(v.reason[:160])}[/]"
        table.add_row(
            str(v.number), escape(v.ending), f"{b.figure:,.0f}" if b is not None and b.figure else "-",
            str(len(b.measurements)) if b is not None else "1", _best_level(at),
            f"{at.p95_ttft_ms:.0f}" if b is not None and at.p95_ttft_ms is not None else "-",
            f"{at.p95_tpot_ms:.1f}" if b is not None and at.p95_tpot_ms is not None else "-",
            memory_text(at.peak_memory_gib, at.memory_source, short=True, cap_gib=at.cap_gib), detail,
        )
    return table


def calibration_text(v) -> str:
    """Whether the estimate is fitted on this study's warm boots on this card and vLLM version."""
    if v.calibrated_by:
        return f"calibrated on {v.calibrated_by} warm boot{'s' if v.calibrated_by > 1 else ''} ({v.predicted_on})"
    return f"uncalibrated ({v.predicted_on})" if v.predicted_on else "uncalibrated"


def verdict_text(v) -> str:
    """fits / booted to learn (inside the band, or not modelled) / refused, and why."""
    if not v.fits:
        return f"refused: {v.reason}"
    return f"boot: {v.reason}" if v.reason else "fits"


def estimates_table(rows, *, title: str) -> Table:
    """rows: (label, model, flags, feasibility.Verdict)."""
    t = Table(title=escape(title), title_justify="left", caption=escape(calibration_text(rows[0][3])) if rows else None)
    for col in ("configuration", "weights", "KV cache", "KV tokens (range)", "conc. at max len", "verdict"):
        t.add_column(col, justify="left" if col in ("configuration", "verdict") else "right", overflow="fold")
    for label, model, _flags, v in rows:
        e = v.estimate
        verdict = verdict_text(v)
        shown = ("[green]fits[/]" if verdict == "fits" else f"[red]refused[/]: {escape(v.reason)}" if not v.fits
                 else f"[yellow]boot[/]: {escape(v.reason)}")
        t.add_row(f"{escape(label)}\n[dim]{escape(model)}[/]", format_gib(e.weights_bytes, 1),
                  f"{format_gib(e.kv_cache_bytes)} ± {format_gib(e.uncertainty_bytes)}",
                  f"{e.kv_tokens:,}\n[dim]{e.kv_tokens_low:,}-{e.kv_tokens_high:,}[/]",
                  f"{e.max_concurrency_at_max_len:.1f}x", shown)
    return t


def estimates_json(rows, *, profile_name: str) -> str:
    """`autotune estimate --format json`: one document, for scripts."""
    out = []
    for label, model, flags, v in rows:
        e = v.estimate
        out.append({"configuration": label, "model": model, "flags": flags, "verdict": verdict_text(v),
                    "boot": v.fits, "refused": not v.fits, "reason": v.reason, "fits_at_centre": e.fits,
                    "kv_tokens": e.kv_tokens, "kv_tokens_low": e.kv_tokens_low, "kv_tokens_high": e.kv_tokens_high,
                    "kv_cache_bytes": e.kv_cache_bytes, "uncertainty_bytes": e.uncertainty_bytes,
                    "weights_bytes": e.weights_bytes, "activation_peak_bytes": e.activation_peak_bytes,
                    "cudagraph_bytes": e.cudagraph_bytes, "overhead_bytes": e.overhead_bytes,
                    "boot_peak_bytes": e.boot_peak_bytes,
                    "max_concurrency_at_max_len": e.max_concurrency_at_max_len,
                    "not_modelled": list(e.not_modelled), "calibrated_by": v.calibrated_by,
                    "calibration": calibration_text(v), "vllm_version": e.vllm_version,
                    "vision_encoder_bytes": e.vision_bytes,
                    "version_note": e.version_note})
    return json.dumps({"hardware": profile_name, "configurations": out}, indent=1, default=str)


def breakdown_rows(est: Estimate) -> list[tuple[str, str]]:
    """An estimate's figures as (item, value) lines, for `autotune estimate`."""
    g = format_gib
    rows = [("weights", g(est.weights_bytes)), ("activation peak", g(est.activation_peak_bytes)),
            ("CUDA graphs", g(est.cudagraph_bytes)), ("overhead", g(est.overhead_bytes)),
            ("reserved (total x utilization)", g(est.reserved_bytes)), ("KV cache", g(est.kv_cache_bytes)),
            ("KV per token", f"{est.kv_bytes_per_token / 1024:.1f} KiB")]
    if est.vision_bytes:
        rows.insert(1, ("of which the vision encoder", f"{g(est.vision_bytes)} (language_model_only=true frees it)"))
    if est.boot_peak_bytes:
        rows.append(("boot peak (outside the budget)", g(est.boot_peak_bytes)))
    if est.state_bytes_per_seq:
        rows.append(("state per sequence", f"{est.state_bytes_per_seq / MiB:.1f} MiB"))
    rows += [("block size", f"{est.block_size} tokens"),
             ("blocks", f"{est.num_blocks} x {est.bytes_per_block / MiB:.2f} MiB"),
             ("KV tokens", f"{est.kv_tokens:,} (range {est.kv_tokens_low:,}-{est.kv_tokens_high:,})"),
             ("uncertainty of the non-KV memory", g(est.uncertainty_bytes)),
             (f"max concurrency at {est.max_model_len:,} tokens", f"{est.max_concurrency_at_max_len:.2f}x"),
             ("sequences running at once, at most", str(est.max_running_seqs)),
             ("fits", "yes" if est.fits else "refused" if est.refused else "inside the band: booted to learn")]
    rows += [("reason", r) for r in est.reasons]
    rows += [("vLLM modelled", est.vllm_version)] + ([("note", est.version_note)] if est.version_note else [])
    return rows


def breakdown_table(est: Estimate, *, title: str) -> Table:
    t = Table(title=escape(title), title_justify="left", show_header=False)
    t.add_column("item")
    t.add_column("value", overflow="fold")
    for item, value in breakdown_rows(est):
        t.add_row(escape(item), escape(value))
    return t
