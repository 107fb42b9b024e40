"""The study as pictures: Pareto plots, history, importances, load curves, and one offline HTML report.

Everything is read from the trials' user attributes (outcome.py writes them, units in their names), so a report
can be made from any study database, finished or still running, on a machine without vLLM or a GPU.
"""

from __future__ import annotations

import html
import math
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import optuna
import plotly.graph_objects as go
from optuna.trial import FrozenTrial, TrialState
from plotly.subplots import make_subplots

from autotune.errors import AutotuneError
from autotune.measure.memory import memory_source_name, memory_text
from autotune.search.record import (
    REMEASURE_ATTR,
    TrialView,
    _level_of,
    at_level,
    feasible,
    view,
    views,
    why_not,
)
from autotune.search.remeasure import best_trial

LATENCY_TITLES = {"ttft_p95_ms": "p95 time to first token (ms)", "tpot_p95_ms": "p95 time per output token (ms)"}


BLUE, GREEN, ORANGE, GREY, RED = "#1f77b4", "#2ca02c", "#ff7f0e", "#9e9e9e", "#d62728"


PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#ff7f0e", "#7f7f7f")


MIN_IMPORTANCE_CONFIGS = 4  # distinct booted configurations: fewer say nothing about which parameter matters


THROUGHPUT = "output tokens/s (best level within the limits)"


def _memory_text(v: TrialView) -> str:
    return f"peak {memory_text(v.peak_memory_gib, v.memory_source)}"


def remeasure_views(study: optuna.Study) -> list[TrialView]:
    return [view(t) for t in study.get_trials(deepcopy=False)
            if t.state.is_finished() and REMEASURE_ATTR in t.user_attrs]


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats: lower x (latency, memory) and higher y (throughput) are
    better. Sorted by x, so the front can be drawn left to right."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front: list[int] = []
    best_y = -math.inf
    for i in order:
        if points[i][1] > best_y:
            front.append(i)
            best_y = points[i][1]
    return front


@dataclass(frozen=True)
class Gain:
    """The best feasible trial against one baseline: gain_pct is None when the baseline is not feasible."""

    baseline: str
    number: int
    throughput: float | None
    gain_pct: float | None
    reason: str


def gains(study: optuna.Study) -> list[Gain]:
    """Against each baseline's own measurement, the winner's figure (remeasure.best)."""
    best = best_trial(study)
    out = []
    for v in views(study):
        if v.baseline is None or v.kind == "running":
            continue
        # a baseline without a (non-zero) feasible figure has no gain: its reason is shown instead
        figure = v.throughput if v.kind == "feasible" and v.throughput else None
        pct = (best.figure / figure - 1) * 100 if figure is not None and best is not None and best.figure else None
        out.append(Gain(v.baseline, v.number, figure, pct, "" if figure is not None else v.reason or v.kind))
    return out


def _hover(v: TrialView) -> str:
    lines = [f"<b>trial {v.number}</b> ({v.kind})", _wrap(v.label)]
    if v.throughput is not None:
        lines.append(f"{v.throughput:,.0f} output tok/s {at_level(v)}")
    if v.ttft_p95_ms is not None:
        lines.append(f"p95 TTFT {v.ttft_p95_ms:,.0f} ms, p95 TPOT {v.tpot_p95_ms or 0:,.1f} ms")
    if v.peak_memory_gib is not None:
        lines.append(_memory_text(v))
    if v.kind != "feasible" and v.reason:
        lines.append("<i>" + _wrap(v.reason) + "</i>")
    return "<br>".join(lines)


def _wrap(text: str, width: int = 70) -> str:
    out, line = [], ""
    for word in html.escape(text).split(" "):
        if line and len(line) + len(word) > width:
            out.append(line)
            line = ""
        line = f"{line} {word}" if line else word
    return "<br>".join(out + [line])


