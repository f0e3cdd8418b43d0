"""Timelines into one event table: torch-profiler Chrome traces and `nsys stats` CSVs.

    ev = read_chrome_trace("trace.json.gz")       # kind, name, ts_us, dur_us, end_us, stream, ...
    k = kernels(ev)                               # GPU kernels only, in time order
    kernel_summary(k)                             # per kernel name: count, total, mean, share
    j = kernels_in_ranges(ev, r"^step\\[")       # every kernel launched inside each matching range
    kt = step_kernels(ev, r"^step\\[", outer=r"^scheduler\\.run_batch$", parse=...)   # the kernels of each step
    step_summary(kt)                              # one row per step: GPU span, kernels, time per class, top 3
    calls_in_ranges(ev, r"^step\\[", r"^cudaGraphLaunch$")   # CPU calls (or nested ranges) inside each range
    split_at_marker(names, "spin_kernel")         # sweep points between marker kernels
    capture_calls(torch, [("decode b=32", fn)], "trace.json")   # labelled calls under torch.profiler
    assign_layers(list(step_kernels["kernel"]))   # layer index of each kernel of a forward (graphs too)
    kernel_class(name)                            # gemm / attention / norm / rope / kv_store / ...
    gaps(k, min_us=20)                            # where the GPU sat idle between kernels
    s = read_nsys_csv("report_cuda_gpu_kern_sum.csv")   # nsys summary tables, or a trace table

Event kinds: kernel, memcpy, memset (GPU); cpu_op, runtime, python, user_annotation (CPU);
gpu_annotation (a user range as the GPU saw it: from the first to the last kernel it launched).
Times are microseconds; ``t_us`` is relative to the first event of the trace.
"""
from __future__ import annotations

import gzip
import json
import math
import re
import zlib
from pathlib import Path

from common.capture.ncu import short_name


class TraceError(ValueError):
    """A trace that holds nothing to read (empty, not a Chrome trace, no GPU events)."""


_KIND = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset", "cpu_op": "cpu_op",
         "cuda_runtime": "runtime", "cuda_driver": "runtime", "python_function": "python",
         "user_annotation": "user_annotation", "gpu_user_annotation": "gpu_annotation"}
COLUMNS = ["kind", "name", "short", "ts_us", "dur_us", "end_us", "t_us", "pid", "tid", "stream",
           "correlation", "external_id", "device", "grid", "block"]


def _dims(v) -> str | None:
    """[64, 1, 1] -> '64x1x1' (grid/block of a kernel event); None when absent."""
    return "x".join(str(int(x)) for x in v) if isinstance(v, (list, tuple)) else None


def _load(path):
    path = Path(path)
    try:
        raw = gzip.open(path, "rt").read() if path.suffix == ".gz" else path.read_text()
    except OSError as e:
        raise TraceError(f"cannot read trace {path}: {e}") from None
    except (EOFError, zlib.error, UnicodeDecodeError) as e:     # a .gz cut while it was written or copied
        raise TraceError(f"trace {path} is cut short or damaged ({e.__class__.__name__}: {e})") from None
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
                     "external_id": a.get("External id"), "device": a.get("device"),
                     "grid": _dims(a.get("grid")), "block": _dims(a.get("block"))})
    if not rows:
        raise TraceError(f"{path}: the trace holds no timed events")
    df = pd.DataFrame(rows)
    if require_gpu and not (df["kind"] == "kernel").any():
        raise TraceError(f"{path}: no GPU kernel events: was the profiler run with CUDA activities?")
    df["short"] = [short_name(n) if k == "kernel" else n for k, n in zip(df["kind"], df["name"])]
    df["t_us"] = df["ts_us"] - df["ts_us"].min()
    out = df.sort_values("ts_us", kind="stable").reset_index(drop=True)[COLUMNS]
    # Kineto times are microseconds from a base it records: ts_us + base_us is the epoch time in us
    # (the clock of time.time() * 1e6), which puts client, server-log and kernel events on one axis
    base = tr.get("baseTimeNanoseconds") if isinstance(tr, dict) else None
    out.attrs["base_us"] = float(base) / 1e3 if base is not None else None
    return out


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


