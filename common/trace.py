"""Timelines into one event table: torch-profiler Chrome traces and `nsys stats` CSVs.

    ev = read_chrome_trace("trace.json.gz")       # kind, name, ts_us, dur_us, end_us, stream, ...
    k = kernels(ev)                               # GPU kernels only, in time order
    kernel_summary(k)                             # per kernel name: count, total, mean, share
    steps = annotate(ev, r"step\\[")              # each range (e.g. a scheduler step) with its kernels
    gaps(k, min_us=20)                            # where the GPU sat idle between kernels
    s = read_nsys_csv("report_cuda_gpu_kern_sum.csv")   # nsys summary tables, or a trace table

Event kinds: kernel, memcpy, memset (GPU); cpu_op, runtime, python, user_annotation (CPU);
gpu_annotation (a user range as the GPU saw it: from the first to the last kernel it launched).
Times are microseconds; ``t_us`` is relative to the first event of the trace.
"""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

from .ncu import short_name


class TraceError(ValueError):
    """A trace that holds nothing to read (empty, not a Chrome trace, no GPU events)."""


_KIND = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset", "cpu_op": "cpu_op",
         "cuda_runtime": "runtime", "cuda_driver": "runtime", "python_function": "python",
         "user_annotation": "user_annotation", "gpu_user_annotation": "gpu_annotation"}
COLUMNS = ["kind", "name", "short", "ts_us", "dur_us", "end_us", "t_us", "pid", "tid", "stream",
           "correlation", "external_id", "device"]


def _load(path):
    path = Path(path)
    try:
        raw = gzip.open(path, "rt").read() if path.suffix == ".gz" else path.read_text()
    except OSError as e:
        raise TraceError(f"cannot read trace {path}: {e}") from None
    if not raw.strip():
        raise TraceError(f"trace {path} is empty")
    try:
        return json.loads(raw)
    except ValueError as e:
        raise TraceError(f"trace {path} is not valid JSON (truncated?): {e}") from None


def read_chrome_trace(path, require_gpu: bool = True):
    """Read a torch-profiler (Kineto) Chrome trace into the event table (a DataFrame)."""
    import pandas as pd
    tr = _load(path)
    events = tr.get("traceEvents") if isinstance(tr, dict) else tr
    if not isinstance(events, list):
        raise TraceError(f"{path}: no 'traceEvents' list: not a Chrome trace")
    rows = []
    for e in events:
        if e.get("ph") != "X" or "ts" not in e:
            continue
        kind = _KIND.get(e.get("cat"), "other")
        a = e.get("args") or {}
        ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
        rows.append({"kind": kind, "name": e.get("name", ""), "ts_us": ts, "dur_us": dur,
                     "end_us": ts + dur, "pid": e.get("pid"), "tid": e.get("tid"),
                     "stream": a.get("stream"), "correlation": a.get("correlation"),
                     "external_id": a.get("External id"), "device": a.get("device")})
    if not rows:
        raise TraceError(f"{path}: the trace holds no timed events")
    df = pd.DataFrame(rows)
    if require_gpu and not (df["kind"] == "kernel").any():
        raise TraceError(f"{path}: no GPU kernel events: was the profiler run with CUDA activities?")
    df["short"] = [short_name(n) if k == "kernel" else n for k, n in zip(df["kind"], df["name"])]
    df["t_us"] = df["ts_us"] - df["ts_us"].min()
    return df.sort_values("ts_us", kind="stable").reset_index(drop=True)[COLUMNS]


def kernels(ev):
    """GPU kernels only, in start order."""
    return ev[ev["kind"] == "kernel"].reset_index(drop=True)


def kernel_summary(k, by: str = "short"):
    """Per kernel name: launches, total and mean time, share of all kernel time (sorted)."""
    g = k.groupby(by)["dur_us"].agg(["count", "sum", "mean", "max"]).reset_index()
    g.columns = [by, "launches", "total_us", "mean_us", "max_us"]
    g["share_pct"] = 100 * g["total_us"] / g["total_us"].sum()
    return g.sort_values("total_us", ascending=False).reset_index(drop=True)


def gaps(k, min_us: float = 0.0):
    """Idle intervals of the GPU between consecutive kernels (all streams merged)."""
    import pandas as pd
    k = k.sort_values("ts_us")
    busy_until, rows = None, []
    prev = None
    for r in k.itertuples():
        if busy_until is not None and r.ts_us - busy_until > min_us:
            rows.append({"start_us": busy_until, "gap_us": r.ts_us - busy_until,
                         "after": prev, "before": r.short})
        busy_until = r.end_us if busy_until is None else max(busy_until, r.end_us)
        prev = r.short
    return pd.DataFrame(rows, columns=["start_us", "gap_us", "after", "before"])


