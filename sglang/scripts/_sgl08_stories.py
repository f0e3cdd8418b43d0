"""SGLang 08, phases 1-2: the traced stories (one request, a batch) and the observer effect, and what the joined
story tables make of them (08_execution_story.py conducts; this module imports nothing of 08's other phases).

    serve_story(srv, run, name, send, P, prof_dir)   untraced then traced repetitions: observer rows, traces, logs
    analyse_story(trace, log, cfg, pk)               a traced story's kernel table: steps joined to the scheduler log,
                                                     layers, roles, FLOPs and bytes (common.tables.timeline)
    median_traced(traced)                            the repetition whose TTFT is the median (the story's tree)
    gemm_efficiency(kt, pk)                          TFLOP/s and weight streaming per step kind and GEMM role
    layer_trees(data)                                one layer and the once-per-step kernels of each story's steps
    write_story(run, data)                           kernels_/steps_<story>.csv and the Perfetto traces story_<story>.json
    story_findings(data, trees, eff)                 the sentences the page shows beside the story (Run.finding)
"""
from __future__ import annotations

import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _sglang as sg  # noqa: E402
from common.capture import ceilings, clocks  # noqa: E402
from common.tables import timeline, trace  # noqa: E402

ENV = dict(sg.SERVING_ENV)     # 08's servers: ms log time stamps, traces without stacks and shapes (the shared server's too)
SP = sg.GREEDY     # greedy, and every request generates all its max_new_tokens


def one_request(srv, seed, P):
    r = srv.generate(text=sg.random_text(P["prompt"], seed), stream=True,      # through SGLang's tokenizer
                     sampling_params={**SP, "max_new_tokens": P["new"]})
    return [r]


def batch_requests(srv, seed, P):
    return srv.generate_many([{"text": sg.random_text(P["prompt"], seed * 1000 + i),
                               "sampling_params": {**SP, "max_new_tokens": P["new"]}} for i in range(P["batch"])],
                             stream=True)


def client_figures(results, log_text) -> dict:
    """Client TTFT / ITL medians and the scheduler's decode step (median, from SGLang's own clock:
    _sgl_logs.decode_step_ms)."""
    ok = [r["client"] for r in results if "error" not in r]
    return {"ttft_ms": statistics.median(c["ttft_s"] for c in ok) * 1e3,
            "itl_ms": statistics.median(x for c in ok for x in c["itl_s"]) * 1e3,
            "step_ms": sg.decode_step_ms(sg.parse_batch_log(log_text)), "requests": len(ok)}


def step_key(obs) -> str:
    """The observer rows' decode-step column: step_ms, or log_step_ms in recordings made before it (the mean gap
    between the Decode lines' whole-ms time stamps)."""
    return "step_ms" if all("step_ms" in r for r in obs) else "log_step_ms"


def serve_story(srv, run, name, send, P, prof_dir):
    """Untraced then traced repetitions of one story: the observer rows (with the SM clock and power NVML read while
    each ran: common.capture.clocks), every traced run (trace, log, results) and every untraced run's log (so that a
    re-analysis reads the scheduler's decode step from it again)."""
    send(srv, 900 + len(name), P)                                           # warm this shape once
    rows, traced, plain = [], [], []
    with clocks.Sampler(period_s=0.01) as sampler:
        for rep in range(P["reps"]):
            mark, t0 = srv.log_mark(), time.time()
            res = send(srv, 10 * rep + 1, P)
            log = srv.log_since(mark)
            rows.append({"story": name, "traced": False, "rep": rep, **client_figures(res, log),
                         **clock_cols(sampler, t0)})
            plain.append({"log": log})
        for rep in range(P["reps"]):
            mark, t0 = srv.log_mark(), time.time()
            (tr, *_), res = srv.traced(prof_dir, lambda rep=rep: send(srv, 10 * rep + 5, P))
            log = srv.log_since(mark)
            rows.append({"story": name, "traced": True, "rep": rep, **client_figures(res, log), **clock_cols(sampler, t0)})
            traced.append({"trace": tr, "log": log, "results": res})
            run.log(f"{name}: traced rep {rep}: TTFT {rows[-1]['ttft_ms']:.1f} ms, ITL {rows[-1]['itl_ms']:.2f} ms"
                    + (f", SM {rows[-1]['sm_mhz']:.0f} MHz" if rows[-1].get("sm_mhz") else ""))
    return rows, traced, plain


