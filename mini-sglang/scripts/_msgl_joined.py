"""08's joined view of a traced generate: steps -> layers -> kernels -> FLOPs/bytes -> counters, the layer and range
checks, the timed steps per generate (no GPU: tested on recorded traces)."""
from __future__ import annotations

import statistics

import _msgl
from _msgl_forward import NCU_DECODE, parse_step
from _msgl_waterfall import waterfall_summary
from common.tables import timeline, trace
from common.tables.trace import TraceError

LAYER_CLASSES = ("norm", "gemm", "rope", "kv_store", "attention", "activation")
EXPECTED_LAYER = ["norm", "gemm", "rope", "kv_store", "attention", "gemm", "norm", "gemm", "activation", "gemm"]


def kernel_table(ev, work, cfg, pk, step=r"^step\[", outer=None, parse=parse_step):
    """The joined kernel table of one traced generate: steps -> layers -> roles -> FLOPs/bytes -> rates. mini-SGLang's
    embedding is its own index kernel (_msgl.EMBEDDING_KERNEL), which common.tables.timeline labels 'prepare'."""
    kt = timeline.layered(trace.step_kernels(ev, step, outer=outer, parse=parse), layers=cfg["num_hidden_layers"])
    emb = (kt["segment"] == "pre") & kt["kernel"].str.contains(_msgl.EMBEDDING_KERNEL)
    kt.loc[emb, "role"] = "embedding"
    if work is not None and len(work) == kt["step"].nunique():
        kt = timeline.add_work(kt, cfg, dict(enumerate(work)), pk)
    return kt


def layer_order(kt) -> list[dict]:
    """Per (step, layer): its kernel classes in launch order, split-K reduce / merge folded, other kernels noted."""
    rows = []
    for (s, layer), g in kt[kt["segment"] == "layer"].groupby(["step", "layer"], sort=True):
        cls = [c for c in g["cls"] if c in LAYER_CLASSES]
        seq = [c for i, c in enumerate(cls) if i == 0 or c != cls[i - 1]]
        rows.append({"step": int(s), "mode": g["mode"].iloc[0] if "mode" in g else None, "layer": int(layer),
                     "kernels": len(g), "sequence": " > ".join(seq), "matches": seq == EXPECTED_LAYER,
                     "others": ", ".join(sorted(set(g[~g["cls"].isin(LAYER_CLASSES)]["kernel"])))})
    return rows


def range_check(ev, kt, layers: int) -> list[dict]:
    """Per traced step: Layer_i ranges inside it, cudaEventSynchronize and cudaGraphLaunch calls, and whether every kernel
    inside a Layer_i range carries layer i in the kernel table (the repeating-unit assignment)."""
    try:
        j = trace.kernels_in_ranges(ev, r"^Layer_\d+$", empty_rows=False)
        j = j[j["gpu_kind"] == "kernel"]
        by_ts = dict(zip(j["ts_us"], j["range"].str.slice(6).astype(int)))
    except TraceError:
        by_ts = {}
    ranges = dict(enumerate(n for _name, n in trace.calls_in_ranges(ev, r"^step\[", r"^Layer_\d+$", inner=("user_annotation",))))
    syncs = dict(enumerate(n for _name, n in trace.calls_in_ranges(ev, r"^step\[", r"^cudaEventSynchronize$")))
    graphs = dict(enumerate(n for _name, n in trace.calls_in_ranges(ev, r"^step\[", r"^cudaGraphLaunch$")))
    out = []
    for s, g in kt.groupby("step", sort=True):
        rl = g["ts_us"].map(by_ts)
        inside = rl.notna()
        out.append({"step": int(s), "mode": g["mode"].iloc[0] if "mode" in g else None, "layer_ranges": ranges.get(s, 0),
                    "model_layers": layers, "kernels_in_layer_ranges": int(inside.sum()),
                    "agree": bool(inside.any() and (g.loc[inside, "layer"] == rl[inside]).all()),
                    "event_syncs": syncs.get(s, 0), "graph_launches": graphs.get(s, 0)})
    return out