def busy_fraction(k, start_us: float | None = None, end_us: float | None = None) -> float:
    """Share of the window in which at least one kernel ran (0..1)."""
    if k.empty:
        return 0.0
    start = k["ts_us"].min() if start_us is None else start_us
    end = k["end_us"].max() if end_us is None else end_us
    busy, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(zip(k["ts_us"].clip(start, end), k["end_us"].clip(start, end))):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_s
    return busy / (end - start) if end > start else 0.0


def annotate(ev, pattern: str, gpu_side: bool = True):
    """Each user range whose name matches ``pattern`` with the kernels inside it.

    With ``gpu_side`` the GPU's view of the range is used (kernels between its first and last
    kernel); otherwise kernels are matched by their launch falling inside the CPU range.
    Returns a DataFrame: name, start_us, dur_us, kernels, kernel_us, top (top 3 kernels).
    """
    import pandas as pd
    kind = "gpu_annotation" if gpu_side and (ev["kind"] == "gpu_annotation").any() else "user_annotation"
    rx = re.compile(pattern)
    rng = ev[(ev["kind"] == kind) & ev["name"].str.contains(rx)]
    k = kernels(ev)
    if kind == "user_annotation":
        launches = ev[ev["kind"] == "runtime"][["ts_us", "correlation"]]
        k = k.merge(launches.rename(columns={"ts_us": "launch_us"}), on="correlation", how="left")
        key = "launch_us"
    else:
        key = "ts_us"
    rows = []
    for r in rng.itertuples():
        inside = k[(k[key] >= r.ts_us) & (k[key] < r.end_us)]
        top = inside.groupby("short")["dur_us"].sum().sort_values(ascending=False).head(3)
        rows.append({"name": r.name, "start_us": r.ts_us, "dur_us": r.dur_us, "kernels": len(inside),
                     "kernel_us": float(inside["dur_us"].sum()),
                     "top": "; ".join(f"{n} {v:.0f}us" for n, v in top.items())})
    return pd.DataFrame(rows, columns=["name", "start_us", "dur_us", "kernels", "kernel_us", "top"])


# ------------------------------------------------------------------ Nsight Systems

_NSYS_COLS = {"Time (%)": "time_pct", "Total Time (ns)": "total_ns", "Instances": "instances",
              "Avg (ns)": "avg_ns", "Med (ns)": "med_ns", "Min (ns)": "min_ns", "Max (ns)": "max_ns",
              "StdDev (ns)": "std_ns", "Name": "name", "Range": "name", "Style": "style",
              "Start (ns)": "start_ns", "Duration (ns)": "dur_ns", "Strm": "stream", "Device": "device",
              "GrdX": "grid_x", "GrdY": "grid_y", "GrdZ": "grid_z", "BlkX": "block_x", "BlkY": "block_y",
              "BlkZ": "block_z", "CorrId": "correlation", "Count": "count", "Operation": "name"}


def read_nsys_csv(path):
    """Read an `nsys stats --format csv` table; a trace report (Start/Duration) becomes an event table.

    Summary reports (cuda_gpu_kern_sum, nvtx_sum, cuda_api_sum...) come back with snake_case
    columns (total_ns, instances, avg_ns, ..., name); NVTX range names lose nsys's leading ':'.
    """
    import pandas as pd
    path = Path(path)
    text = path.read_text(errors="replace") if path.exists() else ""
    lines = [l for l in text.splitlines() if l.strip()]
    # nsys may print a banner ("Processing ...", "NOTICE: ...") before the CSV header
    start = next((i for i, l in enumerate(lines) if l.startswith(("Time (%)", "Start (ns)", '"Time (%)"',
                                                                   "Range", "Name", "Operation"))), None)
    if start is None:
        raise TraceError(f"{path}: not an nsys stats CSV (no 'Time (%)' or 'Start (ns)' header); "
                         "was the report empty (nothing traced)?")
    import io
    df = pd.read_csv(io.StringIO("\n".join(lines[start:])))
    if df.empty:
        raise TraceError(f"{path}: nsys stats table has a header but no rows")
    df = df.rename(columns={c: _NSYS_COLS.get(c, c) for c in df.columns})
    if "style" in df.columns and "name" in df.columns:
        df["name"] = df["name"].astype(str).str.lstrip(":")
    if "start_ns" in df.columns and "dur_ns" in df.columns:  # a trace: make it an event table
        ev = pd.DataFrame({"kind": "kernel", "name": df["name"], "ts_us": df["start_ns"] / 1e3,
                           "dur_us": df["dur_ns"] / 1e3})
        ev["end_us"] = ev["ts_us"] + ev["dur_us"]
        ev["short"] = ev["name"].map(short_name)
        ev["t_us"] = ev["ts_us"] - ev["ts_us"].min()
        for c in ("pid", "tid", "external_id"):
            ev[c] = None
        ev["stream"] = df.get("stream")
        ev["correlation"] = df.get("correlation")
        ev["device"] = df.get("device")
        return ev[COLUMNS]
    if "name" in df.columns and "total_ns" in df.columns:
        df["short"] = df["name"].astype(str).map(short_name)
    return df
