#!/usr/bin/env python3
"""08 · The joined execution story: one request from HTTP to kernels and hardware counters.

What it measures (one SGLang server, Llama-3.1-8B shapes with dummy weights, one GPU, at SGLang's
default serving configuration: CUDA graphs for prefill and decode, the default scheduler, FA3 where
sgl_kernel.flash_attn imports — else FlashInfer, and the story says which ran and why; with --quick the
KV pool is the pipeline's 32768 tokens -- the story's first line lists every change. In a --quick pipeline it runs on the pipeline's shared server when its flags are
exactly that server's (FlashInfer); where FA3 runs it starts its own beside it)
    0. Every millisecond of one request, untraced, before any profiler runs: 5 text prompts (512 characters through
       SGLang's tokenizer: 513 tokens with BOS) and 5 input_ids prompts, one at a time, each between two /metrics
       scrapes. Its TTFT from SGLang's own stamps (meta_info: request_received_ts, api_server_dispatch_finish_ts,
       forward_entry_time, queue_time, prefill_finished_time, response_sent_to_client_ts; /metrics stage
       request_process) and the client's clock: HTTP receive, tokenize + dispatch, to the scheduler, request
       processing, queue wait, prefill forward, detokenize + return, HTTP stream (common.tables.waterfall: the median
       repetition's parts, each with its spread; consecutive stamps, so they add up by construction: shown, not
       judged). The prefill forward split on the traced median repetition (batch scheduling, prep + FlashInfer plan(),
       GPU forward, sampling, the overlap scheduler's next step, result processing) and one decode step on the
       scheduler loop; traced vs untraced per part. Judged where two clocks meet: the stamps around each traced
       prefill, the scheduler's decode step against the client's ITL, the loop's ranges against its iteration
       (_sgl08_waterfall). Token IDs stay where an experiment needs exact lengths (the counters windows);
       the stories send text.
    1. Two stories: one request (512 prompt characters = 513 tokens, 64 new) and a batch of 32 such requests sent
       together. Each is served untraced (3 times: client TTFT and ITL, the scheduler's step lines) and
       traced with the torch profiler (/start_profile, 3 times). From the trace: request -> each
       scheduler step it takes part in (scheduler.run_batch, with its step[...] name and the batch the
       log line reports: new and cached tokens, running, queued, token usage) -> each layer (the
       repeating unit of the step's kernels; CUDA-graph replays joined by correlation id) -> each
       kernel and its role (QKV / O / gate-up / down GEMMs, norms, RoPE, KV store, attention + merge,
       activation; embedding, logits GEMM, sampling), with FLOPs and bytes (common.tables.flops) and the
       rate its traced time gives, as % of this GPU's measured ceilings (_sgl08_stories).
    1b. A decode step at the batch 01's pressure load plateaus at (_sgl01_pressure.plateau on this server's pool: 63
       with --quick): that many requests of the load's shape sent at once, 6 decode steps traced once they all decode.
       The floor of each traced step (_sgl08_floors): each kernel's minimum bytes over the measured DRAM read ceiling
       or its FLOPs over the measured bf16 ceiling, whichever is longer, summed, beside the step's traced period;
       the rest split into GEMM and attention kernels below their ceiling, small kernels, GPU idle inside the step
       and CPU work the overlap scheduler does not hide: the prefill, the batch-1 decode step, the batch story's and
       the loaded step. The one-request story on two lanes (_sgl08_lanes): CPU (stamps, scheduler ranges) and GPU
       (kernels by layer) on one millisecond axis, SGLang's stamps marked.
    2. The observer effect: TTFT, ITL and the decode step time traced vs untraced, in %.
    3. Counters: the same configuration with the model cut to 1 layer (shapes unchanged) under Nsight
       Compute (--graph-profiling node: kernels inside CUDA graphs are profiled one by one), one-step
       windows opened by /start_profile CUDA_PROFILER: prefill of one request (input_ids: nothing cached, FlashInfer
       ragged only), the same as text after another text prompt (its BOS cached: ragged + paged + merge), a decode
       step at batch 1 and one at batch 32 (the batch's prefill steps vary from run to run: no window matches
       them, so they stay without counters and the page says so). Every kernel of the traced steps gets the
       counters of its position (common.tables.timeline.attach_counters; where the cut model runs another kernel there,
       those of the same kernel at the same grid in its layer): time, DRAM / SM / tensor %, occupancy and its
       limiter, top warp stalls. The counters' server is launched with the run and held by a gate (_sgl_gate)
       after its imports until phases 0-2 are done with the GPU; the traces are joined while ncu replays
       (_sgl08_counters). The transitions inside the story as events: prefill -> decode, and with the counters the
       cache's cold -> warm prefill.
    Elsewhere: the scheduler under a load that fills the KV pool is 01's (its pressure load), the cache over time
    (a round-robin over more prefixes than the pool holds) 02's, the GPU's own counters over a served timeline
    (nsys GPU metrics) 04's.

What the plan expected (hypotheses; each is judged on an interval of repeated measurements)
    * decode at small batch is bound by reading the weights: its GEMMs stream them near the DRAM ceiling (judged
      here, on each layer's traced GEMM time: no CPU gap between steps enters it, as it does 01's ITL);
    * prefill GEMMs (512 tokens) run on tensor cores near the bf16 ceiling; attention is a small share at
      512 tokens (the A100 plan said ~45%: a hypothesis for long prompts; judged here, beside the GEMMs of the
      same traced prefill step);
    * the profiler changes what it watches by little: traced step times within 5% of untraced.

Run
    python sglang/scripts/08_execution_story.py --quick          # phases 0-2 (no counters), ~2 min warm
    python sglang/scripts/08_execution_story.py --quick --ncu    # + phase 3: the counters (needs ncu)
    python sglang/scripts/08_execution_story.py --ncu            # plan scale: 5 repetitions
Writes sglang/results/08_execution_story/: kernels_<story>.csv (and kernels_loaded.csv), steps_<story>.csv,
layer_tree.csv, class_shares.csv, gemm_efficiency.csv, floors.csv, observer.csv, ncu_windows_<story>.csv,
waterfall.csv, transitions.csv, story_<story>.json (open in https://ui.perfetto.dev: kernels, steps, each request's
waterfall, counters, transitions as instants), timeline.png, layer_tree.png, two_lanes.png, server logs, raw.json
(for --reanalyse), story.txt, summary.json (with the findings: sentences written from the run's figures).
"""
from __future__ import annotations