def analyse(run, data, cfg, pk, rows=None) -> dict:
    """Per variant: the kernel table (with counters when ``rows`` holds the ncu summary), the layer checks, the layer tree
    of its prefill and a middle decode step, class shares; then the timed tables. Returns what the verdicts need."""
    import pandas as pd
    out = {"kt": {}, "order": [], "ranges": [], "tree": [], "shares": [], "ncu": []}
    for v, tr in data["traced"].items():
        ev = trace.read_chrome_trace(tr["path"])
        kt = kernel_table(ev, tr["work"], cfg, pk)
        pre, dec = kt[kt["mode"] == "prefill"]["step"], sorted(kt[kt["mode"] == "decode"]["step"].unique())
        steps = {"prefill": int(pre.min())} if len(pre) else {}
        if dec:
            steps["decode"] = int(dec[min(NCU_DECODE - 1, len(dec) - 1)])
        if rows is not None:
            wins = [{"name": m, "step": st, "match": {"mode": m}} for m, st in steps.items()]   # in profiling order
            kt, info = timeline.attach_counters(kt, rows, wins, pk)
            out["ncu"] += [{"variant": v, **i} for i in info]
        out["kt"][v] = kt
        out["order"] += [{"variant": v, **r} for r in layer_order(kt)]
        out["ranges"] += [{"variant": v, **r} for r in range_check(ev, kt, cfg["num_hidden_layers"])]
        out["tree"] += [{"variant": v, "step": st, "mode": m, "bs": int(kt[kt["step"] == st]["bs"].iloc[0]), **r}
                        for m, st in steps.items() for r in timeline.layer_tree(kt, st)]
        out["shares"].append(timeline.class_shares(kt).assign(variant=v))
        run.table(f"kernels_{v}", kt)
        spans = [{"name": g["step_name"].iloc[0], "start_us": float(g["ts_us"].min()), "dur_us": float(g["end_us"].max()
                  - g["ts_us"].min()), "kernels": len(g), "kernel_us": float(g["dur_us"].sum())} for _s, g in kt.groupby("step")]
        events, meta = timeline.perfetto_events(kt, steps=spans)
        timeline.write_perfetto(run.path(f"story_{v}.json"), events, {**meta, "gpu": pk.get("gpu"), "variant": v})
    out["steps"], out["prefix"] = pd.DataFrame(data["steps"]), pd.DataFrame(data["prefix"])
    if data.get("waterfall"):
        from common.tables import waterfall
        out["waterfall"] = w = waterfall_summary(data["waterfall"])
        run.table("waterfall", waterfall.rows(w["ttft"], waterfall="ttft")
                  + (waterfall.rows(w["decode"], waterfall="itl") if w["decode"] else []))
    for name in ("steps", "prefix"):
        run.table(name, out[name])
    traced = [{"variant": v, **r} for v, tr in data["traced"].items() for r in tr.get("rows") or []]
    if traced:            # the traced generates' own steps (CUDA events): the observer headline reads them
        run.table("traced_steps", traced)
    checks = pd.DataFrame(out["ranges"])
    if out["order"]:      # one row per layer, with its step's range / sync / graph counts
        checks = pd.DataFrame(out["order"]).merge(checks, on=["variant", "step", "mode"], how="left")
    run.table("layer_check", checks)
    run.table("layer_tree", out["tree"])
    run.table("class_shares", pd.concat(out["shares"], ignore_index=True))
    if out["ncu"]:
        run.table("ncu_windows", out["ncu"])
    return out


def per_generate(steps, variant, col, phase="decode") -> list[float]:
    """The median of ``col`` over the ``phase`` steps of each timed generate (one value per repetition)."""
    d = steps[(steps["variant"] == variant) & (steps["phase"] == phase)]
    if col == "gap_before_ms":       # the idle between two decode steps, not after the prefill
        d = d[d["step"] > d.groupby("rep")["step"].transform("min")]
    return [float(g[col].median()) for _r, g in d.groupby("rep", sort=True)]


def observer(data, steps) -> dict:
    """The torch profiler's cost on what it watches: traced / untraced decode step GPU time - 1, in %, per variant
    (the traced generate of phase 2 against the median of the timed ones)."""
    out = {}
    for v, tr in data["traced"].items():
        traced = [r["gpu_ms"] for r in tr.get("rows") or [] if r["phase"] == "decode"]
        timed = per_generate(steps, v, "gpu_ms")
        if traced and timed:
            out[f"observer_pct_{v.replace('-', '_')}"] = 100 * (statistics.median(traced) / statistics.median(timed) - 1)
    return out
