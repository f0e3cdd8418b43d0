"""SGLang 07's parts of one configuration: where a batch-1 TTFT goes (the first request after the start beside
steady ones, each traced prefill split on its trace), what a prefill and a decode step spend per kernel class, every
collective launch with its message size, and one decode step kernel by kernel; then the same compared across TP
sizes (tables, verdicts, story lines, figures). 07_tp_scaling.py conducts; this room imports _sglang and common only.

Capture (a server, one configuration):
    ttft_phase(srv, prof_dir, tp)     the first request traced, TTFT_REPS untraced ones, one more traced (each a new
                                      512-token prompt, one at a time, between /metrics scrapes)
    decode_rows(ev, key, hidden)      the traced batch-16 decode window's rows (classes, collectives, one step)

Rows (the CSVs a run writes; --reanalyse reads them back, so every table, verdict and line below comes from them):
    ttft_parts.csv    key, request (first | steady | steady traced), level, part, ms, total_ms
    step_classes.csv  key, phase (prefill first | prefill | decode), cls, us_per_step, share_pct, steps, span_us
    collectives.csv   key, phase, step, kernel, collective (all-reduce | all-gather), dur_us, msg_bytes
    step_timeline.csv key, phase (decode), kernel, cls, start_us, dur_us: the decode step of median GPU span
(key: model, tp, custom_allreduce.)

Why the first request is traced: a cost paid once (a communicator set up on first use, a first kernel launch, a
first plan) is visible only on the request that pays it; the steady requests measure the same prefill without it.
The profiler slows both traced requests alike; the untraced steady median is the batch-1 TTFT that is judged.
"""
from __future__ import annotations

import math
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _sglang as sg  # noqa: E402
from common.base import stats, story  # noqa: E402
from common.tables import trace, waterfall  # noqa: E402

PROMPT = 512             # tokens of every batch-1 prompt (random ids: no prefix is shared between requests)
TTFT_REPS = 5            # untraced steady requests
KEY = ("model", "tp", "custom_allreduce")
BF16 = 2                 # bytes per element of the hidden state an all-reduce sums


def is_allgather(kernel: str) -> bool:
    """The logits all-gather (vocab-parallel lm_head) shares the collective class with all-reduce."""
    return bool(re.search(r"all_?gather", kernel, re.I))


def rank0(files: list) -> Path:
    return next((f for f in files if "-TP-0" in Path(f).name), files[0])


# ------------------------------------------------------------------ capture

def _one(srv, seed: int, new: int) -> dict:
    before = sg.stage_lines(srv.get_text("/metrics"))
    r = srv.generate(input_ids=sg.random_ids(PROMPT, seed), stream=True,
                     sampling_params={**sg.GREEDY, "max_new_tokens": new})
    if r["meta_info"].get("completion_tokens") != new:
        raise RuntimeError(f"sanity: {r['meta_info'].get('completion_tokens')} tokens instead of {new}")
    return {"result": {"meta_info": r["meta_info"], "client": r["client"]}, "metrics_before": before,
            "metrics_after": sg.stage_lines(srv.get_text("/metrics"))}


def ttft_phase(srv, prof_dir: Path, tp: int, reps: int = TTFT_REPS) -> dict:
    """{"first": record + trace, "steady": [records], "traced": record + trace}: the first request after the start
    under the profiler (rank 0's trace kept), ``reps`` untraced ones, then one more traced."""
    out = {}
    for name, seed in (("first", 301), ("traced", 302)):
        if name == "traced":
            out["steady"] = [_one(srv, 310 + i, 4) for i in range(reps)]
        files, rec = srv.traced(Path(prof_dir) / name, lambda s=seed: _one(srv, s, 4), ranks=tp)
        out[name] = {**rec, "trace": str(rank0(files))}
    return out


def _key(key: dict) -> dict:
    return {k: key[k] for k in KEY}


def class_rows(kt, phase: str, key: dict) -> list[dict]:
    """Kernel time per class per step of ``kt`` (one phase's steps), with the steps' median GPU span."""
    if kt is None or not len(kt):
        return []
    n = kt["step"].nunique()
    total = float(kt["dur_us"].sum())
    span = kt.groupby("step").agg(a=("ts_us", "min"), b=("end_us", "max"))
    span_us = float(statistics.median(span["b"] - span["a"]))
    return [{**_key(key), "phase": phase, "cls": c, "us_per_step": float(g["dur_us"].sum()) / n,
             "share_pct": 100 * float(g["dur_us"].sum()) / total if total else math.nan, "steps": n, "span_us": span_us}
            for c, g in kt.groupby("cls")]


