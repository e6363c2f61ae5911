"""The report's ``index.html`` (pure): one self-contained page, readable offline.

No script, no stylesheet or font from elsewhere: the style is inline and the figures are PNG files
next to the page, linked by relative path, so the folder can be copied, mailed or logged to MLflow
as it is. Every value is escaped. A figure a trial did not record reads "not recorded".

Each configuration's section opens with plain sentences: what starving costs and the knee
(:func:`opening`, from the section's own rows), then the diagnosis's headline; its evidence follows as a
small table of labelled figures with units (:data:`EVIDENCE`), never as ``key = value`` pairs.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from orchestrator.observe.analysis.knee import decode_needs_more
from orchestrator.observe.report.comparison import TIMEOUT_MAJORITY
from orchestrator.observe.report.sections import Extras
from orchestrator.observe.report.tables import ReportOptions, Slo
from orchestrator.values import figures
from orchestrator.values.figures import Figure

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.6em 0; }
th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: right; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; }
.muted { color: #777; } .bad { color: #b00; } .knee { font-weight: bold; background: #eef6ee; }
.diagnosis { background: #f6f6ee; padding: 0.5em; border-left: 3px solid #aa8; }
.diagnosis p { margin: 0.3em 0; } .diagnosis table { background: #fff; }
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
    knee_estimate: Any = None  # orchestrator.observe.analysis.knee.KneeEstimate
    tpot_knee_estimate: Any = None  # the same rule on the time per output token


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
    search: pd.DataFrame | None = None  # orchestrator.observe.report.search.why_table: a knee search's trials, why each
    search_costs: pd.DataFrame | None = None  # orchestrator.observe.report.search.cost_table


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


def _cores(n: Any) -> str:
    return "1 core" if int(n) == 1 else f"{int(n)} cores"


def _sentence(text: str) -> str:
    """``text`` as a sentence: a capital first, a full stop last."""
    text = str(text).strip()
    return text[:1].upper() + text[1:] + ("" if text.endswith((".", "!", "?")) else ".") if text else ""


def _share(v: float) -> str:
    return f"{min(max(v, 0.0), 1.0):.0%}"


def _times(v: float) -> str:
    return f"{v:.1f}x" if v < 10 else f"{v:.0f}x"


def opening(rows: pd.DataFrame, knee: int | None, tolerance: float) -> str:
    """The section's first sentence, from its comparison rows: what starving costs and the knee.

    "At 1 core TTFT p50 is 2.3x the best (580 ms against 250 ms at 4 cores); the knee is 4 cores, the fewest
    within 10% of the best." The starved point is the fewest cores that count for the knee; core counts that
    do not count (every trial failed, most requests timed out) are said first, and none reads as "nan".
    """
    def num(col: str) -> pd.Series:
        return pd.to_numeric(rows[col], errors="coerce") if col in rows else pd.Series(float("nan"), rows.index)

    ttft, rate = num("ttft_p50_s"), num("timeout_rate")
    cores = num("cores")
    left_out: dict[str, list[int]] = {}
    usable: list[tuple[int, float, float]] = []  # (cores, TTFT p50, timeout rate)
    for i in rows.index[cores.notna()]:
        c, t, r = int(cores[i]), ttft[i], rate[i]
        if _nan(t) or t <= 0:
            failed = str(rows["status"][i]) == "FAILED" if "status" in rows else False
            cell = rows["cell"][i] if "cell" in rows and not _nan(rows["cell"][i]) and rows["cell"][i] else ""
            why = ("every trial failed" if failed else "no request finished") + (f" ({cell})" if cell else "")
        elif not _nan(r) and r > TIMEOUT_MAJORITY:
            why = f"{_share(r)} of requests time out"
        else:
            usable.append((c, float(t), 0.0 if _nan(r) else float(r)))
            continue
        left_out.setdefault(why, []).append(c)
    parts = [f"at {' and '.join(str(c) for c in cs[:-1])}{' and ' if len(cs) > 1 else ''}{_cores(cs[-1])} {why}"
             for why, cs in left_out.items()]
    if not usable:
        return _sentence("; ".join(parts) if parts else "no core count has a TTFT p50 yet")
    usable.sort()
    c_lo, t_lo, r_lo = usable[0]
    c_best, t_best, _ = min(usable, key=lambda u: (u[1], u[0]))
    ms = f"{1000 * t_lo:.0f} ms"
    if len(usable) == 1:
        parts.append(f"only {_cores(c_lo)} has a TTFT p50 that counts ({ms}), so there is nothing to compare it with")
    elif c_best == c_lo:
        parts.append(f"TTFT p50 is at its best at the fewest cores that count, {_cores(c_lo)} ({ms}): starving "
                     f"costs nothing at this load")
    else:
        ratio = t_lo / t_best
        against = f"({ms} against {1000 * t_best:.0f} ms at {_cores(c_best)})"
        if ratio <= 1 + tolerance:
            parts.append(f"at {_cores(c_lo)} TTFT p50 is within {_share(ratio - 1)} of the best {against}")
        else:
            parts.append(f"at {_cores(c_lo)} TTFT p50 is {_times(ratio)} the best {against}")
        if r_lo > 0.01:
            parts[-1] += f", and {_share(r_lo)} of its requests time out"
    if knee is not None:
        parts.append(f"the knee is {_cores(knee)}, the fewest within {tolerance:.0%} of the best")
        if len(usable) > 1 and knee == max(int(c) for c in cores.dropna()):
            parts[-1] += ", and the most cores tested, so TTFT may still fall beyond it"
    return _sentence("; ".join(parts))


def knee_paragraph(k: Any) -> str:
    """The knee from every window's requests, with its interval, and which figure decides it and why."""
    if k.knee is None:
        return f"<p class='knee'>Knee with its interval: {_e(k.sentence())}.</p>"
    drawn = ", ".join(f"{c} cores {v:.0%}" for c, v in sorted(k.shares.items(), key=lambda cv: -cv[1]) if v >= 0.01)
    return (f"<p class='knee'><b>Knee with its interval: {_e(k.sentence())}</b> (the draws named {_e(drawn)}). "
            f"Decided on the {_e(k.statistic)} TTFT of every window's requests together, made non-increasing in "
            f"cores (a higher core count that reads worse within noise does not move it), the fewest cores within "
            f"{k.tolerance:.0%} of the best; the interval is the central {k.level:.0%} of {k.n_boot} bootstrap draws "
            f"of windows, then of their requests. {_e(why_statistic(k.statistic))} The table keeps p50 and p90; "
            f"the knee mark in it is p50's rule on the medians of repeats.</p>")


