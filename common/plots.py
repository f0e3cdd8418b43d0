"""The figures several scripts draw: a roofline and a sweep line plot (matplotlib, no display).

    fig = roofline([{"label": "decode b32", "flop_per_byte": 1.0, "tflop_s": 2.7}], peaks)
    fig = sweep(df, x="kv_len", y="tb_s", hue="batch", logx=True, ylabel="TB/s")
    run.figure("roofline", fig)
"""
from __future__ import annotations

import math


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def roofline(points, peaks: dict, title: str = "Roofline"):
    """Points (label, flop_per_byte, tflop_s) against the device's memory and compute roofs.

    ``peaks``: dram_tb_s and bf16_tflops (measured where available; the source is shown).
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    bw, comp = peaks.get("dram_tb_s"), peaks.get("bf16_tflops")
    xs = [p["flop_per_byte"] for p in points if p.get("flop_per_byte")] or [1.0]
    ridge_x = comp / bw if bw and comp else max(xs)
    lo, hi = min(xs + [ridge_x]) / 4, max(xs + [ridge_x]) * 4
    if bw and comp:
        ridge = comp / bw
        grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
        ax.plot(grid, [min(comp, bw * x) for x in grid], "k-", lw=1.5,
                label=f"roof ({peaks.get('source', '?')}): {bw:.2f} TB/s, {comp:.0f} TFLOP/s")
        ax.axvline(ridge, color="grey", ls=":", lw=1)
        ax.text(ridge, comp * 1.05, f" ridge {ridge:.0f} FLOP/B", fontsize=8, color="grey")
    crowded = len(points) > 8  # then a legend reads better than labels on top of each other
    for p in points:
        if p.get("flop_per_byte") and p.get("tflop_s"):
            ax.scatter(p["flop_per_byte"], p["tflop_s"], s=28, zorder=3, label=p["label"] if crowded else None)
            if not crowded:
                ax.annotate(p["label"], (p["flop_per_byte"], p["tflop_s"]), fontsize=7,
                            xytext=(4, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / DRAM byte)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(f"{title} — {peaks.get('gpu', '')}")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=6 if crowded else 8, loc="lower right", ncol=2 if crowded else 1)
    return fig


def sweep(df, x: str, y: str, hue: str | None = None, logx: bool = False, logy: bool = False,
          ylabel: str | None = None, title: str = "", hline: float | None = None, hline_label: str = ""):
    """One line per ``hue`` value of ``y`` against ``x`` (points with NaN are skipped)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    groups = [(None, df)] if hue is None else list(df.groupby(hue))
    for key, g in groups:
        g = g.sort_values(x)
        g = g[[not (isinstance(v, float) and math.isnan(v)) for v in g[y]]]
        ax.plot(g[x], g[y], marker="o", ms=3, label=None if key is None else f"{hue}={key}")
    if hline:
        ax.axhline(hline, color="grey", ls="--", lw=1, label=hline_label or None)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(x)
    ax.set_ylabel(ylabel or y)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if hue is not None or hline:
        ax.legend(fontsize=8)
    return fig
