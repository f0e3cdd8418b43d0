#!/usr/bin/env python3
"""01 · One request, then a batch, then load: SGLang's execution story end to end.

What it measures (one SGLang HTTP server, Llama-3.1-8B shapes with dummy weights, one GPU, CUDA graphs
for prefill and decode; --quick caps the KV pool at 32768 tokens, the story's first line says so; in a --quick pipeline it runs on the pipeline's shared server, whose flags
are exactly these)
    1. one request (text prompt -> the byte tokenizer; 512 tokens in, 128 out), streamed and traced
       with the torch profiler (/start_profile), repeated 3 times: tokenize -> queue -> PREFILL step ->
       each DECODE step -> finish, from meta_info time stamps, the scheduler's per-step log lines
       (--decode-log-interval 1, SGLANG_LOG_MS=1) and the trace's steps with their kernels
       (scheduler.run_batch around step[...], CUDA-graph replays included); kernel classes per stage;
    2. a batch of requests sent together: how the scheduler forms prefill and decode batches;
    3. ITL against KV length over long decodes at several batch sizes (client-side stream times, each
       point 3 times), with the bytes a decode step must read (weights + KV) -> TB/s and % of the
       measured DRAM ceiling (common.capture.ceilings.peaks);
    3b. the decode step against batch size, 1 to 256 (_sgl01_batch: that many requests at once, the step read from
       the scheduler's lines, each point 3 times, about a second each with --quick), beside its two floors: the
       weights and KV over the measured DRAM read ceiling, the FLOPs over the measured bf16 ceiling; the batch where
       the step stops being bound by reading the weights, and which points replayed a CUDA graph;
    4. continuous batching under load: SGLang's own `sglang.benchmark.serving` at several request
       rates (the highest 3 times); batch size, running/queued requests and token usage over time from
       the log lines; then a load that fills the KV pool (_sgl01_pressure, its docstring has the arithmetic:
       with --quick 114 prompts of 384 in / 192 out at once, 2.0x the 32768-token pool, after a 10,000-token
       prompt that needs chunked prefill): queue, retractions, the chunk, batch dynamics per scheduler step,
       the wall time of each step and GPU memory over time by owner (NVML); then, in a staggered burst of its
       own (a trace export stalls the scheduler, so no measured run is traced), a window of scheduler steps
       under load next to their kernels;
    5. the performance bar: the workbook's own client vs `sglang.benchmark.serving
       --request-rate inf` on the same server and workload (3 rounds).

What the plan expected (hypotheses in H below: each with its range and the plan figure it comes from;
judged on the interval of its repetitions, common.judge.verdicts)
    * CPU work before the first kernel was ~6% of TTFT on A100; larger on faster GPUs.
    * ITL rose ~25% over 128 generated tokens (A100). Restated: flat at batch 1 (weights dominate
      the bytes), linear in KV bytes only at large batch x context.
    * Under load #running-req rises and plateaus; prefill batches interrupt decode (ITL tail); under
      pressure the KV pool fills and SGLang retracts requests (judged on the pressure load, the one load built to
      fill the pool; its filling is that verdict's premise, not a verdict of its own).
    Judged by 08 on its traced steps, not here: attention's share of the prefill step (the A100 plan's ~45%;
    08 judges it beside the same step's GEMMs, role by role) and a batch-1 decode bound by reading the weights
    (08 times each layer's GEMMs: no CPU gap enters it, as one enters the ITL here; the story below still gives
    the ITL's effective bandwidth).

Run
    python sglang/scripts/01_baseline_perf.py --quick                  # ~2.5 min warm
    python sglang/scripts/01_baseline_perf.py                          # full (~5 min)
    python sglang/scripts/01_baseline_perf.py --backend triton --out sglang/results/01_baseline_perf_triton
    python sglang/scripts/01_baseline_perf.py --quick --rates 4,16,inf --skip-load
    python sglang/scripts/01_baseline_perf.py --quick --bench-control   # + one bench_serving as its own process
    python sglang/scripts/01_baseline_perf.py --reanalyse DIR --out OUT   # no GPU, no sglang: the analysis again
    (nsys/ncu views of the same server: 04_nsys_profile.py, 05_ncu_attention.py)
Writes sglang/results/01_baseline_perf/: request_steps.csv, phase_kernels.csv, itl_vs_kv.csv,
itl_vs_batch.csv, load_runs.csv, batch_timeline.csv, step_join.csv, perf_bar.csv, bench_runs.csv (each bench_serving run's wall
time: the worker's start, the run, the benchmark's own duration), requests.csv (each traced request's client and
meta_info stamps, log lines, trace<->log join), batch_log.csv and batch.csv (part 2's log lines, its throughput),
joins.csv (the under-load trace<->log join): the last four for --reanalyse; the pressure load's pressure_run.csv,
pressure_steps.csv, gpu_memory.csv, server_memory.csv (for --reanalyse), gpu_memory_owners.csv, pressure_events.csv,
story_pressure.json (Perfetto), pressure.png; server_start.csv (its own server's start, phase by phase),
itl_vs_kv.png, itl_vs_batch.png, batch_dynamics.png, server.log, bench/, profiles/, story.txt, summary.json.
"""
from __future__ import annotations