# ------------------------------------------------------------------ ranges -> kernels (the one join)

JOIN_COLUMNS = ["range", "label", "call", "range_index", "range_ts_us", "range_end_us", "order", "gpu_kind",
                "kernel", "full_name", "ts_us", "dur_us", "end_us", "stream", "correlation", "grid", "block"]
_CALL = re.compile(r"^(?P<label>.*?)\s*#(?P<call>\d+)$")


def split_label(name: str) -> tuple[str, int]:
    """'decode cuda b=32 kv=4096 #2' -> ('decode cuda b=32 kv=4096', 2); no '#n' suffix -> (name, 0)."""
    m = _CALL.match(name)
    return (m.group("label"), int(m.group("call"))) if m else (name, 0)


def kernels_in_ranges(ev, pattern: str, kinds=("user_annotation",), gpu_kinds=("kernel", "memcpy", "memset"),
                      empty_rows: bool = True):
    """Every GPU event launched inside each CPU range whose name matches ``pattern``.

    The join: a GPU event belongs to a range when the runtime call that launched it (the event with
    the same correlation id: cudaLaunchKernel, cudaMemcpyAsync, cudaGraphLaunch...) started inside
    the range, in the same process and on the same thread. A CUDA-graph replay lends the correlation
    id of its cudaGraphLaunch to every kernel inside it, so graph kernels join like any other launch.
    Works for torch-profiler traces (read_chrome_trace) and for any event table with the same columns
    (kind, name, ts_us, end_us, pid, tid, correlation).

    ``kinds``: which CPU events count as ranges (user_annotation: record_function / NVTX mirrored by
    common.capture.ranges; add "cpu_op" for aten ops). Returns one row per (range, GPU event) with
    JOIN_COLUMNS: range (its name), label and call ('label #call'), range_index (n-th range of that
    name), range start/end, order (launch order inside the range, by GPU start), gpu_kind, kernel (short
    name; the op name for copies), full_name, ts_us/dur_us/end_us (GPU side), stream, correlation, grid,
    block. A range that launched nothing gives one row with gpu_kind None (``empty_rows``).
    Raises TraceError when no range matches.
    """
    import pandas as pd
    rx = re.compile(pattern)
    rng = ev[ev["kind"].isin(kinds) & ev["name"].str.contains(rx)].sort_values("ts_us", kind="stable")
    if rng.empty:
        raise TraceError(f"no range in the trace matches {pattern!r}: were the calls wrapped in "
                         "record_function / common.capture.ranges.nvtx_range while the profiler ran?")
    rt = ev[(ev["kind"] == "runtime") & ev["correlation"].notna()][["ts_us", "pid", "tid", "correlation"]]
    rt = rt.drop_duplicates("correlation").rename(columns={"ts_us": "launch_us", "pid": "launch_pid",
                                                          "tid": "launch_tid"})
    cols = ["kind", "short", "name", "ts_us", "dur_us", "end_us", "stream", "correlation", "grid", "block"]
    k = ev[ev["kind"].isin(gpu_kinds) & ev["correlation"].notna()][cols].merge(rt, on="correlation", how="inner")
    k = k.sort_values("ts_us", kind="stable").reset_index(drop=True)
    # per launching thread, its launches in launch order: a range's launches are one searchsorted slice (a
    # boolean filter of the whole table per range made a long trace's join quadratic)
    import numpy as np
    by_thread = {}
    for key, g in k.groupby(["launch_pid", "launch_tid"], sort=False):
        g = g.sort_values(["launch_us"], kind="stable")
        by_thread[key] = (g["launch_us"].to_numpy(), g.index.to_numpy())
    rows, seen = [], {}
    for r in rng.itertuples():
        label, call = split_label(r.name)
        idx = seen.get(r.name, 0)
        seen[r.name] = idx + 1
        at, pos = by_thread.get((r.pid, r.tid), (np.empty(0), np.empty(0, dtype=int)))
        lo, hi = np.searchsorted(at, r.ts_us, side="left"), np.searchsorted(at, r.end_us, side="right")
        inside = k.iloc[np.sort(pos[lo:hi])]
        base = {"range": r.name, "label": label, "call": call, "range_index": idx, "range_ts_us": r.ts_us,
                "range_end_us": r.end_us}
        if inside.empty and empty_rows:
            rows.append({**base, "order": None, "gpu_kind": None, "kernel": None, "full_name": None,
                         "ts_us": math.nan, "dur_us": 0.0, "end_us": math.nan})
        for n, g in enumerate(inside.itertuples()):
            rows.append({**base, "order": n, "gpu_kind": g.kind, "kernel": g.short, "full_name": g.name,
                         "ts_us": g.ts_us, "dur_us": g.dur_us, "end_us": g.end_us, "stream": g.stream,
                         "correlation": g.correlation, "grid": g.grid, "block": g.block})
    return pd.DataFrame(rows, columns=JOIN_COLUMNS)