def _points(fig: go.Figure, vs: list[TrialView], x: Callable[[TrialView], object], y: Callable[[TrialView], object],
            name: str, **marker) -> None:
    fig.add_trace(go.Scatter(
        x=[x(v) for v in vs], y=[y(v) for v in vs], mode="markers", name=name, hovertext=[_hover(v) for v in vs],
        hoverinfo="text", marker={"size": 10, "line": {"width": 1, "color": "white"}, **marker},
    ))


def _tradeoff(study: optuna.Study, x: Callable[[TrialView], float | None], x_title: str, title: str,
              limit: float | None = None) -> go.Figure:
    """Throughput against a cost (a latency, memory): feasible trials, their Pareto front, baselines, the best
    trial, the measured infeasible trials in grey, and the limit as a vertical line."""
    vs = [v for v in views(study) if v.kind != "running"]
    placed = [v for v in vs if x(v) is not None and v.throughput is not None]
    ok = [v for v in placed if v.kind == "feasible"]
    front = [ok[i] for i in pareto_front([(x(v), v.throughput) for v in ok])]  # type: ignore[misc]
    fig = go.Figure()
    _points(fig, [v for v in placed if v.kind not in ("feasible", "pruned")], x, lambda v: v.throughput,
            "missed the limits (at its lowest load level)", color=GREY, symbol="x")
    _points(fig, [v for v in placed if v.kind == "pruned"], x, lambda v: v.throughput,
            "pruned (its best level before the cut)", color=GREY, symbol="circle-open")
    _points(fig, [v for v in ok if v.baseline is None], x, lambda v: v.throughput, "feasible trial", color=BLUE)
    fig.add_trace(go.Scatter(x=[x(v) for v in front], y=[v.throughput for v in front], mode="lines",
                             line={"shape": "hv", "color": GREEN, "width": 2}, name="Pareto front", hoverinfo="skip"))
    base = [v for v in placed if v.baseline is not None]
    _points(fig, base, x, lambda v: v.throughput, "baseline", color=ORANGE, symbol="star", size=16)
    for v in base:
        fig.add_annotation(x=x(v), y=v.throughput, text=v.baseline, showarrow=False, yshift=-16,
                           font={"color": ORANGE})
    _remeasurements(fig, study, x)
    best = best_trial(study)
    if best is not None and x(bv := view(best.trial)) is not None:
        # On the configuration's figure (all its measurements), at the cost its first measurement showed.
        fig.add_trace(go.Scatter(x=[x(bv)], y=[best.figure], mode="markers", name=f"best: trial {bv.number}",
                                 hovertext=[f"<b>best: {html.escape(best.text)}</b><br>{_hover(bv)}"],
                                 hoverinfo="text",
                                 marker={"size": 20, "symbol": "circle-open", "color": GREEN, "line": {"width": 3}}))
        fig.add_annotation(x=x(bv), y=best.figure, text=_best_text(study, bv), showarrow=True, arrowhead=2, ax=-60,
                           ay=-30, font={"color": GREEN}, align="right", xanchor="right")
    if limit is not None:
        fig.add_vline(x=limit, line={"color": RED, "dash": "dash"}, annotation_text=f"limit {limit:g}",
                      annotation_position="bottom right", annotation_font_color=RED)
    unplaced = len(vs) - len(placed)
    if unplaced:
        fig.add_annotation(xref="paper", yref="paper", x=1, y=-0.2, showarrow=False, xanchor="right",
                           text=f"{unplaced} trial(s) without a measurement not shown: see the chart of trials "
                           "that were not feasible",
                           font={"size": 11, "color": GREY})
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=THROUGHPUT, template="plotly_white",
                      hoverlabel={"align": "left"}, legend={"orientation": "h", "y": -0.28}, margin={"b": 120})
    fig.update_yaxes(rangemode="tozero")
    return fig