import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _sglang as sg  # noqa: E402
from _sgl01_batch import batch_figure, batch_findings, batch_items, itl_rows, with_floors  # noqa: E402,F401
from _sgl01_measure import measure  # noqa: E402
from _sgl01_pressure import (  # noqa: E402
    PRESSURE_TABLES, at_plateau, line_floor_ms, load_shape, pressure_events, pressure_figure,
    pressure_findings, pressure_items, read_pressure, record_pressure, retractions, step_classes,
    top_usage, write_pressure
)
from common.base import story  # noqa: E402
from common.base.checks import run_main, SetupError  # noqa: E402
from common.capture import ceilings, models, timing  # noqa: E402
from common.judge.verdicts import declare  # noqa: E402
from common.run import cli, recording  # noqa: E402
from common.run.results import Run  # noqa: E402

QUICK = dict(reps=3, prompt=512, new=128, batch=8, itl_points=[(1, 512), (16, 512)], itl_new=160, rates=("8", "32"),
             load_n=32, load_in=512, load_out=64, trace_steps=24, bar_n=64, bar_in=512, bar_out=128,
             **load_shape(quick=True))
FULL = dict(reps=3, prompt=512, new=128, batch=32, itl_points=[(1, 512), (1, 8192), (8, 4096), (32, 4096), (64, 2048)],
            itl_new=512, rates=("4", "16", "64", "inf"), load_n=256, load_in=1024, load_out=256, trace_steps=48,
            bar_n=256, bar_in=1024, bar_out=256, **load_shape(quick=False))
PLAN = "PLAN.md Session 1 and sglang/reports/plan.md, experiment 01"
KV_SPAN_MIN = 0.25    # itl-linear-kv is judged only when the KV range moves >= 25% of a step's bytes
H = declare(f"""
    cpu_share = ttft-cpu-share: CPU work before the first kernel (tokenize, schedule, plan) was ~6% of TTFT on A100;
            on H100/H200 prefill is faster, so the share is larger
        judged on: share of the client TTFT outside the traced prefill step (per traced request)
        confirmed: [6, 100]%
        source: {PLAN}: '~6% of the A100 TTFT'
    itl_rise = itl-rise-b1: ITL rises ~25% over 128 generated tokens at batch 1 (A100 plan; restated: nearly flat)
        judged on: median ITL of tokens 113-128 vs 1-16 at batch 1 (per repetition)
        confirmed: >= 15%
        source: {PLAN}: '+25% over 128 tokens' (A100), confirmed from +15%
    itl_linear = itl-linear-kv: ITL grows linearly with the KV bytes read per step at batch >= 8 (restated plan)
        judged on: R^2 of the ITL-vs-KV-tokens line at batch >= 8, signed by its slope (per repetition)
        confirmed: [0.8, 1]
        source: {PLAN} (restated): 'a clearly linear ITL-vs-KV slope at batch >= 16'
    itl_tail = itl-tail-under-load: under load, prefill batches interrupt decode and show up as an ITL tail
        judged on: p99 / p50 ITL at the highest request rate (bench_serving, per repetition)
        confirmed: >= 2
        source: {PLAN}: 'prefill batches interrupt decode (ITL spikes)'
    retract = retract-at-plateau: #running-req plateaus when token usage nears 1.0 and retractions appear
        judged on: whether SGLang retracts requests in the pressure load (its retract lines, else /metrics), a fact;
            premise: the load filled the pool (token usage of its fullest steps reached 0.9)
        source: {PLAN}: 'retractions appear at the plateau'; PLAN.md Experiment 5: continuous batching under memory
            pressure (the pool fills)
    perf_bar = perf-bar: the workbook's instrumentation does not slow SGLang: its client (non-streaming /generate with
            token ids, all requests at once) keeps up with sglang.benchmark.serving --request-rate inf
        judged on: workbook client output tok/s as % of bench_serving's on the same server and shape (per round)
        confirmed: >= 97%
        source: PLAN.md success criteria: 'instrumentation within 97% of SGLang's own tools'
""")


def parse_args(argv=None):
    p = cli.parser(__file__, __doc__, quick="smaller workloads, 2 request rates (~2 min)")
    p.add_argument("--rates", type=cli.rates, default=None, help="request rates for the load runs, e.g. '4,16,inf'")
    p.add_argument("--skip-load", action="store_true", help="no load runs (parts 4 and 5: the rates, the pressure "
                   "load, the steps under load, the bar)")
    p.add_argument("--bench-control", action="store_true",
                   help="also run the first load benchmark as its own `python -m sglang.benchmark.serving` process "
                        "(as before the one-process worker), to measure what the worker saves (bench_runs.csv)")
    sg.add_model_args(p)
    recording.add_flag(p)
    return p.parse_args(argv)