WHY_STATISTIC = {
    "p90": "Why p90: replaying the real windows of three dense H200 grids, a knee search decided on p90 named the "
           "6-repeat grid's knee more often than on the mean (100%, 99% and 94% of 500 seeds against 95%, 96% and "
           "89%), from fewer windows (6.8-8.9 against 9.4-10.4); above the knee a "
           "window's p90 spread least of mean, p50, p90, trimmed and geometric mean, between windows and within "
           "one, and it reads the starvation at 1 core as large as the mean does "
           "(benchmarks/results/knee-search-sim.md, knee-noise.md).",
    "mean": "The mean was the default before p90: on a dense H200 grid it spread half as much as p50, within a "
            "window and between windows (benchmarks/results/knee-noise.md).",
}


def why_statistic(stat: str) -> str:
    """Why the knee is decided on ``stat`` (the default's evidence), or that it was asked for."""
    return WHY_STATISTIC.get(stat, f"The {stat} was asked for instead of the default, p90.")


def decode_paragraph(ttft: Any, tpot: Any) -> str:
    """The knee of the time per output token beside TTFT's; said first and plainly where decode needs more cores."""
    if tpot is None or tpot.knee is None:
        return ""
    if not decode_needs_more(ttft, tpot):
        return (f"<p class='knee muted'>Knee of the time per output token, by the same rule: {_e(tpot.sentence())}; "
                f"decode needs no more cores than the first token.</p>")
    at = dict(zip(tpot.cores, tpot.figures))
    slow = f"{_ms_text(at[ttft.knee])} ms a token at {_cores(ttft.knee)} against {_ms_text(at[tpot.knee])} ms at " \
           f"{_cores(tpot.knee)}" if ttft.knee in at and tpot.knee in at else ""
    return (f"<p class='knee'><b>Decode needs more cores than the first token: the knee of the time per output "
            f"token is {_e(tpot.sentence())}</b>{' (' + _e(slow) + ')' if slow else ''}. The fewest cores that keep "
            f"both TTFT and decode within {tpot.tolerance:.0%} of their best is {_cores(tpot.knee)}, not "
            f"{_cores(ttft.knee)}. Seen with structured output, whose token masks run on the CPU at every step.</p>")