def calls_in_ranges(ev, pattern: str, call: str, kinds=("user_annotation",), inner=("runtime",)) -> list[tuple[str, int]]:
    """(range name, how many events of kind ``inner`` named like ``call`` start inside it, on the same process
    and thread) for each range matching ``pattern``, in time order: the cudaEventSynchronize of an attention
    backend's plan in a step, the cudaGraphLaunch of a graph replay, or (inner=("user_annotation",)) the
    Layer_i ranges inside a step. The CPU-side twin of kernels_in_ranges (which joins GPU work by correlation)."""
    rng = ev[ev["kind"].isin(kinds) & ev["name"].str.contains(pattern)].sort_values("ts_us", kind="stable")
    calls = ev[ev["kind"].isin(inner) & ev["name"].str.contains(call)]
    return [(r.name, int(((calls["pid"] == r.pid) & (calls["tid"] == r.tid) & (calls["ts_us"] >= r.ts_us)
                          & (calls["ts_us"] <= r.end_us)).sum())) for r in rng.itertuples()]


def split_at_marker(names, marker: str) -> tuple[list[int], list[bool]]:
    """Sweep points of a profiled run: a marker kernel (common.capture.ncu.MARKER_KERNEL, or any name) opens each point.
    Returns (point index of every row, 0-based by markers seen so far, -1 before the first; whether the row is
    a marker). The one marker split, for ncu rows (common.tables.kernels.split_points) and traced kernels alike."""
    point, pts, is_mark = -1, [], []
    for n in names:
        m = marker in str(n)
        point += m
        pts.append(point)
        is_mark.append(m)
    return pts, is_mark


# ------------------------------------------------------------------ steps: the kernels of each forward step

STEP_COLUMNS = ["step", "step_name", "order", "kernel", "full_name", "cls", "ts_us", "dur_us", "end_us", "stream",
                "grid", "block", "how"]


def step_ranges(ev, step: str, parse=None) -> list[dict]:
    """Every range matching ``step`` in time order, as dicts: step (its index), name, ts_us, cpu_us (the range on
    the CPU), pid, tid and the fields ``parse(name)`` returns (a step whose name ``parse`` rejects with None is
    left out). Raises TraceError when none matches."""
    ua = ev[(ev["kind"] == "user_annotation") & ev["name"].str.contains(step)].sort_values("ts_us", kind="stable")
    if ua.empty:
        raise TraceError(f"no step range matches {step!r}: was the trace written by the system's profiler "
                         "(SGLang /start_profile, a script's capture)?")
    out = []
    for r in ua.itertuples():
        meta = parse(r.name) if parse else {}
        if meta is None:
            continue
        out.append({"step": len(out), "name": r.name, "ts_us": r.ts_us, "end_us": r.end_us, "cpu_us": r.dur_us,
                    "pid": r.pid, "tid": r.tid, **meta})
    return out