# ------------------------------------------------------------------ pure helpers (tested on a CPU)

def linear_fit(xs, ys) -> tuple[float, float, float]:
    """(slope, intercept, R^2) of a least-squares line."""
    n = len(xs)
    if n < 3:
        return float("nan"), float("nan"), float("nan")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    syy = sum((y - my) ** 2 for y in ys)
    if sxx == 0 or syy == 0:
        return 0.0, my, 0.0
    b = sxy / sxx
    return b, my - b * mx, (sxy * sxy) / (sxx * syy)


def rise_pct(rows, first=(1, 16), last=(113, 128)) -> float:
    """% change of the median ITL from tokens first..  to last.. (the plan's 'over 128 tokens')."""
    a = [r["itl_ms"] for r in rows if first[0] <= r["token"] <= first[1]]
    b = [r["itl_ms"] for r in rows if last[0] <= r["token"] <= last[1]]
    return 100 * (statistics.median(b) / statistics.median(a) - 1) if a and b else float("nan")


def class_table(steps) -> list[dict]:
    """Kernel time per class (common.tables.trace.kernel_class) in PREFILL (all EXTEND steps) vs DECODE (per step)."""
    pre = [s for s in steps if s["mode"] == "EXTEND"]
    dec = [s for s in steps if s["mode"] == "DECODE"]
    classes = sorted({k[:-3] for s in steps for k in s if k.endswith("_us") and k not in
                      ("dur_us", "kernel_us", "start_us", "cpu_us")})
    tp, td = sum(s["kernel_us"] for s in pre) or 1, sum(s["kernel_us"] for s in dec) or 1
    rows = [{"class": c, "prefill_us": sum(s.get(c + "_us", 0) for s in pre),
             "prefill_pct": 100 * sum(s.get(c + "_us", 0) for s in pre) / tp,
             "decode_us_per_step": sum(s.get(c + "_us", 0) for s in dec) / max(len(dec), 1),
             "decode_pct": 100 * sum(s.get(c + "_us", 0) for s in dec) / td} for c in classes]
    return sorted(rows, key=lambda r: -r["prefill_us"])


def request_figures(rep: dict) -> dict:
    """One traced request: TTFT at the client, its prefill step(s) on the GPU and the share outside them."""
    ext = [s for s in rep["steps"] if s["mode"] == "EXTEND"]
    ttft = (rep["result"]["client"]["ttft_s"] or 0) * 1e3
    ext_ms = sum(s["dur_us"] for s in ext) / 1e3
    return {"ttft_ms": ttft, "prefill_gpu_ms": ext_ms, "cpu_share_pct": 100 * (1 - ext_ms / ttft) if ttft else float("nan")}


REQUEST_META = ("prompt_tokens", "completion_tokens", "api_server_dispatch_finish_ts", "forward_entry_time",
                "queue_time", "e2e_latency")


def request_record(r: dict) -> dict:
    """What the story reads of one traced request (a row of requests.csv): the client's stamps (s) and TTFT, its
    median ITL, meta_info's stamps, how many scheduler log lines it had, its trace<->log join. A re-analysed request
    carries it as ``record``."""
    if "record" in r:
        return r["record"]
    cl, mi, rows = r["result"]["client"], r["result"]["meta_info"], r["log_rows"]
    return {"rep": r["rep"], **{k: cl.get(k) for k in ("t_send", "t_first", "t_done", "ttft_s")},
            "itl_p50_ms": statistics.median(cl["itl_s"]) * 1e3 if cl.get("itl_s") else None,
            **{k: mi.get(k) for k in REQUEST_META}, "e2e_latency": mi.get("e2e_latency", 0),
            "log_prefill_lines": sum(x["kind"] == "prefill" for x in rows),
            "log_decode_lines": sum(x["kind"] == "decode" for x in rows),
            "join_matched": r["join"]["matched"], "join_of": r["join"]["of"]}


# ------------------------------------------------------------------ measure

def check(args):
    """Everything that can fail before a GPU is touched: packages, GPU, values, the model dir."""
    pd = sg.require_stack()
    P = QUICK if args.quick else FULL
    model_dir, fl = server_flags(args)
    return pd, P, list(args.rates or P["rates"]), model_dir, fl


def server_flags(args, write: bool = True) -> tuple[str, list[str]]:
    """(model dir, flags) of 01's server: the workbook's serving configuration with its --backend (with the
    default options and --quick: exactly the --quick pipeline's shared server)."""
    return sg.serving_flags(args, quick=args.quick, backend=args.backend, write=write)


