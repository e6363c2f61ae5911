"""The report's PNG figures (matplotlib's Agg canvas: no display, no pyplot state shared between threads).

Each function draws one figure from report tables (``orchestrator.observe.report.tables``) and
writes it to ``path``. A figure a configuration did not record (no GPU, no vLLM /metrics) is drawn
as a panel that says "not recorded": a missing value is never plotted as 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from orchestrator.observe.report.tables import SIDE_FIGURES, Slo, configurations

_DPI = 100
_QUANTILES = (("p50", "TTFT p50"), ("p90", "TTFT p90"), ("p99", "TTFT p99"))


def _figure(width: float, height: float, **margins: float) -> Figure:
    """A figure with fixed margins (a layout engine would draw every figure twice: too slow on a busy host)."""
    fig = Figure(figsize=(width, height), dpi=_DPI)
    FigureCanvasAgg(fig)
    fig.subplots_adjust(**{"left": 0.11, "right": 0.97, "bottom": 0.13, "top": 0.9, **margins})
    return fig


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def _cores_axis(ax: Any, cores: Sequence[int]) -> None:
    """Cores on a log2 axis when they span 4x or more, ticked at the measured counts, all of them in view."""
    cores = sorted({int(c) for c in cores})
    if not cores:
        return
    if cores[0] > 0 and cores[-1] / cores[0] >= 4:
        ax.set_xscale("log", base=2)
        ax.set_xlim(cores[0] / 2**0.3, cores[-1] * 2**0.3)
    else:  # every measured count in view, also those without a point (a timeout)
        pad = 0.1 * max(1, cores[-1] - cores[0])
        ax.set_xlim(cores[0] - pad, cores[-1] + pad)
    ax.set_xticks(cores, [str(c) for c in cores])
    ax.minorticks_off()
    ax.set_xlabel("cores")


def _not_recorded(ax: Any, title: str) -> None:
    ax.set_title(title, fontsize=9)
    ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def knee_plot(est: Any, path: Path, *, title: str) -> Path:
    """The knee's evidence: every window's figure (dots), each core count's pooled figure (rings), the monotone
    fit (line), the tolerance band over the best, and the knee's interval shaded (``analysis.knee``)."""
    fig = _figure(6.4, 4.0)
    ax = fig.subplots()
    if not est.cores:
        _not_recorded(ax, title)
        return _save(fig, path)
    wx = [c for c, _ in est.window_figures]
    wy = [1000 * v for _, v in est.window_figures]
    ax.scatter(wx, wy, s=14, color="0.55", label="one window", zorder=2)
    ax.scatter(est.cores, [1000 * v for v in est.figures], s=60, facecolors="none", edgecolors="C0",
               label=f"all windows ({est.statistic})", zorder=3)
    ax.plot(est.cores, [1000 * v for v in est.fitted], color="C0", label="monotone fit", zorder=3)
    best = 1000 * min(est.fitted)
    ax.axhspan(best, best * (1 + est.tolerance), color="C2", alpha=0.12, label=f"within {est.tolerance:.0%} of the best")
    if est.low is not None:
        lo, hi = est.low / 2**0.15, est.high * 2**0.15
        ax.axvspan(lo, hi, color="C1", alpha=0.15, label=f"knee, {est.level:.0%} interval")
        ax.axvline(est.knee, color="C1", linestyle=":")
    _cores_axis(ax, est.cores)
    ax.set_ylabel(f"TTFT {est.statistic} (ms)")
    ax.set_title(f"{title}: {est.sentence()}", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    return _save(fig, path)


def ttft_plot(rows: pd.DataFrame, path: Path, *, title: str, knee: int | None,
              predicted: pd.DataFrame | None = None) -> Path:
    """TTFT p50/p90/p99 (ms) against cores with their bootstrap intervals as error bars; the knee as a
    dotted line, the predicted TTFT p50 dashed, and ``timeout``/``failed`` cells named at the bottom."""
    fig = _figure(6.4, 4.0)
    ax = fig.subplots()
    x = rows["cores"].astype(int).to_numpy()
    numeric = (rows["cell"] == "").to_numpy()
    for key, label in _QUANTILES:
        y = rows[f"ttft_{key}_s"].to_numpy(np.float64) * 1000
        lo = rows[f"ttft_{key}_lo"].to_numpy(np.float64) * 1000
        hi = rows[f"ttft_{key}_hi"].to_numpy(np.float64) * 1000
        keep = numeric & np.isfinite(y)
        if not keep.any():
            continue
        err = np.vstack([np.clip(y - lo, 0, None), np.clip(hi - y, 0, None)])
        err = np.where(np.isfinite(err), err, 0.0)[:, keep]
        ax.errorbar(x[keep], y[keep], yerr=err, marker="o", capsize=3, label=label)
    if predicted is not None and len(predicted):
        ax.plot(predicted["cores"], predicted["predicted_s"] * 1000, "k--", lw=1, label="predicted p50")
    if knee is not None:
        ax.axvline(knee, color="0.5", ls=":", lw=1, label=f"knee: {knee} cores")
    for c, cell in zip(x, rows["cell"]):
        if cell:
            ax.annotate(cell, (c, 0), xycoords=("data", "axes fraction"), xytext=(0, 4), textcoords="offset points",
                        ha="center", fontsize=8, color="tab:red")
    ax.set_ylabel("TTFT (ms)")
    return _finish(fig, ax, x, title, path)


def _finish(fig: Any, ax: Any, x: Sequence[int], title: str, path: Path) -> Path:
    """Title, the cores axis and the legend (when something is labelled) of a one-panel plot; saved."""
    ax.set_title(title, fontsize=10)
    _cores_axis(ax, x)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    return _save(fig, path)


def side_plot(rows: pd.DataFrame, path: Path, *, title: str) -> Path:
    """A panel per figure of ``tables.SIDE_FIGURES`` against cores (timeout rate, GPU and replica CPU
    utilisation, frontend share of TTFT); a figure without any value says "not recorded"."""
    fig = _figure(7.2, 4.8, left=0.08, bottom=0.1, top=0.88, hspace=0.45, wspace=0.2)
    axes = fig.subplots(2, 2).ravel()
    x = rows["cores"].astype(int).to_numpy()
    for ax, (col, label) in zip(axes, SIDE_FIGURES.items()):
        y = rows[col].to_numpy(np.float64) if col in rows else np.full(len(rows), np.nan)
        keep = np.isfinite(y)
        if not keep.any():
            _not_recorded(ax, label)
            continue
        ax.plot(x[keep], y[keep], marker="o")
        ax.set_title(label, fontsize=9)
        top = 1.0 if col in ("timeout_rate", "frontend_share") else 100.0  # shares, or percent
        ax.set_ylim(0, max(top, float(np.nanmax(y)) * 1.05))
        _cores_axis(ax, x)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def goodput_plot(rows: pd.DataFrame, path: Path, *, title: str, slo: Slo) -> Path:
    """Goodput under the SLOs and the measured request throughput (requests/s) against cores."""
    fig = _figure(6.4, 3.6)
    ax = fig.subplots()
    x = rows["cores"].astype(int).to_numpy()
    for col, label in (("request_throughput_rps", "throughput"), ("slo_goodput_rps", f"goodput ({slo.describe()})")):
        y = rows[col].to_numpy(np.float64) if col in rows else np.full(len(rows), np.nan)
        keep = np.isfinite(y)
        if keep.any():
            ax.plot(x[keep], y[keep], marker="o", label=label)
    ax.set_ylabel("requests / s")
    ax.set_ylim(bottom=0)
    return _finish(fig, ax, x, title, path)


def holdout_plot(holdout: pd.DataFrame, path: Path, *, title: str) -> Path:
    """The knee model's predicted TTFT p50 against the measured one (ms), each core count held out in turn."""
    fig = _figure(4.4, 4.0, left=0.16)
    ax = fig.subplots()
    m = holdout["measured_s"].to_numpy(np.float64) * 1000
    p = holdout["predicted_s"].to_numpy(np.float64) * 1000
    ax.scatter(m, p)
    for c, mx, py in zip(holdout["cores"], m, p):
        ax.annotate(str(c), (mx, py), xytext=(3, 3), textcoords="offset points", fontsize=8)
    finite = np.concatenate([m[np.isfinite(m)], p[np.isfinite(p)]])
    if len(finite):
        lo, hi = float(finite.min()) * 0.9, float(finite.max()) * 1.1
        ax.plot([lo, hi], [lo, hi], color="0.6", lw=1, ls="--")
    ax.set_xlabel("measured TTFT p50 (ms)")
    ax.set_ylabel("predicted TTFT p50 (ms)")
    ax.set_title(title, fontsize=10)
    return _save(fig, path)


def heatmap_plot(table: pd.DataFrame, labels: dict[tuple[Any, ...], str], path: Path) -> Path:
    """Speedups (TTFT p50 at the fewest cores / here) of every configuration against cores; ``timeout`` and
    ``failed`` cells are grey and named, cells outside a configuration's grid are blank."""
    groups = configurations(table)
    cores = sorted({int(c) for c in table["cores"]})
    values = np.full((len(groups), len(cores)), np.nan)
    text = [["" for _ in cores] for _ in groups]
    for i, (_, g) in enumerate(groups):
        for _, r in g.iterrows():
            j = cores.index(int(r["cores"]))
            if r["cell"]:
                text[i][j] = r["cell"]
            elif pd.notna(r["speedup_p50"]):
                values[i, j] = r["speedup_p50"]
                text[i][j] = f"{r['speedup_p50']:.2f}x"
    names = [labels[k] for k, _ in groups]
    left_in = 0.3 + 0.065 * max((len(n) for n in names), default=4)  # room for the labels at 8 pt
    width, height = left_in + 1.4 + 0.9 * len(cores), 1.2 + 0.45 * len(groups)
    fig = _figure(width, height, left=left_in / width, right=1 - 0.3 / width, bottom=0.55 / height,
                  top=1 - 0.35 / height)
    ax = fig.subplots()
    finite = values[np.isfinite(values)]
    top = max(2.0, float(finite.max())) if len(finite) else 2.0
    bottom = min(1.0, float(finite.min())) if len(finite) else 1.0
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="0.85")
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=bottom, vmax=top, aspect="auto")
    for i in range(len(groups)):
        for j in range(len(cores)):
            if text[i][j]:
                dark = math.isfinite(values[i, j]) and values[i, j] < (1 + top) / 2
                ax.text(j, i, text[i][j], ha="center", va="center", fontsize=8, color="white" if dark else "black")
    ax.set_xticks(range(len(cores)), [str(c) for c in cores])
    ax.set_yticks(range(len(groups)), names, fontsize=8)
    ax.set_xlabel("cores")
    ax.set_title("speedup of TTFT p50 over the fewest cores", fontsize=10)
    fig.colorbar(image, ax=ax, shrink=0.8, pad=0.02)
    return _save(fig, path)


__all__ = ["goodput_plot", "heatmap_plot", "holdout_plot", "side_plot", "ttft_plot"]