class Shared(list):
    """A list a table carries in its ``.attrs`` (the step ranges), shared by every frame derived from it: pandas
    deep-copies ``.attrs`` on each operation that derives a frame (``__finalize__``), once per filter of a long
    analysis. The ranges are read, never changed, after the join."""

    def __deepcopy__(self, memo):
        return self


def step_kernels(ev, step: str, outer: str | None = None, parse=None):
    """The kernels of every step of a trace: the one place kernels are matched to a step.

    A step is a range matching ``step`` (e.g. SGLang's ``step[DECODE bs=32]``, mini-SGLang's ``step[...]``);
    its kernels are those of the range matching ``outer`` that encloses it on the same thread when there is one
    (SGLang's ``scheduler.run_batch``, which also holds the sampling kernels launched after the step range
    closes: ``how`` = "outer"), else those of the step range itself (``how`` = "step"). The join under both is
    kernels_in_ranges (correlation ids; CUDA-graph replays included). ``parse(name) -> dict`` adds a step's
    fields (mode, bs, toks...) to each of its rows. Returns the kernel table (STEP_COLUMNS + the parsed fields),
    one row per kernel in start order within each step; ``.attrs["steps"]`` holds every step range
    (step_ranges), those without kernels too.
    """
    import pandas as pd
    ranges = step_ranges(ev, step, parse)
    ua = ev[ev["kind"] == "user_annotation"]
    outers = ua[ua["name"].str.contains(outer)] if outer else ua.iloc[0:0]
    joins = {"step": kernels_in_ranges(ev, step, empty_rows=False)}
    if len(outers):
        joins["outer"] = kernels_in_ranges(ev, outer, empty_rows=False)
    # each range's kernels, found once (a filter of the whole join per step made long traces slow)
    by_range = {how: {key: g for key, g in j[j["gpu_kind"] == "kernel"].groupby(["range", "range_ts_us"], sort=False)}
                for how, j in joins.items()}
    none = joins["step"].iloc[0:0]
    rows = []
    for st in ranges:
        around = outers[(outers["ts_us"] <= st["ts_us"]) & (outers["end_us"] >= st["end_us"]) &
                        (outers["tid"] == st["tid"]) & (outers["pid"] == st["pid"])]
        how = "outer" if len(around) else "step"
        name = around["name"].iloc[0] if len(around) else st["name"]
        start = around["ts_us"].iloc[0] if len(around) else st["ts_us"]
        inside = by_range[how].get((name, start), none)
        meta = {k: v for k, v in st.items() if k not in ("step", "name", "ts_us", "end_us", "cpu_us", "pid", "tid")}
        for n, r in enumerate(inside.sort_values("ts_us", kind="stable").itertuples()):
            rows.append({"step": st["step"], "step_name": st["name"], **meta, "order": n, "kernel": r.kernel,
                         "full_name": r.full_name, "cls": kernel_class(r.kernel), "ts_us": r.ts_us, "dur_us": r.dur_us,
                         "end_us": r.end_us, "stream": r.stream, "grid": r.grid, "block": r.block, "how": how})
        st["how"] = how
    kt = pd.DataFrame(rows)
    if kt.empty:
        kt = pd.DataFrame(columns=STEP_COLUMNS)
    kt.attrs["steps"] = Shared(ranges)
    return kt