def bench_summary(rows: list[dict]) -> dict:
    """What the one-process bench_serving worker saves (issue #22 item 4), from this run's own timings:
    each separate process would have paid the worker's import (spawn + import sglang) again, so saved =
    (runs - 1) x its import (import_s; start_s where a recording predates it); start_s is the part of it the
    first run waited for (less than the import when the worker was started early, BenchWorker.warm); with
    --bench-control, the own-process run's overhead (wall - its benchmark duration) is the measured cost of one
    run the old way, next to the worker runs' median overhead."""
    work = [r for r in rows if r["how"] == "worker" and r["wall_s"] is not None]
    own = [r for r in rows if r["how"] == "own process" and r["overhead_s"] is not None]
    first = next((r for r in work if r.get("worker_run") == 1), None) or \
        next((r for r in work if r["start_s"]), None)
    later = [r["overhead_s"] for r in work if r is not first and r["overhead_s"] is not None]
    out = {"bench_runs": len(work)}
    if first is not None and first["start_s"] is not None:
        imp = first.get("import_s")
        out["bench_worker_start_s"] = round(first["start_s"], 2)
        if imp is not None:
            out["bench_worker_import_s"] = round(imp, 2)
        out["bench_saved_s"] = round((imp if imp is not None else first["start_s"]) * (len(work) - 1), 1)
    if later:
        out["bench_worker_overhead_s"] = round(statistics.median(later), 2)
    if own:
        out["bench_own_process_overhead_s"] = round(own[0]["overhead_s"], 2)
    return out


# ------------------------------------------------------------------ analyse, judge, tell

def derive(d, pd, cfg: dict, pk) -> dict:
    """Per-request figures, the class table, ITL with the bytes a step must read (weights + KV: many times the L2,
    so they stream from DRAM) and their effective bandwidth over the ITL as % of the DRAM read ceiling (``cfg``: the
    model's config.json)."""
    a = {"req": [request_figures(r) for r in d["requests"]], "classes": class_table(d["requests"][-1]["steps"])}
    itl = pd.DataFrame(d["itl"])
    wbytes = models.param_count(cfg) * 2.0                                        # bf16 weights, read once per step
    kvb = models.kv_bytes_per_token(cfg)                                          # K and V of every layer, bf16
    if len(itl):
        itl["bytes_per_step"] = wbytes + itl["kv_tokens"] * kvb
        r = [timing.rates(ms, bytes=b, peaks=ceilings.complete(pk), mix="read")
             for ms, b in zip(itl["itl_ms"], itl["bytes_per_step"])]
        itl["eff_tb_s"] = [x["eff_tb_s"] for x in r]
        itl["eff_pct"] = [x.get("eff_pct") for x in r]
    a.update(itl=itl, wbytes=wbytes, kvb=kvb, batch=with_floors(d.get("batch_sweep") or [], cfg, pk))
    b1 = itl[itl["batch"] == 1] if len(itl) else itl
    first_L = int(b1["prompt_len"].iloc[0]) if len(b1) else None
    a["rise"] = [rise_pct(g.to_dict("records")) for _, g in b1[b1["prompt_len"] == first_L].groupby("rep")] if len(b1) else []
    a["b1_pct"] = [float(g["eff_pct"].median()) for _, g in b1.groupby("rep")] if len(b1) else []
    big = itl[itl["batch"] >= 8] if len(itl) else itl
    fits = [linear_fit(list(g["kv_tokens"]), list(g["itl_ms"])) for _, g in big.groupby("rep")] if len(big) else []
    a["fits"] = [(s, r2) for s, _, r2 in fits]
    if len(big):
        a["kv_span"] = kv_span(big, wbytes, kvb)
    a["b1_L"] = first_L
    top = [lr for lr in d["loads"] if d["loads"] and lr["rate"] == d["loads"][-1]["rate"]]
    a["top_loads"] = top
    return a


def kv_span(big, wbytes: float, kvb: float) -> tuple[int, int, float]:
    """(fewest, most KV tokens of the batch >= 8 ITL rows, the share of a step's bytes that range changes): how
    much room an ITL-vs-KV line has to rise above the step's weight reads."""
    lo_kv, hi_kv = int(big["kv_tokens"].min()), int(big["kv_tokens"].max())
    return lo_kv, hi_kv, (hi_kv - lo_kv) * kvb / (wbytes + hi_kv * kvb)