def _ms_text(v: float) -> str:
    return f"{1000 * v:.0f}" if abs(v) >= 0.0095 else f"{1000 * v:.1f}"


def _fixed(fmt: str) -> Callable[[float], str]:
    return lambda v: fmt.format(v)


def _formatter(f: Figure) -> Callable[[float], str]:
    """How the evidence table writes a figure in its ``shown`` unit ("%" of a fraction is clipped to 0-100%; a
    utilisation is already a percent; a time shown in ms is seconds times 1000)."""
    if f.shown == "%":
        return (lambda v: f"{min(max(v, 0.0), 100.0):.0f}") if f.unit == "%" else \
            (lambda v: f"{100 * min(max(v, 0.0), 1.0):.0f}")
    if f.shown == "ms":
        digits = f.digits
        return _ms_text if digits is None else (lambda v: f"{1000 * v:.{digits}f}")
    return _fixed(f"{{:.{f.digits or 0}f}}")


# Evidence figure (a Diagnosis.evidence key, without its _lo / _hi end, or a family's prefix) -> (label, unit,
# formatter), from the catalogue (orchestrator.values.figures: ``evidence``, ``label``, ``shown``, ``digits``).
EVIDENCE: dict[str, tuple[str, str, Callable[[float], str]]] = {
    f.stem: (f.label or f.key, f.shown, _formatter(f)) for f in figures.evidence()}
_PREFIXED = tuple(f.stem for f in figures.evidence() if f.family)
_GUESSED = (("_s", "ms", _ms_text), ("_frac", "%", EVIDENCE["frontend_share"][2]),
            ("_share", "%", EVIDENCE["frontend_share"][2]), ("_rate", "%", EVIDENCE["frontend_share"][2]),
            ("_us", "µs", _fixed("{:.0f}")), ("_ms", "ms", _fixed("{:.1f}")))


def _figure(key: str) -> tuple[int, tuple[str, str, Callable[[float], str]]]:
    """(its place in the table, (label, unit, formatter)) of an evidence figure; a key :data:`EVIDENCE` does not
    know gets a label read from its name and a unit guessed from its ending."""
    if key in EVIDENCE:
        return list(EVIDENCE).index(key), EVIDENCE[key]
    for prefix in _PREFIXED:
        if key.startswith(prefix):
            label, unit, fmt = EVIDENCE[prefix]
            return list(EVIDENCE).index(prefix), (label.format(key[len(prefix):].replace("_", " ")), unit, fmt)
    name = key.removesuffix("_mean")
    unit, fmt = "", _fixed("{:.4g}")
    for end, guessed, formatter in _GUESSED:
        if name.endswith(end) or name == end[1:]:
            name, unit, fmt = name.removesuffix(end) or end[1:], guessed, formatter
            break
    label = name.replace("_", " ").strip() + (" (mean)" if key.endswith("_mean") else "")
    return len(EVIDENCE), (label, unit, fmt)


def _with_unit(v: Any, unit: str, fmt: Callable[[float], str], sign: bool = False) -> str:
    if _nan(v):
        return "-"
    text = fmt(float(v))
    if sign:
        text = ("+" if float(v) >= 0 else "−") + text.lstrip("-")
    return text + ("" if unit in ("", "%", "x") else " ") + unit