def _remeasurements(fig: go.Figure, study: optuna.Study, x: Callable[[TrialView], float | None]) -> None:
    """Each re-measurement as a point joined by a thin line to its configuration's first measurement (filled:
    it met the limits; open: it missed them, drawn at its lowest load level)."""
    first = {v.number: v for v in views(study)}
    again = [v for v in remeasure_views(study) if x(v) is not None and v.throughput is not None]
    if not again:
        return
    xs: list[object] = []
    ys: list[object] = []
    for v in again:
        o = first.get(v.remeasure_of)  # type: ignore[arg-type]
        if o is not None and x(o) is not None and o.throughput is not None:
            xs += [x(o), x(v), None]
            ys += [o.throughput, v.throughput, None]
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line={"color": BLUE, "width": 1, "dash": "dot"},
                             hoverinfo="skip", showlegend=False))
    fig.add_trace(go.Scatter(
        x=[x(v) for v in again], y=[v.throughput for v in again], mode="markers",
        name="re-measurement (joined to its trial)", hovertext=[_hover(v) for v in again], hoverinfo="text",
        marker={"size": 9, "color": BLUE, "line": {"width": 1, "color": BLUE},
                "symbol": ["diamond" if v.kind == "feasible" else "diamond-open" for v in again]},
    ))


def _best_text(study: optuna.Study, best: TrialView) -> str:
    text = f"best: trial {best.number}" + (f" ({best.baseline})" if best.baseline else "")
    for g in gains(study):
        if g.gain_pct is not None and g.number != best.number:
            text += f"<br>{g.gain_pct:+.0f}% vs {g.baseline}"
    return text


def latency_figure(study: optuna.Study, metric: str = "ttft_p95_ms") -> go.Figure:
    limit = (study.user_attrs.get("limits") or {}).get(metric)
    title = f"Throughput against {LATENCY_TITLES[metric].split(' (')[0]}"
    return _tradeoff(study, lambda v: getattr(v, metric), LATENCY_TITLES[metric], title, limit)


def memory_axis_title(study: optuna.Study) -> str:
    """What the memory axis measures, from the sources recorded with the peaks: one, or each with its count."""
    counts: dict[str | None, int] = {}
    for t in study.get_trials(deepcopy=False):
        if "peak_memory_gib" in t.user_attrs:
            source = t.user_attrs.get("memory_source")
            counts[source] = counts.get(source, 0) + 1
    if not counts:
        return "peak memory, GiB"
    if len(counts) == 1:
        return f"peak {memory_source_name(next(iter(counts)))}, GiB"
    parts = ", ".join(f"{memory_source_name(s)} for {n} trial(s)" for s, n in counts.items())
    return f"peak memory, GiB: {parts} (not comparable)"


def memory_figure(study: optuna.Study) -> go.Figure:
    return _tradeoff(study, lambda v: v.peak_memory_gib, memory_axis_title(study), "Throughput against peak memory")


