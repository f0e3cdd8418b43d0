"""The figures several scripts draw: a roofline and a sweep line plot (matplotlib, no display).

    fig = roofline([{"label": "decode b32", "flop_per_byte": 1.0, "tflop_s": 2.7}], peaks)
    fig = roofline(points_of_one_layer, peaks, series_order=LAYER_CLASSES)   # GEMM, attention, norm, ...
    fig = sweep(df, x="kv_len", y="tflop_s", hue="batch", logx=True, ylabel="TFLOP/s")
    fig = effective(df, peaks, hue="batch", mix="read")      # effective TB/s vs working set, DRAM ceilings, L2 marks
    fig = lanes(spans, marks, lane_order=[...])              # one request on one time axis: CPU and GPU lanes
    fig = against_floors(rows, x="batch", y="itl_ms", floors={"read": "read_ms", ...})   # measured vs floor lines
    run.figure("roofline", fig)

Rules every figure here keeps, so a reader can trust it at a glance:

* one colour and one marker per series; two series never share a colour (a qualitative palette of 10,
  else 20 colours; past 20 series the marker tells them apart, a colour/marker pair is never reused);
* the roofs are this GPU's measured ceilings (``common.capture.ceilings.peaks``), labelled with their method, and the
  datasheet roof is drawn dashed beside them;
* a point above the roof gets a red edge and the title says how many: the ceiling probe under-measures
  (the point is drawn where it was measured, never clipped);
* few points (≤ 10) carry text labels next to them; more get a legend by series.
"""
from __future__ import annotations

import math

# the kernel classes of one transformer layer, in a fixed order so each keeps its colour across figures
LAYER_CLASSES = ("GEMM", "attention", "norm", "RoPE", "store")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p")
ABOVE_EDGE = "red"
LABEL_LIMIT = 10


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def palette(n: int) -> list[tuple]:
    """``n`` RGBA colours, all different for n ≤ 20: tab10 up to 10 series, else tab20 (its dark shades
    first, then the light ones); beyond 20 the colours repeat and :func:`styles` varies the marker."""
    from matplotlib import colormaps
    if n <= 10:
        cm = colormaps["tab10"]
        return [cm(i) for i in range(n)]
    cm = colormaps["tab20"]
    order = list(range(0, 20, 2)) + list(range(1, 20, 2))
    return [cm(order[i % 20]) for i in range(n)]


def styles(names, order=None) -> dict:
    """{series name: (colour, marker)}. With ``order`` (e.g. LAYER_CLASSES) a name keeps the slot it has
    there whatever else is plotted; other names follow in first-appearance order. Colour i % 20 and
    marker i % 12 give a distinct pair for up to 60 series."""
    names = list(dict.fromkeys(names))
    order = list(order or ())
    slots, nxt = {}, len(order)
    for s in names:
        if s in order:
            slots[s] = order.index(s)
        else:
            slots[s], nxt = nxt, nxt + 1
    n = max(slots.values(), default=-1) + 1
    cols = palette(n)
    return {s: (cols[i], MARKERS[i % len(MARKERS)]) for s, i in slots.items()}


def _close(a: dict, b: dict, f: float = 1.25) -> bool:
    """Two points within a factor ``f`` of each other on both log axes (their labels would overlap)."""
    return (1 / f < a["flop_per_byte"] / b["flop_per_byte"] < f) and (1 / f < a["tflop_s"] / b["tflop_s"] < f)


def _roof_label(what: str, value: float, unit: str, peaks: dict, key: str) -> str:
    src = (peaks.get("sources") or {}).get(key) or peaks.get("source") or "?"
    how = (peaks.get("method") or {}).get(key)
    fmt = f"{value:.2f}" if value < 100 else f"{value:.0f}"
    return f"{what} {fmt} {unit} ({src}{': ' + how if how and src == 'measured' else ''})"


