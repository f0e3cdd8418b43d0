"""One joined timeline per story: scheduler steps -> layers -> kernels -> hardware counters.

    kt = layered(trace.step_kernels(ev, r"^step\\[", outer=r"^scheduler\\.run_batch$", parse=parse_step))
    kt = add_work(kt, cfg, steps, ceilings)            # FLOPs / formula bytes by role -> TFLOP/s, effective TB/s
    kt, info = attach_counters(kt, ncu_rows, windows, ceilings)  # Nsight Compute counters on every kernel of a step kind
    tree = layer_tree(kt, step=0)                       # one layer + the once-per-step kernels, shares of the step
    write_perfetto_fit("story.json", kt, steps=spans, requests=reqs, counters=tracks)   # ui.perfetto.dev, <= 5 MB

The kernel table ``kt`` has one row per GPU kernel of a traced step; its columns are declared once in
common.tables.kernels (trace, layers, work, counters, joined), plus the fields ``parse`` returns for a step
name (mode, bs, toks ...).

How the pieces are joined (each join is one function, shared by the three systems):
  * kernels -> steps: common.tables.trace.step_kernels (the one join; correlation id, same process and thread;
    graph replays included; an enclosing ``outer`` range such as SGLang's scheduler.run_batch, which also
    holds the sampling kernels, gives the step its kernels).
  * kernels -> layers: common.tables.trace.assign_layers (the repeating unit of the step's kernel names).
  * kernels -> counters: Nsight Compute profiles a few windows (one step each, usually of a model cut to
    2 layers of unchanged shapes); each window is aligned kernel by kernel with a traced step of the same
    kind, with its layers cut to the same count (difflib on kernel names), and the counters of window
    layer 0 / layer 1 go to layer 0 / every later layer of every traced step of that kind (same shapes,
    same kernels); pre- and post-layer kernels by their position.
"""
from __future__ import annotations

import difflib
import json
import math
import re
from pathlib import Path

from common.base.story import fmt
from common.capture.ceilings import kind_ceiling, l2_bytes, STREAM_FACTOR
from common.tables import kernels
from common.tables.flops import GAP_PARTS, step_floor
from common.tables.trace import assign_layers, kernel_class, TraceError

GEMM_ROLES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
COUNTER_COLUMNS = tuple(kernels.names("counters"))     # what attach_counters copies (+ ncu's grid and block)


# ------------------------------------------------------------------ kernels of each step

def layered(kt, layers: int | None = None):
    """Layers, positions, segments and roles of the kernels of a common.tables.trace.step_kernels table (the one join
    of kernels to steps): per step, assign_layers finds the repeating unit of its kernel names (CUDA-graph
    replays included); ``layers``: the model's layer count (checked when given; a step that is not one whole
    forward gets no layers). Returns the table with layer, pos, segment and role (common.tables.kernels LAYERS)."""
    import pandas as pd
    parts = []
    for _s, g in kt.groupby("step", sort=True):
        g = g.sort_values("ts_us", kind="stable").copy()
        names_ = g["kernel"].tolist()
        try:
            lay = assign_layers(names_, layers=layers)
        except TraceError:
            lay = [None] * len(names_)
        roles, pos, seg = _roles(names_, lay)
        g["order"] = range(len(g))
        g["layer"], g["pos"], g["segment"], g["role"] = lay, pos, seg, roles
        parts.append(g)
    out = pd.concat(parts, ignore_index=True) if parts else kt.assign(layer=None, pos=None, segment=None, role=None)
    out.attrs = dict(kt.attrs)
    return out