def verdicts(run, d, a) -> None:
    req = a["req"]
    run.judge(H["cpu_share"], [r["cpu_share_pct"] for r in req], evidence="request_steps.csv",
              detail="TTFT " + ", ".join(f"{r['ttft_ms']:.1f}" for r in req) + " ms; prefill step on the GPU "
              + ", ".join(f"{r['prefill_gpu_ms']:.1f}" for r in req) + " ms")
    if a["rise"]:
        run.judge(H["itl_rise"], a["rise"], evidence="itl_vs_kv.csv", detail=f"batch 1, prompt {a['b1_L']}")
    if a["fits"]:
        signed = [(1 if s > 0 else -1) * r2 for s, r2 in a["fits"]]
        lo_kv, hi_kv, share = a.get("kv_span") or (0, 0, 1.0)
        premise = True if share >= KV_SPAN_MIN else (
            f"the sweep's KV range ({lo_kv:,}-{hi_kv:,} tokens at batch >= 8) changes the bytes a step reads by "
            f"{100 * share:.1f}%, too little for a line to rise above the noise (needs >= {100 * KV_SPAN_MIN:.0f}%: "
            "longer prompts, as without --quick)")
        run.judge(H["itl_linear"], signed, evidence="itl_vs_kv.csv", premise=premise,
                  detail="slopes " + ", ".join(f"{s * 1e3:.3f}" for s, _ in a["fits"]) + " ms per 1k KV tokens")
    top = a["top_loads"]
    if top:
        tails = [lr["p99_itl_ms"] / lr["median_itl_ms"] for lr in top if lr["median_itl_ms"]]
        run.judge(H["itl_tail"], tails, evidence="load_runs.csv", detail=f"rate {top[0]['rate']}")
    judge_retraction(run, d.get("pressure"), a.get("plateau"))
    if d["bar"]:
        run.judge(H["perf_bar"], [b["ratio_pct"] for b in d["bar"]], evidence="perf_bar.csv")
        run.headline(perf_bar_pct=min(b["ratio_pct"] for b in d["bar"]))
    if a["b1_pct"]:
        b1 = a["itl"][a["itl"]["batch"] == 1]
        run.headline(itl_b1_ms=float(b1["itl_ms"].median()), decode_b1_pct_of_dram_ceiling=statistics.median(a["b1_pct"]))


def judge_retraction(run, pr, plat) -> None:
    """retract-at-plateau on the pressure load (the load built to fill the pool; the rate loads before it never did):
    a fact, whether SGLang retracted requests, with its premise that the pool filled; 'not observed' without a
    pressure load."""
    if not pr:
        run.fact(H["retract"], None, "not observed: this run has no pressure load (--skip-load, or it failed: see "
                 "point_errors)", evidence="pressure_run.csv")
        return
    use = top_usage(pr)
    full = max(use, default=0.0)
    n = retractions(pr)
    r = pr["run"]
    seen = (f"the fullest {len(use)} steps' token usage {min(use, default=0):.2f}-{full:.2f}; running peaked at "
            f"{r.get('max_running')} with {r.get('max_queue')} queued" + (f", {plat['batch']} requests on a full pool"
                                                                          if plat else "")
            + (f"; {n} request(s) retracted in {r.get('retract_lines')} retract line(s)" if n is not None else
               "; retractions: not recorded"))
    run.fact(H["retract"], None if n is None else n >= 1, seen, evidence="pressure_steps.csv, pressure_events.csv",
             premise=True if full >= 0.9 else f"token usage reached only {full:.2f} (< 0.9): the load did not fill "
             "the KV pool")


def figures(run, a, d, pk, backend) -> None:
    from common.render import plots
    itl = a["itl"]
    if len(itl):
        med = itl.groupby(["batch", "prompt_len", "token", "kv_tokens"], as_index=False)["itl_ms"].median()
        med["series"] = [f"batch {b}, prompt {L}" for b, L in zip(med["batch"], med["prompt_len"])]
        run.figure("itl_vs_kv", plots.sweep(med, "kv_tokens", "itl_ms", hue="series", logx=True,
                                            ylabel="inter-token latency (ms, client; median of reps)",
                                            title=f"ITL vs KV tokens read per step — {pk['gpu']}, {backend}"))
    if a.get("batch"):
        run.figure("itl_vs_batch", batch_figure(a["batch"], pk))
    if d["timeline"]:
        run.figure("batch_dynamics", dynamics_figure(d["timeline"]))
    if d.get("pressure"):
        run.figure("pressure", pressure_figure(d["pressure"]))