def step_summary(kt, ranges: list[dict] | None = None) -> list[dict]:
    """One row per step of a step_kernels() table (``ranges``: its ``.attrs["steps"]``, so steps without a
    kernel get a row too): the step's fields, name, start_us (its first kernel, GPU clock), dur_us (GPU span:
    first kernel start to last kernel end), cpu_us (the step range on the CPU), kernels, kernel_us,
    ``<class>_us`` per kernel class, how (outer | step) and top (its 3 largest kernels)."""
    ranges = ranges if ranges is not None else kt.attrs.get("steps", [])
    out = []
    for st in ranges:
        g = kt[kt["step"] == st["step"]] if len(kt) else kt
        meta = {k: v for k, v in st.items() if k not in ("step", "name", "ts_us", "end_us", "cpu_us", "pid", "tid", "how")}
        by_cls = g.groupby("cls")["dur_us"].sum() if len(g) else {}
        top = g.groupby("kernel")["dur_us"].sum().sort_values(ascending=False).head(3) if len(g) else {}
        out.append({**meta, "name": st["name"], "start_us": float(g["ts_us"].min()) if len(g) else float(st["ts_us"]),
                    "dur_us": float(g["end_us"].max() - g["ts_us"].min()) if len(g) else 0.0,
                    "cpu_us": float(st["cpu_us"]), "kernels": int(len(g)), "kernel_us": float(g["dur_us"].sum()) if len(g) else 0.0,
                    **{f"{c}_us": float(v) for c, v in dict(by_cls).items()}, "how": st.get("how", "step"),
                    "top": "; ".join(f"{n} {v:.0f}us" for n, v in dict(top).items())})
    return out


def capture_calls(torch, calls, path, reps: int = 3, warm: bool = True) -> Path:
    """Run each (label, fn) ``reps`` times under torch.profiler (CPU + CUDA activities), each call inside
    a range "label #i" (NVTX too, via common.capture.ranges), and write the Chrome trace to ``path``. Read it
    back with read_chrome_trace and kernels_in_ranges(ev, "^label"). ``warm`` calls each fn once first,
    outside the trace (lazy buffers, JIT loads)."""
    from torch.profiler import ProfilerActivity, profile

    from common.capture.ranges import nvtx_range
    if warm:
        for _label, fn in calls:
            fn()
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for label, fn in calls:
            for i in range(reps):
                with nvtx_range(f"{label} #{i}"):
                    fn()
            torch.cuda.synchronize()
    prof.export_chrome_trace(str(path))
    return Path(path)