def _roles(names: list, layers: list):
    """(role, position in the layer, segment) of each kernel of one step."""
    roles, pos, seg = [None] * len(names), [None] * len(names), [None] * len(names)
    first = next((i for i, l in enumerate(layers) if l is not None), None)
    last = max((i for i, l in enumerate(layers) if l is not None), default=None)
    cur_layer, k_in_layer, gemms, norms, prev_role = None, 0, 0, 0, None
    for i, (n, l) in enumerate(zip(names, layers)):
        c = kernel_class(n)
        if l is not None:
            if l != cur_layer:
                cur_layer, k_in_layer, gemms, norms, prev_role = l, 0, 0, 0, None
            pos[i], seg[i] = k_in_layer, "layer"
            k_in_layer += 1
            if c == "gemm" and re.search("splitKreduce", n):
                r = prev_role or "other"
            elif c == "gemm":
                r = GEMM_ROLES[gemms] if gemms < len(GEMM_ROLES) else "other"
                gemms += 1
            elif c == "norm":
                r = "input_norm" if norms == 0 else "post_norm"
                norms += 1
            elif c == "activation":
                r = "act"
            elif c in ("attention", "rope", "kv_store"):
                r = c
            else:
                r = "other"
            roles[i] = prev_role = r
        elif first is None or i < first:
            seg[i] = "pre"
            roles[i] = "embedding" if re.search(r"gather|indexSelect|embedding", n, re.I) else "prepare"
        else:
            seg[i] = "post"
            before_gemm = not any(kernel_class(x) == "gemm" for x in names[last + 1:i])
            roles[i] = ("final_norm" if c == "norm" and before_gemm else "lm_head" if c == "gemm" and before_gemm
                        else "sampling")
    return roles, pos, seg


def primary(kt):
    """Rows that carry a role's work: the first kernel of each (step, layer, role); split-K reduces and
    merge kernels are the second part of the same work (their own time still counts for the step)."""
    key = kt["layer"].fillna(-1).astype(int).astype(str) + "/" + kt["role"].astype(str)
    return ~kt.assign(_k=key).duplicated(subset=["step", "_k"]).to_numpy()


# ------------------------------------------------------------------ work and rates

def add_work(kt, cfg: dict, steps: dict, ceilings: dict | None = None, tp: int = 1):
    """FLOPs and formula bytes of each kernel's role (common.tables.flops.layer_work), and the rates its traced time
    gives (the work columns of common.tables.kernels): tflop_s and pct_bf16_ceiling; eff_tb_s, the effective
    bandwidth (formula bytes / time, not a DRAM rate); stream_pct for the GEMMs of a step whose weights are
    at least STREAM_FACTOR x the L2 (``ceilings["l2_mb"]``): their formula bytes then do come from DRAM.

    ``steps``: {step: {"tokens": new tokens, "qo_lens": [...], "kv_lens": [...]}} (the batch of that
    step, from the scheduler's log). Only the primary kernel of a role carries its work (see primary()).
    """
    from common.tables.flops import layer_work
    kt = kt.copy()
    kt["flops"], kt["bytes"] = math.nan, math.nan
    prim = primary(kt)
    for s, info in steps.items():
        work = layer_work(cfg, tokens=info["tokens"], kv_lens=info["kv_lens"], qo_lens=info.get("qo_lens"), tp=tp)
        m = (kt["step"] == s) & prim
        for role, w in work.items():
            sel = m & (kt["role"] == role)
            kt.loc[sel, "flops"] = float(w["flops"])
            kt.loc[sel, "bytes"] = float(w["bytes"])
    sec = kt["dur_us"] * 1e-6
    kt["tflop_s"] = (kt["flops"] / sec / 1e12).where(kt["flops"] > 0)
    kt["eff_tb_s"] = kt["bytes"] / sec / 1e12
    kt["pct_bf16_ceiling"] = 100 * kt["tflop_s"] / ceilings["bf16_tflops"] if (ceilings or {}).get("bf16_tflops") \
        else math.nan
    kt["stream_pct"] = math.nan
    read = kind_ceiling(ceilings or {}, "read")
    l2 = (ceilings or {}).get("l2_mb")
    if read and l2:
        gemm = kt["role"].isin(GEMM_ROLES + ("lm_head",))
        weights = kt[gemm].groupby("step")["bytes"].sum()
        big = set(weights[weights >= STREAM_FACTOR * l2_bytes(ceilings)].index)
        sel = gemm & kt["step"].isin(big)
        kt.loc[sel, "stream_pct"] = 100 * kt.loc[sel, "eff_tb_s"] / read
    return kt


