"""The report's ``index.html`` (pure): one self-contained page, readable offline.

No script, no stylesheet or font from elsewhere: the style is inline and the figures are PNG files
next to the page, linked by relative path, so the folder can be copied, mailed or logged to MLflow
as it is. Every value is escaped. A figure a trial did not record reads "not recorded".
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import pandas as pd

from orchestrator.observe.report.sections import Extras
from orchestrator.observe.report.tables import ReportOptions, Slo

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.6em 0; }
th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: right; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; }
.muted { color: #777; } .bad { color: #b00; } .knee { font-weight: bold; background: #eef6ee; }
.diagnosis { background: #f6f6ee; padding: 0.5em; border-left: 3px solid #aa8; }
img { max-width: 100%; margin: 0.4em 0; }
"""
NOT_RECORDED = "not recorded"
HOLDOUT_COLUMNS = ["cores", "measured_s", "predicted_s", "error", "note"]


@dataclass(frozen=True)
class Section:
    """One configuration: its factors, its rows (one per core count) and what was drawn of it."""

    anchor: str
    label: str
    factors: Mapping[str, Any]
    rows: pd.DataFrame
    knee: int | None
    extras: Extras = Extras()
    plots: Mapping[str, str] = field(default_factory=dict)  # name -> path relative to the page
    costs: pd.DataFrame | None = None