def history_figure(study: optuna.Study) -> go.Figure:
    """Best feasible throughput so far, by trial number and by the time trials finished."""
    vs = [v for v in views(study) if v.kind != "running"]
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.05,
                        subplot_titles=("by trial number", "by wall-clock time (trial finished)"))
    timed = sorted((v for v in vs if v.completed is not None), key=lambda v: v.completed or datetime.min)
    for col, ordered, x in ((1, sorted(vs, key=lambda v: v.number), lambda v: v.number),
                            (2, timed, lambda v: v.completed)):
        best, ys = 0.0, []
        for v in ordered:
            best = max(best, v.throughput or 0.0) if v.kind == "feasible" else best
            ys.append(best)
        fig.add_trace(go.Scatter(x=[x(v) for v in ordered], y=ys, mode="lines", line={"shape": "hv", "color": GREEN},
                                 name="best feasible so far", showlegend=col == 1, legendgroup="best"), 1, col)
        for kind, color, symbol, keep in (
            ("feasible trial", BLUE, "circle", lambda v: v.kind == "feasible" and v.baseline is None),
            ("baseline", ORANGE, "star", lambda v: v.kind == "feasible" and v.baseline is not None),
            ("not feasible (shown at 0)", GREY, "x", lambda v: v.kind != "feasible"),
        ):
            sel = [v for v in ordered if keep(v)]
            fig.add_trace(go.Scatter(
                x=[x(v) for v in sel], y=[v.throughput if v.kind == "feasible" else 0 for v in sel], mode="markers",
                name=kind, legendgroup=kind, showlegend=col == 1, hovertext=[_hover(v) for v in sel],
                hoverinfo="text", marker={"color": color, "symbol": symbol, "size": 14 if symbol == "star" else 9},
            ), 1, col)
    for g in gains(study):
        if g.throughput is not None:
            fig.add_hline(y=g.throughput, line={"color": ORANGE, "dash": "dot", "width": 1},
                          annotation_text=g.baseline, annotation_font_color=ORANGE)
    fig.update_layout(title="Best throughput found so far", yaxis_title=THROUGHPUT, template="plotly_white",
                      hoverlabel={"align": "left"})
    fig.update_yaxes(rangemode="tozero")
    fig.update_xaxes(title_text="trial", row=1, col=1)
    return fig


@dataclass(frozen=True)
class ImportanceBasis:
    """What an importance chart stands on: the finished trials it is computed from (re-measurements left out)
    and how many distinct configurations among them booted a server (the rest were refused before boot)."""

    trials: tuple[FrozenTrial, ...]
    booted_configs: int

    @property
    def enough(self) -> bool:
        return self.booted_configs >= MIN_IMPORTANCE_CONFIGS

    def describe(self) -> str:
        return f"{len(self.trials)} finished trials, {self.booted_configs} booted configurations"


def importance_basis(study: optuna.Study) -> ImportanceBasis:
    done = tuple(t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                 if REMEASURE_ATTR not in t.user_attrs)
    booted = {t.user_attrs.get("flags", str(t.params)) for t in done if t.user_attrs.get("booted") is not False}
    return ImportanceBasis(done, len(booted))


def param_importances(study: optuna.Study) -> dict[str, float]:
    """PED-ANOVA importances: which parameters it takes to reach the top trials by feasible throughput
    (infeasible trials count as 0). PED-ANOVA needs no scikit-learn, unlike fANOVA. Empty when fewer than
    MIN_IMPORTANCE_CONFIGS distinct configurations booted, or there is too little variety, to say."""
    import warnings

    basis = importance_basis(study)
    if not basis.enough:
        return {}
    storage = optuna.storages.InMemoryStorage()  # the originals only; a baseline may lie outside the space, as
    done = optuna.create_study(storage=storage, directions=study.directions)  # add_trials would refuse
    study_id = storage.get_study_id_from_name(done.study_name)
    for t in basis.trials:
        storage.create_new_trial(study_id, template_trial=t)
    evaluator = optuna.importance.PedAnovaImportanceEvaluator(
        target_quantile=min(0.5, max(0.1, 2 / len(basis.trials))))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            imp = optuna.importance.get_param_importances(
                done, evaluator=evaluator, target=lambda t: -((t.value or 0.0) if feasible(t) else 0.0))
    except (ValueError, RuntimeError, ZeroDivisionError):  # no shared parameters, a single distinct value, ...
        return {}
    return imp if any(v > 0 for v in imp.values()) else {}