def kernel_period(names: list, min_period: int = 3, max_period: int = 80, min_repeats: int = 3,
                  anchor: str | None = None):
    """The repeating unit of a kernel sequence (e.g. the kernels of one transformer layer).

    Returns (period, block, start) for the period whose repetition covers the longest stretch
    (``names[i] == names[i + period]``), or (None, [], None) when nothing repeats ``min_repeats``
    times. Shorter periods win ties, so a layer is not reported as two layers. ``anchor`` (a regex)
    rotates the block to begin at a matching kernel: the one from which the block reaches an
    attention or RoPE kernel soonest (a layer begins with the norm before the QKV projection, not
    the norm before the MLP). Inside a CUDA graph there are no per-layer ranges: this is how a
    step's kernels are assigned to layers.
    """
    best = (0, None, None)
    n = len(names)
    for p in range(min_period, min(max_period, n // 2) + 1):
        run = start = 0
        best_run, best_start = 0, 0
        for i in range(n - p):
            if names[i] == names[i + p]:
                if run == 0:
                    start = i
                run += 1
                if run > best_run:
                    best_run, best_start = run, start
            else:
                run = 0
        if best_run + p >= min_repeats * p and best_run > best[0]:
            best = (best_run, p, best_start)
    if best[1] is None:
        return None, [], None
    _, p, s = best
    block = names[s:s + p]
    if anchor:
        hits = [i for i, nm in enumerate(block) if re.search(anchor, nm)]
        if hits:
            def reach(i):   # kernels from position i to the first attention / rope kernel of the block
                rot = block[i:] + block[:i]
                return next((k for k, nm in enumerate(rot) if kernel_class(nm) in ("attention", "rope")), p)
            hit = min(hits, key=reach)
            s += hit
            block = names[s:s + p] if s + p <= len(names) else block[hit:] + block[:hit]
    return p, block, s


def _same_layer(window: list, block: list) -> bool:
    """A window of kernels is one more copy of the layer block: the same names, except at most one
    kernel of the same class (layer 0 starts with a plain RMSNorm where the others fuse the residual add)."""
    diff = [(a, b) for a, b in zip(window, block) if a != b]
    return len(window) == len(block) and (not diff or (len(diff) == 1 and kernel_class(diff[0][0]) ==
                                                       kernel_class(diff[0][1]) != "other"))


def assign_layers(names: list, anchor: str | None = "Norm", layers: int | None = None) -> list:
    """Layer index of each kernel of one forward step (None before the first and after the last layer:
    input preparation, embedding, final norm, logits, sampling), from the repeating unit found by
    :func:`kernel_period`. With ``layers`` (the model's layer count) the result is checked: another
    number of repeats is a TraceError (the step is not one whole forward)."""
    p, block, s = kernel_period(names, anchor=anchor)
    if p is None:
        raise TraceError("no repeating layer pattern in the step's kernels")
    while s - p >= 0 and _same_layer(names[s - p:s], block):      # walk back over layers that differ by a kernel
        s -= p
    out = [None] * len(names)
    i, layer = s, 0
    while i + p <= len(names) and _same_layer(names[i:i + p], block):
        for j in range(i, i + p):
            out[j] = layer
        i, layer = i + p, layer + 1
    if layers is not None and layer != layers:
        raise TraceError(f"found {layer} repeats of a {p}-kernel layer, the model has {layers} layers")
    return out


# ------------------------------------------------------------------ kernel classes

_CLASSES = [  # first match wins; case-insensitive; names as seen in SGLang, mini-SGLang and FlashInfer traces
    ("allreduce", r"allreduce|all_reduce|cross_device_reduce|one_?shot|two_?shot|nccl|custom_ar|AllGather|all_gather"),
    ("attention", r"PrefillWithKVCache|BatchPrefillWith|BatchDecodeWith|MergeState|VariableLengthMergeStates|"
                  r"^_fwd_kernel|^_fwd_grouped_kernel|flash_fwd|flash_attn|fmha|attention"),
    ("gemm", r"nvjet|gemm|cutlass|xmma|splitKreduce|cublas|matmul|sm90_xmma"),
    ("norm", r"RMSNorm|LayerNorm|rms_norm|layer_norm"),
    ("rope", r"rope|rotary"),
    ("activation", r"act_and_mul|silu|gelu"),
    ("kv_store", r"store_kvcache|StoreKVCache|store_cache|set_kv|store_kv"),
    ("index", r"kv_indices|req_to_token|compute_position|DeviceScan|index_kernel"),
    ("sampling", r"sampling|sampler|softmax|argmax|topk|top_k|top_p|gumbel"),
    ("memory", r"memcpy|memset|CatArray|copy|indexSelect|gather|scatter"),
    ("elementwise", r"elementwise|multi_tensor_apply|reduce_kernel|fill"),
]
_CLASS_RX = [(c, re.compile(rx, re.I)) for c, rx in _CLASSES]
KERNEL_CLASSES = tuple(c for c, _ in _CLASSES) + ("other",)


def kernel_class(name: str) -> str:
    """A coarse class for a kernel name (short or full): gemm, attention, norm, rope, ..., other."""
    for cls, rx in _CLASS_RX:
        if rx.search(name or ""):
            return cls
    return "other"


# ------------------------------------------------------------------ Nsight Systems

_NSYS_COLS = {"Time (%)": "time_pct", "Total Time (ns)": "total_ns", "Instances": "instances",
              "Avg (ns)": "avg_ns", "Med (ns)": "med_ns", "Min (ns)": "min_ns", "Max (ns)": "max_ns",
              "StdDev (ns)": "std_ns", "Name": "name", "Range": "name", "Style": "style",
              "Start (ns)": "start_ns", "Duration (ns)": "dur_ns", "Strm": "stream", "Device": "device",
              "GrdX": "grid_x", "GrdY": "grid_y", "GrdZ": "grid_z", "BlkX": "block_x", "BlkY": "block_y",
              "BlkZ": "block_z", "CorrId": "correlation", "Count": "count", "Operation": "name"}


def _unreadable(e: Exception, lines: list[tuple[int, str]], start: int) -> str:
    """Where pandas stopped reading an nsys CSV ('EOF inside string starting at row 15'): the file's line and,
    for a quote never closed, the column it opened in."""
    msg = str(e).strip().splitlines()[0] if str(e).strip() else e.__class__.__name__
    m = re.search(r"row (\d+)", msg)
    if not m or start + int(m.group(1)) >= len(lines):
        return f"not a readable CSV, cut short? ({msg})"
    n, text = lines[start + int(m.group(1))]
    header = lines[start][1].split(",")
    col = text[:text.index('"')].count(",") if '"' in text else None
    where = f"column {header[col]}, " if col is not None and col < len(header) else ""
    return f"{where}line {n}: a quote never closed (the file cut mid-quote?) ({msg})"


def _check_nsys(df, path, line_of: list[int]) -> None:
    """TraceError naming the file, column and line of what a trace or summary table cannot do without: its
    name column, and in each row a name and numeric times (a file cut mid-row leaves them empty)."""
    import pandas as pd
    times = [c for c in ("Start (ns)", "Duration (ns)", "Total Time (ns)") if c in df.columns]
    if not times:
        return
    name = next((c for c in ("Name", "Range", "Operation") if c in df.columns), None)
    if name is None:
        raise TraceError(f"{path}: no Name column (columns: {', '.join(map(str, df.columns))}): not an nsys stats "
                         "table this reads")
    for c in [name, *times]:
        bad = df[c].isna() | (pd.to_numeric(df[c], errors="coerce").isna() if c != name else False)
        if bad.any():
            i = int(bad.to_numpy().argmax())
            v = df[c].iloc[i]
            raise TraceError(f"{path}: column {c}, line {line_of[i]}: "
                             + ("empty (the file cut mid-row?)" if pd.isna(v) else f"{v!r} is not a number"))


def read_nsys_csv(path):
    """Read an `nsys stats --format csv` table; a trace report (Start/Duration) becomes an event table.

    Summary reports (cuda_gpu_kern_sum, nvtx_sum, cuda_api_sum...) come back with snake_case
    columns (total_ns, instances, avg_ns, ..., name); NVTX range names lose nsys's leading ':'.
    """
    import pandas as pd
    path = Path(path)
    text = path.read_text(errors="replace") if path.exists() else ""
    lines = [(n, l) for n, l in enumerate(text.splitlines(), 1) if l.strip()]     # (line in the file, text)
    # nsys may print a banner ("Processing ...", "NOTICE: ...") before the CSV header
    start = next((i for i, (_, l) in enumerate(lines) if l.startswith(("Time (%)", "Start (ns)", '"Time (%)"',
                                                                        "Range", "Name", "Operation"))), None)
    if start is None:
        raise TraceError(f"{path}: not an nsys stats CSV (no 'Time (%)' or 'Start (ns)' header); "
                         "was the report empty (nothing traced)?")
    import io
    try:
        df = pd.read_csv(io.StringIO("\n".join(l for _, l in lines[start:])))
    except (pd.errors.ParserError, ValueError) as e:
        raise TraceError(f"{path}: {_unreadable(e, lines, start)}") from None
    if df.empty:
        raise TraceError(f"{path}: nsys stats table has a header but no rows")
    _check_nsys(df, path, [n for n, _ in lines[start + 1:]])
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
        dims = lambda a, b, c: [f"{int(x)}x{int(y)}x{int(z)}" if x == x else None  # noqa: E731
                                for x, y, z in zip(df.get(a, []), df.get(b, []), df.get(c, []))] or None
        ev["grid"] = dims("grid_x", "grid_y", "grid_z")
        ev["block"] = dims("block_x", "block_y", "block_z")
        ev["stream"] = df.get("stream")
        ev["correlation"] = df.get("correlation")
        ev["device"] = df.get("device")
        return ev[COLUMNS]
    if "name" in df.columns and "total_ns" in df.columns:
        df["short"] = df["name"].astype(str).map(short_name)
    return df