def evidence_table(evidence: Mapping[str, Any]) -> str:
    """The diagnosis's figures as a small table: one labelled row per figure, with its unit; a figure measured at
    both ends has a column for each (the most cores first) and, in time units, the change between them."""
    ends = {end: evidence.get(f"cores_{end}") for end in ("hi", "lo")}
    both = not _nan(ends["hi"]) and not _nan(ends["lo"]) and ends["hi"] != ends["lo"]
    pairs: dict[str, dict[str, Any]] = {}
    single: dict[str, Any] = {}
    for key, v in evidence.items():
        base, _, end = str(key).rpartition("_")
        if end in ("lo", "hi") and base:
            if base != "cores":
                pairs.setdefault(base, {})[end] = v
        else:
            single[str(key)] = v
    if not pairs and not single:
        return ""
    names = {e: _cores(ends[e]) if not _nan(ends[e]) else f"the {'fewest' if e == 'lo' else 'most'} cores"
             for e in ends}
    one = [e for e in ("hi", "lo") if not _nan(ends[e])][:1]  # one core count: both ends are the same point
    shown = ["hi", "lo"] if both or not one else one
    head = [f"at {names[e]}" for e in shown] + (["change"] if both else [])
    out = ["<table class='evidence'><tr><th class='l'>figure</th>" + "".join(f"<th>{_e(h)}</th>" for h in head)
           + "</tr>"] if pairs else ["<table class='evidence'>"]
    width = len(head) if pairs else 1
    for base, at in sorted(pairs.items(), key=lambda kv: _figure(kv[0])[0]):
        label, unit, fmt = _figure(base)[1]
        cells = [_with_unit(at.get(e), unit, fmt) for e in shown]
        if both:
            timed = unit in ("ms", "s per window", "µs") and not _nan(at.get("lo")) and not _nan(at.get("hi"))
            cells.append(_with_unit(float(at["lo"]) - float(at["hi"]), unit, fmt, sign=True) if timed else "")
        out.append(f"<tr><td class='l'>{_e(label)}</td>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    for key, v in sorted(single.items(), key=lambda kv: _figure(kv[0])[0]):
        label, unit, fmt = _figure(key)[1]
        label = label.replace("{lo}", names["lo"]).replace("{hi}", names["hi"])
        value = _with_unit(v, unit, fmt) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)
        span = f" colspan='{width}'" if width > 1 else ""
        out.append(f"<tr><td class='l'>{_e(label)}</td><td class='l'{span}>{_e(value)}</td></tr>")
    return "".join(out) + "</table>"


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
    out = [f"<h2 id='{_e(s.anchor)}'>{_e(s.label)}</h2>", f"<p class='muted'>{factors}</p>"]
    said, table, detail = [opening(s.rows, s.knee, opts.tolerance)], "", ""
    d = s.extras.diagnosis
    if d is not None:
        said.append(getattr(d, "headline", "") or _sentence(d.sentence))
        table = evidence_table(getattr(d, "evidence", None) or {})
        detail = getattr(d, "detail", "")
    out.append("<div class='diagnosis'><p>" + " ".join(_e(x) for x in said) + "</p>" + table
               + (f"<p class='muted'>{_e(detail)}</p>" if detail else "") + "</div>")
    if s.knee_estimate is not None:
        out.append(knee_paragraph(s.knee_estimate))
        out.append(decode_paragraph(s.knee_estimate, s.tpot_knee_estimate))
    out.append(_rows_table(s.rows, opts.slo))
    for name, alt in (("ttft", "TTFT against cores"), ("knee", "the knee: every window, the fit and the interval"),
                      ("side", "timeouts, utilisation and frontend share"), ("goodput", "goodput against cores")):
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


def _search(page: Page) -> str:
    why = _frame_section(
        page.search, "search", "Knee search: why each point",
        "The trials a knee search ran, in order: the most and the fewest cores first, then bisection on the "
        "knee the estimate names, then more windows where its interval is, until the knee is settled and "
        "bracketed or a budget was spent (the sweep's <code>search_stop_reason</code> tag says which).")
    return why + _frame_section(
        page.search_costs, "search-cost", "Knee search: what it cost",
        "GPU-seconds the search held (each trial's seconds times its GPUs; a CPU trial's once) against an estimate "
        "of a 3-repeat grid of the same configuration: the mean trial's seconds x the grid's core counts x 3.")


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
    body = [_heatmap(page), _start_modes(page), _references(page), _search(page),
            *(_section(s, o) for s in page.sections)]
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>{_e(page.sweep)}: sweep report</title><style>{_STYLE}</style></head><body>\n"
            + "\n".join(head + body) + "\n</body></html>\n")


__all__ = ["EVIDENCE", "NOT_RECORDED", "Page", "Section", "evidence_table", "opening", "render"]