def collective_rows(kt, phase: str, key: dict, hidden: int) -> list[dict]:
    """Every collective launch of ``kt`` with the bytes an all-reduce sums (tokens of its step x hidden x bf16)."""
    if kt is None or not len(kt):
        return []
    out = []
    for r in kt[kt["cls"] == "allreduce"].to_dict("records"):
        ag = is_allgather(r["kernel"])
        toks = r.get("toks") if str(r.get("mode")) in ("EXTEND", "MIXED") else r.get("bs")
        out.append({**_key(key), "phase": phase, "step": int(r["step"]), "kernel": r["kernel"],
                    "collective": "all-gather" if ag else "all-reduce", "dur_us": float(r["dur_us"]),
                    "msg_bytes": None if ag or toks is None or toks != toks else int(toks) * hidden * BF16})
    return out


def timeline_rows(kt, phase: str, key: dict) -> list[dict]:
    """The kernels of the step of median GPU span, from its first kernel's start."""
    if kt is None or not len(kt):
        return []
    span = kt.groupby("step").agg(a=("ts_us", "min"), b=("end_us", "max"))
    d = list(span["b"] - span["a"])
    pick = span.index[waterfall.median_index(d)]
    g = kt[kt["step"] == pick].sort_values("ts_us")
    t0 = float(g["ts_us"].min())
    return [{**_key(key), "phase": phase, "kernel": r["kernel"], "cls": r["cls"], "start_us": float(r["ts_us"]) - t0,
             "dur_us": float(r["dur_us"])} for r in g.to_dict("records")]


def prefill_kernels(ev):
    """The first EXTEND step's kernels of a traced one-request window."""
    kt, _ = sg.steps(ev)
    if not len(kt):
        return kt
    pre = kt[kt["mode"].isin(("EXTEND", "MIXED"))]
    return pre[pre["step"] == pre["step"].min()] if len(pre) else pre


def decode_rows(ev, key: dict, hidden: int) -> tuple[list, list, list]:
    kt, _ = sg.steps(ev)
    dec = kt[kt["mode"] == "DECODE"] if len(kt) else kt
    return (class_rows(dec, "decode", key), collective_rows(dec, "decode", key, hidden),
            timeline_rows(dec, "decode", key))


def ttft_rows(rec: dict, key: dict, hidden: int, read=trace.read_chrome_trace) -> dict:
    """The TTFT waterfalls of ttft_phase's records as rows (first, steady median, steady traced; each traced prefill
    forward split on its trace), with the traced prefills' class and collective rows; notes for what was not split."""
    parts, classes, colls, notes = [], [], [], []
    steady = waterfall.median([sg.ttft_waterfall(r["result"], r["metrics_before"], r["metrics_after"], label=f"rep {i}")
                               for i, r in enumerate(rec["steady"])], label=f"steady, median of {len(rec['steady'])}")
    named = {"steady": steady}
    for name, phase in (("first", "prefill first"), ("traced", "prefill")):
        r = rec[name]
        wf = sg.ttft_waterfall(r["result"], r["metrics_before"], r["metrics_after"], label=name, source="traced")
        try:
            ev = read(r["trace"])
            stamps = sg.request_stamps(r["result"], r["metrics_before"], r["metrics_after"])
            wf = waterfall.with_split(wf, "prefill forward", sg.prefill_split(ev, stamps))
            pk = prefill_kernels(ev)
            classes += class_rows(pk, phase, key)
            colls += collective_rows(pk, phase, key, hidden)
        except (trace.TraceError, KeyError, IndexError, ValueError) as e:
            notes.append(f"{key['model']} TP {key['tp']}: the {name} request's prefill not split "
                         f"({str(e).splitlines()[0][:160] if str(e) else type(e).__name__})")
        named["first" if name == "first" else "steady traced"] = wf
    for request, wf in named.items():
        for row in waterfall.rows(wf):
            parts.append({**_key(key), "request": request, "level": row["level"], "part": row["part"], "ms": row["ms"],
                          "total_ms": wf["total_ms"]})
    ttft = [r["result"]["client"]["ttft_s"] * 1e3 for r in rec["steady"]]
    return {"parts": parts, "classes": classes, "collectives": colls, "notes": notes, "steady_ttft_ms": ttft,
            "first_ttft_ms": rec["first"]["result"]["client"]["ttft_s"] * 1e3,
            "traced_ttft_ms": rec["traced"]["result"]["client"]["ttft_s"] * 1e3}