@dataclass(frozen=True)
class Page:
    """Everything on the page."""

    sweep: str
    source: str
    opts: ReportOptions
    trials: int
    sections: Sequence[Section]
    heatmap: pd.DataFrame
    heatmap_png: str | None = None
    csvs: Mapping[str, str] = field(default_factory=dict)  # label -> path relative to the page
    notes: Sequence[str] = ()
    time_use: Sequence[str] = ()  # orchestrator.observe.time_use.describe_time_use lines
    start_modes: pd.DataFrame | None = None  # orchestrator.observe.report.comparison.calibration: each start mode vs fresh
    references: pd.DataFrame | None = None  # orchestrator.observe.report.comparison.references: harness vs bare vs vllm bench


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _nan(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or bool(pd.isna(v))


def _ms(v: Any) -> str:
    return "-" if _nan(v) else f"{1000 * float(v):.1f}"


def _ci(row: pd.Series, p: str) -> str:
    point, lo, hi = row[f"ttft_{p}_s"], row.get(f"ttft_{p}_lo"), row.get(f"ttft_{p}_hi")
    if _nan(point):
        return "-"
    if _nan(lo) or _nan(hi):
        return f"{_ms(point)} <span class='muted'>[no records]</span>"
    return f"{_ms(point)} <span class='muted'>[{_ms(lo)}, {_ms(hi)}]</span>"


def _num(v: Any, fmt: str = "{:.3g}", missing: str = "-") -> str:
    return missing if _nan(v) else fmt.format(float(v))


def _pairs(values: Mapping[str, Any]) -> str:
    """``name = value`` pairs (numbers to 4 significant digits; anything else as text)."""
    def one(v: Any) -> str:
        return _num(v, "{:.4g}") if isinstance(v, (int, float)) and not isinstance(v, bool) else _e(v)
    return ", ".join(f"{_e(k)} = {one(v)}" for k, v in values.items())


def _table(frame: pd.DataFrame, left: Sequence[str] = ()) -> str:
    """A plain table of a small frame (floats to 4 significant digits)."""
    head = "".join(f"<th class='{'l' if c in left else ''}'>{_e(c)}</th>" for c in frame.columns)
    body = []
    for _, r in frame.iterrows():
        cells = []
        for c in frame.columns:
            v = r[c]
            text = _num(v, "{:.4g}") if isinstance(v, float) else ("-" if _nan(v) else _e(v))
            cells.append(f"<td class='{'l' if c in left else ''}'>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _rows_table(rows: pd.DataFrame, slo: Slo) -> str:
    cols = ["cores", "status", "repeats", "requests", "TTFT p50 ms [CI]", "TTFT p90 ms [CI]", "TTFT p99 ms [CI]",
            "spread", "speedup", "timeout rate", "GPU util %", "replica CPU %", "frontend share"]
    if slo.given:
        cols += ["goodput req/s", "met SLOs"]
    out = ["<table><tr>" + "".join(f"<th>{_e(c)}</th>" for c in cols) + "</tr>"]
    for _, r in rows.iterrows():
        status = _e(r["status"]) + (f" <span class='bad'>({_e(r['cell'])})</span>" if r["cell"] else "")
        spread = "-" if _nan(r["p50_spread"]) or r["repeats"] < 2 else f"{r['p50_spread']:.0%}{_e(r['spread_flag'])}"
        cells = [str(int(r["cores"])), status, _num(r["repeats"], "{:.0f}"), _num(r["requests"], "{:.0f}"),
                 _ci(r, "p50"), _ci(r, "p90"), _ci(r, "p99"), spread,
                 "-" if _nan(r["speedup_p50"]) else f"{r['speedup_p50']:.2f}x",
                 _num(r["timeout_rate"], "{:.1%}", NOT_RECORDED), _num(r["gpu0_util_mean"], "{:.0f}", NOT_RECORDED),
                 _num(r["replica_cpu_util_mean"], "{:.0f}", NOT_RECORDED),
                 _num(r["frontend_share"], "{:.0%}", NOT_RECORDED)]
        if slo.given:
            cells += [_num(r["slo_goodput_rps"], "{:.3g}"), _num(r["slo_met_share"], "{:.0%}")]
        css = " class='knee'" if r["knee"] else ""
        out.append(f"<tr{css}>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    out.append("</table>")
    return "".join(out)


def _img(path: str | None, alt: str) -> str:
    return f"<img src='{_e(path)}' alt='{_e(alt)}'>" if path else ""


def _extras(s: Section) -> str:
    x, out = s.extras, []
    if x.predicted_knee is not None:
        observed = f"{s.knee} cores" if s.knee is not None else "none"
        params = _pairs(x.model_params or {})
        out.append(f"<p>Predicted knee: <b>{x.predicted_knee} cores</b> (observed: {observed}). "
                   f"<span class='muted'>Model: {params}</span></p>")
    elif x.unfitted:
        out.append(f"<p>Predicted knee: not fitted ({_e(x.unfitted)}).</p>")
    if x.holdout is not None:
        shown = x.holdout.reindex(columns=[c for c in HOLDOUT_COLUMNS if c in x.holdout])
        out.append("<p>Each core count held out in turn, predicted from the others:</p>" + _table(shown, ["note"]))
        out.append(_img(s.plots.get("holdout"), "predicted against measured TTFT p50"))
    if s.costs is not None and len(s.costs):
        out.append("<h3>Cost of cores against GPUs</h3>" + _table(s.costs))
    if x.knee_costs is not None and len(x.knee_costs):
        out.append("<p>Starved, at the knee, and with one more GPU:</p>"
                   + _table(x.knee_costs, left=["option", "measured", "note"]))
    out.extend(f"<p class='bad'>{_e(n)}</p>" for n in x.notes)
    return "".join(out)


def _section(s: Section, opts: ReportOptions) -> str:
    factors = ", ".join(f"{_e(k)}={_e(v)}" for k, v in s.factors.items())
    knee = (f"<b>{s.knee} cores</b>: the fewest within {opts.tolerance:.0%} of the best TTFT p50"
            if s.knee is not None else "none (no core count gave a TTFT p50)")
    if s.knee is not None and len(s.rows) > 1 and s.knee == int(s.rows["cores"].max()):
        knee += "; it is the most cores tested, so TTFT may still fall beyond it"
    out = [f"<h2 id='{_e(s.anchor)}'>{_e(s.label)}</h2>", f"<p class='muted'>{factors}</p>",
           f"<p>Observed knee: {knee}.</p>"]
    d = s.extras.diagnosis
    if d is not None:
        evidence = _pairs(getattr(d, "evidence", None) or {})
        out.append(f"<p class='diagnosis'><b>Diagnosis ({_e(d.stage)}):</b> {_e(d.sentence)}"
                   + (f"<br><span class='muted'>{evidence}</span>" if evidence else "") + "</p>")
    out.append(_rows_table(s.rows, opts.slo))
    for name, alt in (("ttft", "TTFT against cores"), ("side", "timeouts, utilisation and frontend share"),
                      ("goodput", "goodput against cores")):
        out.append(_img(s.plots.get(name), alt))
    out.append(_extras(s))
    return "\n".join(out)


def _heatmap(page: Page) -> str:
    if page.heatmap.empty:
        return ""
    frame = page.heatmap.reset_index()
    frame.columns = [str(c) for c in frame.columns]
    return ("<h2 id='heatmap'>Speedup of TTFT p50 over the fewest cores</h2>"
            "<p class='muted'>TTFT p50 at the configuration's fewest cores that gave a figure / TTFT p50 here; <i>timeout</i>: the "
            "trial timed out at start-up, or most of its requests did; <i>failed</i>: no repeat completed.</p>"
            + _img(page.heatmap_png, "speedup heatmap") + _table(frame, left=["configuration"]))


def _frame_section(frame: pd.DataFrame | None, anchor: str, title: str, blurb: str) -> str:
    """A heading, its explanation and the table; nothing for a missing or empty table."""
    if frame is None or frame.empty:
        return ""
    return f"<h2 id='{anchor}'>{title}</h2><p class='muted'>{blurb}</p>" + _table(frame)


def _start_modes(page: Page) -> str:
    return _frame_section(
        page.start_modes, "start-modes", "Start modes against fresh starts",
        "TTFT at the same cores after a re-pin (<i>repin</i>: one live replica moved down the core "
        "counts, thread pools of its start) or a <i>sized</i> start (started on more cores with every pool sized "
        "for these, then pinned) against a fresh start pinned from the beginning; the medians over repeats, "
        "ratio = mode / fresh. <i>within_noise</i>: both ratios within the fresh repeats' own p50 spread.")


def _references(page: Page) -> str:
    return _frame_section(
        page.references, "references", "The harness against clients nobody here wrote",
        "TTFT of the same window's workload, each run from a prefix-cache reset on the same "
        "server: <i>harness</i> (the measured window), <i>bare</i> (the bare client: one plain process, no "
        "actor, no telemetry) and <i>vllm_bench</i> (vLLM's own <code>vllm bench serve</code> replaying the "
        "prompts the harness sent, turn-major, at the same concurrency and output lengths). Medians over "
        "repeats; <i>harness_vs_*</i>: the median of the per-repeat p50 ratios (below 1: the harness reads "
        "less TTFT); <i>*_p50_spread</i>: (max - min) / median over repeats. The order of the runs rotates "
        "with the repeat (see each trial's <code>crosscheck_order</code>).")


def render(page: Page) -> str:
    """The whole ``index.html``."""
    o = page.opts
    toc = "".join(f"<li><a href='#{_e(s.anchor)}'>{_e(s.label)}</a></li>" for s in page.sections)
    files = " · ".join(f"<a href='{_e(path)}'>{_e(label)}</a>" for label, path in page.csvs.items())
    head = [
        f"<h1>Sweep {_e(page.sweep)}: TTFT against CPU cores</h1>",
        f"<p>Trials read from {_e(page.source)}: {page.trials} trial(s), {len(page.sections)} configuration(s) "
        "(repeats aggregated: the median of their figures).</p>",
        f"<p>Intervals: {o.level:.0%} bootstrap that resamples repeats, then requests within each "
        f"({o.n_boot} draws, seed {o.seed}). Knee tolerance: {o.tolerance:.0%}. SLOs: {_e(o.slo.describe())}.</p>",
    ]
    for line in page.time_use:
        head.append(f"<p>{_e(line)}.</p>")
    if files:
        head.append(f"<p>Tables: {files}</p>")
    if page.notes:
        head.append("<ul>" + "".join(f"<li class='bad'>{_e(n)}</li>" for n in page.notes) + "</ul>")
    if toc:
        head.append(f"<ul>{toc}</ul>")
    body = [_heatmap(page), _start_modes(page), _references(page), *(_section(s, o) for s in page.sections)]
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>{_e(page.sweep)}: sweep report</title><style>{_STYLE}</style></head><body>\n"
            + "\n".join(head + body) + "\n</body></html>\n")


__all__ = ["NOT_RECORDED", "Page", "Section", "render"]