def importance_figure(study: optuna.Study) -> go.Figure:
    basis = importance_basis(study)
    imp = param_importances(study)
    fig = go.Figure()
    title = "Which parameters it takes to reach the top trials (PED-ANOVA importance)"
    if imp:
        names = list(imp)[::-1]
        fig.add_trace(go.Bar(x=[imp[n] for n in names], y=names, orientation="h", marker_color=BLUE,
                             text=[f"{imp[n]:.2f}" for n in names], textposition="auto"))
        title += f"<br><sup>based on {basis.describe()}</sup>"
    else:
        why = (f"Not enough trials yet: importances need at least {MIN_IMPORTANCE_CONFIGS} booted configurations; "
               f"this study has {basis.booted_configs} booted configuration(s) of {len(basis.trials)} finished "
               "trials." if not basis.enough else
               f"No importance to show: the {basis.describe()} do not differ enough in their parameters or results.")
        fig.add_annotation(text=why, xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False)
    fig.update_layout(title=title, template="plotly_white",
                      xaxis_title="importance (sums to 1)", height=max(300, 80 + 40 * len(imp)))
    return fig


def levels_figure(study: optuna.Study, top: int = 3) -> go.Figure:
    """Throughput and p95 TTFT against load level for the best trials and the baselines."""
    vs = views(study)
    ranked = sorted((v for v in vs if v.kind == "feasible" and v.levels), key=lambda v: -(v.throughput or 0))[:top]
    chosen = ranked + [v for v in vs if v.baseline is not None and v.levels and v not in ranked]
    limit = (study.user_attrs.get("limits") or {}).get("ttft_p95_ms")
    rate = any("rate_req_s" in lv for v in chosen for lv in v.levels)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.08,
                        subplot_titles=("output tokens/s", "p95 time to first token (ms)"))
    for i, v in enumerate(chosen):
        color = ORANGE if v.baseline is not None and i >= len(ranked) else PALETTE[i % len(PALETTE)]
        name = f"trial {v.number}" + (f" ({v.baseline})" if v.baseline else "")
        xs = [_level_of(lv) for lv in v.levels]
        symbols = ["circle" if lv.get("passed") else "circle-open" for lv in v.levels]
        hover = [f"{name}<br>level {_level_of(lv):g}: {lv['output_tok_s']:,.0f} tok/s, p95 TTFT "
                 f"{lv['ttft_p95_ms']:,.0f} ms, {'passed' if lv.get('passed') else 'missed the limits'}"
                 for lv in v.levels]
        dash = "dash" if v.baseline is not None else "solid"
        for col, key in ((1, "output_tok_s"), (2, "ttft_p95_ms")):
            fig.add_trace(go.Scatter(
                x=xs, y=[lv[key] for lv in v.levels], mode="lines+markers", name=name, legendgroup=name,
                showlegend=col == 1, line={"color": color, "dash": dash}, hovertext=hover, hoverinfo="text",
                marker={"symbol": symbols, "size": 9, "color": color},
            ), 1, col)
    if limit is not None:
        fig.add_hline(y=limit, line={"color": RED, "dash": "dash"}, annotation_text=f"limit {limit:g} ms",
                      annotation_font_color=RED, row=1, col=2)
    ticks: list[float] = []
    for t in sorted({level for v in chosen for lv in v.levels if (level := _level_of(lv)) is not None}):
        if not ticks or t >= ticks[-1] * 1.3:  # on a log axis, closer labels overlap
            ticks.append(t)
    fig.update_xaxes(type="log", tickvals=ticks, ticktext=[f"{t:g}" for t in ticks],
                     title_text="request rate (req/s)" if rate else "concurrency (requests in flight)")
    fig.update_yaxes(rangemode="tozero")
    fig.update_layout(title="Load levels of the best trials and the baselines (open markers: missed the limits)",
                      template="plotly_white", hoverlabel={"align": "left"})
    return fig


def infeasible_figure(study: optuna.Study) -> go.Figure:
    bad = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished() and not feasible(t)]
    fig = go.Figure()
    if bad:
        fig.add_trace(go.Scatter(
            x=[t.number for t in bad], y=[why_not(t) for t in bad], mode="markers", hoverinfo="text",
            hovertext=[_hover(view(t)) for t in bad], marker={"symbol": "x", "size": 12, "color": RED},
            name="not feasible"))
    else:
        fig.add_annotation(text="Every finished trial was feasible.", xref="paper", yref="paper", x=0.5, y=0.5,
                           showarrow=False)
    fig.update_layout(title="Trials that were not feasible, and why (hover for the reason)", xaxis_title="trial",
                      template="plotly_white", height=320, hoverlabel={"align": "left"})
    fig.update_xaxes(tickformat="d", dtick=1 if len(bad) < 30 else None)
    return fig