# ------------------------------------------------------------------ across TP sizes: tables, verdicts, lines

def label(r: dict) -> str:
    return f"{r['model']} TP {int(r['tp'])}{'' if is_true(r['custom_allreduce']) else ' NCCL'}"


def is_true(v) -> bool:
    """The custom_allreduce column as a run wrote it (a bool) or a CSV gave it back ("True", "False")."""
    return v is True or str(v).lower() in ("true", "1")


def _of(df, r: dict):
    """The rows of ``df`` of the configuration ``r`` (model, tp, custom_allreduce)."""
    if df is None or not len(df):
        return df
    m = (df["model"] == r["model"]) & (df["tp"].astype(int) == int(r["tp"]))
    return df[m & (df["custom_allreduce"].map(is_true) == is_true(r["custom_allreduce"]))]


def ttft_lines(runs: list[dict], parts) -> list:
    """Per configuration: the TTFT of the first request, the steady median (interval), the traced steady one, and
    the parts of the first and steady traced requests side by side (the traced prefill forward's split below)."""
    out = []
    for r in runs:
        g = _of(parts, r)
        if g is None or not len(g):
            continue
        tot = {q: float(h["total_ms"].iloc[0]) for q, h in g.groupby("request")}
        head = (f"{label(r)}: TTFT first request {story.fmt(tot.get('first'))} ms (traced), steady "
                f"{story.fmt(r.get('ttft_b1_ms'))} ms untraced [{story.fmt(r.get('ttft_b1_ms_lo'))}, "
                f"{story.fmt(r.get('ttft_b1_ms_hi'))}], steady traced {story.fmt(tot.get('steady traced'))} ms")
        kids = []
        f, s, u = (g[g["request"] == q] for q in ("first", "steady traced", "steady"))
        for row in f.to_dict("records"):
            def at(h, level=row["level"], part=row["part"]):
                o = h[(h["part"] == part) & (h["level"] == level)]
                return float(o["ms"].iloc[0]) if len(o) else math.nan
            text = (f"{row['part']}: first {story.fmt(row['ms'])} ms, steady traced {story.fmt(at(s))} ms"
                    + (f", steady untraced {story.fmt(at(u))} ms" if row["level"] == 0 else ""))
            if row["level"] == 0 or not kids:
                kids.append((text, []))
            else:
                kids[-1][1].append((text, []))
        out.append((head, kids))
    return out


def grown_part(parts, a: dict, b: dict, request: str = "first") -> tuple[str, float] | None:
    """The level-0 part of ``request`` that grows most from configuration a to b (name, ms more)."""
    pa, pb = _of(parts, a), _of(parts, b)
    if pa is None or pb is None or not len(pa) or not len(pb):
        return None
    pa = pa[(pa["request"] == request) & (pa["level"] == 0)].set_index("part")["ms"]
    pb = pb[(pb["request"] == request) & (pb["level"] == 0)].set_index("part")["ms"]
    d = (pb - pa.reindex(pb.index)).dropna()
    d = d[[not str(i).startswith("(") for i in d.index]]
    return (str(d.idxmax()), float(d.max())) if len(d) else None


def class_lines(runs: list[dict], classes, phase: str = "decode") -> list:
    """Per configuration: one step of ``phase`` per kernel class (us per step, share), its kernel sum and GPU span."""
    out = []
    for r in runs:
        g = _of(classes, r)
        g = g[g["phase"] == phase] if g is not None and len(g) else g
        if g is None or not len(g):
            continue
        g = g.sort_values("us_per_step", ascending=False)
        tot = float(g["us_per_step"].sum())
        out.append((f"{label(r)}: {phase} step kernels {story.fmt(tot)} us in a GPU span of "
                    f"{story.fmt(float(g['span_us'].iloc[0]))} us: " + ", ".join(
                        f"{c} {story.fmt(u)} ({story.fmt(p)}%)" for c, u, p in
                        zip(g["cls"], g["us_per_step"], g["share_pct"])), []))
    return out