def clock_cols(sampler, t0: float) -> dict:
    """The SM clock (median), the highest power and the slowdown reasons NVML saw from ``t0`` until now."""
    w = clocks.window(sampler.rows, t0, time.time())
    return {"sm_mhz": w.get("sm_mhz"), "power_w_max": w.get("power_w_max"),
            "slowdown": ", ".join(w.get("slowdown") or [])}


def parse_step(name: str) -> dict:
    m = sg.parse_step_name(name) or {}
    return {"mode": m.get("mode"), "bs": m.get("bs"), "toks": m.get("toks") or m.get("bs")}


_EVENTS: dict = {}      # (path, size, mtime) -> (events, step kernels): the traces of one analysis
KEEP_TRACES = 8         # the one-request repetitions, the batch story's median one, the loaded window, and spare


def _key(trace_path) -> tuple:
    st = Path(trace_path).stat()
    return str(trace_path), st.st_size, st.st_mtime_ns


def _read_story(trace_path):
    ev = trace.read_chrome_trace(trace_path)
    return ev, trace.step_kernels(ev, sg.STEP_RANGE, outer=sg.OUTER_RANGE, parse=parse_step)


def _keep(key, value) -> None:
    _EVENTS[key] = value
    while len(_EVENTS) > KEEP_TRACES:
        _EVENTS.pop(next(iter(_EVENTS)))


def story_events(trace_path):
    """A traced story's events and their step kernel table, read and joined once per analysis: the median
    repetition's trace serves the story, the attention shares and the waterfall's split (callers do not change
    them). Keyed by the file's path, size and time, so a changed file is read again."""
    key = _key(trace_path)
    if key not in _EVENTS:
        _keep(key, _read_story(trace_path))
    return _EVENTS[key]


def prefetch(paths, workers: int | None = None) -> int:
    """Read the traces an analysis is about to use side by side, one worker process each (spawned: nothing of this
    process is copied), into story_events' store. Called once the GPU work is done. Reading and joining them
    one after another took 26.8 s of a 74.9 s --quick 08 on an H200 (2026-11-28, after the loaded window). Returns
    how many were read here; on any failure it returns 0 and story_events reads them as before."""
    import multiprocessing as mp
    import os
    from concurrent.futures import ProcessPoolExecutor
    todo = [p for p in dict.fromkeys(str(p) for p in paths if p) if Path(p).is_file() and _key(p) not in _EVENTS]
    todo = todo[:KEEP_TRACES]
    if len(todo) < 2:
        return 0
    n = max(1, min(len(todo), workers or os.cpu_count() or 1))
    try:
        with ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn")) as pool:
            got = list(pool.map(_read_story, todo))
    except Exception:  # noqa: BLE001 - a worker could not start or read: the traces are read here, as before
        return 0
    for p, res in zip(todo, got):
        _keep(_key(p), res)
    return len(todo)