# ------------------------------------------------------------------ Nsight Compute counters

def _collapse(g, keep_layers: int):
    """The kernels of one traced step with its layers cut to ``keep_layers`` (what a model cut to that
    many layers launches): (names, keys) where a key is ('pre', i) / ('layer', l, pos) / ('post', i)."""
    names, keys, pre, post = [], [], 0, 0
    for r in g.itertuples():
        if r.segment == "layer":
            if r.layer < keep_layers:
                names.append(r.kernel)
                keys.append(("layer", int(r.layer), int(r.pos)))
        elif r.segment == "pre":
            names.append(r.kernel)
            keys.append(("pre", pre))
            pre += 1
        else:
            names.append(r.kernel)
            keys.append(("post", post))
            post += 1
    return names, keys


def attach_counters(kt, ncu_rows, windows: list[dict], ceilings: dict | None = None, keep_layers: int = 2):
    """Nsight Compute counters on the kernels of the traced steps.

    ``ncu_rows``: common.tables.kernels.summarize() rows (a DataFrame) of ALL profiled kernels in launch order;
    ``windows``: in the order they were profiled, one dict each: {"name", "step": a traced step of the
    same kind, "match": {column: value} selecting every traced step the counters apply to}. A window whose
    "step" is None ran a step no traced story has (a cold prefill, say): it takes no place in the alignment,
    and its ncu rows are those between its neighbours' rows.
    Returns (kt with the COUNTER_COLUMNS, ``ncu_window`` and the joined columns of common.tables.kernels, info)
    where info has one row per window: kernels expected / profiled / matched by name, and ``ncu_rows``
    (first, last) index of the window's rows in ``ncu_rows`` (None when none is known).
    """
    import pandas as pd
    kt = kt.copy()
    rows = ncu_rows.to_dict("records")
    ncu_names = [r["kernel"] for r in rows]
    traced = [w for w in windows if w.get("step") is not None]
    parts = [_collapse(kt[kt["step"] == w["step"]], keep_layers) for w in traced]
    owners = [(w["name"], k) for w, (_n, keys) in zip(traced, parts) for k in keys]
    by_window: dict = {w["name"]: {} for w in windows}
    span: dict = {}
    for w, (_names, keys), mapping in zip(traced, parts, _align_in_order([n for n, _k in parts], ncu_names)):
        for i, j in mapping.items():
            by_window[w["name"]][keys[i]] = rows[j]
        if mapping:
            span[w["name"]] = (min(mapping.values()), max(mapping.values()))
    for n, w in enumerate(windows):
        if w.get("step") is None:
            before = [span[v["name"]][1] for v in windows[:n] if v["name"] in span]
            after = [span[v["name"]][0] for v in windows[n + 1:] if v["name"] in span]
            lo, hi = (max(before) + 1 if before else 0), (min(after) - 1 if after else len(rows) - 1)
            if lo <= hi:
                span[w["name"]] = (lo, hi)
    info, hits = [], {}   # hits: row index -> (window, its ncu row); a later window's wins, as it always did
    seg_pos = kt.groupby(["step", "segment"], sort=False, dropna=False).cumcount()   # _seg_index of every row
    for w in windows:
        got = by_window[w["name"]]
        n_exp = sum(1 for o in owners if o[0] == w["name"])
        sel = kt["step"] >= 0
        if w.get("step") is None:
            sel &= False
        for col, val in (w.get("match") or {}).items():
            sel &= kt[col] == val
        applied = by_shape = 0
        # a layer's kernel at another place in the profiled layers, same name and launch grid: the first layer of a
        # model cut to 1 layer opens with RMSNorm where the full model's later layers open with FusedAddRMSNorm,
        # the kernel (and grid) that the profiled layer runs after its attention
        shapes = {}
        for key, c in got.items():
            if key[0] == "layer":
                shapes.setdefault((c["kernel"], _dims(c.get("grid"))), c)
        sub = kt.loc[sel, ["segment", "layer", "pos", "kernel", "grid"]]
        for idx, seg, layer, pos, name, grid, k in zip(sub.index, sub["segment"], sub["layer"], sub["pos"],
                                                       sub["kernel"], sub["grid"], seg_pos[sel]):
            key = ("layer", min(int(layer), keep_layers - 1), int(pos)) if seg == "layer" else (seg, int(k))
            c = got.get(key)
            if (c is None or c["kernel"] != name) and seg == "layer":
                c = shapes.get((name, _dims(grid)))
                by_shape += c is not None
            if c is None or c["kernel"] != name:
                continue
            applied += 1
            hits[idx] = (w["name"], c)
        info.append({"window": w["name"], "expected": n_exp, "matched": len(got), "kernels_with_counters": applied,
                     "by_shape": by_shape, "ncu_rows": span.get(w["name"])})
    # one column at a time (a cell at a time was 1.3 million pandas writes on a --quick recording: ~50 s)
    pos_of = {idx: i for i, idx in enumerate(kt.index)}
    sources = {**{c: (lambda h, c=c: h[1].get(c)) for c in COUNTER_COLUMNS}, "ncu_window": lambda h: h[0],
               "ncu_grid": lambda h: h[1].get("grid"), "ncu_block": lambda h: h[1].get("block")}
    for col, get in sources.items():
        vals = [None] * len(kt)
        for idx, h in hits.items():
            vals[pos_of[idx]] = get(h)
        kt[col] = pd.Series(vals, index=kt.index, dtype=object)
    return kernels.joined(kt, ceilings), info


