#!/usr/bin/env python3
"""08 · The joined execution story: one request from HTTP to kernels and hardware counters.

What it measures (one SGLang server, Llama-3.1-8B shapes with dummy weights, one GPU, at SGLang's
default serving configuration: CUDA graphs for prefill and decode, the default scheduler, FA3 where
sgl_kernel.flash_attn imports — else FlashInfer, and the story says which ran and why; the changes are
a smaller KV pool, --max-total-tokens, so that phase 3 can fill it, and with --quick decode graphs
captured up to bs 64 -- the story's first line lists every change. In a --quick pipeline it runs on the
pipeline's shared server when its flags are exactly that server's (FlashInfer); where FA3 runs it starts
its own beside it, and the GPU memory curve of phase 3 then includes the shared server's share)
    0. Every millisecond of one request, untraced, before any profiler runs: 5 text prompts (512 characters through
       SGLang's tokenizer: 513 tokens with BOS) and 5 input_ids prompts, one at a time, each between two /metrics
       scrapes. Its TTFT from SGLang's own stamps (meta_info: request_received_ts, api_server_dispatch_finish_ts,
       forward_entry_time, queue_time, prefill_finished_time, response_sent_to_client_ts; /metrics stage
       request_process) and the client's clock: HTTP receive, tokenize + dispatch, to the scheduler, request
       processing, queue wait, prefill forward, detokenize + return, HTTP stream (common.tables.waterfall: per-part
       medians that must add up to the median TTFT within 5%, the remainder printed). The prefill forward split on
       the traced median repetition (batch scheduling, prep + FlashInfer plan(), GPU forward, sampling, the overlap
       scheduler's next step, result processing) and one decode step on the scheduler loop; traced vs untraced
       per part. Token IDs stay where an experiment needs exact lengths: the counters windows, the pressure load,
       the long prompt and the cache phase; the stories send text.
    1. Two stories: one request (512 prompt characters = 513 tokens, 64 new) and a batch of 32 such requests sent
       together. Each is served untraced (3 times: client TTFT and ITL, the scheduler's step lines) and
       traced with the torch profiler (/start_profile, 3 times). From the trace: request -> each
       scheduler step it takes part in (scheduler.run_batch, with its step[...] name and the batch the
       log line reports: new and cached tokens, running, queued, token usage) -> each layer (the
       repeating unit of the step's kernels; CUDA-graph replays joined by correlation id) -> each
       kernel and its role (QKV / O / gate-up / down GEMMs, norms, RoPE, KV store, attention + merge,
       activation; embedding, logits GEMM, sampling), with FLOPs and bytes (common.tables.flops) and the
       rate its traced time gives, as % of this GPU's measured ceilings.
    2. The observer effect: TTFT, ITL and the decode step time traced vs untraced, in %.
    3. Pressure: a load that fills the KV pool (queue > 0, token usage near 1, retractions if SGLang
       makes them, chunked prefill of a long prompt): batch dynamics per scheduler step from the log
       (running, queued, usage, prefill/decode mix, step wall time) and GPU memory over time (NVML).
    4. The cache over time: round-robin over more shared prefixes than the pool holds, then a repeat
       of the most recent one: per request hit / miss / evicted tokens from the scheduler log,
       checked against meta_info.cached_tokens.
    5. Counters: the same configuration with the model cut to 1 layer (shapes unchanged) under Nsight
       Compute (--graph-profiling node: kernels inside CUDA graphs are profiled one by one), one-step
       windows opened by /start_profile CUDA_PROFILER: prefill of one request (input_ids: nothing cached, FlashInfer
       ragged only), the same as text after another text prompt (its BOS cached: ragged + paged + merge), a decode
       step at batch 1 and one at batch 32 (the batch's prefill steps vary from run to run: no window matches
       them, so they stay without counters and the page says so). Every kernel of the traced steps gets the
       counters of its position (common.tables.timeline.attach_counters; where the cut model runs another kernel there,
       those of the same kernel at the same grid in its layer): time, DRAM / SM / tensor %, occupancy and its
       limiter, top warp stalls. The counters' server is launched with the run and held by a gate (_sgl_gate)
       after its imports until phases 1-4 are done with the GPU; the traces are joined while ncu replays.

What the plan expected (hypotheses; each is judged on an interval of repeated measurements)
    * decode at small batch is bound by reading the weights: its GEMMs stream them near the DRAM ceiling;
    * prefill GEMMs (512 tokens) run on tensor cores near the bf16 ceiling; attention is a small share at
      512 tokens (the A100 plan said ~45%: a hypothesis for long prompts);
    * the profiler changes what it watches by little: traced step times within 5% of untraced;
    * under pressure #running-req plateaus as token usage nears 1.0, requests queue, retractions appear;
    * an LRU radix cache evicts a prefix before its reuse when a round-robin cycles over more prefixes
      than fit; the scheduler log and meta_info agree on every request's cached tokens.

Run
    python sglang/scripts/08_execution_story.py --quick          # phases 1-4 (no counters), ~3 min warm
    python sglang/scripts/08_execution_story.py --quick --ncu    # + phase 5: the counters (needs ncu)
      (on an H100 at 1c8479f: 158-167 s in the pipeline, whose server it shares; 230 s on its own: README timings)
    python sglang/scripts/08_execution_story.py --ncu            # plan scale: 500 prompts at 50 req/s
Writes sglang/results/08_execution_story/: kernels_<story>.csv, steps_<story>.csv, layer_tree.csv,
class_shares.csv, gemm_efficiency.csv, observer.csv, pressure_steps.csv, gpu_memory.csv, gpu_memory_owners.csv,
cache_requests.csv, ncu_windows.csv, waterfall.csv, transitions.csv, story_<story>.json and story_pressure.json (open
in https://ui.perfetto.dev: kernels, steps, each request's waterfall, counters, transitions as instants),
timeline.png, layer_tree.png, pressure.png, cache.png, server logs, raw.json (for --reanalyse), story.txt, summary.json.
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
import re
import shutil
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _sglang as sg  # noqa: E402
from common.base import story  # noqa: E402
from common.base.checks import run_main, SetupError  # noqa: E402
from common.capture import ceilings, clocks, models, ncu  # noqa: E402
from common.capture.store import load_summary  # noqa: E402
from common.tables import kernels, timeline, trace  # noqa: E402
from common.judge.verdicts import declare  # noqa: E402
from common.run import cli, recording  # noqa: E402
from common.run.results import Run  # noqa: E402

QUICK = dict(reps=3, prompt=512, new=64, batch=32, pool=sg.QUICK_POOL_TOKENS, load_n=200, load_rate=50, load_in=512, load_out=128,
             long_prompt=10000, groups=8, prefix=4096)
FULL = dict(reps=5, prompt=512, new=64, batch=32, pool=65536, load_n=500, load_rate=50, load_in=1024, load_out=256,
            long_prompt=20000, groups=12, prefix=6144)
ENV = dict(sg.SERVING_ENV)     # ms log time stamps, traces without stacks and shapes (the shared server's too)
SP = {"temperature": 0, "ignore_eos": True}

H = declare("""
    decode_gemm = decode-gemm-bw: decode at batch 1 is bound by reading the weights
        judged on: decode GEMMs' weight-streaming rate (weight bytes / traced time) as % of the measured DRAM read
            ceiling, per layer (the step's weights are many times the L2: they stream from DRAM)
        confirmed: [70, 100]%
        source: PLAN.md 01: 'decode is memory-bound'; restated in sglang/reports/plan.md (a batch-1 step reads all
            weights once)
    prefill_gemm = prefill-gemm-tc: prefill GEMMs (512 tokens) run near the tensor-core ceiling
        judged on: prefill GEMMs' TFLOP/s as % of the measured bf16 ceiling (per layer)
        confirmed: [70, 100]%
        source: sglang/reports/plan.md: GEMMs dominate prefill at 512 tokens
    attention_share = prefill-attention-share: attention is ~45% of prefill (A100, plan) — restated: a small share at
            512 tokens
        judged on: attention kernels' share of the prefill step's kernel time
        confirmed: [0, 10]%
        source: PLAN.md Experiment 1 (~45%, A100); sglang/reports/plan.md restates < 10% at 512 tokens
    observer = observer-effect: the torch profiler changes the decode step it watches by < 5%
        judged on: traced / untraced ITL - 1 (median per run)
        confirmed: [-5, 5]%
        source: the workbook's observer budget: a traced step within 5% of the untraced one
    observer_ttft = observer-effect-ttft: the torch profiler changes the first token's latency by < 5%
        judged on: traced / untraced TTFT - 1 (one request, per run)
        confirmed: [-5, 5]%
        source: the same 5% observer budget, applied to the prefill step
    usage = pressure-usage: under pressure the KV pool fills (token usage near 1.0)
        judged on: max token usage of the scheduler's steps in the pressure run(s)
        confirmed: [0.9, 1]
        source: PLAN.md Experiment 5: continuous batching under memory pressure
    lru = lru-thrash: a round-robin over more prefixes than fit evicts each before its reuse
        judged on: hit fraction (cached / prefix tokens) of second-pass requests
        confirmed: [0, 0.1]
        source: RadixCache with LRU eviction (sglang radix_cache.py); PLAN.md Experiment 2
""")


def parse_args(argv=None):
    p = cli.parser(__file__, __doc__, quick="plan scale reduced: 200 prompts for the pressure run")
    p.add_argument("--ncu", action="store_true", help="phase 5: every kernel of the traced steps on the Nsight Compute "
                   "counters (a second server, cut to 1 layer, under ncu, started with the run and held until the GPU is free)")
    p.add_argument("--reanalyse", metavar="DIR", default=None, help="no GPU, no server: redo the analysis from the "
                   "files an earlier run recorded in DIR (e.g. a copy of sglang/results/08_execution_story)")
    p.add_argument("--pool", type=cli.positive_int, default=None, help="--max-total-tokens of the server "
                   "(default 32768 quick, 65536 full): small enough for the pressure run to fill it")
    sg.add_model_args(p, backend_default=None)
    return p.parse_args(argv)


# ------------------------------------------------------------------ phase 1-2: the stories

def backend_choice() -> tuple[str | None, str]:
    """(--attention-backend to pass, or None for SGLang's own default; why)."""
    ok, why = sg.fa3_usable()
    if ok:
        return None, "SGLang's default on Hopper (FA3: sgl_kernel.flash_attn imports)"
    return "flashinfer", f"FlashInfer: SGLang's Hopper default (FA3) cannot run here ({why})"


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


def metrics_phase(srv, run, P) -> dict:
    """The counters on the whole served timeline: one more untraced batch repetition while Nsight Systems samples the
    GPU's own counters (common.capture.nsys.GpuMetrics: a separate nsys process, system scope, nothing injected into the
    server): SM active, tensor active, DRAM read and write throughput, 10 kHz. Its TTFT / ITL beside the untraced
    median is the overhead of the sampling. Returns the samples in 1 ms bins and the request window (epoch s)."""
    from common.capture import nsys
    with nsys.GpuMetrics(run.dir / "nsys", echo=run.log, max_s=120) as gm:
        mark = srv.log_mark()
        res = batch_requests(srv, 77, P)
        fig = client_figures(res, srv.log_since(mark))
    ok = [r["client"] for r in res if "error" not in r]
    out = {"why": gm.why, "t0": gm.t0, "client": fig, "t_send": min((c["t_send"] for c in ok), default=None),
           "t_done": max((c["t_done"] for c in ok), default=None)}
    if gm.rows is None:
        run.note(f"GPU metrics over the served timeline: not sampled ({gm.why or 'no samples'})")
        return out
    b = gm.rows.assign(t_s=(gm.rows["t_s"] * 1e3).round() / 1e3).groupby("t_s").mean().reset_index()
    run.log(f"GPU metrics: {len(gm.rows):,} samples over {b['t_s'].max():.1f} s; batch TTFT {fig['ttft_ms']:.1f} ms, "
            f"ITL {fig['itl_ms']:.2f} ms while sampling")
    return {**out, "rows": b.to_dict("records")}


def parse_step(name: str) -> dict:
    m = sg.parse_step_name(name) or {}
    return {"mode": m.get("mode"), "bs": m.get("bs"), "toks": m.get("toks") or m.get("bs")}


def story_events(trace_path):
    """A traced story's events and their step kernel table, read and joined once per analysis: the median
    repetition's trace serves the story, the attention shares and the waterfall's split (callers do not change
    them). Keyed by the file's path, size and time, so a changed file is read again."""
    st = Path(trace_path).stat()
    return _story_events(str(trace_path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=4)         # the median traces of both stories and the one-request repetitions
def _story_events(trace_path, _size, _mtime):
    ev = trace.read_chrome_trace(trace_path)
    return ev, trace.step_kernels(ev, sg.STEP_RANGE, outer=sg.OUTER_RANGE, parse=parse_step)


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
              **{k.replace("log_", ""): j.get(k) for k in ("log_new_token", "log_cached_token", "log_running_req",
                                                            "log_queue_req", "log_token_usage")}}
             for (s, g), j in zip(kt.groupby("step"), joined)]
    return kt, spans, base, info


# ------------------------------------------------------------------ phase 3-4: pressure and the cache

def pressure(srv, run, P):
    """A load that fills the KV pool, plus one prompt longer than a prefill chunk; per-step log rows."""
    srv.flush_cache()
    mark = srv.log_mark()
    with clocks.Sampler(0, period_s=0.1) as mem:              # GPU memory in use, every 100 ms
        def long_prompt():       # once the load runs (the pool is filling): a prompt longer than a prefill chunk
            try:
                srv.wait_log(r"Decode batch(?: \[\d+\])?, #running-req: (?:[89]|\d\d+),", mark, timeout=300)
            except sg.ServerError:
                return
            srv.generate(input_ids=sg.random_ids(P["long_prompt"], 77), sampling_params={**SP, "max_new_tokens": 8})
        long = threading.Thread(target=long_prompt)
        long.start()
        rec = sg.run_bench(srv, run.dir / "bench", "pressure", num_prompts=P["load_n"], input_len=P["load_in"],
                           output_len=P["load_out"], rate=P["load_rate"], echo=run.log)
        long.join()
    rows = [r for r in sg.parse_batch_log(srv.log_since(mark))]
    for a, b in zip(rows, rows[1:]):
        a["step_wall_ms"] = (b["ts"] - a["ts"]) * 1e3
    run.log(f"pressure: {len(rows)} scheduler lines, max usage {max((r.get('token_usage') or 0) for r in rows):.2f}, "
            f"max queue {max((r.get('queue_req') or 0) for r in rows)}, retractions {sum(r['kind'] == 'retract' for r in rows)}")
    return rows, [(r["t"], r["used_gb"]) for r in mem.rows], sg.bench_headline(rec)


def cache_story(srv, run, P):
    """Round-robin over more prefixes than the pool holds (two passes), then the last prefix again."""
    srv.flush_cache()
    prefixes = [sg.random_ids(P["prefix"], 500 + g) for g in range(P["groups"])]
    order = [(p, g) for p in (0, 1) for g in range(P["groups"])] + [(2, P["groups"] - 1)]
    out = []
    for n, (pas, g) in enumerate(order):
        mark = srv.log_mark()
        r = srv.generate(input_ids=prefixes[g] + sg.random_ids(32, 9000 + n), sampling_params={**SP, "max_new_tokens": 1})
        pre = [x for x in sg.parse_batch_log(srv.log_since(mark)) if x["kind"] == "prefill"]
        log_cached = sum(x["cached_token"] for x in pre)
        api = r["meta_info"]["cached_tokens"]
        seen_before = any(gg == g for _p, gg in order[:n])
        out.append({"request": n, "pass": pas, "group": g, "t": r["client"]["t_send"], "prompt": P["prefix"] + 32,
                    "api_cached": api, "log_cached": log_cached, "agree": api == log_cached,
                    "hit_fraction": api / P["prefix"], "prefix_inserted_before": seen_before,
                    "outcome": "hit" if api >= P["prefix"] * 0.9 else ("evicted" if seen_before else "miss")})
    run.log("cache: " + " ".join(f"{o['group']}:{o['outcome'][0]}" for o in out))
    return out


# ------------------------------------------------------------------ phase 5: counters

COUNTER_LAYERS = 1    # the server under ncu runs the model cut to this many layers (recordings before: 2)


def counters_server(args, run, model_dir, base, P, backend):
    """The server cut to COUNTER_LAYERS layers under ncu, not started yet. One layer holds every kernel a layer of the
    full model launches (its FusedAddRMSNorm after attention is the one later layers open with: the join finds it by
    name and grid), and ncu replays ~35% fewer kernels than with 2 (each kernel costs ~0.5 s of replay on an H100). It is launched when the run begins and its scheduler
    is held by a gate (_sgl_gate, an SGLang plugin) after its imports and before it touches the GPU, so that its
    start (~60 s of Python imports under ncu on an H100) overlaps phases 1-4; measure() releases it when the
    stories' server is done with the GPU. Niced: its imports yield the CPU to the stories' server."""
    log_file = run.dir / "ncu" / "ncu_log.txt"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    wrapper = ncu.build_cmd([], log_file=log_file, metrics=kernels.SUMMARY_METRICS, launch_count=5000, cache_control="none",
                            extra=["--profile-from-start", "off", "--graph-profiling", "node"])
    if shutil.which("nice"):
        wrapper = ["nice", "-n", "10", *wrapper]
    fl = base + sg.flags(attention_backend=backend, skip_server_warmup=True, decode_log_interval=1,
                         max_total_tokens=P["pool"], json_model_override_args={"num_hidden_layers": COUNTER_LAYERS},
                         **counter_graphs(P))
    gate = sg.Gate(run.dir / "ncu" / "gate")
    srv = sg.Server(model_dir, fl, port=args.port, log_path=run.path("server_ncu.log"), wrapper=wrapper, echo=run.log,
                    start_timeout=max(args.start_timeout, 1800), env={**ENV, **gate.env()},
                    name=f"server[{COUNTER_LAYERS} layer{'s' if COUNTER_LAYERS > 1 else ''} under ncu]")
    return srv, gate, log_file


def counters(srv, run, P, log_file):
    """Phase 5 on the (released, healthy) server under ncu: one-step windows; then the server is stopped, so that
    ncu writes its log. Returns (summary rows, window names)."""
    windows = []
    srv.generate(input_ids=sg.random_ids(16, 1), sampling_params={**SP, "max_new_tokens": 2})

    def window(name, during, steps=1):
        t0 = time.time()
        srv.start_profile(run.dir / "ncu", activities=["CUDA_PROFILER"], num_steps=steps)
        during()
        srv.stop_profile()
        windows.append(name)
        run.log(f"ncu window {name} done in {time.time() - t0:.1f} s")

    def while_decoding(n):
        reqs = [{"input_ids": sg.random_ids(P["prompt"], 60 + i), "sampling_params": {**SP, "max_new_tokens": 400}}
                for i in range(n)]
        srv.while_decoding(reqs, lambda: window(f"decode_b{n}", lambda: time.sleep(0.5)), running=n, timeout=900)
    # cache cold: token IDs that share nothing with the cache (attention: the ragged kernel only). No traced
    # story runs such a step; its counters are the cold side of the cache transition
    window("prefill-cold_b1", lambda: srv.generate(input_ids=sg.random_ids(P["prompt"], 2),
                                                   sampling_params={**SP, "max_new_tokens": 1}))
    # the served prefill: a text prompt after another one finds their common BOS token in the radix cache, so
    # attention reads that prefix from the paged KV (FlashInfer: ragged + paged + merge), as in the stories
    srv.generate(text=sg.random_text(16, 3), sampling_params={**SP, "max_new_tokens": 1})
    window("prefill_b1", lambda: srv.generate(text=sg.random_text(P["prompt"], 4),
                                              sampling_params={**SP, "max_new_tokens": 1}))
    while_decoding(1)
    # no window for the batch's prefill: its requests reach the scheduler one by one, so its prefill batches
    # differ from run to run (10, 13 and 8 requests on the H200 run of c447205) and a fixed window of batch/2
    # prompts (8192 tokens) matched none of them while costing the pass its largest replays
    while_decoding(P["batch"])
    t0 = time.time()
    srv.stop()
    rows = kernels.summarize(ncu.read_log(log_file, run.path("ncu/ncu.csv")))
    run.log(f"ncu: server stopped and its log read in {time.time() - t0:.1f} s")
    return rows, windows


def counter_graphs(P) -> dict:
    """The CUDA graphs the server under ncu captures: only the sizes its windows run (decode at batch 1 and
    at the batch; prefill of one prompt), so ncu follows 3 captures, not ~94. The kernels of those graphs are the
    full server's at the same sizes (its graphs cover every size)."""
    return {"cuda_graph_bs_decode": [1, P["batch"]], "cuda_graph_bs_prefill": [P["prompt"]]}


def prefill_paths(kt, spans=None) -> dict:
    """Each prefill step's attention path: "warm" when its prompt found a prefix in the radix cache (attention
    reads it from the paged KV), "cold" when nothing was cached; from the scheduler log's cached tokens (``spans``
    of analyse_story, in step order), or where the log says nothing, from a merge kernel in the step."""
    out = {}
    steps = sorted(int(s) for s in kt[kt["mode"] == "EXTEND"]["step"].unique())
    by_step = dict(zip(sorted(int(s) for s in kt["step"].unique()), spans or []))
    for s in steps:
        cached = (by_step.get(s) or {}).get("cached_token")
        if cached is None:
            cached = int(kt[kt["step"] == s]["kernel"].str.contains("Merge").any())
        out[s] = "warm" if cached else "cold"
    return out


SAME_TOKENS = 0.1     # a prefill window stands for a traced prefill whose token count is within 10% of its own


def window_specs(kt, names, P, spans=None) -> list[dict]:
    """Which traced step each ncu window stands for, and which steps take its counters. A prefill window stands
    for the traced prefill of its path (cold: "prefill-cold_*", else warm) nearest in tokens, within SAME_TOKENS; a
    decode window for the middle traced decode step of its batch size. A window no traced step matches keeps its place (step None),
    so the windows after it still align, and takes no kernel."""
    paths = prefill_paths(kt, spans)
    specs = []
    for name in names:
        mode = "EXTEND" if name.startswith("prefill") else "DECODE"
        bs = int(name.split("_b")[1])
        spec = {"name": name, "step": None, "match": {}}
        if mode == "EXTEND":
            want = "cold" if name.startswith("prefill-cold") else "warm"
            m = kt[(kt["mode"] == mode) & kt["step"].map(lambda s: paths.get(int(s)) == want)]
            per = m.groupby("step")[["bs", "toks"]].first().reset_index()
            per["d"] = (per["toks"] - bs * P["prompt"]).abs() * 1000 + (per["bs"] - bs).abs()
            per = per[(per["toks"] - bs * P["prompt"]).abs() <= SAME_TOKENS * bs * P["prompt"]]
            if len(per):
                best = per.sort_values(["d", "step"]).iloc[0]
                spec = {"name": name, "step": int(best["step"]),
                        "match": {"mode": mode, "bs": int(best["bs"]), "toks": int(best["toks"])}}
        else:
            m = kt[(kt["mode"] == mode) & (kt["bs"] == bs)]
            if len(m):
                steps = sorted(m["step"].unique())
                spec = {"name": name, "step": int(steps[len(steps) // 2]), "match": {"mode": mode, "bs": bs}}
        specs.append(spec)
    return specs


# ------------------------------------------------------------------ analysis and verdicts

def gemm_efficiency(kt, pk) -> list[dict]:
    """Per step kind and GEMM role (traced kernel time): TFLOP/s and % of the bf16 ceiling; effective bandwidth
    of the weights and, where the step's weights are many times the L2, the weight-streaming % of the DRAM read
    ceiling (common.tables.kernels stream_pct); the ncu counters where they ran (DRAM % from ncu's bytes)."""
    rows = []
    gem = kt[kt["role"].isin(timeline.GEMM_ROLES + ("lm_head",)) & kt["flops"].notna()]
    read = pk.get("dram_read_tb_s") or pk.get("dram_tb_s")
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


def judge_all(run, data):
    """Every verdict of the run, each on the interval of its repeated measurement."""
    one, obs, P = data["kt_one"], data["observer"], data["P"]
    dec = one[(one["mode"] == "DECODE") & (one["role"] == "gate_up_proj") & one["stream_pct"].notna()]
    run.judge(H["decode_gemm"], list(dec["stream_pct"]), evidence="kernels_one.csv: gate_up GEMM of every layer "
              "and decode step (traced time, weight bytes from common.tables.flops; the step reads all 16 GB of weights, many "
              "times the L2, so they come from DRAM)")
    pre = one[(one["mode"] == "EXTEND") & one["role"].isin(timeline.GEMM_ROLES) & one["pct_bf16_ceiling"].notna()]
    run.judge(H["prefill_gemm"], list(pre["pct_bf16_ceiling"]), evidence="kernels_one.csv: the 4 GEMMs x 32 layers "
              "of the prefill step")
    run.judge(H["attention_share"], data["attention_shares"], evidence="the prefill step of each traced one-request run")
    base = statistics.median(r["itl_ms"] for r in obs if r["story"] == "one" and not r["traced"])
    run.judge(H["observer"], [100 * (r["itl_ms"] / base - 1) for r in obs if r["story"] == "one" and r["traced"]],
              evidence="observer.csv (one request: ITL of each traced run against the untraced median)")
    base = statistics.median(r["ttft_ms"] for r in obs if r["story"] == "one" and not r["traced"])
    run.judge(H["observer_ttft"], [100 * (r["ttft_ms"] / base - 1) for r in obs if r["story"] == "one" and r["traced"]],
              evidence="observer.csv (one request: TTFT of each traced run against the untraced median)")
    use = [r.get("token_usage") or 0 for r in data["pressure"] if r["kind"] in ("prefill", "decode")]
    top = sorted(use)[-max(3, len(use) // 20):]                            # the top 5% of the steps
    run.judge(H["usage"], top, evidence="pressure_steps.csv: token usage of the fullest scheduler steps")
    fits = P["groups"] * P["prefix"] < P["pool"] * 0.9
    run.judge(H["lru"], [c["hit_fraction"] for c in data["cache"] if c["pass"] == 1], evidence="cache_requests.csv",
              premise=True if not fits else "the pool held every prefix (no eviction pressure)")
    agree = sum(c["agree"] for c in data["cache"])
    run.observe("the scheduler log and meta_info.cached_tokens agree on every request's cached tokens",
                f"{agree}/{len(data['cache'])} requests agree", "confirmed" if agree == len(data["cache"]) else "refuted",
                "cache_requests.csv (log_cached vs api_cached)")


# ------------------------------------------------------------------ every millisecond of a request

WATERFALL_REPS = 5       # untraced requests of each kind in the waterfall phase (text, input_ids), one at a time
_STAGE_LINE = re.compile(r"^sglang:per_stage_req_latency_seconds_(?:sum|count)\{")


def _stage_lines(metrics_text: str) -> str:
    """The /metrics lines the waterfall needs (per-stage latency sums and counts): what the recording keeps."""
    return "\n".join(ln for ln in metrics_text.splitlines() if _STAGE_LINE.match(ln))


def waterfall_phase(srv, run, P) -> dict:
    """One request at a time, untraced, before any profiler ran: WATERFALL_REPS text prompts (SGLang's tokenizer)
    and as many input_ids prompts (no tokenizer, no cached BOS), each between two /metrics scrapes (its
    request_process stage dates the scheduler's receipt). Returns {"text": [...], "ids": [...]} records."""
    out = {"text": [], "ids": []}
    srv.generate(text=sg.random_text(P["prompt"], 800), sampling_params={**SP, "max_new_tokens": 2})   # the text path once
    for rep in range(max(WATERFALL_REPS, P["reps"])):
        for kind in ("text", "ids"):
            before = _stage_lines(srv.get_text("/metrics"))
            kw = ({"text": sg.random_text(P["prompt"], 820 + rep)} if kind == "text" else
                  {"input_ids": sg.random_ids(P["prompt"], 840 + rep)})
            r = srv.generate(stream=True, sampling_params={**SP, "max_new_tokens": P["new"]}, **kw)
            out[kind].append({"result": {"meta_info": r["meta_info"], "client": r["client"]},
                              "metrics_before": before, "metrics_after": _stage_lines(srv.get_text("/metrics"))})
    for kind, recs in out.items():
        run.log(f"waterfall {kind}: TTFT " + ", ".join(f"{r['result']['client']['ttft_s'] * 1e3:.1f}" for r in recs)
                + " ms (untraced)")
    return out


def median_traced(traced: list) -> int:
    """Index of the traced repetition whose TTFT (the median of its requests) is the median of the repetitions."""
    from common.tables import waterfall
    ttft = [statistics.median([r["client"]["ttft_s"] for r in t["results"] if "error" not in r and r["client"].get("ttft_s")]
                              or [math.nan]) for t in traced]
    i = waterfall.median_index(ttft)
    return len(traced) - 1 if i is None else i


def waterfalls(data, cfg) -> dict:
    """The untraced TTFT and ITL waterfalls (medians of the repetitions), the traced ones beside them part by part,
    the prefill stage split on the median traced repetition, one decode step split on the scheduler loop."""
    from common.tables import waterfall
    out, notes = {}, []
    per_kind = {}
    for kind, recs in (data.get("waterfall") or {}).items():
        ws = [sg.ttft_waterfall(r["result"], r["metrics_before"], r["metrics_after"], label=f"{kind} rep {i}")
              for i, r in enumerate(recs)]
        per_kind[kind] = waterfall.median(ws, label=f"untraced {kind}, median of {len(ws)} requests")
    ones = data["traced_one"]
    pick = data.get("pick_one", median_traced(ones))
    tr = waterfall.median([sg.ttft_waterfall(t["results"][0], label=f"traced rep {i}", source="traced")
                           for i, t in enumerate(ones)], label=f"traced, median of {len(ones)}")
    split = dec = None
    try:
        ev, _kt = story_events(ones[pick]["trace"])
        split = sg.prefill_split(ev, sg.request_stamps(ones[pick]["results"][0]), layers=cfg["num_hidden_layers"])
        dec = sg.decode_split(ev)
    except (trace.TraceError, KeyError, IndexError) as e:
        notes.append(f"split not possible on traced repetition {pick}: {str(e).splitlines()[0][:160]}")
    u = per_kind.get("text")
    if u is None:
        notes.append("no untraced waterfall in this recording (it predates the waterfall phase): traced parts only")
        u, t = tr, None
    else:
        u, t = waterfall.align(u, tr)
    if split:
        u = waterfall.with_split(u, "prefill forward", split)
    obs = data["observer"]
    med = lambda key, traced: statistics.median(r[key] for r in obs if r["story"] == "one" and r["traced"] == traced)  # noqa: E731
    sk = step_key(obs)
    itl_u = sg.itl_waterfall(med("itl_ms", False), med(sk, False), label="untraced, median of the repetitions",
                             step_from=sk)
    itl_t = sg.itl_waterfall(med("itl_ms", True), med(sk, True), label="traced", source="traced", step_from=sk)
    if dec:
        itl_u = waterfall.with_split(itl_u, "scheduler decode step", dec)
    out.update(ttft=u, ttft_traced=t, ttft_by_kind=per_kind, itl=itl_u, itl_traced=itl_t, split=split, decode=dec,
               pick=pick, picks=[statistics.median([r["client"]["ttft_s"] * 1e3 for r in x["results"] if "error" not in r])
                                 for x in ones], notes=notes)
    return out


def waterfall_text(w: dict) -> list:
    """The story's waterfall block: (label, children) items, every line <= 120 characters."""
    from common.tables import waterfall
    u, t = w["ttft"], w["ttft_traced"]
    src = ("measured untraced: every top-level part (SGLang's own stamps, /metrics, the client's clock); taken from "
           "the traced median repetition: the split of the prefill forward (traced ms, not scaled)" if t is not None else
           "measured traced only (this recording has no untraced waterfall); the split: the traced median repetition")
    kids = [(ln, []) for ln in waterfall.render(u, traced=t, total_name="client TTFT (median)", width=110)]
    kids.append(_wrapped(src))
    pk = w["ttft_by_kind"]
    if {"text", "ids"} <= set(pk):
        # per-part medians over each kind's requests (the parts shown above are the median repetition's)
        g = {k: {p["name"]: p.get("median_ms", p["ms"]) for p in v["parts"]} for k, v in pk.items()}
        tok = g["text"].get("tokenize + dispatch", math.nan) - g["ids"].get("tokenize + dispatch", math.nan)
        kids.append(_wrapped(f"tokenizer: text prompts spend {tok:+.2f} ms more in tokenize + dispatch than input_ids "
                             f"ones (medians, {pk['text']['n']} each)"))
        pf = {k: next((ms for n, ms in v.items() if "prefill forward" in n), math.nan) for k, v in g.items()}
        kids.append(_wrapped(f"prefill forward: text {pf['text']:.1f} ms (BOS cached: ragged + paged + merge) vs "
                             f"input_ids {pf['ids']:.1f} ms (nothing cached: ragged only)"))
    pick, picks = w["pick"], w["picks"]
    kids.append((f"traced tree and split: repetition {pick} of {len(picks)} (median TTFT; the repetitions: "
                 + ", ".join(f"{x:.1f}" for x in picks) + " ms)", []))
    items = [("TTFT waterfall — one request, " + (u.get("label") or ""), kids)]
    itl = [(ln, []) for ln in waterfall.render(w["itl"], traced=w["itl_traced"], total_name="client ITL (median)",
                                               width=110)]
    d = w.get("decode")
    if d:
        itl.append(_wrapped(f"split: one scheduler iteration of the traced median repetition ({d['iterations']} decode "
                            f"steps); its GPU step {d['gpu_span_ms']:.2f} ms, busy {d['gpu_busy_pct']:.0f}%"))
    items.append(("ITL waterfall — one decode step (client ITL = the scheduler's decode step + delivery)", itl))
    for n in w["notes"]:
        items.append(_wrapped(n))
    return items


def _wrapped(text: str, width: int = 100):
    """(first line, [continuation lines]) of a long text for story.tree: nothing cut off."""
    import textwrap
    lines = textwrap.wrap(text, width) or [""]
    return (lines[0], [(ln, []) for ln in lines[1:]])


def judge_waterfalls(run, w) -> None:
    """The add-up checks as observations: a waterfall that does not add up is refuted, never printed as fine."""
    for key, what in (("ttft", "the client's TTFT"), ("itl", "the client's ITL")):
        wf = w[key]
        run.observe(f"the {key.upper()} waterfall's parts add up to {what} within 5% ({wf.get('label')})",
                    f"parts {wf['sum_ms']:.2f} ms vs {wf['total_ms']:.2f} ms: {wf['remainder_ms']:+.2f} ms unattributed "
                    f"({wf['remainder_pct']:+.1f}%)" + (f"; negative: {wf['negative']}" if wf["negative"] else ""),
                    "confirmed" if wf["ok"] else "refuted", "waterfall.csv")
        for p in wf["parts"]:
            sp = p.get("split")
            if sp:
                run.observe(f"the split of '{p['name']}' adds up to its traced total within 5% ({sp.get('label')})",
                            f"{sp['sum_ms']:.2f} of {sp['total_ms']:.2f} ms ({sp['remainder_pct']:+.1f}% unattributed)",
                            "confirmed" if sp["ok"] else "refuted", "waterfall.csv")


def finish_waterfall(run, data) -> None:
    """The waterfall's tables and checks, the transitions, memory by owner, the pressure phase as a Perfetto trace."""
    from common.tables import waterfall
    w = data["wf"]
    rows = waterfall.rows(w["ttft"], traced=w["ttft_traced"], waterfall="ttft")
    rows += waterfall.rows(w["itl"], traced=w["itl_traced"], waterfall="itl")
    for kind, m in w["ttft_by_kind"].items():
        rows += waterfall.rows(m, waterfall=f"ttft_{kind}")
    run.table("waterfall", rows)
    judge_waterfalls(run, w)
    sg.table(run, "transitions", data["transitions"])
    owners = memory_by_owner(data)
    sg.table(run, "gpu_memory_owners", owners)
    pr = [r for r in data["pressure"] if r["kind"] in ("prefill", "decode")]
    if pr:
        us = lambda t: t * 1e6  # noqa: E731
        tracks = {k: [(us(r["ts"]), r.get(f)) for r in pr] for k, f in (("running", "running_req"), ("queued", "queue_req"),
                                                                        ("token usage", "token_usage"))}
        for k, name in (("used_gb", "GPU memory used (GB)"), ("weights_gb", "weights (GB)"), ("kv_pool_gb", "KV pool (GB)"),
                        ("cuda_graphs_gb", "CUDA-graph pools (GB)"), ("rest_gb", "rest (GB)")):
            if owners and owners[0].get(k) is not None:
                tracks[name] = [(us(m["t"]), m[k]) for m in owners]
        marks = [(us(x["t"]), x["kind"], {"what": x["text"]}) for x in data["transitions"]
                 if x["kind"] in ("retraction", "chunked prefill", "queue starts", "queue drains", "pool full")]
        ev, meta = timeline.perfetto_events(None, counters=tracks, marks=marks)
        timeline.write_perfetto(run.path("story_pressure.json"), ev, meta)


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


# ------------------------------------------------------------------ transitions as events

def _step_state(kt, step) -> dict:
    """One traced step's kernel story: classes by time share, attention and GEMM kernels, GPU busy, counters."""
    g = kt[kt["step"] == step]
    span = float(g["end_us"].max() - g["ts_us"].min())
    tot = float(g["dur_us"].sum())
    sh = (g.groupby("cls")["dur_us"].sum() / tot * 100).sort_values(ascending=False)
    out = {"step": int(step), "mode": g["mode"].iloc[0], "bs": int(g["bs"].iloc[0]), "t_us": float(g["ts_us"].min()),
           "busy_pct": 100 * tot / span if span else math.nan, "shares": {k: float(v) for k, v in sh.head(4).items()},
           "attention": list(dict.fromkeys(g[(g["cls"] == "attention") & (g["layer"] == 1)]["kernel"])),
           "gemm": next(iter(g[(g["role"] == "gate_up_proj") & (g["layer"] == 1)]["kernel"]), None)}
    for col in ("tensor_pct", "dram_pct"):
        if col in g:
            c = g[g[col].notna()]
            w = c["dur_us"].astype(float)
            out[col] = float((c[col].astype(float) * w).sum() / w.sum()) if w.sum() else math.nan
    return out


def cold_attention(rows, info, n_layers: int = 2) -> list[dict]:
    """The attention kernels of one layer of the cold prefill window (ncu rows of "prefill-cold_*"): the cold side
    of the cache transition, which no traced story runs."""
    w = next((i for i in info if i["window"].startswith("prefill-cold") and i.get("ncu_rows")), None)
    if w is None:
        return []
    lo, hi = w["ncu_rows"]
    att = [r for r in rows.iloc[lo:hi + 1].to_dict("records") if trace.kernel_class(r["kernel"]) == "attention"]
    # the server under ncu ran n_layers: keep the last one's (of 2, the second: the one later layers are like)
    per = len(att) // n_layers if len(att) >= n_layers else len(att)
    return att[per * (n_layers - 1):] if per else att


def _attention_hw(rows) -> str:
    """'Kernel 12.3 us (ncu), tensor 45%, DRAM 20%' for each attention kernel of one layer."""
    f = story.fmt
    return " + ".join(f"{r['kernel'][:40]} {f(r.get('ncu_time_us'))} us (ncu), tensor {f(r.get('tensor_pct'))}%, "
                      f"DRAM {f(r.get('dram_pct'))}%" for r in rows)


def transitions(data) -> list[dict]:
    """The plan's transitions as events (t: epoch s, kind, text): prefill -> decode with what the hardware does,
    cache cold -> warm per request, and under pressure each change of the scheduler's state."""
    f = story.fmt
    out = []
    kt, base = data["kt_one"], data.get("base_one") or 0.0
    modes = {}
    for mode in ("EXTEND", "DECODE"):
        steps = sorted(kt[kt["mode"] == mode]["step"].unique())
        if steps:
            modes[mode] = _step_state(kt, steps[0] if mode == "EXTEND" else steps[len(steps) // 2])
    if len(modes) == 2:
        a, b = modes["EXTEND"], modes["DECODE"]
        hw = (f"; tensor pipe {f(a.get('tensor_pct'))}% -> {f(b.get('tensor_pct'))}%, DRAM {f(a.get('dram_pct'))}% -> "
              f"{f(b.get('dram_pct'))}% (ncu, time-weighted)" if _ok(a.get("tensor_pct")) and _ok(b.get("tensor_pct"))
              else "; counters: run with --ncu")
        out.append({"t": (b["t_us"] + base) / 1e6, "kind": "prefill -> decode", "text":
                    f"prefill -> decode: attention {'+'.join(a['attention'])} -> {'+'.join(b['attention'])}; GEMM "
                    f"(gate/up) {a['gemm']} -> {b['gemm']}; shares " + ", ".join(f"{k} {f(v)}%" for k, v in a["shares"].items())
                    + " -> " + ", ".join(f"{k} {f(v)}%" for k, v in b["shares"].items())
                    + f"; GPU busy {f(a['busy_pct'])}% -> {f(b['busy_pct'])}%" + hw})
    prev = None
    cold, warm = data.get("cold_attention") or [], []
    warm_steps = [s for s, p in prefill_paths(kt, data.get("spans_one")).items() if p == "warm"]
    if warm_steps and "ncu_time_us" in kt:
        g = kt[(kt["step"] == warm_steps[0]) & (kt["layer"] == 1) & (kt["cls"] == "attention")]
        warm = [r for r in g.to_dict("records") if _ok(r.get("ncu_time_us"))]
    for c in data["cache"]:
        if c["outcome"] != prev:
            path = "paged + merge (prefix in the cache)" if c["api_cached"] else "ragged only (nothing cached)"
            hw = cold if not c["api_cached"] else warm
            if hw:
                path += f"; per layer, a {'cold' if not c['api_cached'] else 'warm'} {data['P']['prompt']}-token prefill under ncu: " \
                        + _attention_hw(hw)
            out.append({"t": c["t"], "kind": f"cache {c['outcome']}", "text":
                        f"cache request {c['request']} (prefix {c['group']}): {prev or 'start'} -> {c['outcome']}, "
                        f"{c['api_cached']} of {c['prompt']} tokens cached; attention {path}"})
        prev = c["outcome"]
    out += pressure_events(data["pressure"], data["kt_one"])
    return out


def pressure_events(rows, kt=None) -> list[dict]:
    """Per scheduler step under pressure, each change of state as an event: the queue starts / drains, token usage
    crosses 0.9, a retraction, a chunk of a long prompt; with the kernel classes a step of that kind ran (from the
    traced steps of the same kind: the pressure run itself is not traced)."""
    cls = {}
    if kt is not None and len(kt):
        for mode, kind in (("EXTEND", "prefill"), ("DECODE", "decode")):
            g = kt[kt["mode"] == mode]
            if len(g):
                sh = (g.groupby("cls")["dur_us"].sum() / g["dur_us"].sum() * 100).sort_values(ascending=False).head(3)
                cls[kind] = ", ".join(f"{k} {v:.0f}%" for k, v in sh.items())
    out, q, hot, state = [], 0, False, "before the first step"
    for r in rows:
        if r["kind"] in ("prefill", "decode"):
            state = f"running {r.get('running_req')}, queued {r.get('queue_req')}, usage {r.get('token_usage')}"
        kinds = []
        if r["kind"] == "retract":
            kinds.append(("retraction", f"{r.get('retracted')} request(s) retracted, {r.get('gained')} tokens freed"))
        elif is_chunk(r):
            kinds.append(("chunked prefill", f"one chunk of {r.get('new_token')} tokens of a long prompt"))
        if r["kind"] in ("prefill", "decode"):
            qq = r.get("queue_req") or 0
            if qq and not q:
                kinds.append(("queue starts", "requests wait for KV space or a batch slot"))
            elif q and not qq:
                kinds.append(("queue drains", "every waiting request was admitted"))
            q = qq
            u = r.get("token_usage") or 0
            if u >= 0.9 and not hot:
                kinds.append(("pool full", "token usage crossed 0.9"))
            hot = u >= 0.9 if u >= 0.9 or u < 0.8 else hot
        for kind, what in kinds:
            out.append({"t": r["ts"], "kind": kind, "text": f"{kind}: {what} ({r['kind']} line; scheduler: {state}"
                        + (f"; a {r['kind']} step runs {cls[r['kind']]}" if r["kind"] in cls else "") + ")"})
    return out


# ------------------------------------------------------------------ GPU memory by owner

def memory_by_owner(data) -> list[dict]:
    """NVML's used memory over time, split into the owners SGLang's start-up log names (weights, KV pool, other pools,
    CUDA-graph pools) and the rest (CUDA context, the allocator's cache, activations: used - the owners)."""
    own = sg.startup_memory(data.get("startup_log") or "")
    mem = data.get("mem") or []
    if not mem:
        return []
    graphs = sum(v for k, v in own.items() if k.startswith("cuda_graph_"))
    fixed = {"weights_gb": own.get("weights_gb"), "kv_pool_gb": own.get("kv_pool_gb"),
             "other_pools_gb": own.get("other_pools_gb"), "cuda_graphs_gb": graphs if own else None}
    known = sum(v for v in fixed.values() if v)
    return [{"t": t, "t_s": t - mem[0][0], "used_gb": v, **fixed, "rest_gb": v - known if own else None} for t, v in mem]


# ------------------------------------------------------------------ outputs

def write_story(run, data, pk, backend_why):
    """Tables, Perfetto traces, figures and the text tree."""
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
    # the rest is written by the caller (tables of the pressure/cache phases, figures, tree)


def check(args):
    """Everything that can fail before a GPU is touched: packages, GPU, ncu, values, the model dir."""
    sg.require_stack()
    if args.ncu:
        from common.base.checks import require_tool
        require_tool("ncu", "Nsight Compute ships with the CUDA toolkit; add it to PATH, or leave out --ncu.")
    P = dict(QUICK if args.quick else FULL)
    P["pool"] = args.pool or P["pool"]
    model_dir, base = sg.model_and_flags(args)
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    return P, model_dir, base, cfg


def server_flags(args, P, backend, write: bool = True) -> tuple[str, list[str]]:
    """(model dir, flags) of 08's server: the serving configuration with its pool and backend (None: SGLang's
    own choice, FA3; with flashinfer, the default options and --quick: the pipeline's shared server)."""
    return sg.serving_flags(args, quick=args.quick, backend=backend, pool=P["pool"], write=write)


def measure(args, run, P, model_dir, base, backend, backend_why="") -> dict:
    """Phases 1-4 on one server: the two stories (untraced, traced), pressure, the cache over time."""
    prof = run.dir / "profiles"
    _, fl = server_flags(args, P, backend)
    data = {"P": P, "server_flags": fl, "quick": bool(args.quick)}
    with sg.server(run, model_dir, fl, quick=args.quick, env=ENV, port=args.port, start_timeout=args.start_timeout,
                   own_why=f"attention backend: {backend_why}" if backend is None else "") as srv:
        check = srv.generate(input_ids=sg.random_ids(16, 0), sampling_params={**SP, "max_new_tokens": 8})
        if check["meta_info"]["completion_tokens"] != 8:
            raise RuntimeError(f"sanity request came back wrong: {check['meta_info']}")
        run.log("sanity: 8 tokens back ✅  Starting the stories.")
        srv.bench_worker(run.log).warm()     # its import (~20 s) overlaps the stories; the pressure phase uses it
        data["waterfall"] = waterfall_phase(srv, run, P)
        obs_one, data["traced_one"], data["untraced_one"] = serve_story(srv, run, "one", one_request, P, prof)
        obs_b, data["traced_batch"], data["untraced_batch"] = serve_story(srv, run, "batch", batch_requests, P, prof)
        data["observer"] = obs_one + obs_b
        data["gpu_metrics"] = metrics_phase(srv, run, P)
        data["pressure"], data["mem"], data["bench"] = pressure(srv, run, P)
        data["cache"] = cache_story(srv, run, P)
        data["server_args"] = next((l for l in srv.log_since(0).splitlines() if "server_args=" in l), "")
        data["startup_log"] = sg.memory_lines(srv.log_since(0))
    return data


def trace_tables(data, cfg) -> dict:
    """The traced stories' tables, without counters: the join of the last traced run of each story, per-run
    attention shares and the waterfalls. Reads ``data``, changes nothing in it (returns the new keys): safe in a
    thread while the counters run (main)."""
    pk = ceilings.complete(data["pk"])
    out = {"pk": pk}
    for name in ("one", "batch"):
        out[f"pick_{name}"] = pick = median_traced(data[f"traced_{name}"])
        last = data[f"traced_{name}"][pick]
        kt, spans, base_us, info = analyse_story(last["trace"], last["log"], cfg, pk)
        out.update({f"kt_{name}": kt, f"spans_{name}": spans, f"base_{name}": base_us,
                    f"results_{name}": last["results"], f"join_{name}": info})
    shares = []
    for t in data["traced_one"]:
        _ev, kt = story_events(t["trace"])
        pre = kt[kt["mode"] == "EXTEND"]
        shares.append(100 * pre[pre["cls"] == "attention"]["dur_us"].sum() / pre["dur_us"].sum())
    out["attention_shares"] = shares
    out["wf"] = waterfalls({**data, **out}, cfg)
    return out


def analyse(run, data, cfg, tables: dict | None = None) -> None:
    """The joined tables of the last traced run of each story (``tables``: trace_tables(), when already made),
    with the counters when ncu ran; per-run scalars of every traced run."""
    data.update(tables if tables is not None else trace_tables(data, cfg))
    pk = data["pk"]
    if data.get("windows"):
        rows = kernels.summarize(ncu.read_raw(run.dir / "ncu" / "ncu.csv"), peaks=pk)
        for name in ("one", "batch"):
            specs = window_specs(data[f"kt_{name}"], data["windows"], data["P"], data[f"spans_{name}"])
            data[f"kt_{name}"], info = timeline.attach_counters(data[f"kt_{name}"], rows, specs, pk,
                                                                keep_layers=data.get("ncu_layers") or 2)
            info = [{**i, "step": w["step"], **same_kernels(data[f"kt_{name}"], i["window"])}
                    for i, w in zip(info, specs)]
            run.table(f"ncu_windows_{name}", info)
            run.log(f"counters on {name}: " + ", ".join(f"{i['window']} (step {i['step']}) {i['matched']}/{i['expected']} "
                                                        f"by name, {i['same_grid_pct']:.0f}% same grid, ncu/traced "
                                                        f"median {i['ncu_over_traced']:.2f}" for i in info if i["expected"]))
            if name == "one":
                data["cold_attention"] = cold_attention(rows, info, data.get("ncu_layers") or 2)
    data["transitions"] = transitions(data)     # after the counters: prefill -> decode names their change


SAME_TIME = 0.25      # the few-layer server runs the same kernel when its ncu time is within 25% of the traced time


def same_kernels(kt, window: str) -> dict:
    """How far the kernels of the few-layer server under ncu are those of the full server, for one window: the share of
    kernels that took counters whose launch grid is the traced one, the median ncu/traced time, and the share
    within SAME_TIME of it (the rest is ncu's replay, clocks and caches: the observer effect of ncu)."""
    g = kt[kt["ncu_window"] == window]
    if not len(g):
        return {"same_grid_pct": math.nan, "ncu_over_traced": math.nan, "within_margin_pct": math.nan}
    grid = [timeline.same_dims(a, b) for a, b in zip(g["grid"], g["ncu_grid"])]
    ratio = g["ncu_ratio"].astype(float)
    return {"same_grid_pct": 100 * sum(grid) / len(g), "ncu_over_traced": float(ratio.median()),
            "within_margin_pct": float(100 * ((ratio - 1).abs() <= SAME_TIME).mean())}


PK_KEYS = ("gpu", "dram_tb_s", "dram_read_tb_s", "dram_mixed_tb_s", "dram_copy_tb_s", "dram_write_tb_s", "bf16_tflops",
           "bf16_sm_mhz", "l2_mb", "source")      # the ceilings a recording keeps (a re-analysis divides by them)
RAW = ("P", "observer", "pressure", "mem", "bench", "cache", "server_args", "windows", "ncu_layers", "backend_why", "pk",
       "waterfall", "startup_log", "gpu_metrics", "server_flags", "quick")


def save_raw(run, data) -> None:
    """Everything the analysis reads, so that --reanalyse can redo it without a GPU: raw.json, the traces
    (profiles/, already in the run), each traced run's server log, the ncu CSV (ncu/ncu.csv)."""
    raw = {k: data.get(k) for k in RAW}
    for name in ("one", "batch"):
        raw[f"traced_{name}"] = []
        for i, t in enumerate(data[f"traced_{name}"]):
            run.path(f"logs/{name}_{i}.log").write_text(t["log"])
            raw[f"traced_{name}"].append({"trace": str(Path(t["trace"]).relative_to(run.dir)),
                                          "log": f"logs/{name}_{i}.log", "results": t["results"]})
        raw[f"untraced_{name}"] = []
        for i, u in enumerate(data.get(f"untraced_{name}") or []):
            run.path(f"logs/{name}_untraced_{i}.log").write_text(u["log"])
            raw[f"untraced_{name}"].append({"log": f"logs/{name}_untraced_{i}.log"})
    run.json("raw", raw)


def load_raw(folder: Path) -> dict:
    """The recorded files of an earlier run (see save_raw) as the ``data`` of measure()."""
    raw = json.loads((folder / "raw.json").read_text())
    data = {k: raw.get(k) for k in RAW}
    for name in ("one", "batch"):
        data[f"traced_{name}"] = [{"trace": folder / t["trace"], "log": (folder / t["log"]).read_text(),
                                   "results": t["results"]} for t in raw[f"traced_{name}"]]
        data[f"untraced_{name}"] = [{"log": (folder / u["log"]).read_text()} for u in raw.get(f"untraced_{name}") or []]
    return data


def decode_steps_again(data) -> None:
    """A re-analysis reads each repetition's decode step from its recorded scheduler log again
    (_sgl_logs.decode_step_ms), so a better reading applies to old runs too; the untraced logs are recorded since
    the step is read from SGLang's clock: in older recordings only the traced rows get it, and step_key then keeps
    the recorded column for all."""
    for r in data["observer"]:
        runs = data.get(f"{'traced' if r['traced'] else 'untraced'}_{r['story']}") or []
        if r["rep"] < len(runs):
            r["step_ms"] = sg.decode_step_ms(sg.parse_batch_log(runs[r["rep"]]["log"]))


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.reanalyse:
        return reanalyse(args)
    P, model_dir, base, cfg = check(args)
    backend, backend_why = backend_choice()
    with Run(__file__, args, out=args.out) as run:
        pk = ceilings.peaks()
        run.log(f"{pk['gpu']}: ceilings {ceilings.ceiling_text(pk, 'dram_read_tb_s', short=True)}, "
                f"bf16 {pk['bf16_tflops']:.0f} TFLOP/s "
                f"({pk.get('source')}); attention backend: {backend_why}")
        tables = None
        with contextlib.ExitStack() as stack:
            if args.ncu:     # launched now, held by its gate until the stories' server is done with the GPU
                srv_ncu, gate, log_file = counters_server(args, run, model_dir, base, P, backend)
                stack.callback(srv_ncu.stop)
                srv_ncu.launch()
            data = measure(args, run, P, model_dir, base, backend, backend_why)
            data.update(backend_why=backend_why, pk={k: pk.get(k) for k in PK_KEYS}, windows=[])
            if args.ncu:
                gate.release(srv_ncu)        # a GateError naming why when the held server is gone (its gate closed)
                run.log("phases 1-4 done: the server under ncu may use the GPU now; the traced stories are joined "
                        "meanwhile")
                # the CPU-heavy join of the traces (~20 s) runs in a thread while ncu replays kernels on the GPU
                with ThreadPoolExecutor(1) as pool:
                    job = pool.submit(trace_tables, data, cfg)
                    srv_ncu.wait_ready()
                    gate.verify(srv_ncu)     # a start that was not held is a GateError: its counters not trusted
                    _rows, data["windows"] = counters(srv_ncu, run, P, log_file)
                    data["ncu_layers"] = COUNTER_LAYERS
                    t0 = time.time()
                    tables = job.result()
                    run.log(f"traced stories joined (waited {time.time() - t0:.1f} s for it after the counters)")
        save_raw(run, data)
        analyse(run, data, cfg, tables)
        finish(run, data, data["pk"], backend_why)
    return 0


def reanalyse(args) -> int:
    """--reanalyse DIR: the analysis of a recorded run, again, without a GPU (provenance of the recording)."""
    src = Path(args.reanalyse).resolve()
    if not (src / "raw.json").is_file():
        raise SetupError(f"{src}: no raw.json to re-analyse (written by 08_execution_story.py)")
    prev = load_summary(src) or {}
    data = load_raw(src)
    cfg = models.config((prev.get("args") or {}).get("preset") or "llama-3.1-8b")
    with Run(__file__, recording.Recording(src, prev).args_like(args), out=args.out) as run:
        run.reanalysis_of(prev, src)
        # the recording travels with the new run, so that it can be re-analysed in its turn
        keep = ["raw.json", *(["ncu/ncu.csv"] if data["windows"] else [])]
        raw = json.loads((src / "raw.json").read_text())
        keep += [t[k] for name in ("one", "batch") for t in raw[f"traced_{name}"] for k in ("trace", "log")]
        keep += [u["log"] for name in ("one", "batch") for u in raw.get(f"untraced_{name}") or []]
        decode_steps_again(data)
        for rel in keep:
            if ".." not in Path(rel).parts and (src / rel).is_file() and (src / rel).resolve() != (run.dir / rel).resolve():
                shutil.copyfile(src / rel, run.path(rel))
        analyse(run, data, cfg)
        finish(run, data, data["pk"], data["backend_why"])
    return 0


def finish(run, data, pk, backend_why):
    """Analysis, verdicts, tables, figures and the story tree (no GPU: tested on recorded data)."""
    import pandas as pd
    write_story(run, data, pk, backend_why)
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
    run.table("layer_tree", trees)
    run.table("class_shares", pd.concat([timeline.class_shares(data[f"kt_{n}"]).assign(story=n) for n in ("one", "batch")]))
    eff = gemm_efficiency(pd.concat([data["kt_one"], data["kt_batch"]]), pk)
    run.table("gemm_efficiency", eff)
    run.table("observer", data["observer"])
    run.table("pressure_steps", data["pressure"])
    mem = data["mem"]
    run.table("gpu_memory", [{"t_s": t - mem[0][0], "used_gb": v} for t, v in mem] if mem else [{"t_s": None}])
    run.table("cache_requests", data["cache"])
    finish_waterfall(run, data)
    gm = data.get("gpu_metrics") or {}
    if gm.get("rows"):
        run.table("gpu_metrics", gm["rows"])
    judge_all(run, data)
    run.headline(**{f"{r['mode'].lower()}_b{r['bs']}_{r['role']}_pct_of_ceiling": round(
        r["pct_bf16_ceiling"] if r["bound_by_intensity"] == "compute" else r["stream_pct"], 1) for r in eff
        if r["role"] in ("gate_up_proj", "lm_head")})
    for name, fig in figures(data, trees, pk).items():
        run.figure(name, fig)
    first = (sg.config_line(data["server_flags"], ENV, bool(data.get("quick"))) if data.get("server_flags") else
             "server configuration: not recorded (a recording made before the server_flags field)")
    run.story(first + "\n" + story_text(data, trees, eff, pk, backend_why), echo=True)


def figures(data, trees, pk) -> dict:
    """The joined timeline, the layer tree, pressure and the cache over time (matplotlib, no display)."""
    from common.render import plots
    out = {"timeline": plots.joined_timeline(data["kt_one"], data["spans_one"], title=f"One request — {pk['gpu']}"),
           "layer_tree": plots.layer_tree([t for t in trees if t["story"] == "one"], pk)}
    out["pressure"] = pressure_figure(data["pressure"], data["mem"], memory_by_owner(data))
    out["cache"] = cache_figure(data["cache"], data["P"])
    gm = data.get("gpu_metrics") or {}
    if gm.get("rows"):
        out["gpu_metrics"] = metrics_figure(gm, pk)
    return out


def metrics_figure(gm, pk):
    """The GPU's own counters over the served batch (nsys GPU metrics, 1 ms bins): SM active, tensor active, DRAM
    read and write, with the requests' window shaded (epoch clock; the sampling began at gm['t0'])."""
    from common.render.plots import _plt
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 3.4))
    rows = gm["rows"]
    t = [r["t_s"] for r in rows]
    for col, label, color in (("sm_active_pct", "SMs active", "tab:blue"), ("tensor_active_pct", "tensor active", "tab:red"),
                              ("dram_read_pct", "DRAM read", "tab:green"), ("dram_write_pct", "DRAM write", "tab:olive")):
        if col in rows[0]:
            ax.plot(t, [r.get(col) for r in rows], lw=0.8, label=label, color=color)
    if gm.get("t_send") and gm.get("t0"):
        ax.axvspan(gm["t_send"] - gm["t0"], gm["t_done"] - gm["t0"], color="grey", alpha=0.12, label="the batch's requests")
    ax.set_xlabel("time since the sampling began (s)")
    ax.set_ylabel("% of peak (nsys GPU metrics)")
    ax.set_title(f"{pk.get('gpu')}: the GPU's counters over a served batch of {len(rows):,} 1 ms bins", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    return fig


def pressure_figure(rows, mem, owners=None):
    """Batch dynamics per scheduler step (running, queued, token usage; every retraction and chunked-prefill mark),
    the wall time per step, and GPU memory by owner (weights, KV pool, other pools, CUDA graphs, the rest). An idle
    gap > 2 s (the benchmark client's own start-up) is cut out of the time axis and said so; nothing is left out."""
    from common.render.plots import _plt
    plt = _plt()
    fig, (a1, a2, a3) = plt.subplots(3, 1, figsize=(9, 7.5), sharex=True)
    steps = [r for r in rows if r["kind"] in ("prefill", "decode")]
    t0 = rows[0]["ts"] if rows else 0.0
    gaps = [(b["ts"] - a["ts"], a["ts"], b["ts"]) for a, b in zip(rows, rows[1:])]
    g = max(gaps) if gaps else (0.0, 0.0, 0.0)
    cut = (g[1] + 0.5, g[2] - 0.5) if g[0] > 2.0 else None        # the idle stretch taken out of the axis

    def x(ts):
        return ts - t0 - (cut[1] - cut[0] if cut and ts >= cut[1] else 0.0)
    t = [x(r["ts"]) for r in steps]
    a1.plot(t, [r.get("running_req") for r in steps], label="running", color="tab:blue")
    a1.plot(t, [r.get("queue_req") for r in steps], label="queued", color="tab:orange")
    n_ret = n_chunk = 0
    for r in rows:
        if r["kind"] == "retract":
            a1.axvline(x(r["ts"]), color="tab:red", lw=0.8)
            n_ret += 1
        elif is_chunk(r):
            a1.axvline(x(r["ts"]), color="tab:purple", lw=0.8, ls=":")
            n_chunk += 1
    ax = a1.twinx()
    ax.plot(t, [r.get("token_usage") for r in steps], color="tab:green", lw=0.8)
    ax.set_ylabel("token usage", color="tab:green")
    a1.set_ylabel("requests")
    a1.legend(fontsize=7, loc="upper left", title=f"red: {n_ret} retraction(s), purple: {n_chunk} chunked-prefill "
              "line(s)", title_fontsize=7)
    CLIP = 1000.0
    wall = [r.get("step_wall_ms") or 0 for r in steps]
    a2.scatter(t, [min(w, CLIP) for w in wall], s=3, c=["tab:red" if r["kind"] == "prefill" else "tab:blue" for r in steps])
    clipped = [w for w in wall if w > CLIP]
    a2.set_ylabel("step wall time (ms)\nred: prefill")
    if clipped:
        a2.set_title(f"{len(clipped)} step(s) clipped at {CLIP:.0f} ms (largest {max(clipped):,.0f} ms: an idle gap "
                     "before the next step)", fontsize=7)
    for ax_ in (a1, a2, a3):
        if cut:
            ax_.axvline(x(cut[1]), color="black", lw=0.6, ls="--")
    if cut:
        a1.text(x(cut[1]), a1.get_ylim()[1], f" {g[0]:.1f} s idle gap shown as 1 s", fontsize=7, va="top")
    mem = owners or [{"t": m[0], "used_gb": m[1]} for m in mem or []]
    if mem:
        tm = [x(m["t"]) for m in mem]
        if mem[0].get("rest_gb") is not None:
            keys = [("weights_gb", "weights"), ("kv_pool_gb", "KV pool"), ("other_pools_gb", "other pools"),
                    ("cuda_graphs_gb", "CUDA-graph pools"), ("rest_gb", "rest (context, cache, activations)")]
            a3.stackplot(tm, *[[m.get(k) or 0 for m in mem] for k, _ in keys], labels=[n for _, n in keys], alpha=0.8)
            a3.legend(fontsize=6, loc="lower right")
        else:
            a3.plot(tm, [m["used_gb"] for m in mem], color="grey", lw=0.8, label="used (no start-up log recorded: no owners)")
            a3.legend(fontsize=6, loc="lower right")
    a3.set_ylabel("GPU memory (GB, NVML)")
    a3.set_xlabel("time since the first scheduler line of the pressure phase (s)" + (", idle gap cut out" if cut else ""))
    return fig


CHUNK = 8192     # SGLang's default chunked_prefill_size on H100/H200 (the server_args line of server.log says so)


def is_chunk(row) -> bool:
    """A scheduler line that is one chunk of a prompt longer than a prefill chunk: one new request whose new
    tokens fill the whole chunk."""
    return row["kind"] == "prefill" and row.get("new_seq") == 1 and (row.get("new_token") or 0) >= CHUNK


def cache_figure(cache, P):
    """Per request of the cache phase: cached vs new prompt tokens, coloured by hit / miss / evicted."""
    from common.render.plots import _plt
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 3.2))
    col = {"hit": "tab:green", "miss": "tab:grey", "evicted": "tab:red"}
    for c in cache:
        ax.bar(c["request"], c["prompt"], color=col[c["outcome"]], alpha=0.35)          # the whole prompt
        ax.bar(c["request"], c["api_cached"], color=col[c["outcome"]])                 # the cached part
        ax.text(c["request"], c["prompt"] * 1.01, str(c["group"]), ha="center", fontsize=6)
    ax.set_xlabel("request (in order; the number on top is its prefix group)")
    ax.set_ylabel("prompt tokens (solid: cached)")
    ax.set_title(f"{P['groups']} prefixes of {P['prefix']} tokens, pool {P['pool']} tokens: green hit, red evicted, "
                 "grey first use", fontsize=8)
    return fig


def metrics_lines(data) -> list:
    """The observer effect of nsys GPU-metrics sampling on the batch, and what the counters read while it was served."""
    gm, f = data.get("gpu_metrics") or {}, story.fmt
    if not gm:
        return []
    if not gm.get("rows"):
        return [(f"GPU metrics over the served timeline: not sampled ({gm.get('why') or 'no samples'})", [])]
    obs = [r for r in data["observer"] if r["story"] == "batch" and not r["traced"]]
    base_t, base_i = statistics.median(r["ttft_ms"] for r in obs), statistics.median(r["itl_ms"] for r in obs)
    c, rows = gm["client"], gm["rows"]
    inside = [r for r in rows if gm.get("t_send") and gm["t_send"] - gm["t0"] <= r["t_s"] <= gm["t_done"] - gm["t0"]]
    mean = lambda col: statistics.fmean(r[col] for r in inside if r.get(col) is not None) if inside and col in inside[0] \
        else None  # noqa: E731
    return [(f"batch with nsys GPU-metrics sampling (10 kHz, nothing injected into the server): TTFT {f(c['ttft_ms'])} ms "
             f"vs {f(base_t)} untraced ({f(100 * (c['ttft_ms'] / base_t - 1))}%), ITL {f(c['itl_ms'])} vs {f(base_i)} ms "
             f"({f(100 * (c['itl_ms'] / base_i - 1))}%); while the requests ran: SMs active {f(mean('sm_active_pct'))}%, "
             f"tensor active {f(mean('tensor_active_pct'))}%, DRAM read {f(mean('dram_read_pct'))}% and write "
             f"{f(mean('dram_write_pct'))}% of peak (gpu_metrics.csv, figure gpu_metrics)", [])]


def story_text(data, trees, eff, pk, backend_why) -> str:
    """The text tree: request -> steps -> one layer -> kernels with counters, then the other phases."""
    f = story.fmt
    one = data["kt_one"]
    items = []
    res = data["results_one"][0]
    cl, mi = res["client"], res["meta_info"]
    t0 = cl["t_send"]
    ms = lambda t: f"+{(t - t0) * 1e3:7.1f} ms" if t else "   ?"  # noqa: E731
    req = [(f"{ms(t0)}  client POST /generate ({mi['prompt_tokens']} prompt tokens, {mi['completion_tokens']} new)", []),
           (f"{ms(mi.get('request_received_ts'))}  received by SGLang's TokenizerManager (HTTP receive)", []),
           (f"{ms(mi.get('api_server_dispatch_finish_ts'))}  tokenized and sent to the scheduler (ZMQ)", []),
           (f"{ms(mi.get('forward_entry_time'))}  enters a forward batch (queued {f((mi.get('queue_time') or 0) * 1e3)} ms)", [])]
    for mode in ("EXTEND", "DECODE"):
        tr = [x for x in trees if x["story"] == "one" and x["mode"] == mode]
        if not tr:
            continue
        n_layers = int(one[one["step"] == tr[0]["step"]]["layer"].max() or 0) + 1
        kids = [kernels.node(x, head=f"{x['segment']} {x['role']}: {x['kernel']} {f(x['dur_us'])} us kernel time, "
                             f"{f(x['share_all_layers_pct'])}% of the step's kernel time"
                             + (f" (x{n_layers} layers)" if x["segment"] == "layer" else ""))
                for x in tr if x["segment"] == "layer" or x["role"] in ("embedding", "final_norm", "lm_head")
                or x["share_pct"] >= 0.2]
        small = [x for x in tr if x["segment"] != "layer" and x["role"] not in ("embedding", "final_norm", "lm_head")
                 and x["share_pct"] < 0.2]
        if small:
            kids.append((f"+ {len(small)} small input-preparation / sampling kernels, {f(sum(x['share_pct'] for x in small))}% "
                         "of the step together (layer_tree.csv lists them)", []))
        g = one[one["step"] == tr[0]["step"]]
        req.append((f"{mode} step (bs {tr[0]['bs']}): {len(g)} kernels, {f(g['dur_us'].sum() / 1e3)} ms of kernel time "
                    f"-> one layer and the once-per-step kernels:", kids))
    req.append((f"{ms(cl.get('t_first'))}  first token at the client (TTFT {f((cl.get('ttft_s') or 0) * 1e3)} ms)", []))
    req.append((f"{ms(cl['t_done'])}  last token (ITL median {f(statistics.median(cl['itl_s']) * 1e3)} ms)", []))
    items.append((f"one request (traced repetition {data.get('pick_one', 0)} of {len(data['traced_one'])}, the median "
                   f"TTFT) — attention backend: {backend_why}", req))
    obs = data["observer"]
    items.append(("observer effect (torch profiler; medians of the repetitions)", [
        (f"{s}: TTFT {f(statistics.median(r['ttft_ms'] for r in obs if r['story'] == s and not r['traced']))} ms untraced vs "
         f"{f(statistics.median(r['ttft_ms'] for r in obs if r['story'] == s and r['traced']))} ms traced; ITL "
         f"{f(statistics.median(r['itl_ms'] for r in obs if r['story'] == s and not r['traced']))} vs "
         f"{f(statistics.median(r['itl_ms'] for r in obs if r['story'] == s and r['traced']))} ms", [])
        for s in ("one", "batch")] + metrics_lines(data)))
    served = [r["sm_mhz"] for r in obs if r.get("traced") and r.get("sm_mhz")]
    clock = (f"; served at SM {f(statistics.median(served))} MHz (NVML), the bf16 ceiling was reached at "
             f"{f(pk.get('bf16_sm_mhz'))} MHz" if served and pk.get("bf16_sm_mhz") else "")
    items.append(("GEMM efficiency (kernel time, traced; the ceiling that binds each: bf16 above the ridge, the DRAM "
                  f"read ceiling below it{clock})", [
        (f"{r['mode']} bs {r['bs']} {r['role']}: {f(r['tflop_s'])} TFLOP/s = {f(r['pct_bf16_ceiling'])}% of the bf16 "
         f"ceiling; weights effective {f(r['eff_tb_s'])} TB/s" + (f" = {f(r['stream_pct'])}% of the DRAM read ceiling"
                                                                 if _ok(r.get("stream_pct")) else "")
         + f"; {f(r['flop_per_byte'])} FLOP/B vs ridge {f(r['ridge'])}: {r['why']}", []) for r in eff]))
    pr = data["pressure"]
    items.append((f"pressure ({data['P']['load_n']} prompts at {data['P']['load_rate']}/s, pool {data['P']['pool']} tokens)", [
        (f"max running {max((r.get('running_req') or 0) for r in pr)}, max queued {max((r.get('queue_req') or 0) for r in pr)}, "
         f"max token usage {f(max((r.get('token_usage') or 0) for r in pr))}, retractions "
         f"{sum(r.get('retracted') or 0 for r in pr if r['kind'] == 'retract')}, chunked prefill lines "
         f"{sum(1 for r in pr if is_chunk(r))}", [])]))
    items[:0] = waterfall_text(data["wf"])
    items.append(("transitions as events (transitions.csv; instants in the Perfetto traces)",
                  [_wrapped(x["text"]) for x in data.get("transitions", [])[:40]]
                  + ([(f"... {len(data['transitions']) - 40} more in transitions.csv", [])]
                     if len(data.get("transitions", [])) > 40 else [])))
    items.append(("the cache over time (per request: hit / miss / evicted)", [
        (" ".join(f"{c['group']}{c['outcome'][0]}" for c in data["cache"]), [])]))
    return story.tree(f"EXECUTION STORY — {pk['gpu']} ({ceilings.ceiling_text(pk, 'dram_read_tb_s', short=True)}, bf16 "
                      f"{f(pk['bf16_tflops'])} TFLOP/s" + (f" at SM {f(pk['bf16_sm_mhz'])} MHz" if pk.get("bf16_sm_mhz")
                                                           else "") + ")", items)


def _ok(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


if __name__ == "__main__":
    run_main(main)
