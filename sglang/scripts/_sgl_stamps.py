"""SGLang's steps in a trace and a request's own clock: the forward steps (common.tables.trace.step_kernels with SGLang's
range names), each step beside its scheduler log line, the per-request time stamps of the waterfall and the
traced splits of a prefill and a decode step. Part of _sglang."""
from __future__ import annotations

import math
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from common.tables import trace  # noqa: E402
from _sgl_logs import Metrics, parse_metrics  # noqa: E402


# ================================================================== traces: steps and their kernels

STEP_RANGE = r"^step\["                       # SGLang's forward-step range: step[EXTEND bs=1 toks=11]
OUTER_RANGE = r"^scheduler\.run_batch$"       # the scheduler range around it (also holds the sampling kernels)
STEP_RE = re.compile(r"^step\[(?P<mode>[A-Z_]+) bs=(?P<bs>\d+)(?: toks=(?P<toks>\d+))?\]$")


def parse_step_name(name: str) -> dict | None:
    """'step[EXTEND bs=1 toks=11]' -> {"mode": "EXTEND", "bs": 1, "toks": 11}; None for other names."""
    m = STEP_RE.match(name or "")
    if not m:
        return None
    return {"mode": m["mode"], "bs": int(m["bs"]), "toks": int(m["toks"]) if m["toks"] else None}


def steps(ev):
    """SGLang's forward steps in a torch-profiler trace: (the kernel table of common.tables.trace.step_kernels, the one
    join: each step's kernels from the ``scheduler.run_batch`` range around its ``step[...]`` range, which also
    holds the sampling kernels; one summary row per step from common.tables.trace.step_summary)."""
    kt = trace.step_kernels(ev, STEP_RANGE, outer=OUTER_RANGE, parse=parse_step_name)
    return kt, trace.step_summary(kt)


def _sig_step(s: dict):
    return ("P", s["bs"], s.get("toks")) if s["mode"] in ("EXTEND", "MIXED") else ("D", s["bs"])


def _sig_row(r: dict):
    return ("P", r["new_seq"], r["new_token"]) if r["kind"] == "prefill" else ("D", r["running_req"])


LOG_FIELDS = ("time", "new_seq", "new_token", "cached_token", "running_req", "queue_req", "token_usage",
              "num_token", "cuda_graph")


def join_steps(steps: list[dict], rows: list[dict], min_match: float = 0.8) -> tuple[list[dict], dict]:
    """Put each traced step next to the scheduler log line of the same forward.

    Traced steps are a contiguous run of the forwards that the log lists in the same order (one
    Prefill line per prefill forward; one Decode line per decode forward when the server runs
    with --decode-log-interval 1). The alignment is the offset at which the signatures
    (EXTEND bs/toks <-> #new-seq/#new-token, DECODE bs <-> #running-req) agree most. Returns
    (steps with log fields added under ``log_*``, {"offset", "matched", "of", "ok"}).
    """
    rows = [r for r in rows if r["kind"] in ("prefill", "decode")]
    st = [_sig_step(s) for s in steps]
    lg = [_sig_row(r) for r in rows]
    best, best_off = -1, None
    for off in range(-len(st) + 1, len(lg)):
        score = sum(1 for i, sig in enumerate(st) if 0 <= off + i < len(lg) and lg[off + i] == sig)
        if score > best:
            best, best_off = score, off
    info = {"offset": best_off, "matched": max(best, 0), "of": len(st),
            "ok": bool(st) and best >= min_match * len(st)}
    joined = []
    for i, s in enumerate(steps):
        j = (best_off or 0) + i
        r = rows[j] if info["ok"] and 0 <= j < len(rows) else {}
        joined.append({**s, "log_match": bool(r) and lg[j] == st[i], **{f"log_{k}": r.get(k) for k in LOG_FIELDS}})
    return joined, info


# ================================================================== a request's own clock: the waterfall's stamps