def _dims(grid) -> tuple:
    """A launch grid as numbers: the traced '2x66x1' and ncu's '(2, 66, 1)' read alike."""
    return tuple(int(x) for x in re.findall(r"\d+", str(grid)))


def same_dims(traced, counted) -> bool:
    """A traced grid '2x66x1' and ncu's '(2, 66, 1)' name the same launch shape."""
    return _dims(traced) == _dims(counted) != ()


def _align_in_order(parts: list[list[str]], names: list[str], slack: float = 0.1) -> list[dict]:
    """Each window's expected kernel names matched to the ncu rows, window after window: a window is looked for
    after the last row of the one before, at the start (one of its first three kernels) whose stretch of rows
    (its own length plus ``slack``) matches most of its names, the earliest of equals. So a window without a
    traced step (rows in no part) is skipped, never half-matched. Returns {expected index: row index} per part."""
    out, cursor = [], 0
    for exp in parts:
        n, best, mapping = len(exp), (0, None, None), {}
        width = n + max(4, int(n * slack))
        heads = set(exp[:3])
        for s in range(cursor, len(names)):
            if names[s] not in heads:
                continue
            sm = difflib.SequenceMatcher(None, exp, names[s:s + width], autojunk=False)
            got = sum(b.size for b in sm.get_matching_blocks())
            if got > best[0]:
                best = (got, s, sm)
                if got == n:
                    break
        if best[1] is not None:
            for a, b, size in best[2].get_matching_blocks():
                for k in range(size):
                    mapping[a + k] = best[1] + b + k
            cursor = max(mapping.values()) + 1
        out.append(mapping)
    return out


# ------------------------------------------------------------------ the layer tree

TREE_COLUMNS = tuple(kernels.names("work", "counters", "joined"))


# ------------------------------------------------------------------ the floor of a step (the time it cannot beat)