def dynamics_figure(timeline):
    """Running / queued requests and token usage over time, one panel per request rate."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rates = list(dict.fromkeys(r["rate"] for r in timeline))
    fig, axes = plt.subplots(len(rates), 1, figsize=(8, 2.6 * len(rates)), squeeze=False)
    for ax, rate in zip(axes[:, 0], rates):
        g = [r for r in timeline if r["rate"] == rate]
        dec = [r for r in g if r["kind"] == "decode"]
        ax.plot([r["t_s"] for r in dec], [r["running_req"] for r in dec], label="running (decode batch size)")
        ax.plot([r["t_s"] for r in g], [r["queue_req"] for r in g], label="queued")
        top = max([r["running_req"] for r in dec] or [1])
        ax.vlines([r["t_s"] for r in g if r["kind"] == "prefill"], 0, top * 0.15, color="k", lw=0.5, label="prefill batch")
        ax2 = ax.twinx()
        ax2.plot([r["t_s"] for r in g], [r["token_usage"] for r in g], color="tab:red", lw=0.8)
        ax2.set_ylabel("token usage", color="tab:red")
        ax.set_title(f"request rate {rate}/s", fontsize=9)
        ax.set_ylabel("requests")
    axes[-1, 0].set_xlabel("time since the first batch line (s)")
    axes[0, 0].legend(fontsize=7, loc="upper left")
    return fig


def tell(d, a, model_dir, fl, P, pk, backend) -> str:
    """The execution story of the last traced request, then the batch, ITL, load and the bar."""
    last, fig = d["requests"][-1], a["req"][-1]
    fr = request_record(last)
    ms = lambda t: f"+{(t - fr['t_send']) * 1e3:7.1f} ms" if t else "        ?   "  # noqa: E731
    top = lambda key: ", ".join(f"{r['class']} {r[key]:.0f}%" for r in sorted(a["classes"], key=lambda r: -r[key])[:4])  # noqa: E731
    dec = [s for s in last["steps"] if s["mode"] == "DECODE"]
    req = [
        (f"{ms(fr['t_send'])}  client POST /generate ({fr['prompt_tokens']} prompt tokens incl. BOS, {P['new']} new)", []),
        (f"{ms(fr.get('api_server_dispatch_finish_ts'))}  tokenized, sent to the scheduler [meta_info]", []),
        (f"{ms(fr.get('forward_entry_time'))}  enters a forward batch (queue {story.fmt((fr.get('queue_time') or 0) * 1e3)} ms)", []),
        *[(f"PREFILL {s['name']}: GPU {s['dur_us'] / 1e3:.2f} ms, {s['kernels']} kernels — {top('prefill_pct')}", [])
          for s in last["steps"] if s["mode"] == "EXTEND"],
        (f"{ms(fr['t_first'])}  first token (TTFT {fig['ttft_ms']:.1f} ms; {fig['cpu_share_pct']:.0f}% outside the prefill step)", []),
        (f"DECODE {fr['completion_tokens'] - 1} steps: ITL p50 {fr['itl_p50_ms']:.2f} ms; traced "
         f"{len(dec)} steps, GPU {statistics.median(s['dur_us'] for s in dec) / 1e3 if dec else float('nan'):.2f} ms/step — "
         f"{top('decode_pct')}", []),
        (f"{ms(fr['t_done'])}  last token (server e2e {(fr.get('e2e_latency') or 0) * 1e3:.1f} ms); log: "
         f"{fr['log_prefill_lines']} prefill + {fr['log_decode_lines']} decode lines; "
         f"trace<->log join {fr['join_matched']}/{fr['join_of']}", []),
    ]
    pre_b = [r for r in d["batch_rows"] if r["kind"] == "prefill"]
    items = [(f"configuration: {backend}, {sg.graphs_text(fl)}", []),
             (f"one request (the last of {len(d['requests'])} traced)", req),
             (f"batch of {P['batch']} sent together: " + ", ".join(f"prefill #new-seq {r['new_seq']} #new-token "
                                                                  f"{r['new_token']}" for r in pre_b[:4])
              + f" -> decode bs={max((r['running_req'] for r in d['batch_rows'] if r['kind'] == 'decode'), default=0)}; "
              f"{batch_record(d)['output_throughput']:.0f} out tok/s", [])]
    itl = a["itl"]
    items += batch_items(a.get("batch") or [])
    if len(itl):
        items.append(("ITL vs KV (median of reps, client)", [
            (f"batch {b} prompt {L}: {g['itl_ms'].median():.2f} ms, reads {g['bytes_per_step'].median() / 1e9:.2f} GB/step "
             f"-> effective {g['eff_tb_s'].median():.2f} TB/s over the ITL = {g['eff_pct'].median():.0f}% of "
             f"{ceilings.ceiling_text(pk, 'dram_read_tb_s', short=True)}", [])
            for (b, L), g in itl.groupby(["batch", "prompt_len"])]))
    if d["loads"]:
        items.append(("load (sglang.benchmark.serving, random ids)", [
            (f"rate {lr['rate']} #{lr['rep']}: {lr['output_throughput']:.0f} out tok/s, TTFT p50 {lr['median_ttft_ms']:.0f} / "
             f"p99 {lr['p99_ttft_ms']:.0f} ms, ITL p50 {lr['median_itl_ms']:.1f} / p99 {lr['p99_itl_ms']:.1f} ms, "
             f"running<={lr['max_running']}, queued<={lr['max_queue']}, usage<={lr['max_token_usage']:.2f}", [])
            for lr in d["loads"]]))
    if d.get("pressure"):
        items += pressure_items(d["pressure"], a.get("pressure_events") or [], a.get("plateau"))
    if d["under_load"]:
        items.append((f"sampled steps under load (join {d['under_load_join'].get('matched')}/"
                      f"{d['under_load_join'].get('of')})", [
            (f"{s['mode']:6s} bs={s['bs']:<3} new={s.get('toks') or s['bs']:<5} cached={s.get('log_cached_token') or 0:<5} "
             f"queue={s.get('log_queue_req')} | GPU {s['dur_us'] / 1e3:.2f} ms, attention "
             f"{s.get('attention_us', 0) / 1e3:.2f} ms, gemm {s.get('gemm_us', 0) / 1e3:.2f} ms", [])
            for s in d["under_load"][:12]]))
    if d["bar"]:
        items.append(("perf bar: workbook vs bench_serving (rate inf): " +
                      ", ".join(f"{b['ratio_pct']:.1f}%" for b in d["bar"]), []))
    return story.tree(f"EXECUTION STORY — {Path(model_dir).name}, {backend}, {pk['gpu']}", items)


def batch_record(d) -> dict:
    """Part 2's batch as batch.csv keeps it: how many requests, their output throughput (workbook client)."""
    if "batch_record" in d:
        return d["batch_record"]
    return {"requests": len(d["batch"]), "output_throughput": sg.latency_summary(d["batch"]).get("output_throughput", 0)}