import contextlib
import json
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _sglang as sg  # noqa: E402
from _sgl08_counters import COUNTER_LAYERS, counters, counters_server, join_counters, transitions  # noqa: E402
from _sgl08_floors import floor_findings, floor_items, floor_rows, loaded_window  # noqa: E402
from _sgl08_lanes import lanes_figure  # noqa: E402
from _sgl08_stories import (  # noqa: E402
    ENV, SP, analyse_story, batch_requests, gemm_efficiency, known, layer_trees, median_traced, one_request,
    prefetch, serve_story, story_events, story_findings, write_story
)
from _sgl08_waterfall import waterfall_phase, waterfall_text, waterfalls, wrapped, write_waterfalls  # noqa: E402
from common.base import story  # noqa: E402
from common.base.checks import run_main, SetupError  # noqa: E402
from common.capture import ceilings, models  # noqa: E402
from common.capture.store import load_summary  # noqa: E402
from common.tables import kernels, timeline  # noqa: E402
from common.judge.verdicts import declare  # noqa: E402
from common.run import cli, recording  # noqa: E402
from common.run.results import Run  # noqa: E402


QUICK = dict(reps=3, prompt=512, new=64, batch=32, pool=sg.QUICK_POOL_TOKENS)
FULL = dict(reps=5, prompt=512, new=64, batch=32, pool=65536)

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
""")


def parse_args(argv=None):
    p = cli.parser(__file__, __doc__, quick="3 repetitions per story (the full run: 5)")
    p.add_argument("--ncu", action="store_true", help="phase 3: every kernel of the traced steps on the Nsight Compute "
                   "counters (a second server, cut to 1 layer, under ncu, started with the run and held until the GPU is free)")
    p.add_argument("--reanalyse", metavar="DIR", default=None, help="no GPU, no server: redo the analysis from the "
                   "files an earlier run recorded in DIR (e.g. a copy of sglang/results/08_execution_story)")
    p.add_argument("--pool", type=cli.positive_int, default=None, help="--max-total-tokens of the servers (default "
                   "32768 quick: the pipeline's shared server; 65536 full): the counters' server, cut to 1 layer, "
                   "allocates no more than this beside the stories' one")
    sg.add_model_args(p, backend_default=None)
    return p.parse_args(argv)


def backend_choice() -> tuple[str | None, str]:
    """(--attention-backend to pass, or None for SGLang's own default; why)."""
    ok, why = sg.fa3_usable()
    if ok:
        return None, "SGLang's default on Hopper (FA3: sgl_kernel.flash_attn imports)"
    return "flashinfer", f"FlashInfer: SGLang's Hopper default (FA3) cannot run here ({why})"


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
    """Phases 0-2 on one server: the waterfall, then the two stories (untraced, traced)."""
    prof = run.dir / "profiles"
    _, fl = server_flags(args, P, backend)
    data = {"P": P, "server_flags": fl, "quick": bool(args.quick)}
    with sg.server(run, model_dir, fl, quick=args.quick, env=ENV, port=args.port, start_timeout=args.start_timeout,
                   own_why=f"attention backend: {backend_why}" if backend is None else "") as srv:
        check = srv.generate(input_ids=sg.random_ids(16, 0), sampling_params={**SP, "max_new_tokens": 8})
        if check["meta_info"]["completion_tokens"] != 8:
            raise RuntimeError(f"sanity request came back wrong: {check['meta_info']}")
        run.log("sanity: 8 tokens back ✅  Starting the stories.")
        data["waterfall"] = waterfall_phase(srv, run, P)
        obs_one, data["traced_one"], data["untraced_one"] = serve_story(srv, run, "one", one_request, P, prof)
        obs_b, data["traced_batch"], data["untraced_batch"] = serve_story(srv, run, "batch", batch_requests, P, prof)
        data["observer"] = obs_one + obs_b
        try:                 # a decode step at the batch 01's pressure load plateaus at (the floors' third step)
            data["traced_loaded"] = loaded_window(srv, P, bool(args.quick), prof)
            run.log(f"loaded window: {data['traced_loaded']['batch']} requests, traced")
        except Exception as e:  # noqa: BLE001 - the stories stand; the floors say "not observed"
            data["loaded_error"] = f"{e.__class__.__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            run.note(f"loaded window skipped: {data['loaded_error']}")
        data["server_args"] = next((l for l in srv.log_since(0).splitlines() if "server_args=" in l), "")
    return data


def trace_tables(data, cfg) -> dict:
    """The traced stories' tables, without counters: the join of the last traced run of each story, per-run
    attention shares and the waterfalls. Reads ``data``, changes nothing in it (returns the new keys): safe in a
    thread while the counters run (main)."""
    pk = ceilings.complete(data["pk"])
    out = {"pk": pk}
    lw = data.get("traced_loaded")
    batch = data["traced_batch"]
    prefetch([t["trace"] for t in data["traced_one"]] + ([batch[median_traced(batch)]["trace"]] if batch else [])
             + ([lw["trace"]] if lw else []))              # every trace read below, read side by side
    for name in ("one", "batch"):
        out[f"pick_{name}"] = pick = median_traced(data[f"traced_{name}"])
        last = data[f"traced_{name}"][pick]
        kt, spans, base_us, info = analyse_story(last["trace"], last["log"], cfg, pk)
        out.update({f"kt_{name}": kt, f"spans_{name}": spans, f"base_{name}": base_us,
                    f"results_{name}": last["results"], f"join_{name}": info})
    if lw:
        out["kt_loaded"], out["spans_loaded"], _b, _i = analyse_story(lw["trace"], lw["log"], cfg, pk)
        out["loaded_info"] = {k: lw[k] for k in ("batch", "pool", "prompt", "new")}
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
    if data.get("windows"):
        join_counters(run, data)
    data["transitions"] = transitions(data)     # after the counters: prefill -> decode names their change


PK_KEYS = ("gpu", "dram_tb_s", "dram_read_tb_s", "dram_mixed_tb_s", "dram_copy_tb_s", "dram_write_tb_s", "bf16_tflops",
           "bf16_sm_mhz", "l2_mb", "source")      # the ceilings a recording keeps (a re-analysis divides by them)
# what raw.json keeps of a run; a recording made before the pressure load moved to 01, the cache over time to 02 and
# the GPU metrics to 04 also holds "pressure", "mem", "bench", "cache", "startup_log" and "gpu_metrics": not read here
RAW = ("P", "observer", "server_args", "windows", "ncu_layers", "backend_why", "pk", "waterfall", "server_flags",
       "quick", "loaded_error")


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
    lw = data.get("traced_loaded")
    if lw:
        run.path("logs/loaded.log").write_text(lw["log"])
        raw["traced_loaded"] = {**{k: lw[k] for k in ("batch", "pool", "prompt", "new")},
                                "trace": str(Path(lw["trace"]).relative_to(run.dir)), "log": "logs/loaded.log"}
    run.json("raw", raw)


def load_raw(folder: Path) -> dict:
    """The recorded files of an earlier run (see save_raw) as the ``data`` of measure()."""
    raw = json.loads((folder / "raw.json").read_text())
    data = {k: raw.get(k) for k in RAW}
    for name in ("one", "batch"):
        data[f"traced_{name}"] = [{"trace": folder / t["trace"], "log": (folder / t["log"]).read_text(),
                                   "results": t["results"]} for t in raw[f"traced_{name}"]]
        data[f"untraced_{name}"] = [{"log": (folder / u["log"]).read_text()} for u in raw.get(f"untraced_{name}") or []]
    lw = raw.get("traced_loaded")
    if lw:
        data["traced_loaded"] = {**lw, "trace": folder / lw["trace"], "log": (folder / lw["log"]).read_text()}
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
                run.log("phases 0-2 done: the server under ncu may use the GPU now; the traced stories are joined "
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
        keep += [raw["traced_loaded"][k] for k in ("trace", "log")] if raw.get("traced_loaded") else []
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
    write_story(run, data)
    trees = layer_trees(data)
    run.table("layer_tree", trees)
    run.table("class_shares", pd.concat([timeline.class_shares(data[f"kt_{n}"]).assign(story=n) for n in ("one", "batch")]))
    eff = gemm_efficiency(pd.concat([data["kt_one"], data["kt_batch"]]), pk)
    run.table("gemm_efficiency", eff)
    run.table("observer", data["observer"])
    write_waterfalls(run, data["wf"])
    sg.table(run, "transitions", data["transitions"])
    floors = floor_rows(data, pk)
    sg.table(run, "floors", floors)
    if data.get("kt_loaded") is not None:
        run.table("kernels_loaded", data["kt_loaded"])
    judge_all(run, data)
    for text in story_findings(data, trees, eff) + floor_findings(floors, data):
        run.finding(text)
    run.headline(**{f"{r['mode'].lower()}_b{r['bs']}_{r['role']}_pct_of_ceiling": round(
        r["pct_bf16_ceiling"] if r["bound_by_intensity"] == "compute" else r["stream_pct"], 1) for r in eff
        if r["role"] in ("gate_up_proj", "lm_head")})
    for name, fig in figures(run, data, trees, pk).items():
        run.figure(name, fig)
    first = (sg.config_line(data["server_flags"], ENV, bool(data.get("quick"))) if data.get("server_flags") else
             "server configuration: not recorded (a recording made before the server_flags field)")
    run.story(first + "\n" + story_text(data, trees, eff, pk, backend_why, floors), echo=True)


def figures(run, data, trees, pk) -> dict:
    """The joined timeline, the layer tree and the request on two lanes (matplotlib, no display)."""
    from common.render import plots
    out = {"timeline": plots.joined_timeline(data["kt_one"], data["spans_one"], title=f"One request — {pk['gpu']}"),
           "layer_tree": plots.layer_tree([t for t in trees if t["story"] == "one"], pk)}
    lanes = run.optional("the two-lane figure", lanes_figure, data, pk["gpu"])
    if lanes is not None:
        out["two_lanes"] = lanes
    return out


def judge_all(run, data):
    """Every verdict of the run, each on the interval of its repeated measurement."""
    one, obs = data["kt_one"], data["observer"]
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


def story_text(data, trees, eff, pk, backend_why, floors=()) -> str:
    """The text tree: the waterfalls, then request -> steps -> one layer -> kernels with counters, the observer
    effect, the GEMMs' efficiency and the transitions."""
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
        for s in ("one", "batch")]))
    served = [r["sm_mhz"] for r in obs if r.get("traced") and r.get("sm_mhz")]
    clock = (f"; served at SM {f(statistics.median(served))} MHz (NVML), the bf16 ceiling was reached at "
             f"{f(pk.get('bf16_sm_mhz'))} MHz" if served and pk.get("bf16_sm_mhz") else "")
    items.append(("GEMM efficiency (kernel time, traced; the ceiling that binds each: bf16 above the ridge, the DRAM "
                  f"read ceiling below it{clock})", [
        (f"{r['mode']} bs {r['bs']} {r['role']}: {f(r['tflop_s'])} TFLOP/s = {f(r['pct_bf16_ceiling'])}% of the bf16 "
         f"ceiling; weights effective {f(r['eff_tb_s'])} TB/s" + (f" = {f(r['stream_pct'])}% of the DRAM read ceiling"
                                                                 if known(r.get("stream_pct")) else "")
         + f"; {f(r['flop_per_byte'])} FLOP/B vs ridge {f(r['ridge'])}: {r['why']}", []) for r in eff]))
    items[:0] = waterfall_text(data["wf"])
    items += floor_items(list(floors), data)
    items.append(("transitions as events (transitions.csv; instants in the Perfetto traces)",
                  [wrapped(x["text"]) for x in data.get("transitions", [])[:40]]
                  + ([(f"... {len(data['transitions']) - 40} more in transitions.csv", [])]
                     if len(data.get("transitions", [])) > 40 else [])))
    return story.tree(f"EXECUTION STORY — {pk['gpu']} ({ceilings.ceiling_text(pk, 'dram_read_tb_s', short=True)}, bf16 "
                      f"{f(pk['bf16_tflops'])} TFLOP/s" + (f" at SM {f(pk['bf16_sm_mhz'])} MHz" if pk.get("bf16_sm_mhz")
                                                           else "") + ")", items)


if __name__ == "__main__":
    run_main(main)