def analyse_story(trace_path, log_text, cfg, pk):
    """Kernel table of a traced story with its steps joined to the scheduler log and the work of each role."""
    ev, kt = story_events(trace_path)
    kt = timeline.layered(kt, layers=cfg["num_hidden_layers"])
    steps = [{"mode": g["mode"].iloc[0], "bs": int(g["bs"].iloc[0]), "toks": int(g["toks"].iloc[0])}
             for _s, g in kt.groupby("step")]
    joined, info = sg.join_steps(steps, sg.parse_batch_log(log_text))
    work = {}
    for s, j in enumerate(joined):
        bs, toks = j["bs"], j["toks"]
        if j["mode"] == "EXTEND":
            cached = j.get("log_cached_token") or 0
            qo = [max(toks // bs, 1)] * bs
            work[s] = {"tokens": sum(qo), "qo_lens": qo, "kv_lens": [q + cached // bs for q in qo]}
        else:
            kv = j.get("log_num_token") or bs * 512
            work[s] = {"tokens": bs, "kv_lens": [max(kv // bs, 1)] * bs}
    kt = timeline.add_work(kt, cfg, work, pk)
    base = ev.attrs.get("base_us") or 0.0
    spans = [{"name": g["step_name"].iloc[0], "start_us": float(g["ts_us"].min()), "dur_us":
              float(g["end_us"].max() - g["ts_us"].min()), "kernels": len(g), "kernel_us": float(g["dur_us"].sum()),
              "tokens": work[s]["tokens"], "kv_tokens": sum(work[s]["kv_lens"]),
              **{k.replace("log_", ""): j.get(k) for k in ("log_new_token", "log_cached_token", "log_running_req",
                                                            "log_queue_req", "log_token_usage")}}
             for (s, g), j in zip(kt.groupby("step"), joined)]
    return kt, spans, base, info


def median_traced(traced: list) -> int:
    """Index of the traced repetition whose TTFT (the median of its requests) is the median of the repetitions."""
    from common.tables import waterfall
    ttft = [statistics.median([r["client"]["ttft_s"] for r in t["results"] if "error" not in r and r["client"].get("ttft_s")]
                              or [math.nan]) for t in traced]
    i = waterfall.median_index(ttft)
    return len(traced) - 1 if i is None else i


def gemm_efficiency(kt, pk) -> list[dict]:
    """Per step kind and GEMM role (traced kernel time): TFLOP/s and % of the bf16 ceiling; effective bandwidth
    of the weights and, where the step's weights are many times the L2, the weight-streaming % of the DRAM read
    ceiling (common.tables.kernels stream_pct); the ncu counters where they ran (DRAM % from ncu's bytes)."""
    rows = []
    gem = kt[kt["role"].isin(timeline.GEMM_ROLES + ("lm_head",)) & kt["flops"].notna()]
    read = ceilings.kind_ceiling(pk, "read")
    for (mode, bs, role), g in gem.groupby(["mode", "bs", "role"], sort=False):
        intensity = float((g["flops"] / g["bytes"]).median())
        ridge = pk["bf16_tflops"] / read if read else math.nan
        rows.append({"mode": mode, "bs": bs, "role": role, "kernels": len(g), "dur_us": float(g["dur_us"].median()),
                     "tflop_s": float(g["tflop_s"].median()), "pct_bf16_ceiling": float(g["pct_bf16_ceiling"].median()),
                     "eff_tb_s": float(g["eff_tb_s"].median()), "stream_pct": _med(g, "stream_pct"),
                     "flop_per_byte": intensity, "ridge": ridge,
                     "bound_by_intensity": "memory" if intensity < ridge else "compute",
                     "tensor_pct": _med(g, "tensor_pct"), "dram_pct": _med(g, "dram_pct"), "grid": _first(g, "grid"),
                     "split_k": bool(kt[(kt["mode"] == mode) & (kt["bs"] == bs) & (kt["role"] == role)]["kernel"]
                                     .str.contains("splitK").any()),
                     "why": ""})
    for r in rows:
        r["why"] = ("intensity below the ridge: the weights stream in" if r["bound_by_intensity"] == "memory"
                    else "intensity above the ridge: tensor cores") + (" (split-K + reduce kernel)" if r["split_k"] else "")
    return rows


def _med(g, col):
    v = [float(x) for x in g[col] if x is not None and not (isinstance(x, float) and math.isnan(x))] if col in g else []
    return statistics.median(v) if v else math.nan


def _first(g, col):
    v = [x for x in g[col] if x is not None] if col in g else []
    return v[0] if v else None



def layer_trees(data) -> list[dict]:
    """layer_tree.csv: for each story's prefill (its first step) and decode (its middle step) at the story's largest
    batch, one layer and the once-per-step kernels (common.tables.timeline.layer_tree)."""
    trees = []
    for name, mode in (("one", "EXTEND"), ("one", "DECODE"), ("batch", "EXTEND"), ("batch", "DECODE")):
        kt = data[f"kt_{name}"]
        m = kt[kt["mode"] == mode]
        m = m[m["bs"] == m["bs"].max()]
        if len(m):
            steps = sorted(m["step"].unique())
            step = int(steps[len(steps) // 2] if mode == "DECODE" else steps[0])
            trees += [{"story": name, "step": step, "mode": mode, "bs": int(m["bs"].iloc[0]), **r}
                      for r in timeline.layer_tree(kt, step)]
    return trees


def write_story(run, data) -> None:
    """Each story's kernel and step tables and its Perfetto trace (story_<story>.json: kernels, steps, each request's
    waterfall, the scheduler's counters, the transitions inside the trace as instants)."""
    for name in ("one", "batch"):
        kt, spans = data[f"kt_{name}"], data[f"spans_{name}"]
        run.table(f"kernels_{name}", kt)
        run.table(f"steps_{name}", spans)
        reqs, wf_spans, marks = perfetto_extras(data, name)
        counters_ = {"running": [(s["start_us"], s.get("running_req")) for s in spans],
                     "queued": [(s["start_us"], s.get("queue_req")) for s in spans],
                     "token usage": [(s["start_us"], s.get("token_usage")) for s in spans]}
        meta = timeline.write_perfetto_fit(run.path(f"story_{name}.json"), kt, steps=spans, requests=reqs,
                                           counters=counters_, spans=wf_spans, marks=marks)
        run.log(f"story_{name}.json: {meta['kernels']} kernels of {meta['steps_kept']} steps"
                + (f" (steps left out to stay under 5 MB: {len(meta['steps_left_out'])})" if meta["steps_left_out"] else ""))


def perfetto_extras(data, name) -> tuple:
    """For story_<name>.json: each request's waterfall (its stamps, on the trace clock) as phases, the prefill split
    and the decode iteration of the median traced repetition as spans, the transitions inside the trace as instants."""
    from common.tables import waterfall
    base = data[f"base_{name}"]
    us = lambda t: t * 1e6 - base  # noqa: E731
    reqs = []
    for i, r in enumerate(data[f"results_{name}"]):
        if "error" in r:
            continue
        wf = sg.ttft_waterfall(r, label=str(i), source="traced")
        ph = [(n, us(a), us(b)) for n, a, b in waterfall.spans_of(wf)]
        if r["client"].get("t_first"):
            ph.append(("decode (to the last token)", us(r["client"]["t_first"]), us(r["client"]["t_done"])))
        reqs.append({"id": i, "phases": ph})
    spans, w = {}, data.get("wf") or {}
    if name == "one" and w.get("split"):
        spans["prefill forward, split (traced)"] = [(n, us(a), us(b)) for n, a, b in waterfall.spans_of(w["split"])]
    lo = min((a for rq in reqs for _n, a, _b in rq["phases"]), default=-math.inf)
    hi = max((b for rq in reqs for _n, _a, b in rq["phases"]), default=math.inf)
    marks = [(us(x["t"]), x["kind"], {"what": x["text"]}) for x in data.get("transitions", [])
             if lo <= us(x["t"]) <= hi]
    return reqs, spans, marks


def spans_by_step(kt, spans) -> dict:
    """{step: its span record (analyse_story: kv_tokens, tokens, cached_token, the log's fields)} (spans are in step
    order)."""
    return dict(zip(sorted(int(s) for s in kt["step"].unique()), spans or []))


def known(v) -> bool:
    """A value that is there: not None, not NaN."""
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def story_findings(data, trees, eff) -> list[str]:
    """What the story's figures say, as sentences written from them (the page shows them, Run.finding): the prefill
    forward's share of the untraced TTFT and its traced GPU part, the prefill step's kernel mix, the batch-1 decode
    step as one graph replay beside the scheduler's loop, the GEMMs against their ceilings. A sentence whose figures
    this run lacks is left out."""
    from common.base.story import fmt as f
    out = []
    w = data.get("wf") or {}
    u = w.get("ttft") or {}
    pf = next((p for p in u.get("parts", []) if "prefill forward" in p["name"]), None)
    if pf and u.get("total_ms"):
        sp = pf.get("split") or {}
        gpu = next((p for p in sp.get("parts", []) if p["name"] == "GPU forward"), None)
        out.append(f"Untraced, the prefill forward is {f(100 * pf['ms'] / u['total_ms'])}% of the client's TTFT "
                   f"({f(pf['ms'])} of {f(u['total_ms'])} ms); HTTP, tokenizing, queueing and detokenizing make the rest"
                   + (f". Traced, {f(gpu['ms'])} of its {f(sp['total_ms'])} ms are the GPU forward ({sp.get('kernels')} "
                      f"kernels, the GPU busy {f(sp.get('gpu_busy_pct'))}% of their span): around them the CPU schedules, "
                      "prepares inputs and plans attention" if gpu and sp.get("total_ms") else "") + ".")
    ext = [t for t in trees if t["story"] == "one" and t["mode"] == "EXTEND"]
    if ext:
        gemm = sum(t["share_all_layers_pct"] for t in ext if t["role"] in timeline.GEMM_ROLES)
        att = [t for t in ext if t["segment"] == "layer" and t["role"] == "attention"]
        top = max((t for t in ext if t["role"] in timeline.GEMM_ROLES), key=lambda t: t["share_all_layers_pct"],
                  default=None)
        out.append(f"In the one-request prefill step (bs {ext[0]['bs']}) the four layer GEMMs take {f(gemm)}% of the "
                   "kernel time" + (f" ({top['role']} alone {f(top['share_all_layers_pct'])}%)" if top else "")
                   + f", attention {f(sum(t['share_all_layers_pct'] for t in att))}% in {len(att)} kernel(s) a layer.")
    d = w.get("decode") or {}
    if d.get("parts"):
        ms = {p["name"]: p["ms"] for p in d["parts"]}
        out.append(f"A batch-{d.get('bs')} decode step is one CUDA-graph replay of {d.get('kernels')} kernels "
                   f"({f(d.get('kernel_ms'))} ms of kernel time, the GPU busy {f(d.get('gpu_busy_pct'))}% of its "
                   f"step); in the same scheduler iteration of {f(d['total_ms'])} ms the CPU spends "
                   f"{f(ms.get('process_batch_result'))} ms in process_batch_result (the previous step's tokens) and "
                   f"{f(ms.get('run_batch'))} ms in run_batch (metadata, the graph launch), both while the GPU runs.")
    by = {(r["mode"], r["bs"], r["role"]): r for r in eff}
    one, big = by.get(("DECODE", 1, "gate_up_proj")), max(
        (r for r in eff if r["mode"] == "DECODE" and r["role"] == "gate_up_proj"), key=lambda r: r["bs"], default=None)
    if one and known(one.get("stream_pct")):
        out.append(f"At batch 1 the decode gate-up GEMM streams its weights at {f(one['stream_pct'])}% of the DRAM "
                   f"read ceiling ({f(one['flop_per_byte'])} FLOP per byte against a ridge of {f(one['ridge'])})"
                   + (f"; at batch {big['bs']} it takes {f(big['dur_us'])} us against {f(one['dur_us'])} us"
                      if big and big["bs"] > 1 else "") + ".")
    pre = [r for r in eff if r["mode"] == "EXTEND" and r["bs"] == 1 and r["role"] in timeline.GEMM_ROLES]
    if pre:
        lo, hi = (min(pre, key=lambda r: r["pct_bf16_ceiling"]), max(pre, key=lambda r: r["pct_bf16_ceiling"]))
        out.append(f"In the one-request prefill the layer GEMMs reach {f(lo['pct_bf16_ceiling'])}% ({lo['role']}, "
                   f"{f(lo['dur_us'])} us) to {f(hi['pct_bf16_ceiling'])}% ({hi['role']}, {f(hi['dur_us'])} us) of the "
                   "bf16 ceiling.")
    return out