def roofline(points, peaks: dict, title: str = "Roofline", *, series_order=None, label_limit: int = LABEL_LIMIT):
    """Points against the device's memory and compute roofs; returns the matplotlib figure.

    ``points``: dicts with ``label``, ``flop_per_byte``, ``tflop_s`` and optionally ``series`` (points of
    one series share a colour and marker; a point without one is a series of its own, named by its
    label). ``peaks``: :func:`common.capture.ceilings.peaks` (``dram_tb_s``, ``bf16_tflops``, their ``sources`` and
    ``method``, the ``datasheet`` row). ``series_order``: fixed style slots, e.g. :data:`LAYER_CLASSES`
    to place every kernel class of one layer (GEMMs, attention, norm, RoPE, store) as its own series.
    The figure's axes carry ``hands_on_above_roof`` (the labels of the points above the roof).
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 5.6))
    bw, comp = peaks.get("dram_tb_s"), peaks.get("bf16_tflops")
    pts = [p for p in points if (p.get("flop_per_byte") or 0) > 0 and (p.get("tflop_s") or 0) > 0]
    xs = [p["flop_per_byte"] for p in pts] or [1.0]
    ridge = comp / bw if bw and comp else None
    lo, hi = min(xs + [ridge or xs[0]]) / 4, max(xs + [ridge or xs[0]]) * 4

    def roof(x):
        return min(comp, bw * x) if ridge else math.inf

    # the roofs: measured (solid), the datasheet beside them (dashed)
    roof_lines = []
    if ridge:
        roof_lines += ax.plot([lo, ridge], [bw * lo, comp], "-", color="black", lw=1.6,
                              label=_roof_label("memory roof", bw, "TB/s", peaks, "dram_tb_s"))
        roof_lines += ax.plot([ridge, hi], [comp, comp], "-", color="dimgray", lw=1.6,
                              label=_roof_label("compute roof bf16", comp, "TFLOP/s", peaks, "bf16_tflops"))
        ax.axvline(ridge, color="grey", ls=":", lw=1)
        ax.text(ridge, comp * 1.08, f" ridge {ridge:.0f} FLOP/B", fontsize=8, color="grey")
        ds = peaks.get("datasheet") or {}
        if peaks.get("source") == "measured" and ds.get("dram_tb_s") and ds.get("bf16_tflops"):
            dr = ds["bf16_tflops"] / ds["dram_tb_s"]
            roof_lines += ax.plot([lo, dr, hi], [ds["dram_tb_s"] * lo, ds["bf16_tflops"], ds["bf16_tflops"]], "--",
                                  color="silver", lw=1,
                                  label=f"datasheet {ds['dram_tb_s']:g} TB/s, {ds['bf16_tflops']:g} TFLOP/s")

    # the points, one style per series
    names = [p.get("series") or p.get("label") or "?" for p in pts]
    sty = styles(names, series_order)
    explicit = any(p.get("series") for p in pts)
    text_labels = len(pts) <= label_limit
    above, placed = [], []
    for name in dict.fromkeys(names):
        mine = [p for p, s in zip(pts, names) if s == name]
        col, mk = sty[name]
        over = [p["tflop_s"] > roof(p["flop_per_byte"]) * (1 + 1e-9) for p in mine]
        above += [p.get("label") or name for p, o in zip(mine, over) if o]
        sc = ax.scatter([p["flop_per_byte"] for p in mine], [p["tflop_s"] for p in mine], s=36, zorder=3,
                        color=[col] * len(mine), marker=mk,
                        edgecolors=[ABOVE_EDGE if o else col for o in over],
                        linewidths=[1.8 if o else 0.6 for o in over],
                        label=name if (explicit or not text_labels) else None)
        sc.set_gid(str(name))
        if text_labels:
            placed += [(p, col, name) for p in mine]
    # labels top-down; one near a label already placed moves down a line, so close points stay readable
    done = []
    for p, col, name in sorted(placed, key=lambda t: -t[0]["tflop_s"]):
        near = sum(1 for q in done if _close(q, p))
        done.append(p)
        ax.annotate(p.get("label") or name, (p["flop_per_byte"], p["tflop_s"]), fontsize=7,
                    color=col, xytext=(5, 3 - 9 * near), textcoords="offset points")
    ax.hands_on_above_roof = above
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (FLOP / DRAM byte)")
    ax.set_ylabel("achieved TFLOP/s")
    full = f"{title} — {peaks.get('gpu') or ''}".rstrip(" —")
    if above:
        which = "measured" if peaks.get("source") == "measured" else (peaks.get("source") or "")
        full += (f"\n{len(above)} point(s) above the {which} roof: the ceiling probe under-measures"
                 if which == "measured" else f"\n{len(above)} point(s) above the {which} roof")
    ax.set_title(full, fontsize=10, color="darkred" if above else "black")
    ax.grid(True, which="both", alpha=0.25)
    # two legends: the series (short names) in the upper left, above the memory roof where no honest
    # point can be; the roofs (long labels, with their method) below the axes
    handles, labels = ax.get_legend_handles_labels()
    roofs = [(h, l) for h, l in zip(handles, labels) if h in roof_lines]
    series = [(h, l) for h, l in zip(handles, labels) if h not in roof_lines]
    if series:
        leg = ax.legend(*zip(*series), fontsize=6 if len(series) > 8 else 7, loc="upper left",
                        ncol=2 if len(series) > 12 else 1, framealpha=0.9)
        ax.add_artist(leg)
    if roofs:
        fig.subplots_adjust(bottom=0.1 + 0.035 * len(roofs) + 0.06)
        fig.legend(*zip(*roofs), fontsize=7, loc="lower center", frameon=False)
    return fig


def sweep(df, x: str, y: str, hue: str | None = None, logx: bool = False, logy: bool = False,
          ylabel: str | None = None, title: str = "", hline: float | None = None, hline_label: str = "",
          hue_order=None, of: str = ""):
    """One line per ``hue`` value of ``y`` against ``x`` (points with NaN are skipped); each line its own
    colour and marker (see :func:`styles`; ``hue_order`` fixes the slots, e.g. LAYER_CLASSES).
    ``of``: ``y`` is a % of this ceiling (common.capture.ceilings.ceiling_text): drawn at 100, named on the axis."""
    if of:
        hline, hline_label = 100, of
        ylabel = ylabel or "% of " + of.split(" ceiling")[0] + " ceiling"
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    groups = [(None, df)] if hue is None else list(df.groupby(hue))
    sty = styles([str(k) for k, _ in groups], hue_order)
    for key, g in groups:
        g = g.sort_values(x)
        g = g[[not (isinstance(v, float) and math.isnan(v)) for v in g[y]]]
        col, mk = sty[str(key)]
        line, = ax.plot(g[x], g[y], marker=mk, ms=4, color=col, label=None if key is None else f"{hue}={key}")
        line.set_gid(str(key))
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


DRAM_LINES = {"read": "-", "mixed": "-.", "copy": "--", "write": ":"}     # one line style per DRAM ceiling kind


def effective(df, peaks: dict, *, hue: str | None = None, x: str = "working_set", y: str = "eff_tb_s",
              mix: str | None = None, title: str = "", hue_order=None):
    """Effective bandwidth (formula bytes / time, common.capture.timing.rates) of a sweep against its working set (``x``, in
    bytes: drawn in MB, log scale), one line per ``hue`` value, with what bounds it drawn so the reader sees where it
    can exceed DRAM and why:

    * each DRAM ceiling of ``peaks`` (common.capture.ceilings: read, mixed, copy, write) as a horizontal line, named in the
      legend with its value and source; ``mix``, the kind these kernels' traffic is judged against, drawn heavier;
    * the L2 size as two vertical lines: working set = L2, and = STREAM_FACTOR x L2 (common.tables.kernels). Left of the
      second, L2 can serve part of the bytes (a write can end the kernel still in L2), so effective bandwidth may
      exceed every DRAM ceiling; right of it the formula bytes go through DRAM, and there only timing.rates gives a
      % of a ceiling (``eff_pct``).

    A point above the fastest DRAM ceiling gets a red edge, and the title counts them on each side of
    STREAM_FACTOR x L2 (left: served from L2; right: the ceiling probe under-measures). The axes carry
    ``hands_on_above_dram``: (series, working set in bytes) of those points."""
    from common.capture.ceilings import DRAM_KEYS, STREAM_FACTOR, l2_bytes
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    groups = [(None, df)] if hue is None else list(df.groupby(hue, sort=False))
    sty = styles([str(k) for k, _ in groups], hue_order)
    kinds = {k: peaks.get(key) for k, key in DRAM_KEYS.items() if peaks.get(key)}
    top = max(kinds.values(), default=None) or peaks.get("dram_tb_s")
    l2 = peaks.get("l2_mb")
    above = []
    for key, g in groups:
        g = g[[_num(a) and _num(b) and a > 0 for a, b in zip(g[x], g[y])]].sort_values(x)
        col, mk = sty[str(key)]
        xs, ys = [v / 1e6 for v in g[x]], list(g[y])
        line, = ax.plot(xs, ys, marker=mk, ms=4, color=col, label=None if key is None else f"{hue}={key}")
        line.set_gid(str(key))
        over = [(xx, yy) for xx, yy in zip(xs, ys) if top and yy > top]
        if over:
            ax.scatter([o[0] for o in over], [o[1] for o in over], s=40, facecolors="none", edgecolors=ABOVE_EDGE,
                       linewidths=1.6, zorder=4)
            above += [(str(key), o[0] * 1e6) for o in over]
    bounds = []
    for kind, v in kinds.items():
        key = DRAM_KEYS[kind]
        src = (peaks.get("sources") or {}).get(key) or peaks.get("source") or "?"
        heavy = kind == mix
        bounds += [ax.axhline(v, color="black" if heavy else "dimgray", ls=DRAM_LINES[kind], lw=1.6 if heavy else 0.9,
                              label=f"DRAM {kind} ceiling {v:.2f} TB/s ({src})" + (" — these kernels' kind" if heavy
                                                                                   else ""))]
    if l2:
        l2x = l2_bytes(peaks) / 1e6                # the x axis is in MB (1e6 bytes); l2_mb is MiB
        bounds += [ax.axvline(l2x, color="tab:blue", ls=":", lw=1.2, label=f"working set = L2 ({l2:g} MiB)"),
                   ax.axvline(STREAM_FACTOR * l2x, color="tab:blue", ls="--", lw=1.2,
                              label=f"working set = {STREAM_FACTOR} x L2: right of it, effective = a DRAM rate")]
    ax.hands_on_above_dram = above
    ax.set_xscale("log")
    ax.set_ylim(0, max(ax.get_ylim()[1], 1.1 * (top or 0)))
    if l2:       # shade where L2 can serve the bytes, without widening the axis the data set
        lo, hi = ax.get_xlim()
        ax.axvspan(lo, STREAM_FACTOR * l2_bytes(peaks) / 1e6, color="tab:blue", alpha=0.06, lw=0)
        ax.set_xlim(lo, hi)
    ax.set_xlabel("working set (MB: bytes the call touches)")
    ax.set_ylabel("effective TB/s (formula bytes / time)")
    full = title
    if above:
        big = sum(1 for _, ws in above if l2 and ws >= STREAM_FACTOR * l2_bytes(peaks))
        full += (f"\n{len(above) - big} point(s) above every DRAM ceiling below {STREAM_FACTOR} x L2 (L2 served them)"
                 + (f"; {big} at >= {STREAM_FACTOR} x L2: the ceiling probe under-measures" if big else ""))
    ax.set_title(full, fontsize=10, color="darkred" if above else "black")
    ax.grid(True, which="both", alpha=0.25)
    handles, labels = ax.get_legend_handles_labels()
    series = [(h, lab) for h, lab in zip(handles, labels) if h not in bounds]
    if series:
        ax.add_artist(ax.legend(*zip(*series), fontsize=7, loc="lower right", framealpha=0.9))
    named = [(h, lab) for h, lab in zip(handles, labels) if h in bounds]
    if named:
        fig.subplots_adjust(bottom=0.16 + 0.035 * len(named))
        fig.legend(*zip(*named), fontsize=7, loc="lower center", frameon=False)
    return fig


def _num(v) -> bool:
    """A real number (numpy's too), not NaN."""
    if isinstance(v, bool):
        return False
    try:
        return not math.isnan(float(v))
    except (TypeError, ValueError):
        return False


# ------------------------------------------------------------------ the joined story (common.tables.timeline tables)

# kernel classes (common.tables.trace.kernel_class) in a fixed order: each keeps its colour in every story figure
STORY_CLASSES = ("gemm", "attention", "norm", "rope", "activation", "kv_store", "sampling", "index", "memory",
                 "elementwise", "allreduce", "other")


def joined_timeline(kt, spans=None, title: str = "", max_steps: int = 40):
    """Per scheduler step (x: its GPU start, ms from the first), the kernel time of each class stacked
    (one colour per class), with the step's batch size on top; below, the GPU busy share of each step.
    ``kt``: a common.tables.timeline kernel table; ``spans``: the step dicts (running/queued/... shown when given)."""
    plt = _plt()
    st = styles(STORY_CLASSES, order=STORY_CLASSES)
    per = kt.groupby(["step", "cls"])["dur_us"].sum().unstack(fill_value=0.0)
    steps = list(per.index)[:max_steps]
    start = kt.groupby("step")["ts_us"].min()
    end = kt.groupby("step")["end_us"].max()
    t0 = float(start.min())
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(10, 5.2), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    x = [(start[s] - t0) / 1e3 for s in steps]
    width = [max((end[s] - start[s]) / 1e3, 0.05) for s in steps]
    bottom = [0.0] * len(steps)
    for cls in STORY_CLASSES:
        if cls not in per.columns:
            continue
        h = [per.at[s, cls] / 1e3 for s in steps]
        a1.bar(x, h, width=width, bottom=bottom, align="edge", color=st[cls][0], label=cls, edgecolor="none")
        bottom = [b + v for b, v in zip(bottom, h)]
    modes = kt.groupby("step")[["mode", "bs"]].first() if "mode" in kt.columns else None
    if modes is not None:
        for s, xx, b in zip(steps, x, bottom):
            a1.text(xx, b, f"{str(modes.at[s, 'mode'])[:1]}{modes.at[s, 'bs']}", fontsize=6, va="bottom")
    a1.set_ylabel("kernel time per step (ms)")
    a1.legend(fontsize=7, ncol=4, loc="upper right")
    a1.set_title(title + " — letters: E = prefill (EXTEND), D = decode; number = batch size", fontsize=9)
    busy = [100 * kt[kt["step"] == s]["dur_us"].sum() / max(end[s] - start[s], 1e-9) for s in steps]
    a2.bar(x, busy, width=width, align="edge", color="grey")
    a2.set_ylim(0, 105)
    a2.set_ylabel("GPU busy %")
    a2.set_xlabel("time of the step's first kernel (ms from the first step)")
    return fig


def layer_tree(rows, peaks: dict, title: str = ""):
    """One horizontal bar per kernel of one layer and of the once-per-step kernels (a common.tables.timeline
    layer_tree), per step kind; bar length = its share of the step (a layer kernel counted for every
    layer), colour = kernel class, text = rate as % of the ceiling that binds it (measured ceilings)."""
    plt = _plt()
    st = styles(STORY_CLASSES, order=STORY_CLASSES)
    kinds = list(dict.fromkeys((r["mode"], r["bs"]) for r in rows))
    fig, axes = plt.subplots(1, max(len(kinds), 1), figsize=(5.2 * max(len(kinds), 1), 0.22 * max(
        (sum(1 for r in rows if (r["mode"], r["bs"]) == k) for k in kinds), default=10) + 1.2), squeeze=False)
    for ax, k in zip(axes[0], kinds):
        rr = [r for r in rows if (r["mode"], r["bs"]) == k and r["share_all_layers_pct"] >= 0.05]
        y = list(range(len(rr)))[::-1]
        ax.barh(y, [r["share_all_layers_pct"] for r in rr], color=[st[r["cls"]][0] if r["cls"] in st else "k" for r in rr])
        for yy, r in zip(y, rr):
            pct = r.get("pct_bf16_ceiling") if (r.get("tflop_s") or 0) > 20 else r.get("pct_dram_ceiling")
            tag = f" {pct:.0f}% of {'bf16' if (r.get('tflop_s') or 0) > 20 else 'DRAM'}" if pct is not None and pct == pct else ""
            ax.text(r["share_all_layers_pct"], yy, tag, va="center", fontsize=6)
        ax.set_yticks(y)
        ax.set_yticklabels([f"{r['role']} · {r['kernel'][:28]}" for r in rr], fontsize=6)
        ax.set_xlabel("% of the step's kernel time (layer kernels x layers)")
        ax.set_title(f"{k[0]} bs {k[1]}", fontsize=9)
    fig.suptitle(title or f"One layer and the once-per-step kernels — {peaks.get('gpu', '')}", fontsize=9)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ one request on one time axis

def lanes(spans, marks=(), *, title: str = "", xlabel: str = "ms", lane_order=None, series_order=None,
          xlim=None):
    """Spans on horizontal lanes sharing one time axis (a request's CPU and GPU work, say), one colour per series,
    with marks (vertical lines, each labelled at the top: stamps taken outside the trace).

    ``spans``: dicts with ``lane`` (a row, top to bottom in ``lane_order`` or first-appearance order), ``series``
    (the legend entry: one colour each), ``start`` and ``end`` (axis units). ``marks``: (label, t) pairs. ``xlim``:
    (lo, hi) of the axis; spans outside are left out, spans across it are cut at it and said so in the title."""
    plt = _plt()
    spans = [s for s in spans if _num(s.get("start")) and _num(s.get("end"))]
    lo, hi = xlim if xlim else (min([s["start"] for s in spans] + [0.0]), max([s["end"] for s in spans] + [1.0]))
    lane_names = list(dict.fromkeys(list(lane_order or ()) + [s["lane"] for s in spans]))
    lane_names = [n for n in lane_names if any(s["lane"] == n for s in spans)]
    sty = styles([s["series"] for s in spans], series_order)
    fig, ax = plt.subplots(figsize=(11, 1.0 + 0.75 * max(len(lane_names), 1)))
    cut = 0
    for y, lane in enumerate(reversed(lane_names)):
        for series in dict.fromkeys(s["series"] for s in spans if s["lane"] == lane):
            bars = []
            for s in spans:
                if s["lane"] != lane or s["series"] != series or s["end"] < lo or s["start"] > hi:
                    continue
                a, b = max(s["start"], lo), min(s["end"], hi)
                cut += (a, b) != (s["start"], s["end"])
                bars.append((a, max(b - a, (hi - lo) * 1e-4)))
            if bars:
                ax.broken_barh(bars, (y - 0.35, 0.7), facecolors=sty[series][0], edgecolor="white", linewidth=0.3)
    ax.set_yticks(range(len(lane_names)))
    ax.set_yticklabels(list(reversed(lane_names)), fontsize=8)
    top = len(lane_names) - 0.4                 # the marks' labels stand in a band above the lanes
    ax.set_ylim(-0.6, top + (1.8 if marks else 0))
    ax.set_xlim(lo, hi)
    prev = -math.inf
    for label, t in sorted(((lb, t) for lb, t in marks if _num(t) and lo <= t <= hi), key=lambda m: m[1]):
        ax.axvline(t, color="black", ls="--", lw=0.7)
        close = t - prev < 0.015 * (hi - lo)        # two labels that would overlap: the second to the right
        ax.text(t, top + 0.05, label, rotation=90, fontsize=7, va="bottom", ha="left" if close else "right")
        prev = t
    from matplotlib.patches import Patch
    handles = [Patch(color=c, label=n) for n, (c, _m) in sty.items()]
    if marks:
        from matplotlib.lines import Line2D
        handles.append(Line2D([0], [0], color="black", ls="--", lw=0.7, label="stamps (dashed, labelled)"))
    ax.legend(handles=handles, fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.18 - 0.1 / max(
        len(lane_names), 1)))
    ax.set_xlabel(xlabel)
    ax.set_title(title + (f" ({cut} span(s) cut at the axis' ends)" if cut else ""), fontsize=9)
    return fig