# SGLang 0.5.17's per-request stamps (epoch seconds) in the order a request meets them, each with the part that
# ends there (common.tables.waterfall builds the parts). Where each one is set:
#   request_received   TokenizerManager: time_stats.set_created_time (tokenizer_manager.py:3480), the FastAPI
#                      handler's first call -> meta_info request_received_ts
#   dispatch_finish    after the ZMQ send to the scheduler (_send_one_request, tokenizer_manager.py:1553) ->
#                      meta_info api_server_dispatch_finish_ts; tokenize_finish_time (:1426) is not exported
#   scheduler_recv     Req built in the scheduler (schedule_batch.py:1109); not exported: wait_queue_entry minus
#                      the request_process stage of /metrics (per_stage_req_latency_seconds{stage=request_process})
#   wait_queue_entry   into the waiting queue (scheduler.py:2637): forward_entry_time - queue_time
#   forward_entry      taken into a batch by get_next_batch_to_run (scheduler.py:3288) -> meta_info forward_entry_time
#   prefill_finished   process_batch_result of the prefill (batch_result_processor.py:264) -> prefill_finished_time
#   response_sent      TokenizerManager yields the first chunk (tokenizer_manager.py:1752) -> response_sent_to_client_ts
#   client_first       the client's own clock when the first chunk arrived (Server.generate)
TTFT_CHAIN = [("client_send", None), ("request_received", "HTTP receive"), ("dispatch_finish", "tokenize + dispatch"),
              ("scheduler_recv", "to the scheduler"), ("wait_queue_entry", "request processing"),
              ("forward_entry", "queue wait"), ("prefill_finished", "prefill forward"),
              ("response_sent", "detokenize + return"), ("client_first", "HTTP stream")]
TTFT_WHAT = {
    "HTTP receive": "client -> uvicorn -> FastAPI -> TokenizerManager (request_received_ts)",
    "tokenize + dispatch": "the tokenizer (text) or the ids as given, then the ZMQ send to the scheduler",
    "to the scheduler": "ZMQ transit and the scheduler loop reaching recv_requests",
    "request processing": "Req built and checked, into the waiting queue (/metrics stage request_process)",
    "queue wait": "until get_next_batch_to_run takes it into a batch (meta_info queue_time)",
    "prefill forward": "batch scheduling, planning, GPU forward, sampling, result (/metrics stage prefill_forward)",
    "detokenize + return": "scheduler -> detokenizer process -> TokenizerManager writes the first chunk",
    "HTTP stream": "the first chunk through uvicorn to the client",
}


def request_stamps(result: dict, metrics_before=None, metrics_after=None) -> dict:
    """The stamps of one streamed /generate (a :meth:`Server.generate` result: ``client`` and the last chunk's
    ``meta_info``) on the epoch clock, with scheduler_recv from the /metrics request_process stage when the two
    scrapes (text or :class:`Metrics`) around this one request are given. Missing stamps are left out."""
    mi, cl = result.get("meta_info") or {}, result.get("client") or {}
    st = {"client_send": cl.get("t_send"), "request_received": mi.get("request_received_ts"),
          "dispatch_finish": mi.get("api_server_dispatch_finish_ts"), "forward_entry": mi.get("forward_entry_time"),
          "prefill_finished": mi.get("prefill_finished_time"), "response_sent": mi.get("response_sent_to_client_ts"),
          "client_first": cl.get("t_first"), "client_done": cl.get("t_done")}
    if st["forward_entry"] and mi.get("queue_time") is not None:
        st["wait_queue_entry"] = st["forward_entry"] - mi["queue_time"]
    rp = stage_delta(metrics_before, metrics_after, "request_process")
    if rp is not None and st.get("wait_queue_entry"):
        st["scheduler_recv"] = st["wait_queue_entry"] - rp
    return {k: float(v) for k, v in st.items() if isinstance(v, (int, float)) and v}


