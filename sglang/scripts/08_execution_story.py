#!/usr/bin/env python3
"""08 · The joined execution story: one request from HTTP to kernels and hardware counters.

What it measures (one SGLang server, Llama-3.1-8B shapes with dummy weights, one GPU, at SGLang's
default serving configuration: CUDA graphs for prefill and decode, the default scheduler, FA3 where
sgl_kernel.flash_attn imports — else FlashInfer, and the story says which ran and why; the changes are
a smaller KV pool, --max-total-tokens, so that phase 3 can fill it, and with --quick decode graphs
captured up to bs 64 -- the story's first line lists every change. In a --quick pipeline it runs on the
pipeline's shared server when its flags are exactly that server's (FlashInfer); where FA3 runs it starts
its own beside it, and the GPU memory curve of phase 3 then includes the shared server's share)
    1. Two stories: one request (512 prompt tokens, 64 new) and a batch of 32 such requests sent
       together. Each is served untraced (3 times: client TTFT and ITL, the scheduler's step lines) and
       traced with the torch profiler (/start_profile, 3 times). From the trace: request -> each
       scheduler step it takes part in (scheduler.run_batch, with its step[...] name and the batch the
       log line reports: new and cached tokens, running, queued, token usage) -> each layer (the
       repeating unit of the step's kernels; CUDA-graph replays joined by correlation id) -> each
       kernel and its role (QKV / O / gate-up / down GEMMs, norms, RoPE, KV store, attention + merge,
       activation; embedding, logits GEMM, sampling), with FLOPs and bytes (common.flops) and the
       rate its traced time gives, as % of this GPU's measured ceilings.
    2. The observer effect: TTFT, ITL and the decode step time traced vs untraced, in %.
    3. Pressure: a load that fills the KV pool (queue > 0, token usage near 1, retractions if SGLang
       makes them, chunked prefill of a long prompt): batch dynamics per scheduler step from the log
       (running, queued, usage, prefill/decode mix, step wall time) and GPU memory over time (NVML).
    4. The cache over time: round-robin over more shared prefixes than the pool holds, then a repeat
       of the most recent one: per request hit / miss / evicted tokens from the scheduler log,
       checked against meta_info.cached_tokens.
    5. Counters: the same configuration with the model cut to 2 layers (shapes unchanged) under Nsight
       Compute (--graph-profiling node: kernels inside CUDA graphs are profiled one by one), one-step
       windows opened by /start_profile CUDA_PROFILER: prefill of one request, a decode step at batch 1,
       the batch's prefill, a decode step at batch 32. Every kernel of the traced steps gets the
       counters of its position (common.timeline.attach_counters): time, DRAM / SM / tensor %, occupancy
       and its limiter, top warp stalls.

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
    python sglang/scripts/08_execution_story.py --quick --ncu    # + phase 5: the counters (needs ncu), ~+3 min
    python sglang/scripts/08_execution_story.py --ncu            # plan scale: 500 prompts at 50 req/s
Writes sglang/results/08_execution_story/: kernels_<story>.csv, steps_<story>.csv, layer_tree.csv,
class_shares.csv, gemm_efficiency.csv, observer.csv, pressure_steps.csv, gpu_memory.csv,
cache_requests.csv, ncu_windows.csv, story_<story>.json (open in https://ui.perfetto.dev),
pressure.json, timeline.png, layer_tree.png, pressure.png, cache.png, server logs, story.txt, summary.json.
"""
from __future__ import annotations

import json
import math
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _sglang as sg  # noqa: E402
from common import cli, gpu, models, ncu, story, timeline, trace  # noqa: E402
from common.checks import SetupError, run_main  # noqa: E402
from common.results import Run, load_summary  # noqa: E402
from common.verdicts import declare  # noqa: E402

QUICK = dict(reps=3, prompt=512, new=64, batch=32, pool=sg.QUICK_POOL_TOKENS, load_n=200, load_rate=50, load_in=512, load_out=128,
             long_prompt=10000, groups=8, prefix=4096)