def size_text(n) -> str:
    n = float(n)
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def collective_summary(colls) -> list[dict]:
    """Per configuration, phase, collective and kernel: launches per step, median us per launch and its interval, the
    message size (all-reduce)."""
    out = []
    if colls is None or not len(colls):
        return out
    for k, g in colls.groupby(list(KEY) + ["phase", "collective", "kernel"], sort=True):
        iv = stats.interval(list(g["dur_us"]))
        msg = g["msg_bytes"].dropna()
        out.append({**dict(zip(list(KEY) + ["phase", "collective", "kernel"], k)), "launches": int(len(g)),
                    "per_step": len(g) / max(g["step"].nunique(), 1), "us_median": iv.point, "us_lo": iv.lo,
                    "us_hi": iv.hi, "us_min": float(g["dur_us"].min()), "msg_bytes": int(msg.median()) if len(msg) else None})
    return out


def per_call_pairs(colls) -> list[dict]:
    """Where a configuration ran both with SGLang's custom all-reduce and NCCL only: per phase, the all-reduce
    launches of each (durations, kernel names, message size)."""
    out = []
    if colls is None or not len(colls):
        return out
    ar = colls[colls["collective"] == "all-reduce"]
    for (m, tp, phase), g in ar.groupby(["model", "tp", "phase"], sort=True):
        c = g[g["custom_allreduce"].map(is_true)]
        n = g[~g["custom_allreduce"].map(is_true)]
        if len(c) and len(n):
            msg = g["msg_bytes"].dropna()
            out.append({"model": m, "tp": int(tp), "phase": phase, "custom": list(c["dur_us"]), "nccl": list(n["dur_us"]),
                        "custom_kernels": sorted(set(c["kernel"])), "nccl_kernels": sorted(set(n["kernel"])),
                        "msg_bytes": int(msg.median()) if len(msg) else None})
    return out


def part_ms(parts, r: dict, request: str, part: str, level: int = 0) -> float:
    """ms of one part of one configuration's ``request`` waterfall (NaN when absent)."""
    g = _of(parts, r)
    if g is None or not len(g):
        return math.nan
    g = g[(g["request"] == request) & (g["part"] == part) & (g["level"] == level)]
    return float(g["ms"].iloc[0]) if len(g) else math.nan


def classes_of(classes, r: dict, phase: str = "decode") -> dict:
    """{cls: us per step, "span": median GPU span} of one configuration's ``phase`` steps ({} when absent)."""
    g = _of(classes, r)
    g = g[g["phase"] == phase] if g is not None and len(g) else g
    if g is None or not len(g):
        return {}
    return {**dict(zip(g["cls"], g["us_per_step"].astype(float))), "span": float(g["span_us"].iloc[0])}


def findings(run, car, t: dict) -> None:
    """Sentences from the figures the story shows: from each TP size to the next, where the first request's TTFT and
    the batch-16 decode step went."""
    pp, cl = t.get("ttft_parts"), t.get("step_classes")
    for m, g in car.groupby("model"):
        rows = g.sort_values("tp").to_dict("records")
        for a, b in zip(rows, rows[1:]):
            where = f"{m}, TP {a['tp']} -> TP {b['tp']}"
            grown = grown_part(pp, a, b)
            if grown and a.get("ttft_first_ms") == a.get("ttft_first_ms"):
                part = grown[0]
                pa = part_ms(pp, a, "first", part)
                run.finding(f"{where}: the first request's TTFT {story.fmt(a['ttft_first_ms'])} -> "
                            f"{story.fmt(b['ttft_first_ms'])} ms (traced), a steady one's {story.fmt(a['ttft_b1_ms'])} -> "
                            f"{story.fmt(b['ttft_b1_ms'])} ms (untraced median); the first request's part that grows most "
                            f"is '{part}': {story.fmt(pa)} -> {story.fmt(part_ms(pp, b, 'first', part))} ms.")
            pa_, pb_ = classes_of(cl, a, "prefill"), classes_of(cl, b, "prefill")
            if pa_ and pb_:
                ka, kb = (sum(v for k, v in c.items() if k != "span") for c in (pa_, pb_))
                run.finding(f"{where}: the traced steady prefill step's kernels sum to {story.fmt(ka)} -> {story.fmt(kb)} us "
                            f"in a GPU span of {story.fmt(pa_['span'])} -> {story.fmt(pb_['span'])} us; gemm "
                            f"{story.fmt(pa_.get('gemm', 0.0))} -> {story.fmt(pb_.get('gemm', 0.0))} us, allreduce "
                            f"{story.fmt(pa_.get('allreduce', 0.0))} -> {story.fmt(pb_.get('allreduce', 0.0))} us.")
            ca, cb = classes_of(cl, a), classes_of(cl, b)
            if ca and cb:
                show = [c for c in ("gemm", "attention", "allreduce") if c in ca or c in cb]
                ka, kb = (sum(v for k, v in c.items() if k != "span") for c in (ca, cb))
                run.finding(f"{where}: the batch-16 decode step's GPU span {story.fmt(ca['span'])} -> "
                            f"{story.fmt(cb['span'])} us while its kernels sum to {story.fmt(ka)} -> {story.fmt(kb)} us "
                            "(the rest of the span the GPU waits); per step " + ", ".join(
                                f"{c} {story.fmt(ca.get(c, 0.0))} -> {story.fmt(cb.get(c, 0.0))} us" for c in show) + ".")