def stage_delta(before, after, stage: str) -> float | None:
    """Seconds one request spent in a /metrics stage (per_stage_req_latency_seconds{stage}) between two scrapes
    taken around it; None unless exactly one observation was added."""
    if before is None or after is None:
        return None
    b = before if isinstance(before, Metrics) else parse_metrics(before)
    a = after if isinstance(after, Metrics) else parse_metrics(after)
    name = "per_stage_req_latency_seconds"
    dn = a.total(name + "_count", 0.0, stage=stage) - b.total(name + "_count", 0.0, stage=stage)
    if dn != 1:
        return None
    return a.total(name + "_sum", 0.0, stage=stage) - b.total(name + "_sum", 0.0, stage=stage)


def ttft_waterfall(result: dict, metrics_before=None, metrics_after=None, label: str = "", source: str = "untraced"):
    """common.tables.waterfall of one request's TTFT from its stamps; total: the client's own TTFT."""
    from common.tables import waterfall
    st = request_stamps(result, metrics_before, metrics_after)
    ttft = (result.get("client") or {}).get("ttft_s")
    return waterfall.build(st, TTFT_CHAIN, total_ms=ttft * 1e3 if ttft else None, label=label, source=source,
                           what=TTFT_WHAT)


_LAUNCH = re.compile(r"^(cudaGraphLaunch|cudaLaunchKernel|cuLaunchKernel|cuLaunchKernelEx|cudaLaunchKernelExC)$")


def _plan_calls(ev, lo: float, hi: float, tid) -> list[tuple]:
    """FlashInfer plan() calls on the scheduler thread between ``lo`` and ``hi`` (trace us): a cudaMemcpyAsync that
    no aten op encloses (plan() copies its host-built schedule to the GPU from C++, after asking the SM count with
    cudaDeviceGetAttribute). Each call: (start = end of the aten op before it, end of its copy)."""
    th = ev[(ev["tid"] == tid) & (ev["ts_us"] >= lo) & (ev["end_us"] <= hi)]
    ops = th[th["kind"] == "cpu_op"]
    out = []
    for m in th[(th["kind"] == "runtime") & (th["name"] == "cudaMemcpyAsync")].itertuples():
        if ((ops["ts_us"] <= m.ts_us) & (ops["end_us"] >= m.end_us)).any():
            continue
        before = ops[ops["end_us"] <= m.ts_us]["end_us"]
        out.append((float(before.max()) if len(before) else float(m.ts_us), float(m.end_us)))
    return out