FULL = dict(reps=5, prompt=512, new=64, batch=32, pool=65536, load_n=500, load_rate=50, load_in=1024, load_out=256,
            long_prompt=20000, groups=12, prefix=6144)
ENV = dict(sg.SERVING_ENV)     # ms log time stamps, traces without stacks and shapes (the shared server's too)
SP = {"temperature": 0, "ignore_eos": True}

H = declare("""
    decode_gemm = decode-gemm-bw: decode at batch 1 is bound by reading the weights
        judged on: decode GEMMs' weight-streaming rate as % of the measured DRAM ceiling (per layer)
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
        source: issue 14 target: story step times within 5% of untraced
    observer_ttft = observer-effect-ttft: the torch profiler changes the first token's latency by < 5%
        judged on: traced / untraced TTFT - 1 (one request, per run)
        confirmed: [-5, 5]%
        source: issue 14 target, applied to the prefill step as well
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
                   "counters (a second server, cut to 2 layers, under ncu; ~2-3 min)")
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
    r = srv.generate(input_ids=sg.random_ids(P["prompt"], seed), stream=True,
                     sampling_params={**SP, "max_new_tokens": P["new"]})
    return [r]


def batch_requests(srv, seed, P):
    return srv.generate_many([{"input_ids": sg.random_ids(P["prompt"], seed * 1000 + i),
                               "sampling_params": {**SP, "max_new_tokens": P["new"]}} for i in range(P["batch"])],
                             stream=True)


def client_figures(results, log_text) -> dict:
    """Client TTFT / ITL medians and the scheduler's decode step time (gaps between its decode lines)."""
    ok = [r["client"] for r in results if "error" not in r]
    dec = [r for r in sg.parse_batch_log(log_text) if r["kind"] == "decode"]
    # the log's timestamps have ms resolution: the mean gap over many steps of one batch size is exact enough,
    # a median of whole milliseconds is not
    gaps = [(b["ts"] - a["ts"]) * 1e3 for a, b in zip(dec, dec[1:]) if a["running_req"] == b["running_req"]]
    return {"ttft_ms": statistics.median(c["ttft_s"] for c in ok) * 1e3,
            "itl_ms": statistics.median(x for c in ok for x in c["itl_s"]) * 1e3,
            "log_step_ms": statistics.fmean(gaps) if gaps else math.nan, "requests": len(ok)}


def serve_story(srv, run, name, send, P, prof_dir):
    """Untraced then traced repetitions of one story: the observer rows and every traced run (trace, log, results)."""
    send(srv, 900 + len(name), P)                                           # warm this shape once
    rows, traced = [], []
    for rep in range(P["reps"]):
        mark = srv.log_mark()
        res = send(srv, 10 * rep + 1, P)
        rows.append({"story": name, "traced": False, "rep": rep, **client_figures(res, srv.log_since(mark))})
    for rep in range(P["reps"]):
        mark = srv.log_mark()
        (tr, *_), res = srv.traced(prof_dir, lambda rep=rep: send(srv, 10 * rep + 5, P))
        log = srv.log_since(mark)
        rows.append({"story": name, "traced": True, "rep": rep, **client_figures(res, log)})
        traced.append({"trace": tr, "log": log, "results": res})
        run.log(f"{name}: traced rep {rep}: TTFT {rows[-1]['ttft_ms']:.1f} ms, ITL {rows[-1]['itl_ms']:.2f} ms")
    return rows, traced


def parse_step(name: str) -> dict:
    m = sg.parse_step_name(name) or {}
    return {"mode": m.get("mode"), "bs": m.get("bs"), "toks": m.get("toks") or m.get("bs")}


def analyse_story(trace_path, log_text, cfg, pk):
    """Kernel table of a traced story with its steps joined to the scheduler log and the work of each role."""
    ev = trace.read_chrome_trace(trace_path)
    kt = timeline.step_kernels(ev, r"^step\[", outer=r"^scheduler\.run_batch$", parse=parse_step,
                               layers=cfg["num_hidden_layers"])
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

class GpuMemory:
    """GPU memory used (NVML), sampled every 100 ms while the block runs: [(epoch s, GB)]."""

    def __enter__(self):
        self.samples, self._stop = [], threading.Event()
        try:
            import pynvml
            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            read = lambda: pynvml.nvmlDeviceGetMemoryInfo(h).used / 1e9  # noqa: E731
            read()
        except Exception:  # noqa: BLE001 - no NVML: no memory curve, said in the story
            self._t = None
            return self
        self._t = threading.Thread(target=lambda: [self.samples.append((time.time(), read()))
                                                   for _ in iter(lambda: self._stop.wait(0.1), True)], daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._t:
            self._t.join()


def pressure(srv, run, P):
    """A load that fills the KV pool, plus one prompt longer than a prefill chunk; per-step log rows."""
    srv.flush_cache()
    mark = srv.log_mark()
    with GpuMemory() as mem:
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
    return rows, mem.samples, sg.bench_headline(rec)


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

def counters(args, run, model_dir, base, P, backend):
    """The server cut to 2 layers under ncu; one-step windows. Returns (summary rows, window names)."""
    log_file = run.dir / "ncu" / "ncu_log.txt"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    wrapper = ncu.build_cmd([], log_file=log_file, metrics="summary", launch_count=5000,
                            extra=["--profile-from-start", "off", "--graph-profiling", "node"])
    fl = base + sg.flags(attention_backend=backend, skip_server_warmup=True, decode_log_interval=1,
                         max_total_tokens=P["pool"], json_model_override_args={"num_hidden_layers": 2})
    windows = []
    with sg.Server(model_dir, fl, port=args.port, log_path=run.path("server_ncu.log"), wrapper=wrapper, echo=run.log,
                   start_timeout=max(args.start_timeout, 1800), env=ENV, name="server[2 layers under ncu]") as srv:
        srv.generate(input_ids=sg.random_ids(16, 1), sampling_params={**SP, "max_new_tokens": 2})

        def window(name, during, steps=1):
            srv.start_profile(run.dir / "ncu", activities=["CUDA_PROFILER"], num_steps=steps)
            during()
            srv.stop_profile()
            windows.append(name)
            run.log(f"ncu window {name} done")

        def while_decoding(n):
            reqs = [{"input_ids": sg.random_ids(P["prompt"], 60 + i), "sampling_params": {**SP, "max_new_tokens": 400}}
                    for i in range(n)]
            srv.while_decoding(reqs, lambda: window(f"decode_b{n}", lambda: time.sleep(0.5)), running=n, timeout=900)
        window("prefill_b1", lambda: srv.generate(input_ids=sg.random_ids(P["prompt"], 2),
                                                  sampling_params={**SP, "max_new_tokens": 1}))
        while_decoding(1)
        # one /generate with a list of prompts: they reach the scheduler together, so its first step is one
        # prefill batch of batch/2 requests (batch/2 x 512 = 8192 tokens = one prefill chunk)
        window(f"prefill_b{P['batch'] // 2}", lambda: srv.request("/generate", {
            "input_ids": [sg.random_ids(P["prompt"], 80 + i) for i in range(P["batch"] // 2)],
            "sampling_params": {**SP, "max_new_tokens": 1}}))
        while_decoding(P["batch"])
    return ncu.summarize(ncu.read_log(log_file, run.path("ncu/ncu.csv"))), windows


def window_specs(kt, names, P) -> list[dict]:
    """Which traced step each ncu window stands for, and which steps take its counters."""
    specs = []
    for name in names:
        mode = "EXTEND" if name.startswith("prefill") else "DECODE"
        bs = int(name.split("_b")[1])
        m = kt[(kt["mode"] == mode) & (kt["bs"] == bs)]
        if mode == "EXTEND":
            m = m[m["toks"] == bs * P["prompt"]]
        if len(m):
            step = int(m["step"].iloc[len(m) // 2]) if mode == "DECODE" else int(m["step"].iloc[0])
            match = {"mode": mode, "bs": bs} | ({"toks": bs * P["prompt"]} if mode == "EXTEND" else {})
            specs.append({"name": name, "step": step, "match": match})
    return specs


# ------------------------------------------------------------------ analysis and verdicts

def gemm_efficiency(kt, pk) -> list[dict]:
    """Per step kind and GEMM role: achieved TFLOP/s and TB/s (traced time), % of the ceilings, the counters."""
    rows = []
    gem = kt[kt["role"].isin(timeline.GEMM_ROLES + ("lm_head",)) & kt["flops"].notna()]
    for (mode, bs, role), g in gem.groupby(["mode", "bs", "role"], sort=False):
        intensity = float((g["flops"] / g["bytes"]).median())
        ridge = pk["bf16_tflops"] / pk["dram_tb_s"] if pk.get("dram_tb_s") else math.nan
        rows.append({"mode": mode, "bs": bs, "role": role, "kernels": len(g), "time_us": float(g["dur_us"].median()),
                     "tflop_s": float(g["tflop_s"].median()), "pct_bf16_ceiling": float(g["pct_bf16_ceiling"].median()),
                     "tb_s": float(g["tb_s"].median()), "pct_dram_ceiling": float(g["pct_dram_ceiling"].median()),
                     "flop_per_byte": intensity, "ridge": ridge,
                     "bound_by_intensity": "memory" if intensity < ridge else "compute",
                     "tensor_pct": _med(g, "tensor_pct"), "dram_pct": _med(g, "dram_pct"), "grid": _first(g, "grid"),
                     "split_k": bool(kt[(kt["mode"] == mode) & (kt["bs"] == bs) & (kt["role"] == role)]["kernel"]
                                     .str.contains("splitK").any()),
                     "why": ""})
    for r in rows:
        r["why"] = ("memory-bound: intensity below the ridge, the weights stream from DRAM" if r["bound_by_intensity"] ==
                    "memory" else "compute-bound: tensor cores") + (" (split-K + reduce kernel)" if r["split_k"] else "")
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
    dec = one[(one["mode"] == "DECODE") & (one["role"] == "gate_up_proj") & one["pct_dram_ceiling"].notna()]
    run.judge(H["decode_gemm"], list(dec["pct_dram_ceiling"]), evidence="kernels_one.csv: gate_up GEMM of every layer "
              "and decode step (traced time, weight bytes from common.flops)")
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


# ------------------------------------------------------------------ outputs

def write_story(run, data, pk, backend_why):
    """Tables, Perfetto traces, figures and the text tree."""
    for name in ("one", "batch"):
        kt, spans = data[f"kt_{name}"], data[f"spans_{name}"]
        run.table(f"kernels_{name}", kt)
        run.table(f"steps_{name}", spans)
        reqs = [{"id": i, "phases": [("queued", r["client"]["t_send"] * 1e6 - data[f"base_{name}"],
                                       (r["meta_info"].get("forward_entry_time") or r["client"]["t_send"]) * 1e6 - data[f"base_{name}"]),
                                      ("prefill -> first token", (r["meta_info"].get("forward_entry_time") or 0) * 1e6 - data[f"base_{name}"],
                                       (r["client"].get("t_first") or 0) * 1e6 - data[f"base_{name}"]),
                                      ("decode", (r["client"].get("t_first") or 0) * 1e6 - data[f"base_{name}"],
                                       r["client"]["t_done"] * 1e6 - data[f"base_{name}"])]}
                for i, r in enumerate(data[f"results_{name}"]) if "error" not in r]
        counters_ = {"running": [(s["start_us"], s.get("running_req")) for s in spans],
                     "queued": [(s["start_us"], s.get("queue_req")) for s in spans],
                     "token usage": [(s["start_us"], s.get("token_usage")) for s in spans]}
        meta = timeline.write_perfetto_fit(run.path(f"story_{name}.json"), kt, steps=spans, requests=reqs,
                                           counters=counters_)
        run.log(f"story_{name}.json: {meta['kernels']} kernels of {meta['steps_kept']} steps"
                + (f" (steps left out to stay under 5 MB: {len(meta['steps_left_out'])})" if meta["steps_left_out"] else ""))
    # the rest is written by the caller (tables of the pressure/cache phases, figures, tree)


def check(args):
    """Everything that can fail before a GPU is touched: packages, GPU, ncu, values, the model dir."""
    sg.require_stack()
    if args.ncu:
        from common.checks import require_tool
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
        obs_one, data["traced_one"] = serve_story(srv, run, "one", one_request, P, prof)
        obs_b, data["traced_batch"] = serve_story(srv, run, "batch", batch_requests, P, prof)
        data["observer"] = obs_one + obs_b
        data["pressure"], data["mem"], data["bench"] = pressure(srv, run, P)
        data["cache"] = cache_story(srv, run, P)
        data["server_args"] = next((l for l in srv.log_since(0).splitlines() if "server_args=" in l), "")
    return data


def analyse(run, data, cfg) -> None:
    """The joined tables of the last traced run of each story (with the counters when ncu ran); per-run
    scalars of every traced run."""
    pk = data["pk"]
    for name in ("one", "batch"):
        last = data[f"traced_{name}"][-1]
        kt, spans, base_us, info = analyse_story(last["trace"], last["log"], cfg, pk)
        data.update({f"kt_{name}": kt, f"spans_{name}": spans, f"base_{name}": base_us,
                     f"results_{name}": last["results"], f"join_{name}": info})
    shares = []
    for t in data["traced_one"]:
        ev = trace.read_chrome_trace(t["trace"])
        kt = timeline.step_kernels(ev, r"^step\[", outer=r"^scheduler\.run_batch$", parse=parse_step)
        pre = kt[kt["mode"] == "EXTEND"]
        shares.append(100 * pre[pre["cls"] == "attention"]["dur_us"].sum() / pre["dur_us"].sum())
    data["attention_shares"] = shares
    if data.get("windows"):
        rows = ncu.summarize(ncu.read_raw(run.dir / "ncu" / "ncu.csv"))
        for name in ("one", "batch"):
            data[f"kt_{name}"], info = timeline.attach_counters(data[f"kt_{name}"], rows,
                                                                 window_specs(data[f"kt_{name}"], data["windows"], data["P"]))
            run.table(f"ncu_windows_{name}", info)
            run.log(f"counters on {name}: " + ", ".join(f"{i['window']} {i['matched']}/{i['expected']}" for i in info))


RAW = ("P", "observer", "pressure", "mem", "bench", "cache", "server_args", "windows", "backend_why", "pk",
       "server_flags", "quick")


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
    run.json("raw", raw)


def load_raw(folder: Path) -> dict:
    """The recorded files of an earlier run (see save_raw) as the ``data`` of measure()."""
    raw = json.loads((folder / "raw.json").read_text())
    data = {k: raw.get(k) for k in RAW}
    for name in ("one", "batch"):
        data[f"traced_{name}"] = [{"trace": folder / t["trace"], "log": (folder / t["log"]).read_text(),
                                   "results": t["results"]} for t in raw[f"traced_{name}"]]
    return data


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.reanalyse:
        return reanalyse(args)
    P, model_dir, base, cfg = check(args)
    backend, backend_why = backend_choice()
    with Run(__file__, args, out=args.out) as run:
        pk = gpu.peaks()
        run.log(f"{pk['gpu']}: ceilings DRAM {pk['dram_tb_s']:.2f} TB/s, bf16 {pk['bf16_tflops']:.0f} TFLOP/s "
                f"({pk.get('source')}); attention backend: {backend_why}")
        data = measure(args, run, P, model_dir, base, backend, backend_why)
        data.update(backend_why=backend_why, pk={k: pk.get(k) for k in ("gpu", "dram_tb_s", "bf16_tflops", "source")},
                    windows=[])
        if args.ncu:
            rows, data["windows"] = counters(args, run, model_dir, base, P, backend)
        save_raw(run, data)
        analyse(run, data, cfg)
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
    with Run(__file__, args, out=args.out) as run:
        run.reanalysis_of(prev, src)
        if data["windows"]:
            import shutil
            shutil.copyfile(src / "ncu" / "ncu.csv", run.path("ncu/ncu.csv"))
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
    judge_all(run, data)
    run.headline(**{f"{r['mode'].lower()}_b{r['bs']}_{r['role']}_pct_of_ceiling": round(
        r["pct_bf16_ceiling"] if r["bound_by_intensity"] == "compute" else r["pct_dram_ceiling"], 1) for r in eff
        if r["role"] in ("gate_up_proj", "lm_head")})
    for name, fig in figures(data, trees, pk).items():
        run.figure(name, fig)
    first = (sg.config_line(data["server_flags"], ENV, bool(data.get("quick"))) if data.get("server_flags") else
             "server configuration: not recorded (a recording made before the server_flags field)")
    run.story(first + "\n" + story_text(data, trees, eff, pk, backend_why), echo=True)


def figures(data, trees, pk) -> dict:
    """The joined timeline, the layer tree, pressure and the cache over time (matplotlib, no display)."""
    from common import plots
    out = {"timeline": plots.joined_timeline(data["kt_one"], data["spans_one"], title=f"One request — {pk['gpu']}"),
           "layer_tree": plots.layer_tree([t for t in trees if t["story"] == "one"], pk)}
    out["pressure"] = pressure_figure(data["pressure"], data["mem"])
    out["cache"] = cache_figure(data["cache"], data["P"])
    return out


def pressure_figure(rows, mem):
    """Batch dynamics per scheduler step (running, queued, token usage, prefill marks) over GPU time per step."""
    from common.plots import _plt
    plt = _plt()
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True)
    steps = [r for r in rows if r["kind"] in ("prefill", "decode")]
    # start at the load: after the longest idle gap (the benchmark client's own start-up) when there is one
    gaps = [(b["ts"] - a["ts"], i + 1) for i, (a, b) in enumerate(zip(steps, steps[1:]))]
    cut = max(gaps)[1] if gaps and max(gaps)[0] > 2.0 else 0
    steps = steps[cut:]
    t0 = steps[0]["ts"] if steps else 0
    rows = [r for r in rows if r["ts"] >= t0]
    t = [r["ts"] - t0 for r in steps]
    a1.plot(t, [r.get("running_req") for r in steps], label="running", color="tab:blue")
    a1.plot(t, [r.get("queue_req") for r in steps], label="queued", color="tab:orange")
    for r in rows:
        if r["kind"] == "retract":
            a1.axvline(r["ts"] - t0, color="tab:red", lw=0.8)
        elif is_chunk(r):
            a1.axvline(r["ts"] - t0, color="tab:purple", lw=0.8, ls=":")
    ax = a1.twinx()
    ax.plot(t, [r.get("token_usage") for r in steps], color="tab:green", lw=0.8)
    ax.set_ylabel("token usage", color="tab:green")
    a1.set_ylabel("requests")
    a1.legend(fontsize=7, loc="upper left", title="red: retraction, purple: chunked prefill", title_fontsize=7)
    a2.scatter(t, [min(r.get("step_wall_ms") or 0, 1000) for r in steps], s=3,
               c=["tab:red" if r["kind"] == "prefill" else "tab:blue" for r in steps])
    a2.set_ylabel("step wall time (ms)\nred: prefill")
    mem = [m for m in mem or [] if m[0] >= t0]
    if mem:
        ax2 = a2.twinx()
        ax2.plot([m[0] - t0 for m in mem], [m[1] for m in mem], color="grey", lw=0.8)
        ax2.set_ylabel("GPU memory used (GB)", color="grey")
    a2.set_xlabel("time since the load's first scheduler step (s)")
    return fig


CHUNK = 8192     # SGLang's default chunked_prefill_size on H100/H200 (the server_args line of server.log says so)


def is_chunk(row) -> bool:
    """A scheduler line that is one chunk of a prompt longer than a prefill chunk: one new request whose new
    tokens fill the whole chunk."""
    return row["kind"] == "prefill" and row.get("new_seq") == 1 and (row.get("new_token") or 0) >= CHUNK


def cache_figure(cache, P):
    """Per request of the cache phase: cached vs new prompt tokens, coloured by hit / miss / evicted."""
    from common.plots import _plt
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
           (f"{ms(mi.get('api_server_dispatch_finish_ts'))}  tokenized, sent to the scheduler", []),
           (f"{ms(mi.get('forward_entry_time'))}  enters a forward batch (queued {f((mi.get('queue_time') or 0) * 1e3)} ms)", [])]
    for mode in ("EXTEND", "DECODE"):
        tr = [x for x in trees if x["story"] == "one" and x["mode"] == mode]
        if not tr:
            continue
        kids = [(f"{x['segment']:5s} {x['role']:13s} {x['kernel'][:38]:38s} {f(x['time_us'])} us "
                 f"({f(x['share_all_layers_pct'])}% of step{' x32 layers' if x['segment'] == 'layer' else ''})"
                 + (f" · {f(x['tflop_s'])} TFLOP/s = {f(x['pct_bf16_ceiling'])}% bf16" if _ok(x.get('tflop_s')) and (x.get('tflop_s') or 0) > 20 else "")
                 + (f" · {f(x['tb_s'])} TB/s = {f(x['pct_dram_ceiling'])}% DRAM" if _ok(x.get('tb_s')) and (x.get('tb_s') or 0) > 0.5 else "")
                 + (f" · ncu: DRAM {f(x['dram_pct'])}% SM {f(x['sm_pct'])}% TC {f(x['tensor_pct'])}% occ "
                    f"{f(x['occupancy_pct'])}% ({x.get('limiter')}); {x.get('top_stalls')}" if _ok(x.get("dram_pct")) else ""),
                 []) for x in tr if x["segment"] == "layer" or x["role"] in ("embedding", "final_norm", "lm_head")
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
    items.append((f"one request — attention backend: {backend_why}", req))
    obs = data["observer"]
    items.append(("observer effect (torch profiler; medians of the repetitions)", [
        (f"{s}: TTFT {f(statistics.median(r['ttft_ms'] for r in obs if r['story'] == s and not r['traced']))} ms untraced vs "
         f"{f(statistics.median(r['ttft_ms'] for r in obs if r['story'] == s and r['traced']))} ms traced; ITL "
         f"{f(statistics.median(r['itl_ms'] for r in obs if r['story'] == s and not r['traced']))} vs "
         f"{f(statistics.median(r['itl_ms'] for r in obs if r['story'] == s and r['traced']))} ms", [])
        for s in ("one", "batch")]))
    items.append(("GEMM efficiency (traced time; % of the measured ceiling that binds it)", [
        (f"{r['mode']} bs {r['bs']} {r['role']}: {f(r['tflop_s'])} TFLOP/s ({f(r['pct_bf16_ceiling'])}% bf16), "
         f"{f(r['tb_s'])} TB/s ({f(r['pct_dram_ceiling'])}% DRAM), {f(r['flop_per_byte'])} FLOP/B vs ridge {f(r['ridge'])}: "
         f"{r['why']}", []) for r in eff]))
    pr = data["pressure"]
    items.append((f"pressure ({data['P']['load_n']} prompts at {data['P']['load_rate']}/s, pool {data['P']['pool']} tokens)", [
        (f"max running {max((r.get('running_req') or 0) for r in pr)}, max queued {max((r.get('queue_req') or 0) for r in pr)}, "
         f"max token usage {f(max((r.get('token_usage') or 0) for r in pr))}, retractions "
         f"{sum(r.get('retracted') or 0 for r in pr if r['kind'] == 'retract')}, chunked prefill lines "
         f"{sum(1 for r in pr if is_chunk(r))}", [])]))
    items.append(("the cache over time (per request: hit / miss / evicted)", [
        (" ".join(f"{c['group']}{c['outcome'][0]}" for c in data["cache"]), [])]))
    return story.tree(f"EXECUTION STORY — {pk['gpu']} (DRAM ceiling {f(pk['dram_tb_s'])} TB/s, bf16 "
                      f"{f(pk['bf16_tflops'])} TFLOP/s)", items)


def _ok(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


if __name__ == "__main__":
    run_main(main)