MAIN_ROLES = GEMM_ROLES + ("lm_head", "attention")     # the kernels that carry a step's work
FLOOR_PARTS = dict(zip(GAP_PARTS, ("below_ceiling_ms", "small_kernels_ms", "gpu_idle_ms", "cpu_not_hidden_ms")))
FLOOR_WORDS = {"below ceiling": "GEMM and attention kernels running below their ceiling",
               "small kernels": "small kernels (norms, RoPE, KV store, activation, sampling)",
               "GPU idle in step": "the GPU idle between the step's kernels",
               "CPU not hidden": "CPU work the overlap scheduler does not hide"}


def _is_prefill(mode) -> bool:
    return str(mode).lower() in ("extend", "prefill")


def step_starts(kt) -> list[tuple]:
    """(step, mode, bs, first kernel start) of every step of a kernel table, in time order."""
    g = kt.groupby("step").agg(mode=("mode", "first"), bs=("bs", "first"), t0=("ts_us", "min")).reset_index()
    return [(int(r.step), r.mode, int(r.bs), float(r.t0)) for r in g.sort_values("t0").itertuples()]


def pick_step(kt, prefill: bool) -> tuple[int, float | None] | None:
    """(step, period in us) of a kernel table's step: the first prefill (SGLang's EXTEND, mini-SGLang's prefill); for
    decode, the step whose period (its first kernel to the next decode step's first, same batch) is the median at the
    table's largest batch. A step with no next one gets period None; None when the table has no such step."""
    st = step_starts(kt)
    if prefill:
        i = next((i for i, s in enumerate(st) if _is_prefill(s[1])), None)
        if i is None:
            return None
        return st[i][0], (st[i + 1][3] - st[i][3]) if i + 1 < len(st) else None
    dec = [s for s in st if not _is_prefill(s[1])]
    if not dec:
        return None
    bs = max(s[2] for s in dec)
    pairs = [(a, b[3] - a[3]) for a, b in zip(st, st[1:])
             if not _is_prefill(a[1]) and not _is_prefill(b[1]) and a[2] == b[2] == bs]
    if not pairs:
        last = [s for s in dec if s[2] == bs]
        return last[len(last) // 2][0], None
    order = sorted(range(len(pairs)), key=lambda i: pairs[i][1])
    a, per = pairs[order[(len(order) - 1) // 2]]
    return a[0], per


def floor_row(kt, step: int, period_us, pk: dict, label: str, extra: dict | None = None) -> dict:
    """One step's floor and the parts of its period (common.tables.flops.step_floor over the step's kernels, their
    work from add_work) as a row in ms: floor, period, what binds it (read or compute), the FLOOR_PARTS."""
    read = kind_ceiling(pk, "read")
    g = kt[kt["step"] == step]
    ks = [{"ts_us": r.ts_us, "end_us": r.end_us, "dur_us": r.dur_us, "bytes": r.bytes, "flops": r.flops,
           "main": r.role in MAIN_ROLES} for r in g.itertuples()]
    f = step_floor(ks, period_us, read, pk["bf16_tflops"])
    row = {"step_kind": label, "step": step, "mode": g["mode"].iloc[0], "bs": int(g["bs"].iloc[0]), **(extra or {}),
           "kernels": len(g), "period_ms": f["period_us"] / 1e3, "floor_ms": f["floor_us"] / 1e3,
           "floor_pct_of_period": 100 * f["floor_us"] / f["period_us"] if f["period_us"] else math.nan,
           "bound": f["bound"], "read_ms": f["read_us"] / 1e3, "compute_ms": f["compute_us"] / 1e3,
           "gbytes": f["bytes"] / 1e9, "gflops": f["flops"] / 1e9, "kernel_ms": f["kernel_us"] / 1e3,
           "span_ms": f["span_us"] / 1e3}
    row.update({col: f[part] / 1e3 for part, col in FLOOR_PARTS.items()})
    return row


def floor_node(r: dict, kv: str = "") -> tuple:
    """A floor row as a story node: period, floor and what binds it (both bounds' figures), then the parts above
    the floor -- the block a floor_sentence finding cites (SGLang 08 and mini-SGLang 08)."""
    def ms(v) -> str:
        return f"{v:.2f}" if v == v else "-"
    parts = "; ".join(f"{p} {ms(r[c])}" for p, c in FLOOR_PARTS.items())
    return (f"{r['step_kind']} (step {r['step']}, bs {r['bs']}{kv}): period {ms(r['period_ms'])} ms, floor "
            f"{ms(r['floor_ms'])} ms = {fmt(r['floor_pct_of_period'])}% of it ({r['bound']}-bound: "
            f"{fmt(r['gbytes'])} GB over the read ceiling {ms(r['read_ms'])} ms, "
            f"{fmt(r['gflops'])} GFLOP over the bf16 ceiling {ms(r['compute_ms'])} ms)",
            [(f"above the floor, ms: {parts}", [])])


def floor_sentence(r: dict) -> str:
    """A floor row in one sentence (a finding): its traced period against its floor, what binds the floor, and the
    largest part of the rest."""
    f = fmt
    gap = r["period_ms"] - r["floor_ms"]
    parts = [(p, r[c]) for p, c in FLOOR_PARTS.items() if r[c] == r[c]]
    what, ms = max(parts, key=lambda x: x[1]) if parts else ("", math.nan)
    bound = (f"the {f(r['gbytes'])} GB it must read over the DRAM read ceiling" if r["bound"] == "read" else
             f"its {f(r['gflops'])} GFLOP over the bf16 ceiling")
    rest = (f"; of the {f(gap)} ms above it the largest part is {FLOOR_WORDS.get(what, what)} ({f(ms)} ms)"
            if gap > 0 and what else "")
    return (f"{r['step_kind'][0].upper() + r['step_kind'][1:]} at batch {r['bs']}: a traced period of "
            f"{f(r['period_ms'])} ms against a floor of {f(r['floor_ms'])} ms ({bound}), "
            f"{f(r['floor_pct_of_period'])}% of the period{rest}.")


def layer_tree(kt, step: int, layer: int = 1):
    """The hardware tree of one step: the once-per-step kernels and every kernel of one layer, each with
    its time (traced), share of the step's kernel time, rates and counters. Returns a list of dicts."""
    g = kt[kt["step"] == step]
    total = float(g["dur_us"].sum())
    pick = g[(g["segment"] != "layer") | (g["layer"] == layer)]
    n_layers = int(g["layer"].max()) + 1 if g["layer"].notna().any() else 0
    out = []
    for r in pick.to_dict("records"):
        share_one = 100 * r["dur_us"] / total if total else math.nan
        out.append({"segment": r["segment"], "role": r["role"], "kernel": r["kernel"], "cls": r["cls"],
                    "dur_us": r["dur_us"], "share_pct": share_one,
                    "share_all_layers_pct": share_one * n_layers if r["segment"] == "layer" else share_one,
                    **{k: r.get(k) for k in TREE_COLUMNS}, "grid": r.get("grid")})
    return out


def class_shares(kt, by: str = "cls"):
    """Kernel time per class (or role) and step kind: the share of each step's GPU kernel time."""
    import pandas as pd
    keys = [c for c in ("mode", "bs") if c in kt.columns]
    rows = []
    for k, g in kt.groupby(keys, sort=False) if keys else [((), kt)]:
        total = g["dur_us"].sum()
        steps = g["step"].nunique()
        for c, h in g.groupby(by):
            rows.append({**dict(zip(keys, k if isinstance(k, tuple) else (k,))), by: c, "steps": steps,
                         "us_per_step": h["dur_us"].sum() / steps, "share_pct": 100 * h["dur_us"].sum() / total})
    return pd.DataFrame(rows).sort_values(keys + ["share_pct"], ascending=[True] * len(keys) + [False])


# ------------------------------------------------------------------ Perfetto (Chrome JSON)

def _clean_args(d: dict) -> dict:
    out = {}
    for k, v in d.items():
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            continue
        out[k] = round(v, 3) if isinstance(v, float) else (v if isinstance(v, (int, str, bool)) else str(v))
    return out


def perfetto_events(kt, steps=None, requests=None, counters=None, t0_us: float | None = None,
                    max_kernels: int = 20000, spans=None, marks=None) -> tuple[list, dict]:
    """Chrome trace events for ui.perfetto.dev: one process per layer of the story (requests, scheduler
    steps, GPU kernels by stream), counter tracks ("ph": "C") and each kernel's counters in its args.

    ``steps``: dicts with start_us, dur_us, name and any fields (shown as args); ``requests``: dicts
    with id and a list of (phase, start_us, end_us); ``counters``: {track: [(t_us, value), ...]};
    ``spans``: {track: [(name, start_us, end_us), ...]} (a request's waterfall: one thread per track, process
    "waterfall"); ``marks``: [(t_us, name, args), ...] instant events across the whole trace (transitions).
    ``kt`` may be None (a trace of counters and spans only).
    All times in the same clock (microseconds). Windowing: when the story has more than
    ``max_kernels`` kernels, whole steps are kept from the start and the end until the budget is met
    (the metadata says which were left out). Returns (events, meta).
    """
    if kt is None:
        import pandas as pd
        kt = pd.DataFrame(columns=["step", "ts_us", "dur_us", "kernel", "stream", "cls"])
    if t0_us is None:                     # the earliest event of any kind: every ts >= 0
        first = ([float(kt["ts_us"].min())] if len(kt) else []) + [a for v in (spans or {}).values() for _n, a, _b in v
                                                                    if a is not None and math.isfinite(a)]
        first += [t for t, _n, _a in marks or []] + [a for rq in requests or [] for _p, a, _b in rq["phases"]
                                                     if a is not None] + [st["start_us"] for st in steps or []]
        first += [t for pts in (counters or {}).values() for t, _v in pts]
        t0_us = min(first) if first else 0.0
    t0 = t0_us
    ev = [{"ph": "M", "name": "process_name", "pid": p, "args": {"name": n}}
          for p, n in ((1, "requests"), (2, "scheduler steps"), (3, "GPU kernels"), (4, "counters"), (5, "waterfall"))]
    step_ids = sorted(kt["step"].unique()) if len(kt) else []
    keep, budget = set(), max_kernels
    sizes = kt.groupby("step").size().to_dict() if len(kt) else {}
    lo, hi = 0, len(step_ids) - 1
    while lo <= hi:                       # alternate from the start and from the end
        for s in ((step_ids[lo],) if lo == hi else (step_ids[lo], step_ids[hi])):
            if sizes.get(s, 0) <= budget:
                keep.add(s)
                budget -= sizes.get(s, 0)
        lo, hi = lo + 1, hi - 1
        if budget <= 0:
            break
    dropped = [int(s) for s in step_ids if s not in keep]
    streams, lane_end = {}, {}
    for r in sorted(kt[kt["step"].isin(keep)].to_dict("records"), key=lambda r: r["ts_us"]):
        # a kernel that starts before the previous one on its stream ends (programmatic dependent launch on Hopper)
        # goes to a second lane: Perfetto places slices of one thread only when they nest
        lane = 0
        ts, dur = round(r["ts_us"] - t0, 3), round(r["dur_us"], 3)       # as written below
        while lane_end.get((r.get("stream"), lane), -math.inf) > ts:
            lane += 1
        lane_end[(r.get("stream"), lane)] = ts + dur
        key = r.get("stream") if lane == 0 else f"{r.get('stream')} (overlapping, lane {lane + 1})"
        tid = streams.setdefault(key, len(streams) + 1)
        args = {k: r.get(k) for k in ("step", "layer", "role", "cls", *TREE_COLUMNS)}
        ev.append({"ph": "X", "pid": 3, "tid": tid, "name": r["kernel"], "cat": r.get("cls") or "kernel",
                   "ts": round(r["ts_us"] - t0, 3), "dur": round(r["dur_us"], 3), "args": _clean_args(args)})
    for s, tid in streams.items():
        ev.append({"ph": "M", "name": "thread_name", "pid": 3, "tid": tid, "args": {"name": f"stream {s}"}})
    for st in steps or []:
        ev.append({"ph": "X", "pid": 2, "tid": 1, "name": st.get("name", "step"), "cat": "step",
                   "ts": round(st["start_us"] - t0, 3), "dur": round(st["dur_us"], 3),
                   "args": _clean_args({k: v for k, v in st.items() if k not in ("start_us", "dur_us", "name")})})
    for i, rq in enumerate(requests or []):
        for phase, a, b in rq["phases"]:
            if a is None or b is None:
                continue
            ev.append({"ph": "X", "pid": 1, "tid": i + 1, "name": phase, "cat": "request", "ts": round(a - t0, 3),
                       "dur": round(max(b - a, 0.0), 3), "args": {"request": str(rq["id"])}})
        ev.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": i + 1, "args": {"name": f"request {rq['id']}"}})
    for track, pts in (counters or {}).items():
        for t, v in pts:
            if v is not None and math.isfinite(float(v)):
                ev.append({"ph": "C", "pid": 4, "name": track, "ts": round(t - t0, 3), "args": {track: float(v)}})
    for i, (track, items) in enumerate((spans or {}).items()):
        for name, a, b in items:
            if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
                continue
            ev.append({"ph": "X", "pid": 5, "tid": i + 1, "name": name, "cat": "waterfall", "ts": round(a - t0, 3),
                       "dur": round(max(b - a, 0.0), 3)})
        ev.append({"ph": "M", "name": "thread_name", "pid": 5, "tid": i + 1, "args": {"name": track}})
    for t, name, args in marks or []:
        ev.append({"ph": "i", "s": "g", "pid": 4, "tid": 0, "name": name, "ts": round(t - t0, 3),
                   "args": _clean_args(args or {})})
    meta = {"kernels": int(kt["step"].isin(keep).sum()) if len(kt) else 0, "steps_kept": len(keep),
            "steps_left_out": dropped, "t0_us": t0}
    return ev, meta


def write_perfetto(path, events, meta: dict | None = None, max_bytes: int = 5 << 20) -> Path:
    """Write a Chrome trace JSON (open it in https://ui.perfetto.dev); refuses to exceed ``max_bytes``."""
    text = json.dumps({"traceEvents": events, "displayTimeUnit": "ms", "metadata": meta or {}},
                      separators=(",", ":"))
    if len(text) > max_bytes:
        raise ValueError(f"the Perfetto trace would be {len(text) / 2**20:.1f} MiB (> {max_bytes / 2**20:.0f} MiB): "
                         "keep fewer steps (max_kernels)")
    p = Path(path)
    p.write_text(text)
    return p


def write_perfetto_fit(path, kt, max_bytes: int = 5 << 20, **kw) -> dict:
    """perfetto_events + write_perfetto, keeping as many whole steps as fit in ``max_bytes`` (a kernel
    event with its counters is ~400 bytes): tries 12,000 kernels, then halves. Returns the metadata."""
    n = 12000
    while True:
        ev, meta = perfetto_events(kt, max_kernels=n, **kw)
        try:
            write_perfetto(path, ev, meta, max_bytes=max_bytes)
            return meta
        except ValueError:
            if n < 500:
                raise
            n //= 2
