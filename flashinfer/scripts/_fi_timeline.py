"""Each point of a FlashInfer sweep on the GPU's timeline (02 and 03 --nsys): nsys over the --ncu-target child, else
this run's torch trace; the story's lines, ASCII lanes and figure; the table again for --reanalyse."""
from __future__ import annotations

import re

from _fi import MERGE_RX


def _relative(k):
    """Per point (in order): each kernel's start since the point's first kernel, its duration, the idle gap
    before it (since the previous kernel of the point ended)."""
    import pandas as pd
    rows = []
    for (p, label), g in k.groupby(["point", "label"], sort=False):
        g = g.sort_values("ts_us")
        t0, end = float(g["ts_us"].iloc[0]), None
        for r in g.itertuples():
            rows.append({"point": p, "label": label, "kernel": r.short, "start_us": r.ts_us - t0,
                         "dur_us": r.dur_us, "gap_us": max(0.0, r.ts_us - end) if end is not None else 0.0})
            end = r.end_us if end is None else max(end, r.end_us)
    return pd.DataFrame(rows, columns=["point", "label", "kernel", "start_us", "dur_us", "gap_us"])


def point_kernels(ev, points, pattern: str, label, marker: str | None = None):
    """The kernels of each sweep point of a --ncu-target run, from an nsys cuda_gpu_trace event table
    (common.tables.trace.read_nsys_csv): the marker kernel (``marker``, default common.capture.ncu.MARKER_KERNEL) opens point
    i; kernels whose name matches ``pattern`` are kept (not the point's set-up: randn, plan() copies);
    reference repetitions are left out. Columns as _relative: point, label, kernel, start_us, dur_us, gap_us."""
    from common.capture.ncu import MARKER_KERNEL
    from common.tables.trace import split_at_marker
    k = ev.sort_values("ts_us", kind="stable").reset_index(drop=True)
    pts, is_mark = split_at_marker(k["name"], marker or MARKER_KERNEL)
    keep = [not m and bool(re.search(pattern, str(n))) for m, n in zip(is_mark, k["name"])]
    k = k.assign(point=pts)[keep]
    k = k[[0 <= i < len(points) and points[i].get("kind", "sweep") == "sweep" for i in k["point"]]]
    return _relative(k.assign(label=[label(points[i]) for i in k["point"]]))


def call_kernels(rows, pattern: str):
    """The same table from the torch-profiler trace a script wrote: the first call (#0) of each label of a
    common.tables.trace.kernels_in_ranges() join, its kernels whose full name matches ``pattern``."""
    k = rows[(rows["gpu_kind"] == "kernel") & (rows["call"] == 0)]
    k = k[k["full_name"].fillna("").str.contains(pattern)].rename(columns={"kernel": "short"})
    return _relative(k.assign(point=k.groupby("label", sort=False).ngroup()))


def timeline(run, script, argv, points, pattern: str, label, rows):
    """--nsys: ``script --ncu-target`` under Nsight Systems (common.capture.nsys), each point's kernels read from its
    cuda_gpu_trace. Where nsys is not usable or fails, the torch-profiler trace this run already wrote
    (``rows``: its kernels_in_ranges join) stands in, and a note says so. Returns (table, source)."""
    from common.capture import nsys
    from common.tables import ncu_pass, trace
    if nsys.find() is None:
        why = "nsys is not usable here (common.capture.nsys.find() found none)"
    else:
        try:
            rep = nsys.profile(ncu_pass.target_cmd(script, argv), run.dir / "nsys", name="timeline", echo=run.log,
                               timeout=1200)
            csv = nsys.stats(rep, ["cuda_gpu_trace"]).get("cuda_gpu_trace")
            if csv is None:
                raise RuntimeError("nsys stats wrote no cuda_gpu_trace table")
            return point_kernels(trace.read_nsys_csv(csv), points, pattern, label), f"nsys ({rep.name})"
        except Exception as e:  # noqa: BLE001 - the timeline falls back, the run goes on
            why = f"nsys failed ({e.__class__.__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})"
    run.note(f"{why}: the timeline comes from the torch-profiler trace of this run (trace.json, first call of "
             "each traced shape)")
    return call_kernels(rows, pattern), "torch.profiler (trace.json)"


def timeline_lines(tl) -> list[str]:
    """One story line per point: its kernels in order, durations, idle gaps, GPU span."""
    lines = []
    for label, g in tl.groupby("label", sort=False):
        parts = []
        for r in g.itertuples():
            if r.gap_us >= 0.5:
                parts.append(f"idle {r.gap_us:.1f} us")
            parts.append(f"{r.kernel} {r.dur_us:.1f} us")
        lines.append(f"{label}: {' -> '.join(parts)} (GPU span {(g['start_us'] + g['dur_us']).max():.1f} us)")
    return lines


def timeline_ascii(tl, labels, width: int = 64) -> str:
    """story.timeline of a few points, each on its own microsecond axis, one lane per kernel ('M': merge)."""
    from common.base import story
    out = []
    for lab in labels:
        g = tl[tl["label"] == lab]
        if len(g):
            ev = [{"lane": r.kernel, "start": r.start_us, "end": r.start_us + r.dur_us,
                   "mark": "M" if re.search(MERGE_RX, r.kernel) else "#"} for r in g.itertuples()]
            out.append(f"{lab}\n{story.timeline(ev, width=width, label_width=40, unit='us')}")
    return "\n".join(out)


def timeline_figure(tl, title: str):
    """Each point's kernels on one bar: x = % of the point's GPU span (first kernel start to last kernel end),
    one colour per kernel name (common.render.plots.styles); each row's label carries its span in us."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from common.render import plots
    labels = list(dict.fromkeys(tl["label"]))
    sty = plots.styles(list(dict.fromkeys(tl["kernel"])))
    fig, ax = plt.subplots(figsize=(8.5, 1.6 + 0.32 * len(labels)))
    ticks, seen = [], set()
    for y, lab in enumerate(labels):
        g = tl[tl["label"] == lab]
        span = max(float((g["start_us"] + g["dur_us"]).max()), 1e-9)
        ticks.append(f"{lab} ({span:,.1f} us)")
        for r in g.itertuples():
            ax.barh(y, 100 * r.dur_us / span, left=100 * r.start_us / span, height=0.6, color=sty[r.kernel][0],
                    label=None if r.kernel in seen else r.kernel)
            seen.add(r.kernel)
    ax.set_yticks(range(len(labels)), ticks, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of the point's GPU span (first kernel start -> last kernel end)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, axis="x", alpha=0.3)
    return fig


def recorded_timeline(rec):
    """(timeline table, its source) of a recording made with --nsys (None without timeline.csv): the source is the
    torch trace where a note says the timeline fell back to it (timeline()), else nsys."""
    tl = rec.tables.get("timeline")
    if tl is None:
        return None
    torch_trace = any("the timeline comes from the torch-profiler trace" in n for n in rec.summary.get("notes", []))
    return tl, "torch.profiler (trace.json)" if torch_trace else "nsys (timeline.nsys-rep)"