def wait_findings(run, colls) -> None:
    """Where a configuration ran with both all-reduces: the prefill all-reduce's median call against its shortest one
    (a call lasts the transfer plus the wait for the slowest rank) and against NCCL's at the same size."""
    summ = [c for c in collective_summary(colls) if c["collective"] == "all-reduce" and c["phase"] == "prefill"]
    for c in (c for c in summ if is_true(c["custom_allreduce"])):
        n = next((x for x in summ if x["model"] == c["model"] and int(x["tp"]) == int(c["tp"])
                  and not is_true(x["custom_allreduce"])), None)
        if n is None or not c["msg_bytes"]:
            continue
        run.finding(f"{c['model']} TP {int(c['tp'])}: a prefill all-reduce of {size_text(c['msg_bytes'])} takes "
                    f"{story.fmt(c['us_median'])} us per call with the custom kernel, its shortest call "
                    f"{story.fmt(c['us_min'])} us (the rest is waiting for the other ranks), and "
                    f"{story.fmt(n['us_median'])} us with NCCL (shortest {story.fmt(n['us_min'])} us).")


# ------------------------------------------------------------------ figures

def step_figure(tl, title: str):
    """One decode step per configuration on one time axis (us from the step's first kernel), a lane each, every
    kernel a span coloured by class: where the all-reduces sit between the layers' GEMMs and attention."""
    from common.render import plots
    spans = [{"lane": label(r), "series": r["cls"], "start": r["start_us"], "end": r["start_us"] + r["dur_us"]}
             for r in tl.to_dict("records")]
    lanes = list(dict.fromkeys(label(r) for r in tl.to_dict("records")))
    return plots.lanes(spans, title=title, xlabel="us from the step's first kernel", lane_order=lanes,
                       series_order=plots.STORY_CLASSES)


def ttft_figure(parts, title: str):
    """Each configuration's first, steady and steady-traced TTFT as stacked bars of their parts."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from common.render import plots
    top = parts[(parts["level"] == 0) & ~parts["part"].str.startswith("(")]
    bars = list(dict.fromkeys((label(r), r["request"]) for r in top.to_dict("records")))
    names = list(dict.fromkeys(top["part"]))
    sty = plots.styles(names, order=names)
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(bars) + 1.6))
    for y, (lab, req) in enumerate(reversed(bars)):
        left = 0.0
        for row in top[(top["request"] == req)].to_dict("records"):
            if label(row) != lab or not (row["ms"] == row["ms"]):
                continue
            ax.barh(y, row["ms"], left=left, color=sty[row["part"]][0], edgecolor="white", linewidth=0.3)
            left += max(row["ms"], 0.0)
    ax.set_yticks(range(len(bars)))
    ax.set_yticklabels([f"{lab} · {req}" for lab, req in reversed(bars)], fontsize=7)
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color=c, label=n) for n, (c, _m) in sty.items()], fontsize=7, ncol=3,
              loc="upper center", bbox_to_anchor=(0.5, -0.12))
    ax.set_xlabel("ms from the client's send to its first token")
    ax.set_title(title, fontsize=9)
    return fig