def join_rows(d) -> list[dict]:
    """The under-load trace<->log join as joins.csv keeps it (the traced requests' joins are in requests.csv)."""
    return [{"part": "under load", **d["under_load_join"]}] if d["under_load_join"] else []


def write_tables(run, d, a) -> None:
    last = d["requests"][-1]
    sg.table(run, "request_steps", [{"rep": r["rep"], **s} for r in d["requests"] for s in r["joined"]])
    sg.table(run, "phase_kernels", a["classes"])
    sg.table(run, "itl_vs_kv", a["itl"])
    sg.table(run, "itl_vs_batch", d.get("batch_sweep") or [])
    sg.table(run, "load_runs", d["loads"])
    sg.table(run, "batch_timeline", d["timeline"])
    keep = ("mode", "bs", "toks", "log_cached_token", "log_running_req", "log_queue_req", "log_token_usage",
            "dur_us", "cpu_us", "kernels", "kernel_us", "attention_us", "gemm_us", "top", "log_match")
    sg.table(run, "step_join", [{k: r.get(k) for k in keep} for r in d["under_load"]])
    sg.table(run, "perf_bar", d["bar"])
    sg.table(run, "bench_runs", d["bench"])
    if d["bench"]:
        b = bench_summary(d["bench"])
        run.headline(**b)
        run.log("bench_serving: " + ", ".join(f"{k} {v}" for k, v in b.items()))
    sg.table(run, "requests", [request_record(r) for r in d["requests"]])      # for --reanalyse
    sg.table(run, "batch_log", d["batch_rows"])
    sg.table(run, "batch", [batch_record(d)])
    sg.table(run, "joins", join_rows(d))
    if d.get("pressure"):
        record_pressure(run, d["pressure"])
    run.log(f"last traced request: {len(last['steps'])} steps, join {last['join']['matched']}/{last['join']['of']}")


@dataclass
class Record:
    """What the analysis of one run reads: the plan, the server's flags, the ceilings, the model's config and ``d``,
    the measured parts (the same a --reanalyse rebuilds from a recording's tables)."""
    args: Any
    P: dict
    model_dir: str
    fl: list
    pk: dict
    cfg: dict
    d: dict = field(default_factory=dict)
    a: dict = field(default_factory=dict)


def analyse(run, x: Record) -> None:
    """Figures, verdicts, headline and story from the measured parts and what derive() made of them (a GPU run and
    --reanalyse alike)."""
    if x.d.get("pressure"):
        x.a["plateau"] = at_plateau(x.d["pressure"], x.cfg, x.pk)
        x.a["pressure_events"] = pressure_events(x.d["pressure"], step_classes(x.a["classes"]),
                                                 floor=lambda row: line_floor_ms(row, x.cfg, x.pk))
    figures(run, x.a, x.d, x.pk, x.args.backend)
    verdicts(run, x.d, x.a)
    for text in batch_findings(x.a.get("batch") or []):
        run.finding(text)
    if x.d.get("pressure"):
        write_pressure(run, x.d["pressure"], x.a["pressure_events"])
        for text in pressure_findings(x.d["pressure"], x.a["pressure_events"], x.a["plateau"]):
            run.finding(text)
    run.story(sg.config_line(x.fl, sg.SERVING_ENV, x.args.quick) + "\n"
              + tell(x.d, x.a, x.model_dir, x.fl, x.P, x.pk, x.args.backend), echo=True)