def figures(study: optuna.Study) -> dict[str, go.Figure]:
    return {
        "pareto_ttft": latency_figure(study, "ttft_p95_ms"),
        "pareto_tpot": latency_figure(study, "tpot_p95_ms"),
        "pareto_memory": memory_figure(study),
        "history": history_figure(study),
        "levels": levels_figure(study),
        "importances": importance_figure(study),
        "infeasible": infeasible_figure(study),
    }


def _num(value: float | None, fmt: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{unit}"


def trials_table_html(study: optuna.Study, limit: int | None = 10) -> str:
    """Feasible trials by throughput (the first `limit`), then every baseline, with the command each boots."""
    vs = sorted((v for v in views(study) if v.kind != "running"),
                key=lambda v: (v.kind != "feasible", -(v.throughput or 0.0), v.number))
    top = vs if limit is None else vs[:limit] + [v for v in vs[limit:] if v.baseline is not None]
    head = ("#", "trial", "result", "output tok/s", "level", "p95 TTFT", "p95 TPOT", "peak memory", "configuration")
    rows = []
    for rank, v in enumerate(top, 1):
        result = v.reason if v.reason.startswith(v.kind) else f"{v.kind}: {v.reason}" if v.reason else v.kind
        cls = " class='baseline'" if v.baseline else ""
        rows.append(f"<tr{cls}><td>{rank}</td><td>{v.number}</td><td>{html.escape(result)}</td>"
                    f"<td>{_num(v.throughput if v.kind == 'feasible' else None, ',.0f')}</td>"
                    f"<td>{_num(v.level if v.kind == 'feasible' else None, 'g')}</td>"
                    f"<td>{_num(v.ttft_p95_ms if v.kind == 'feasible' else None, ',.0f', ' ms')}</td>"
                    f"<td>{_num(v.tpot_p95_ms if v.kind == 'feasible' else None, ',.1f', ' ms')}</td>"
                    f"<td>{html.escape(memory_text(v.peak_memory_gib, v.memory_source, short=True))}</td>"
                    f"<td>{html.escape(v.label)}<br><code>{html.escape(v.command)}</code></td></tr>")
    return (f"<table><thead><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def summary_html(study: optuna.Study) -> str:
    vs = views(study)
    counts = {k: sum(v.kind == k for v in vs) for k in ("feasible", "infeasible", "pruned", "failed", "running")}
    again = remeasure_views(study)
    a = study.user_attrs
    limits = ", ".join(f"{k} &le; {v:g}" for k, v in (a.get("limits") or {}).items()) or "none recorded"
    parts = [f"<p>Objective <b>{html.escape(str(a.get('objective', '?')))}</b> (limits: {limits}) on hardware "
             f"<b>{html.escape(str(a.get('hardware', '?')))}</b>. {len(vs)} trials: "
             + ", ".join(f"{n} {k}" for k, n in counts.items() if n)
             + (f"; {len(again)} re-measurement(s) of the top ones" if again else "") + ".</p>"]
    best = best_trial(study)
    if best is None:
        parts.append("<p class='bad'>No feasible configuration yet.</p>")
    else:
        b = view(best.trial)
        parts.append(f"<p class='best'><b>best: {html.escape(best.text)}</b></p>"
                     f"<p>Its first measurement: {_num(b.throughput, ',.0f', ' output tok/s')} {at_level(b)} "
                     f"(p95 TTFT {_num(b.ttft_p95_ms, ',.0f', ' ms')}, p95 TPOT {_num(b.tpot_p95_ms, ',.1f', ' ms')}, "
                     f"{_memory_text(b)})</p><pre>{html.escape(b.command)}</pre>")
    items = [f"<li>{html.escape(g.baseline)} (trial {g.number}): "
             + ("the best trial itself" if best is not None and g.number == best.trial.number
                else f"{g.throughput:,.0f} tok/s; best is <b>{g.gain_pct:+.0f}%</b>" if g.gain_pct is not None
                else f"{_num(g.throughput, ',.0f', ' tok/s')}" if g.throughput is not None
                else f"not feasible ({html.escape(g.reason)})") + "</li>" for g in gains(study)]
    if items:
        parts.append(f"<p>Against the baselines:</p><ul>{''.join(items)}</ul>")
    return "".join(parts)


_CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222}
table{border-collapse:collapse;font-size:13px}td,th{border-bottom:1px solid #ddd;padding:4px 8px;text-align:left;
vertical-align:top}tr.baseline{background:#fff4e5}code,pre{font-size:12px;white-space:pre-wrap;word-break:break-all}
pre{background:#f6f6f6;padding:8px}.best{color:#2ca02c}.bad{color:#d62728}"""


@dataclass(frozen=True)
class ReportFiles:
    html: Path
    pngs: tuple[Path, ...]
    png_error: str | None = None  # why no PNGs were written when they were optional (no Chromium)


def write_report(study: optuna.Study, out_dir: Path, *, png: bool | None = True) -> ReportFiles:
    """One self-contained HTML file (plotly.js inline: it opens offline) and PNGs of the two Pareto plots.
    png=None: the PNGs where Chromium can render them; the HTML is the report either way."""
    out_dir.mkdir(parents=True, exist_ok=True)
    figs = figures(study)
    divs = [fig.to_html(full_html=False, include_plotlyjs=(i == 0), div_id=key,
                        config={"displaylogo": False, "responsive": True})
            for i, (key, fig) in enumerate(figs.items())]
    name = study.study_name
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>autotune: {html.escape(name)}</title>"
            f"<style>{_CSS}</style></head><body><h1>autotune study {html.escape(name)}</h1>{summary_html(study)}"
            + "".join(divs[:4]) + f"<h2>Top trials and baselines</h2>{trials_table_html(study)}"
            + "".join(divs[4:]) + "</body></html>")
    html_path = out_dir / f"{name}.html"
    html_path.write_text(page, encoding="utf-8")
    if png is False:
        return ReportFiles(html_path, ())
    pngs = (out_dir / f"{name}-pareto-latency.png", out_dir / f"{name}-pareto-memory.png")
    try:
        export_pngs([figs["pareto_ttft"], figs["pareto_memory"]], pngs)
    except AutotuneError as e:
        if png:
            raise
        return ReportFiles(html_path, (), str(e))
    return ReportFiles(html_path, pngs)


def export_pngs(figs: Sequence[go.Figure], paths: Sequence[Path], width: int = 1100, height: int = 650) -> None:
    """PNG export runs plotly.js in a headless Chromium (kaleido 1.x): the system's chromium when it has one."""
    import logging

    import plotly.io as pio

    logging.getLogger("choreographer").setLevel(logging.CRITICAL)  # logs (and ignores) torn DevTools messages
    if "BROWSER_PATH" not in os.environ and (chromium := shutil.which("chromium")):
        os.environ["BROWSER_PATH"] = chromium
    try:
        pio.write_images(list(figs), [str(p) for p in paths], format="png", width=width, height=height, scale=1)
    except Exception as e:  # kaleido raises its own types (and paragraphs) for a missing or crashing browser
        detail = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
        raise AutotuneError(f"PNG export failed ({type(e).__name__}: {detail}); it needs Chromium: "
                            "`apt-get install chromium`, or run `plotly_get_chrome`, or pass --no-png") from e
