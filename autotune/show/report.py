"""The study as pictures: Pareto plots, history, importances, load curves, and the gains over the baselines
(show/page.py puts them on one offline HTML page).

Everything is read through the trial read model (search/record.TrialView), so a report can be made from any
study database, finished or still running, on a machine without vLLM or a GPU.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

import optuna
import plotly.graph_objects as go
from optuna.trial import FrozenTrial, TrialState
from plotly.subplots import make_subplots

from autotune.search import remeasure
from autotune.search.record import (
    SCREENED_OUT,
    TrialView,
    at_level,
    energy_text,
    feasible,
    level_value,
    memory_source_name,
    peak_text,
    remeasure_views,
    study_limits,
    view,
    views,
)
from autotune.search.remeasure import best_trial
from autotune.show.bought import baseline_gains, bought_figure

LATENCY_TITLES = {"p95_ttft_ms": "p95_ttft_ms (p95 time to first token)",
                  "p95_tpot_ms": "p95_tpot_ms (p95 time per output token)"}


BLUE, GREEN, ORANGE, GREY, RED = "#1f77b4", "#2ca02c", "#ff7f0e", "#9e9e9e", "#d62728"


PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#ff7f0e", "#7f7f7f")


MIN_IMPORTANCE_CONFIGS = 4  # distinct booted configurations: fewer say nothing about which parameter matters


THROUGHPUT = "output_throughput, tok/s (best level within the limits)"


def _memory_text(v: TrialView) -> str:
    return peak_text(v.peak_memory_gib, v.boot_peak_memory_gib, v.memory_source, v.cap_gib)


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
    """Against each baseline, the winner's gain as the report's first panel states it (bought.baseline_gains:
    paired where the comparison measured it), beside the baseline's own figure."""
    trials = study.get_trials(deepcopy=False)
    out = []
    for g in baseline_gains(study):
        own = remeasure.best(trials, keep=lambda t, n=g.trial: t.number == n)  # type: ignore[misc]
        figure = own.figure if own is not None and own.figure else None
        out.append(Gain(g.baseline, g.trial, figure, g.mid * 100 if g.mid is not None else None,
                        "" if figure is not None else g.how))
    return out


def _hover(v: TrialView) -> str:
    lines = [f"<b>trial {v.number}</b> ({v.ending})", _wrap(v.label)]
    if v.throughput is not None:
        lines.append(f"{v.throughput:,.0f} output tok/s {at_level(v)}")
    if v.p95_ttft_ms is not None:
        lines.append(f"p95 TTFT {v.p95_ttft_ms:,.0f} ms, p95 TPOT {v.p95_tpot_ms or 0:,.1f} ms")
    if v.booted and v.throughput is not None:
        lines.append(energy_text(v.joules_per_token))
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
    for ended in dict.fromkeys(v.ending for v in placed if v.kind not in ("feasible", "pruned")):
        _points(fig, [v for v in placed if v.ending == ended and v.kind != "feasible"], x, lambda v: v.throughput,
                f"{ended} (at its lowest load level)", color=GREY, symbol="x")
    _points(fig, [v for v in placed if v.kind == "pruned"], x, lambda v: v.throughput,
            f"{SCREENED_OUT} (its best level before the cut)", color=GREY, symbol="circle-open")
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


def latency_figure(study: optuna.Study, metric: str = "p95_ttft_ms") -> go.Figure:
    limit = study_limits(study).get(metric)
    title = f"Throughput against {LATENCY_TITLES[metric].split(' (')[0]}"
    return _tradeoff(study, lambda v: getattr(v, metric), LATENCY_TITLES[metric], title, limit)


def memory_axis_title(study: optuna.Study) -> str:
    """What the memory axis measures, from the sources recorded with the peaks: one, or each with its count."""
    counts: dict[str | None, int] = {}
    for v in map(view, study.get_trials(deepcopy=False)):
        if v.peak_memory_gib is not None:
            counts[v.memory_source] = counts.get(v.memory_source, 0) + 1
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
                 if view(t).remeasure_of is None)
    booted = {v.config_key for v in map(view, done) if v.booted}
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
    limit = study_limits(study).get("p95_ttft_ms")
    rate = any("rate_req_s" in lv for v in chosen for lv in v.levels)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.08,
                        subplot_titles=("output_throughput (tok/s)", "p95_ttft_ms"))
    for i, v in enumerate(chosen):
        color = ORANGE if v.baseline is not None and i >= len(ranked) else PALETTE[i % len(PALETTE)]
        name = f"trial {v.number}" + (f" ({v.baseline})" if v.baseline else "")
        xs = [level_value(lv) for lv in v.levels]
        symbols = ["circle" if lv.get("passed") else "circle-open" for lv in v.levels]
        hover = [f"{name}<br>level {level_value(lv):g}: {lv['output_throughput']:,.0f} tok/s, p95 TTFT "
                 f"{lv['p95_ttft_ms']:,.0f} ms, {'passed' if lv.get('passed') else 'missed the limits'}"
                 for lv in v.levels]
        dash = "dash" if v.baseline is not None else "solid"
        for col, key in ((1, "output_throughput"), (2, "p95_ttft_ms")):
            fig.add_trace(go.Scatter(
                x=xs, y=[lv[key] for lv in v.levels], mode="lines+markers", name=name, legendgroup=name,
                showlegend=col == 1, line={"color": color, "dash": dash}, hovertext=hover, hoverinfo="text",
                marker={"symbol": symbols, "size": 9, "color": color},
            ), 1, col)
    if limit is not None:
        fig.add_hline(y=limit, line={"color": RED, "dash": "dash"}, annotation_text=f"limit {limit:g} ms",
                      annotation_font_color=RED, row=1, col=2)
    ticks: list[float] = []
    for t in sorted({level for v in chosen for lv in v.levels if (level := level_value(lv)) is not None}):
        if not ticks or t >= ticks[-1] * 1.3:  # on a log axis, closer labels overlap
            ticks.append(t)
    fig.update_xaxes(type="log", tickvals=ticks, ticktext=[f"{t:g}" for t in ticks],
                     title_text="request rate (req/s)" if rate else "concurrency (requests in flight)")
    fig.update_yaxes(rangemode="tozero")
    fig.update_layout(title="Load levels of the best trials and the baselines (open markers: missed the limits)",
                      template="plotly_white", hoverlabel={"align": "left"})
    return fig


def infeasible_figure(study: optuna.Study) -> go.Figure:
    bad = [v for t in study.get_trials(deepcopy=False) if t.state.is_finished() and (v := view(t)).kind != "feasible"]
    fig = go.Figure()
    if bad:
        fig.add_trace(go.Scatter(
            x=[v.number for v in bad], y=[v.why_not for v in bad], mode="markers", hoverinfo="text",
            hovertext=[_hover(v) for v in bad], marker={"symbol": "x", "size": 12, "color": RED},
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
        "bought": bought_figure(study),
        "pareto_ttft": latency_figure(study, "p95_ttft_ms"),
        "pareto_tpot": latency_figure(study, "p95_tpot_ms"),
        "pareto_memory": memory_figure(study),
        "history": history_figure(study),
        "levels": levels_figure(study),
        "importances": importance_figure(study),
        "infeasible": infeasible_figure(study),
    }