def prefill_split(ev, stamps: dict, layers: int | None = None) -> dict:
    """The prefill forward stage of one traced request (forward_entry -> prefill_finished) split on the trace,
    as a common.tables.waterfall: batch scheduling (the rest of get_next_batch_to_run), run_batch before the step range,
    forward input prep + attention planning (FlashInfer plan() calls found by _plan_calls), the GPU forward
    (embedding to logits, GPU clock), sampling (the kernels of run_batch after the forward), the overlap scheduler's
    next iteration (it schedules and launches the next step before it reads this result) and result processing
    until prefill_finished_time. ``ev``: common.tables.trace.read_chrome_trace of the traced run (its base_us puts the
    trace on the epoch clock of the stamps); ``stamps``: request_stamps of the traced request."""
    from common.tables import timeline, waterfall
    base = ev.attrs.get("base_us")
    if base is None:
        raise trace.TraceError("the trace has no baseTimeNanoseconds: its clock cannot be put beside the stamps")
    us = lambda s: s * 1e6 - base  # noqa: E731
    sec = lambda u: (u + base) / 1e6  # noqa: E731
    fe, pf = us(stamps["forward_entry"]), us(stamps["prefill_finished"])
    ua = ev[ev["kind"] == "user_annotation"]
    gnb = ua[(ua["name"] == "scheduler.get_next_batch_to_run") & (ua["ts_us"] <= fe) & (ua["end_us"] >= fe)]
    steps = ua[ua["name"].str.match(STEP_RANGE) & (ua["ts_us"] >= fe) & (ua["ts_us"] <= pf)].sort_values("ts_us")
    steps = steps[steps["name"].str.contains("EXTEND")]
    if gnb.empty or steps.empty:
        raise trace.TraceError("the traced request's forward_entry_time falls in no get_next_batch_to_run range, or "
                               "no EXTEND step follows it: was the request traced whole?")
    step = steps.iloc[0]
    rb = ua[(ua["name"] == "scheduler.run_batch") & (ua["ts_us"] <= step["ts_us"]) & (ua["end_us"] >= step["end_us"])]
    pbr = ua[(ua["name"] == "scheduler.process_batch_result") & (ua["ts_us"] >= rb["end_us"].iloc[0])
             & (ua["ts_us"] <= pf)].sort_values("ts_us")
    kt = timeline.layered(trace.step_kernels(ev, STEP_RANGE, outer=OUTER_RANGE, parse=parse_step_name), layers=layers)
    mine = kt[(kt["ts_us"] >= step["ts_us"]) & (kt["step_name"] == step["name"])]
    mine = mine[mine["step"] == mine["step"].min()]
    fwd = mine[(mine["segment"] == "layer") | mine["role"].isin(("embedding", "final_norm", "lm_head"))]
    if fwd.empty:
        fwd = mine
    plans = _plan_calls(ev, float(step["ts_us"]), float(fwd["ts_us"].min()), step["tid"])
    plan_ms = sum(b - a for a, b in plans) / 1e3
    busy = 100 * trace.busy_fraction(fwd.rename(columns={}), float(fwd["ts_us"].min()), float(fwd["end_us"].max()))
    st = {"forward_entry": stamps["forward_entry"], "scheduled": sec(float(gnb["end_us"].iloc[0])),
          "step_start": sec(float(step["ts_us"])), "gpu_forward_start": sec(float(fwd["ts_us"].min())),
          "gpu_forward_end": sec(float(fwd["end_us"].max())), "sampled": sec(float(mine["end_us"].max())),
          "result_start": sec(float(pbr["ts_us"].iloc[0])) if len(pbr) else None,
          "prefill_finished": stamps["prefill_finished"]}
    n_k = len(fwd)
    what = {"batch scheduling": "the rest of get_next_batch_to_run after the request joined the batch",
            "run_batch before the forward": "ScheduleBatch -> ModelWorkerBatch -> ForwardBatch, copies to the GPU",
            "forward prep + attention plan": f"inputs, positions; FlashInfer plan(): {plan_ms:.2f} ms in {len(plans)} "
                                             "call(s)",
            "GPU forward": f"{n_k} kernels, embedding to logits; GPU busy {busy:.0f}% of the span",
            "sampling": "the sampling kernels of run_batch after the forward",
            "overlap: next step first": "the scheduler launches the next step before it reads this result",
            "result processing": "process_batch_result until prefill_finished_time"}
    chain = [("forward_entry", None), ("scheduled", "batch scheduling"), ("step_start", "run_batch before the forward"),
             ("gpu_forward_start", "forward prep + attention plan"), ("gpu_forward_end", "GPU forward"),
             ("sampled", "sampling"), ("result_start", "overlap: next step first"),
             ("prefill_finished", "result processing")]
    wf = waterfall.build(st, chain, label=f"traced {step['name']}", source="traced", what=what)
    wf.update(plan_ms=plan_ms, plan_calls=len(plans), gpu_busy_pct=busy, kernels=n_k,
              kernel_ms=float(fwd["dur_us"].sum()) / 1e3)
    return wf


LOOP_RANGES = ("scheduler.recv_requests", "scheduler.process_input_requests", "scheduler.get_next_batch_to_run",
               "scheduler.run_batch", "scheduler.process_batch_result")
LOOP_WHAT = {"scheduler.recv_requests": "poll the ZMQ socket for new requests",
             "scheduler.process_input_requests": "turn them into Reqs",
             "scheduler.get_next_batch_to_run": "decide the next batch (the running batch grows by a token)",
             "scheduler.run_batch": "ForwardBatch, attention metadata, the decode CUDA-graph launch, sampling launch",
             "scheduler.process_batch_result": "the previous step's result: waits for its copy to the CPU, then "
                                               "appends tokens, sends them to the detokenizer"}