NEW_TABLES = ("requests", "batch_log", "batch")        # written for --reanalyse since they were added (+ joins)


def _records(t) -> list[dict]:
    """A recorded table as rows, empty cells left out (as the measured dicts had no such key); a column of whole
    numbers that pandas read as floats only because of its empty cells is whole numbers again."""
    if t is None:
        return []
    whole = {c for c in t.columns if t[c].dtype.kind == "f" and t[c].isna().any()
             and all(x.is_integer() for x in t[c].dropna())}
    return [{k: int(v) if k in whole else v for k, v in r.items() if not (isinstance(v, float) and math.isnan(v))}
            for r in t.to_dict("records")]


def main_reanalyse(args) -> int:
    """--reanalyse DIR: the measured parts back from the recording's tables (traced requests: request_steps.csv +
    requests.csv; the batch: batch_log.csv + batch.csv; ITL, load, the pressure load, the steps under load, the bar),
    the model's config from its preset; no server, no sglang. A recording made before requests.csv (the client's TTFT
    and stamps of each traced request were in no table) is one [setup] line."""
    src = Path(args.reanalyse)
    missing = [t for t in NEW_TABLES if not (src / f"{t}.csv").is_file()]
    if src.is_dir() and (src / "summary.json").is_file() and missing:
        import json
        prov = json.loads((src / "summary.json").read_text()).get("provenance") or {}
        raise SetupError(f"--reanalyse {src.resolve()}: no {', '.join(m + '.csv' for m in missing)} (a recording of "
                         f"{(prov.get('git') or {}).get('commit', '?')}, before 01 wrote them): each traced request's "
                         "client TTFT and stamps, which the TTFT-CPU-share verdict and the request story read, were "
                         "in no table. Re-run 01 on a GPU to record them")
    rec = recording.open(src, __file__, tables=("request_steps",) + NEW_TABLES,
                         optional=("joins", "itl_vs_kv", "itl_vs_batch", "load_runs", "batch_timeline", "step_join", "perf_bar", "bench_runs",
                                   *PRESSURE_TABLES))
    a = rec.args_like(args)
    t = rec.tables
    P = QUICK if a.quick else FULL
    model_dir, fl = server_flags(a, write=False)
    servers = rec.summary.get("servers") or []
    fl = servers[0]["flags"] if servers else fl
    cfg = sg.model_shape(a.model_path)["config"] if a.model_path else models.config(a.preset)
    steps = _records(t["request_steps"])
    reqs = [{"rep": int(r["rep"]), "record": r, "result": {"client": {"ttft_s": r.get("ttft_s")}},
             "steps": [{k: v for k, v in s.items() if k != "rep"} for s in steps if s["rep"] == r["rep"]]}
            for r in _records(t["requests"])]
    joins = {r["part"]: {k: v for k, v in r.items() if k != "part"} for r in _records(t["joins"])}
    itl_cols = ("batch", "prompt_len", "token", "kv_tokens", "itl_ms", "requests", "rep")
    d = {"requests": reqs, "batch_rows": _records(t["batch_log"]), "batch_record": _records(t["batch"])[0],
         "itl": [{k: r[k] for k in itl_cols if k in r} for r in _records(t["itl_vs_kv"])],
         "batch_sweep": _records(t.get("itl_vs_batch")),
         "loads": _records(t["load_runs"]), "timeline": _records(t["batch_timeline"]),
         "under_load": _records(t["step_join"]), "under_load_join": joins.get("under load", {}),
         "bar": _records(t["perf_bar"]), "bench": _records(t["bench_runs"]), "pressure": read_pressure(t, _records)}
    import pandas as pd
    x = Record(a, P, model_dir, fl, rec.peaks, cfg, d)
    x.a = derive(d, pd, cfg, x.pk)
    with recording.run(__file__, args, rec) as run:
        for k in ("servers", "server_config"):
            if k in rec.summary:
                run.summary[k] = rec.summary[k]
        if d["bench"]:
            run.headline(**bench_summary(d["bench"]))
        analyse(run, x)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.reanalyse:
        return main_reanalyse(args)
    pd, P, rates, model_dir, fl = check(args)
    with Run(__file__, args, out=args.out) as run:
        x = Record(args, P, model_dir, fl, ceilings.peaks(), sg.model_shape(model_dir)["config"])
        run.log(f"{x.pk['gpu']}: {ceilings.ceiling_text(x.pk, 'dram_read_tb_s', short=True)}; {sg.graphs_text(fl)}")
        x.d = measure(args, P, rates, model_dir, fl, run)
        x.a = derive(x.d, pd, x.cfg, x.pk)
        write_tables(run, x.d, x.a)
        analyse(run, x)
    return 0


if __name__ == "__main__":
    run_main(main)
