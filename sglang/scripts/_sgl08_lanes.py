"""SGLang 08: one request on two lanes -- the CPU (HTTP and tokenizer from SGLang's own stamps; the scheduler loop from
the trace) and the GPU (the traced kernels, one box per layer) on one millisecond axis, SGLang's per-request stamps
marked on it (08_execution_story.py conducts; common.render.plots.lanes draws).

The request is the traced median repetition of the one-request story (the one the story's tree and the waterfall's
split come from). Its stamps (the TTFT waterfall's: meta_info and the client's clock) and the trace share the epoch
clock (the trace's baseTimeNanoseconds), so both go on one axis: milliseconds since the client sent the request.
The window runs to two decode steps past the first token: the prefill, the hand-over to decode, and the overlap
scheduler preparing step N+1 while the GPU runs step N.

    lane_spans(data)      (spans, marks, (lo, hi)) for the figure, every time in ms since the client's send
    lanes_figure(data)    the figure (two_lanes.png)
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _sglang as sg  # noqa: E402
from _sgl08_stories import story_events  # noqa: E402

CPU_TOK = "CPU · HTTP + tokenizer (stamps)"
CPU_SCHED = "CPU · scheduler (traced)"
GPU = "GPU · kernels, one box per layer (traced)"
LANES = (CPU_TOK, CPU_SCHED, GPU)
LOOP = ("recv_requests", "process_input_requests", "get_next_batch_to_run", "run_batch", "process_batch_result")
STAMP_SPANS = (("client_send", "request_received", "HTTP receive"),
               ("request_received", "dispatch_finish", "tokenize + dispatch"),
               ("prefill_finished", "response_sent", "detokenize + return"))
MARKS = (("request_received", "received"), ("dispatch_finish", "to the scheduler"), ("forward_entry", "batch formed"),
         ("prefill_finished", "prefill finished"), ("response_sent", "chunk sent"), ("client_first", "first token"))
SERIES = ("HTTP receive", "tokenize + dispatch", "detokenize + return") + LOOP + (
    "GPU: before the layers", "GPU: one layer", "GPU: after the layers (logits, sampling)")
DECODE_STEPS_SHOWN = 2


def lane_spans(data) -> tuple[list[dict], list[tuple], tuple[float, float]]:
    """The traced median repetition of the one-request story on one axis (ms since the client's send): its stamp
    spans (HTTP receive, tokenize + dispatch, detokenize + return), the scheduler loop's ranges, the GPU kernels
    grouped per (step, layer) with the once-per-step kernels before and after the layers, and its stamps as marks.
    The window: from the send to DECODE_STEPS_SHOWN ITLs past the first token at the client."""
    pick = data.get("pick_one", 0)
    rep = data["traced_one"][pick]
    res = data["results_one"][0]
    st = sg.request_stamps(res)
    t0 = st["client_send"]
    ms = lambda epoch_s: (epoch_s - t0) * 1e3  # noqa: E731
    ev, _kt = story_events(rep["trace"])
    base = ev.attrs.get("base_us") or 0.0
    tr = lambda us: ((us + base) / 1e6 - t0) * 1e3  # noqa: E731
    itl = res["client"].get("itl_s") or []
    hi = ms(st.get("client_first", t0)) + DECODE_STEPS_SHOWN * 1e3 * (statistics.median(itl) if itl else 0.01)
    spans = [{"lane": CPU_TOK, "series": name, "start": ms(st[a]), "end": ms(st[b])}
             for a, b, name in STAMP_SPANS if a in st and b in st]
    ua = ev[ev["kind"] == "user_annotation"]
    loop = ua[ua["name"].isin([f"scheduler.{n}" for n in LOOP])]
    for r in loop.itertuples():
        a, b = tr(r.ts_us), tr(r.end_us)
        if b >= 0 and a <= hi:
            spans.append({"lane": CPU_SCHED, "series": r.name.removeprefix("scheduler."), "start": a, "end": b})
    kt = data["kt_one"]
    kt = kt[kt["segment"].notna()]
    key = kt["segment"].astype(str) + "/" + kt["layer"].fillna(-1).astype(int).astype(str)
    g = kt.assign(_k=key).groupby(["step", "_k"]).agg(seg=("segment", "first"), a=("ts_us", "min"), b=("end_us", "max"))
    names = {"pre": "GPU: before the layers", "layer": "GPU: one layer", "post": "GPU: after the layers (logits, sampling)"}
    for (step, _k), r in g.iterrows():
        a, b = tr(r["a"]), tr(r["b"])
        if b >= 0 and a <= hi:
            spans.append({"lane": GPU, "series": names[r["seg"]], "start": a, "end": b, "step": int(step)})
    marks = [(label, ms(st[k])) for k, label in MARKS if k in st]
    return spans, marks, (0.0, hi)


def lanes_figure(data, gpu: str = ""):
    """two_lanes.png: the request on its CPU and GPU lanes (common.render.plots.lanes)."""
    from common.render import plots
    spans, marks, xlim = lane_spans(data)
    return plots.lanes(spans, marks, lane_order=LANES, series_order=SERIES, xlim=xlim,
                       xlabel="ms since the client sent the request (SGLang's stamps and the trace on one clock)",
                       title=f"One request on two lanes — {gpu}: the traced median repetition, to two decode steps "
                             "past the first token")
