"""One offline HTML report of a study: a summary, the figures (show/report.py), the top trials with the command
each boots, and PNGs of the two Pareto plots."""

from __future__ import annotations

import html
import os
import shutil
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import optuna
import plotly.graph_objects as go

from autotune.errors import AutotuneError
from autotune.search import paired
from autotune.search.record import memory_text, remeasure_views, study_limits, view, views
from autotune.search.remeasure import Best, best_trial, figure_line, ranked
from autotune.show import bought
from autotune.show.longest_context import context_lines
from autotune.show.report import figures, gains


def _num(value: float | None, fmt: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{unit}"


def trials_table_html(study: optuna.Study, limit: int | None = 10) -> str:
    """Configurations by their figure (remeasure.Best, with the latencies of the measurement it is; the first
    `limit`), then every baseline, with the command each boots."""
    trials = study.get_trials(deepcopy=False)
    figures = {b.trial.number: b for b in ranked(trials)}
    vs = sorted((v for v in views(study) if v.kind != "running"),
                key=lambda v: (v.number not in figures, -(figures[v.number].figure if v.number in figures else 0.0),
                               v.number))
    top = vs if limit is None else vs[:limit] + [v for v in vs[limit:] if v.baseline is not None]
    head = ("#", "trial", "ended", "output_throughput", "runs", "level", "p95_ttft_ms", "p95_tpot_ms", "peak memory",
            "configuration")
    rows = []
    for rank, v in enumerate(top, 1):
        b = figures.get(v.number)
        at = view(trials[b.figure_trial]) if b is not None else v  # the measurement the figure is
        result = f"{v.ending}: {v.reason}" if v.reason and b is None else v.ending
        cls = " class='baseline'" if v.baseline else ""
        memory = memory_text(at.peak_memory_gib, at.memory_source, short=True, cap_gib=at.cap_gib)
        rows.append(f"<tr{cls}><td>{rank}</td><td>{v.number}</td><td>{html.escape(result)}</td>"
                    f"<td>{_num(b.figure if b is not None else None, ',.0f')}</td>"
                    f"<td>{len(b.measurements) if b is not None else 1}</td>"
                    f"<td>{_num(at.level if b is not None else None, 'g')}</td>"
                    f"<td>{_num(at.p95_ttft_ms if b is not None else None, ',.0f', ' ms')}</td>"
                    f"<td>{_num(at.p95_tpot_ms if b is not None else None, ',.1f', ' ms')}</td>"
                    f"<td>{html.escape(memory)}</td>"
                    f"<td>{html.escape(v.label)}<br><code>{html.escape(v.command)}</code></td></tr>")
    return (f"<table><thead><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def summary_html(study: optuna.Study) -> str:
    vs = views(study)
    counts = Counter(v.ending for v in vs)
    again = remeasure_views(study)
    a = study.user_attrs
    limits = ", ".join(f"{k} &le; {v:g}" for k, v in study_limits(study).items()) or "none recorded"
    parts = [f"<p>Objective <b>{html.escape(str(a.get('objective', '?')))}</b> (limits: {limits}) on hardware "
             f"<b>{html.escape(str(a.get('hardware', '?')))}</b>. {len(vs)} trials: "
             + ", ".join(f"{n} {k}" for k, n in counts.items() if n)
             + (f"; {len(again)} re-measurement(s) of the top ones" if again else "") + ".</p>"]
    best = best_trial(study)
    if best is None:
        parts.append("<p class='bad'>No feasible configuration yet.</p>")
    else:
        answer = paired.answer(study)
        parts.append(f"<p class='best'><b>best: {html.escape(best.text)}</b></p>"
                     + (f"<p class='answer'><b>answer: {html.escape(answer.sentence)}</b></p>" if answer else "")
                     + "".join(f"<p>{html.escape(line)}</p>" for line in paired.noise_lines(study))
                     + _figure_html(study, best))
    items = [f"<li>{html.escape(g.baseline)} (trial {g.number}): "
             + ("the best trial itself" if best is not None and g.number == best.trial.number
                else f"{g.throughput:,.0f} tok/s; best is <b>{g.gain_pct:+.0f}%</b>" if g.gain_pct is not None
                else f"{_num(g.throughput, ',.0f', ' tok/s')}" if g.throughput is not None
                else f"not feasible ({html.escape(g.reason)})") + "</li>" for g in gains(study)]
    if items:
        parts.append(f"<p>Against the baselines:</p><ul>{''.join(items)}</ul>")
    if longest := context_lines(study):
        parts.append(f"<p>{html.escape(longest[0])}</p><ul>"
                     + "".join(f"<li>{html.escape(line.strip())}</li>" for line in longest[1:]) + "</ul>")
    return "".join(parts)


def bought_html(study: optuna.Study) -> str:
    """The first panel's words (show/bought.py): the gain over each baseline, and what more time would add."""
    items = "".join(f"<li>{html.escape(line)}</li>" for line in bought.lines(study))
    return f"<h2>What the run bought</h2><ul class='bought'>{items}</ul>"


def _figure_html(study: optuna.Study, best: Best) -> str:
    """The measurement the winner's figure is (remeasure.figure_line), and the command it boots."""
    return (f"<p>{html.escape(figure_line(best, study.get_trials(deepcopy=False)))}</p>"
            f"<pre>{html.escape(view(best.trial).command)}</pre>")


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
            f"<style>{_CSS}</style></head><body><h1>autotune study {html.escape(name)}</h1>{bought_html(study)}"
            + divs[0] + summary_html(study) + "".join(divs[1:5])
            + f"<h2>Top trials and baselines</h2>{trials_table_html(study)}" + "".join(divs[5:]) + "</body></html>")
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