def against_floors(rows, x: str, y: str, floors: dict, *, title: str = "", xlabel: str = "", ylabel: str = "",
                   logx: bool = True, mark=None, hollow_key: str | None = None, hollow_label: str = "",
                   label: str = ""):
    """A measured quantity against its floors, one point per row, the floors as lines (one colour per series).

    ``rows``: dicts with ``x``, ``y`` (the measured value; several rows at one x: every repetition drawn, the line
    through their median) and the floor columns; ``floors``: {legend label: column}. ``mark``: (label, x) drawn as a
    vertical line (e.g. the batch where the measurement leaves a floor). ``hollow_key``: rows where it is falsy are
    drawn hollow and named ``hollow_label`` in the legend (e.g. steps that ran without a CUDA graph). ``label``: the
    measured series' name in the legend."""
    import statistics
    plt = _plt()
    rows = [r for r in rows if _num(r.get(x)) and _num(r.get(y))]
    sty = styles(["measured"] + list(floors))
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    xs = sorted({r[x] for r in rows})
    med = [statistics.median(r[y] for r in rows if r[x] == v) for v in xs]
    c, m = sty["measured"]
    ax.plot(xs, med, "-", color=c, lw=1.2)
    full = [r for r in rows if not hollow_key or r.get(hollow_key)]
    ax.scatter([r[x] for r in full], [r[y] for r in full], color=c, marker=m, s=22,
               label=f"{label or 'measured ' + y} (each repetition; line: median)", zorder=3)
    hol = [r for r in rows if hollow_key and not r.get(hollow_key)]
    if hol:
        ax.scatter([r[x] for r in hol], [r[y] for r in hol], facecolors="none", edgecolors=c, marker=m, s=30,
                   label=hollow_label or f"{hollow_key} false", zorder=3)
    for label, col in floors.items():
        pts = sorted({(r[x], statistics.median(q[col] for q in rows if q[x] == r[x] and _num(q.get(col))))
                      for r in rows if any(_num(q.get(col)) for q in rows if q[x] == r[x])})
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "--", color=sty[label][0], lw=1.4, label=label)
    if mark and _num(mark[1]):
        ax.axvline(mark[1], color="grey", ls=":", lw=1)
        ax.text(mark[1], ax.get_ylim()[1], f" {mark[0]}", fontsize=7, va="top", color="dimgray")
    if logx:
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{v:g}" for v in xs])
    ax.set_xlabel(xlabel or x)
    ax.set_ylabel(ylabel or y)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=9)
    return fig