def decode_split(ev, bs: int | None = None) -> dict:
    """One decode step of the traced run, as the scheduler loop spends it (a common.tables.waterfall): the median
    iteration between two consecutive decode run_batch ranges (batch ``bs``, default the largest traced),
    split into the loop's ranges (LOOP_RANGES; copy_result_to_cpu is inside run_batch) and what no range covers
    (the remainder). Also: that step's GPU kernel span, kernel time and GPU busy share."""
    from common.tables import waterfall
    ua = ev[ev["kind"] == "user_annotation"]
    steps = ua[ua["name"].str.match(STEP_RANGE) & ua["name"].str.contains("DECODE")]
    rb = ua[ua["name"] == "scheduler.run_batch"].sort_values("ts_us")
    dec = []
    for r in rb.itertuples():
        inside = steps[(steps["ts_us"] >= r.ts_us) & (steps["end_us"] <= r.end_us) & (steps["tid"] == r.tid)]
        meta = parse_step_name(inside["name"].iloc[0]) if len(inside) else None
        dec.append((r, meta))
    want = bs or max((m["bs"] for _r, m in dec if m), default=None)
    its = [(a, b) for (a, ma), (b, mb) in zip(dec, dec[1:]) if ma and mb and ma["bs"] == mb["bs"] == want]
    if not its:
        raise trace.TraceError("no two consecutive decode steps of one batch size in the trace")
    periods = [b.ts_us - a.ts_us for a, b in its]
    a, b = its[waterfall.median_index(periods)]
    lo, hi = a.ts_us, b.ts_us
    parts = []
    for name in LOOP_RANGES:
        g = ua[(ua["name"] == name) & (ua["tid"] == a.tid) & (ua["ts_us"] >= lo) & (ua["ts_us"] < hi)]
        ms = float((g["end_us"].clip(upper=hi) - g["ts_us"]).sum()) / 1e3
        parts.append({"name": name.removeprefix("scheduler."), "ms": ms, "start": None, "end": None, "from": None,
                      "to": None, "source": "traced", "what": LOOP_WHAT[name], "split": None})
    j = trace.kernels_in_ranges(ev, OUTER_RANGE, empty_rows=False)
    k = j[(j["range_ts_us"] == a.ts_us) & (j["gpu_kind"] == "kernel")]
    span = float(k["end_us"].max() - k["ts_us"].min()) / 1e3 if len(k) else math.nan
    wf = waterfall.finish({"label": f"traced decode step bs {want} (median of {len(its)} iterations)",
                            "total_ms": (hi - lo) / 1e3, "parts": parts, "source": "traced"})
    wf.update(bs=want, iterations=len(its), periods_ms=[p / 1e3 for p in periods], gpu_span_ms=span,
              kernel_ms=float(k["dur_us"].sum()) / 1e3, kernels=int(len(k)),
              gpu_busy_pct=100 * float(k["dur_us"].sum()) / 1e3 / span if span else math.nan)
    return wf


STEP_FROM = {"step_ms": "median step of the scheduler's Decode lines (running requests / gen throughput)",
             "log_step_ms": "mean gap between the scheduler's Decode lines (whole-ms log stamps)"}


def itl_waterfall(itl_ms: float, step_ms: float, label: str = "", source: str = "untraced",
                  step_from: str = "step_ms") -> dict:
    """A decode step's ITL at the client (median) against the scheduler's decode step (``step_from``: a key of
    STEP_FROM, --decode-log-interval 1): the step is the one part, the rest is delivery (the remainder)."""
    from common.tables import waterfall
    return waterfall.finish({"label": label, "total_ms": itl_ms, "source": source, "parts": [
        {"name": "scheduler decode step", "ms": step_ms, "start": None, "end": None, "from": None, "to": None,
         "source": source, "what": STEP_FROM[step_from], "split": None}]})
