#!/usr/bin/env python3
"""08 · One forward of mini-SGLang, joined: steps -> layers -> kernels -> FLOPs/bytes -> hardware counters, eager vs
CUDA graphs, overlap scheduling on and off.

What it measures
    mini-SGLang's offline LLM (llm/llm.py:28-37: the Scheduler itself, in offline mode) on a local Llama-3.1-8B
    config (common.capture.models) with dummy weights (use_dummy_weight, engine/config.py:28), attention_backend "fi"
    (FlashInfer; the lent GPU node's sgl_kernel has no FA3; --backend fa where sgl_kernel.flash_attn imports), in one
    process, the same generate (--batch prompts of --prompt-len tokens, then decode steps, ignore_eos) in up to four
    variants, switched in place between generates:
      eager             no CUDA graphs: graph_runner.max_graph_bs = 0, the value cuda_graph_max_bs=0 leaves
                        (engine/graph.py:64-65, :98); can_use_cuda_graph (engine/graph.py:149-150) is then False for
                        every batch, so Engine.forward_batch runs model.forward() (engine/engine.py:191-197) and
                        pad_batch (engine/graph.py:160-166) pads nothing: the path of an engine started with
                        cuda_graph_max_bs=0
      graph             decode replayed from the CUDA graphs captured at start (engine/graph.py:105-147,
                        engine/engine.py:194-195), captured for the batch sizes this run decodes (cuda_graph_bs,
                        engine/config.py:23; the engine's default captures 1, 2, 4, 8 ... 256: engine/graph.py:49-67)
      *-no-overlap      overlap scheduling off: ENV.DISABLE_OVERLAP_SCHEDULING (env.py:69, the variable
                        MINISGL_DISABLE_OVERLAP_SCHEDULING) is read by Scheduler.run_forever at every generate
                        (scheduler/scheduler.py:121-131, llm/llm.py:90): normal_loop (scheduler/scheduler.py:108-118)
                        instead of overlap_loop (scheduler/scheduler.py:83-106)
    (file:line: minisgl/ at commit 20fcd7f)
    Every engine step runs inside a range step[prefill|decode bs= pad= tokens=] with CUDA events on the engine
    stream (a wrapper around Engine.forward_batch): its GPU time and the GPU idle before it. mini-SGLang's own
    NVTX ranges (Layer_i, MHA, MLP: utils/torch_utils.py:23-37) are routed into torch.profiler (_msgl.mirror_nvtx).
    1. timed: each variant's generate 3 times, the variants interleaved: decode step GPU time, the GPU gap between
       decode steps, wall time per step; and 3 prompts sharing a 1024-token prefix with an earlier one (the radix
       cache in the engine: cached_len, prefill time).
    2. traced: each variant once under torch.profiler (common.tables.trace.capture_calls) -> the kernel table of every step
       (common.tables.trace.step_kernels: kernels joined to their step by correlation id, CUDA-graph replays included;
       layers from the repeating unit of the kernel names, common.tables.trace.assign_layers, checked against
       mini-SGLang's Layer_i ranges in eager steps) -> roles (QKV / O / gate-up / down GEMMs, norms, RoPE, KV store,
       attention, activation; embedding, final norm, logits, sampling) -> FLOPs and bytes of each role
       (common.tables.timeline.add_work with common.tables.flops.layer_work) -> TFLOP/s, TB/s and % of the measured ceilings. The
       traced generate's decode steps against the timed ones give the profiler's own cost (headline observer_pct_*).
    3. counters (--ncu, and the full run): this script again with the model cut to 2 layers of unchanged shapes
       (config num_hidden_layers=2), eager, under Nsight Compute (common.capture.ncu.profile, --profile-from-start off:
       cudaProfilerStart/Stop around its prefill step and one decode step). Every kernel of the two windows is
       aligned kernel by kernel with a traced step of the same kind, and its counters (time, DRAM / SM / tensor %,
       occupancy and its limiter, top warp stalls) go to every layer of every traced step of that kind
       (common.tables.timeline.attach_counters): every kernel class of a layer on the counters.
    --nsys: the eager generate again under Nsight Systems (kernel and NVTX tables).
    Every millisecond of one generate (5 generates of one 512-character text prompt, untraced, the graph variant):
       mini-SGLang records no time stamps of its own, so the script wraps, for these generates only, receive_msg
       (the tokenizer), _schedule_next_batch, attn_backend.prepare_metadata, _forward, FlashInfer's plan(),
       _process_last_data and send_result (perf_counter before and after): the TTFT from generate() to the first
       token handed over, and one decode step as the overlap loop spends it (common.tables.waterfall: the median generate
       with each part's spread; the 5% add-up check on the decode step, whose loop time is not stamped). No HTTP,
       detokenizer process or queue here.

What the plan expected (hypotheses: H_* below, judged on 3 repetitions or on every traced step / layer)
    * Per layer ~10 kernels in a fixed order: norm, QKV GEMM, RoPE, store_kv_cache, attention (+ merge
      when KV is split), O GEMM, fused add-norm, gate/up GEMM, activation, down GEMM.
    * Layer ranges in eager steps, none inside graph replays; one FlashInfer plan sync per step;
      small GPU gaps between steps with overlap scheduling, larger without.
    * CUDA graphs make a decode step cheaper than eager launches (no plan figure: restated as >= 5% less time).
    * A shared prefix shows up as cached_len and a shorter prefill.
    * Per-kernel hardware state through a whole forward (every kernel class of a layer on the counters).

Run (one LLM per process, created before any CUDA call; gloo binds 127.0.0.1:2333, so one at a time)
    python mini-sglang/scripts/08_forward_timeline.py --quick        # ~2 min: eager, graph, graph-no-overlap
    python mini-sglang/scripts/08_forward_timeline.py --quick --ncu  # + the counters of every kernel class (~+2 min)
    python mini-sglang/scripts/08_forward_timeline.py                # all four variants, 32 decode steps, counters
    python mini-sglang/scripts/08_forward_timeline.py --quick --nsys # + Nsight Systems tables of the eager run
    python mini-sglang/scripts/08_forward_timeline.py --quick --batch 8 --variants eager,graph
    ./mini-sglang/scripts/ncu_profile.sh --kernel 'nvjet|Norm|BatchPrefill' --count 40 -- \\
        python mini-sglang/scripts/08_forward_timeline.py --ncu-target --quick     # a 2-layer forward, any ncu set
    python mini-sglang/scripts/08_forward_timeline.py --reanalyse DIR --out OUT  # no GPU: the analysis again from DIR
Writes mini-sglang/results/08_forward_timeline/: steps.csv, prefix.csv, kernels_<variant>.csv, layer_check.csv,
layer_tree.csv, class_shares.csv, waterfall.csv, traced_steps.csv, ncu_windows.csv and ncu/ (with counters), nsys_kernels.csv / nsys_nvtx.csv
(--nsys), story_<variant>.json (Perfetto: open in https://ui.perfetto.dev, <= 5 MB), trace_<variant>.json,
timeline.png, layer_tree.png, variants.png, story.txt, summary.json.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _msgl  # noqa: E402
from _msgl import REPEATS  # noqa: E402
from _msgl_forward import Forward, MAX_SEQ, measure, model_dir, PREFIX, TAIL, target, VARIANTS  # noqa: E402
from _msgl_joined import analyse, observer, per_generate  # noqa: E402
from _msgl_waterfall import judge_waterfall, WATERFALL_REPS, waterfall_from_rows, waterfall_items  # noqa: E402
from common.base import story  # noqa: E402
from common.base.checks import require_gpu, require_module, run_main  # noqa: E402
from common.capture import ceilings, models, ncu, nsys  # noqa: E402
from common.tables import kernels, ncu_pass, timeline, trace  # noqa: E402
from common.judge.verdicts import declare  # noqa: E402
from common.render import plots  # noqa: E402
from common.run import cli, recording  # noqa: E402
from common.run.results import Run  # noqa: E402

# ------------------------------------------------------------------ the run, as data
QUICK = dict(variants=VARIANTS[:3], decode_steps=16, ncu=False)
FULL = dict(variants=VARIANTS, decode_steps=32, ncu=True)
CHILD_ARGS = ("quick", "model", "prompt_len", "batch", "backend")    # what the --ncu/--nsys-target child rebuilds

# ------------------------------------------------------------------ the hypotheses, as data
PLAN = "mini-sglang/reports/plan.md, expected observations 06 (the forward timeline)"
H = declare(f"""
    order = layer-order: each layer runs ~10 kernels in a fixed order: norm, QKV GEMM, RoPE, store, attention
            (+merge), O GEMM, add-norm, gate/up GEMM, act, down GEMM
        judged on: every layer of every traced step: its kernel classes in launch order (split-K reduce and merge
            folded into their GEMM / attention) equal that sequence
        source: {PLAN}: '~10 kernels per layer in a fixed order'
    ranges = layer-ranges-eager: NVTX Layer_i ranges are present in eager steps and agree with the layers found in the
            kernel names
        judged on: every traced eager step: one Layer_i range per model layer, and every kernel inside Layer_i
            assigned to layer i by common.tables.trace.assign_layers
        source: {PLAN}: 'Layer_i / MHA / MLP ranges'; PLAN.md session 2, 06 row
    no_ranges = no-ranges-in-graphs: inside a CUDA-graph replay no Layer_i range is emitted
        judged on: every traced graph decode step: 0 Layer_i ranges (premise: the step launched a CUDA graph)
        source: {PLAN}: 'no Layer_i ranges inside graph replays'
    plan_sync = plan-sync-per-step: one FlashInfer plan sync (cudaEventSynchronize) per step
        judged on: every traced step of every variant: exactly one cudaEventSynchronize inside it
        source: {PLAN}: 'one plan sync per step'; attention/fi.py:123-132
    graph = graph-vs-eager: CUDA-graph replay makes a decode step cheaper than eager launches
        judged on: eager / graph decode step GPU time (median step of each generate), {REPEATS} repetitions
        confirmed: >= 1.05
        source: {PLAN}: 'eager -> graph replay' (no figure; 'cheaper' read as >= 5% less time)
    overlap = overlap-gap: overlap scheduling keeps the GPU gap between decode steps small; without it the gap grows
        judged on: median GPU idle before a decode step, graph without overlap minus graph with overlap (us),
            {REPEATS} repetitions
        confirmed: >= 10 us
        source: {PLAN}: 'small GPU gaps with overlap, larger without'; 'larger' read as >= 10 us more per step (CUDA
            events resolve ~1 us)
    prefix = prefix-hit: a shared prefix becomes cached_len and a shorter prefill
        judged on: prefill GPU time of a prompt sharing {PREFIX} tokens with the previous one / of that previous
            prompt, {REPEATS} prefixes (premise: cached_len >= {PREFIX} every time)
        confirmed: <= 0.9
        source: mini-sglang/reports/plan.md 07 row: 'a shared prefix shows as cached_len and a shorter prefill'
            (measured in the engine here); 'shorter' read as >= 10% less time
    state = counters-every-class: per-kernel hardware state through a whole forward: every kernel class of a layer on
            the counters
        judged on: each kernel class of layer 1 in the eager prefill and decode steps has Nsight Compute counters
        source: PLAN.md session 2 (06 row: 'per-kernel state')
""")


def parse_args(argv=None):
    p = cli.parser(__file__, __doc__, quick="3 variants, 16 decode steps, no counters (~2 min)")
    p.add_argument("--ncu", action="store_true", help="the counters pass (a 2-layer model under Nsight Compute) with --quick")
    p.add_argument("--nsys", action="store_true", help="also run the eager generate under Nsight Systems (if usable)")
    p.add_argument("--model", type=cli.preset, default="llama-3.1-8b", help="architecture preset (dummy weights)")
    p.add_argument("--prompt-len", type=cli.positive_int, default=512, help="tokens per prompt")
    p.add_argument("--batch", type=cli.positive_int, default=1, help="prompts decoded together")
    p.add_argument("--decode-steps", type=_msgl.at_least(REPEATS, "an integer", f"a verdict needs {REPEATS} repetitions"),
                   default=None, help="decode steps of each timed generate")
    p.add_argument("--variants", type=cli.choices_list(*VARIANTS), default=None,
                   help=f"variants to run (default {','.join(QUICK['variants'])} with --quick, all four otherwise)")
    p.add_argument("--backend", type=cli.choices_list("fi", "fa"), default=["fi"], help="attention backend (default fi)")
    p.add_argument("--ncu-target", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--nsys-target", action="store_true", help=argparse.SUPPRESS)
    recording.add_flag(p)
    a = p.parse_args(argv)
    if a.prompt_len + (a.decode_steps or FULL["decode_steps"]) + TAIL > MAX_SEQ:
        p.error(f"argument --prompt-len: {a.prompt_len} tokens plus the decode steps exceed max_seq_len {MAX_SEQ}")
    return a


def settings(args) -> SimpleNamespace:
    mode = QUICK if args.quick else FULL
    return SimpleNamespace(variants=tuple(args.variants or mode["variants"]), decode=args.decode_steps or
                           mode["decode_steps"], ncu=args.ncu or mode["ncu"], backend=args.backend[0])


# ------------------------------------------------------------------ phase 3: counters (a 2-layer model under ncu); nsys
# (phases 1-2 and the child: _msgl_forward; every millisecond of one generate: _msgl_waterfall)

def counters(run, args, pk):
    run.log("counters: a 2-layer model (shapes unchanged) under Nsight Compute, its prefill step and one decode step")
    res = ncu.profile(ncu_pass.target_cmd(__file__, ncu_pass.argv_of(args, CHILD_ARGS)), run.dir / "ncu",
                      metrics=kernels.SUMMARY_METRICS, extra=["--profile-from-start", "off"], echo=run.log, timeout=1500,
                      cache_control="none")       # the forward's kernels as they run: caches as the one before left them
    return kernels.summarize(res.df, peaks=pk)


def nsys_tables(run, args) -> None:
    if not nsys.find():
        run.note("nsys not usable here: the torch-profiler traces (trace_<variant>.json) are the timeline of record")
        return
    try:
        rep = nsys.profile(ncu_pass.target_cmd(__file__, ncu_pass.argv_of(args, CHILD_ARGS), "--nsys-target"),
                           run.dir / "nsys", echo=run.log, timeout=900)
        st = nsys.stats(rep, ("cuda_gpu_kern_sum", "nvtx_sum"))
        for key, name in (("cuda_gpu_kern_sum", "nsys_kernels"), ("nvtx_sum", "nsys_nvtx")):
            if key in st:
                run.table(name, trace.read_nsys_csv(st[key]))
    except Exception as e:   # the torch-profiler timeline stands
        run.point_error({"part": "nsys"}, e)


# ------------------------------------------------------------------ verdicts (the joined view they read: _msgl_joined)

def judge(run, a, variants):
    """Every verdict: the facts on every traced step / layer, the times on the 3 repetitions."""
    import pandas as pd
    order, rng = pd.DataFrame(a["order"]), pd.DataFrame(a["ranges"])
    _msgl.fact(run, H["order"], list(order["matches"]) if len(order) else [], "layer_check.csv", detail=(
        f"{len(order)} layers of {order.groupby('variant')['step'].nunique().sum()} steps; most common: "
        f"{order['sequence'].mode().iloc[0]}; other kernels: "
        f"{', '.join(sorted(set(', '.join(order['others']).split(', ')) - {''})) or 'none'}") if len(order) else
        "no layers found in the traced steps (common.tables.trace.assign_layers)")
    eager = rng[rng["variant"].str.startswith("eager")]
    _msgl.fact(run, H["ranges"], [bool(r["agree"]) and r["layer_ranges"] == r["model_layers"] for r in eager.to_dict("records")],
               "layer_check.csv", premise=True if len(eager) else "no eager variant in this run (--variants)",
               detail=f"Layer_i ranges per eager step: {sorted(set(eager['layer_ranges']))}" if len(eager) else "")
    gd = rng[rng["variant"].str.startswith("graph") & (rng["mode"] == "decode")]
    _msgl.fact(run, H["no_ranges"], [r["layer_ranges"] == 0 for r in gd.to_dict("records")], "layer_check.csv",
               premise=True if len(gd) and (gd["graph_launches"] > 0).all() else
               "no graph decode step launched a CUDA graph (graphs not captured for this batch size?)",
               detail=f"cudaGraphLaunch per graph decode step: {sorted(set(gd['graph_launches']))}" if len(gd) else "")
    _msgl.fact(run, H["plan_sync"], [n == 1 for n in rng["event_syncs"]], "layer_check.csv",
               detail=f"cudaEventSynchronize per step: {sorted(set(rng['event_syncs']))}")
    st = a["steps"]
    if {"eager", "graph"} <= set(variants):
        e, g = per_generate(st, "eager", "gpu_ms"), per_generate(st, "graph", "gpu_ms")
        run.judge(H["graph"], [x / y for x, y in zip(e, g)], evidence="steps.csv",
                  detail=f"eager {statistics.median(e):.2f} ms vs graph {statistics.median(g):.2f} ms per decode step")
    for base in ("graph", "eager"):
        if {base, f"{base}-no-overlap"} <= set(variants):
            on, off = per_generate(st, base, "gap_before_ms"), per_generate(st, f"{base}-no-overlap", "gap_before_ms")
            run.judge(H["overlap"], [1e3 * (y - x) for x, y in zip(on, off)], evidence="steps.csv",
                      detail=f"{base}: {1e3 * statistics.median(on):.0f} us with overlap, {1e3 * statistics.median(off):.0f} "
                             "us without (median gap before a decode step)")
            break
    px = a["prefix"]
    if len(px):
        run.judge(H["prefix"], list(px["shared_ms"] / px["first_ms"]), evidence="prefix.csv",
                  premise=True if (px["cached_len"] >= PREFIX).all() else f"cached_len {list(px['cached_len'])} < {PREFIX}",
                  detail=f"cached_len {sorted(set(px['cached_len']))}, {px['shared_new_tokens'].iloc[0]} new tokens: "
                         f"{px['shared_ms'].median():.2f} ms vs {px['first_ms'].median():.2f} ms for "
                         f"{px['first_new_tokens'].iloc[0]}")
    if a["ncu"]:
        kt = a["kt"]["eager"] if "eager" in a["kt"] else next(iter(a["kt"].values()))
        windows = {w["window"] for w in a["ncu"]}
        seen = [(m, c, kt[(kt["mode"] == m) & (kt["layer"] == 1) & (kt["cls"] == c)]["ncu_time_us"].notna().any())
                for m in sorted(windows) for c in sorted(set(kt[(kt["mode"] == m) & (kt["layer"] == 1)]["cls"]))]
        _msgl.fact(run, H["state"], [ok for *_k, ok in seen], "ncu_windows.csv, kernels_<variant>.csv",
                   detail="; ".join(f"{m} {c}: {'yes' if ok else 'NO'}" for m, c, ok in seen))


# ------------------------------------------------------------------ figures and the story

def variants_figure(steps):
    """Per variant: decode step GPU time and the GPU gap before a decode step (median and range of the repetitions)."""
    plt = plots._plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    vs = list(dict.fromkeys(steps["variant"]))
    sty = plots.styles(vs)
    for ax, col, scale, label in ((a1, "gpu_ms", 1.0, "decode step GPU time (ms)"),
                                  (a2, "gap_before_ms", 1e3, "GPU idle before a decode step (us)")):
        for i, v in enumerate(vs):
            vals = [scale * x for x in per_generate(steps, v, col)]
            med = statistics.median(vals) if vals else 0.0
            ax.bar(i, med, color=sty[v][0], yerr=[[med - min(vals, default=med)], [max(vals, default=med) - med]], capsize=4)
        ax.set_xticks(range(len(vs)))
        ax.set_xticklabels(vs, fontsize=8, rotation=15)
        ax.set_ylabel(label)
    fig.suptitle(f"mini-SGLang decode: eager vs CUDA graph, overlap on/off (bars: median, whiskers: range of {REPEATS})",
                 fontsize=9)
    fig.tight_layout()
    return fig


def tell(a, s, pk, init_s, backend, floor_rows=()) -> str:
    f = story.fmt
    items = [(f"LLM on dummy weights, attention {backend}, init {init_s:.1f} s; variants {', '.join(s.variants)}", [])]
    items += waterfall_items(a.get("waterfall"))
    st = a["steps"]
    items.append((f"timed generates ({REPEATS} per variant, medians)", [
        (f"{v}: decode step {f(statistics.median(per_generate(st, v, 'gpu_ms')))} ms GPU, gap before "
         f"{f(1e3 * statistics.median(per_generate(st, v, 'gap_before_ms')))} us, prefill "
         f"{f(statistics.median(per_generate(st, v, 'gpu_ms', 'prefill')))} ms", []) for v in s.variants]))
    shown = "graph" if "graph" in s.variants else s.variants[0]    # the configuration mini-SGLang serves with
    tr = [r for r in a["tree"] if r["variant"] == shown]
    kt = a["kt"][shown]
    kids = []
    for mode in ("prefill", "decode"):
        rows = [r for r in tr if r["mode"] == mode]
        if not rows:
            continue
        g = kt[kt["step"] == rows[0]["step"]]
        n_layers = int(g["layer"].max() or 0) + 1
        kids.append((f"{mode} step (bs {rows[0]['bs']}): {len(g)} kernels, {f(g['dur_us'].sum() / 1e3)} ms of kernel time",
                     [kernels.node(r, head=f"{r['segment']} {r['role']}: {r['kernel']} {f(r['dur_us'])} us kernel time, "
                                           f"{f(r['share_all_layers_pct'])}% of the step's kernel time"
                                           + (f" (x{n_layers} layers)" if r["segment"] == "layer" else ""))
                      for r in rows if r["segment"] != "pre" or r["role"] == "embedding"]))
    items.append((f"{shown}: one layer and the once-per-step kernels", kids))
    if floor_rows:
        items.append((f"{shown}: the floor of each step (its kernels' least bytes over the DRAM read ceiling or FLOPs "
                      "over the bf16 ceiling, summed) beside its traced period", [timeline.floor_node(r) for r in floor_rows]))
    others = [v for v in s.variants if v != shown]
    if others:
        items.append((f"the other variants, the same kernels: their per-role kernel time beside {shown}'s "
                      "(layer_tree.csv lists every kernel of each)", [(line, []) for line in variant_lines(a, shown, others)]))
    return story.tree(f"ONE FORWARD OF mini-SGLang — {pk['gpu']} ({ceilings.ceiling_text(pk, 'dram_read_tb_s', short=True)}, "
                      f"bf16 {f(pk['bf16_tflops'])} TFLOP/s)", items)


def variant_lines(a, shown: str, others: list[str]) -> list[str]:
    """One line per step kind and role: the kernel time of each variant (median per layer), ``shown`` first."""
    f = story.fmt
    out = []
    for mode in ("prefill", "decode"):
        per = {}
        for v in [shown] + others:
            tr = [r for r in a["tree"] if r["variant"] == v and r["mode"] == mode and r["segment"] == "layer"]
            for r in tr:
                per.setdefault(r["role"], {}).setdefault(v, []).append(r["dur_us"])
        for role, by in per.items():
            if shown in by:
                out.append(f"{mode} {role}: " + ", ".join(f"{v} {f(statistics.median(by[v]))} us" for v in [shown] + others
                                                        if v in by))
    return out


def findings(run, a, shown: str) -> None:
    """The sentences the pages state about this run (Run.finding), from the figures the story and the verdicts print:
    the largest part of each waterfall, what the decode step's GEMMs stream (weight streaming % of the DRAM read
    ceiling against common.tables.kernels.SATURATED), the prefill GEMMs' share of the bf16 ceiling and the split-KV
    merge against the attention it merges, and the shared-prefix prefill's time against its tokens."""
    f = story.fmt
    for key, what in (("ttft", "the wall time to the first token"), ("decode", "the period between two tokens")):
        wf = (a.get("waterfall") or {}).get(key)
        if wf and wf.get("total_ms"):
            top = max(wf["parts"], key=lambda p: p["ms"])
            run.finding(f"The largest part of {what} ({wf['total_ms']:.2f} ms) is {top['name']}: {top['ms']:.2f} ms, "
                        f"{100 * top['ms'] / wf['total_ms']:.1f}%.")
    tree = [r for r in a["tree"] if r["variant"] == shown and r["segment"] == "layer"]
    dec = [r for r in tree if r["mode"] == "decode" and r["cls"] == "gemm"]
    if dec:
        big = max(dec, key=lambda r: r["dur_us"])
        num = lambda v: isinstance(v, (int, float)) and v == v      # noqa: E731 - a measured value, not NaN/None
        text = (f"In the decode step (batch {dec[0]['bs']}) the layers' GEMMs take "
                f"{f(sum(r['share_all_layers_pct'] for r in dec))}% of the kernel time")
        if num(big.get("stream_pct")):
            sat = "at or above" if big["stream_pct"] >= kernels.SATURATED else "below"
            text += (f"; the largest, {big['role']}, streams its weights at {f(big['stream_pct'])}% of the DRAM read "
                     f"ceiling, {sat} the {kernels.SATURATED:g}% that counts as saturated")
            if num(big.get("dram_pct")):
                text += f" (ncu: {f(big['dram_pct'])}% of the {big['dram_kind']} ceiling)"
        run.finding(text + ".")
    pre = [r for r in tree if r["mode"] == "prefill"]
    gemm = [r["pct_bf16_ceiling"] for r in pre if r["cls"] == "gemm" and r["pct_bf16_ceiling"] == r["pct_bf16_ceiling"]]
    att = [r for r in pre if r["role"] == "attention"]
    merge, attn = ([r["dur_us"] for r in att if ("Merge" in r["kernel"]) == m] for m in (True, False))
    if gemm and merge and attn:
        run.finding(f"In the prefill step (batch {pre[0]['bs']}) the layers' GEMMs run at {f(min(gemm))}% to "
                    f"{f(max(gemm))}% of the bf16 ceiling; the split-KV merge kernel takes {f(sum(merge))} us of kernel "
                    f"time per layer, {'longer than' if sum(merge) > sum(attn) else 'less than'} the {f(sum(attn))} us of "
                    "the attention kernel it merges.")
    px = a["prefix"]
    if len(px):
        t = px["shared_ms"].median() / px["first_ms"].median()             # the share of the time ...
        n = px["shared_new_tokens"].iloc[0] / px["first_new_tokens"].iloc[0]  # ... for this share of the tokens
        run.finding(f"A prompt sharing {px['cached_len'].min()} tokens with the previous one prefills its "
                    f"{px['shared_new_tokens'].iloc[0]} new tokens in {px['shared_ms'].median():.2f} ms of GPU time against "
                    f"{px['first_ms'].median():.2f} ms for the first {px['first_new_tokens'].iloc[0]}: {t:.2f} of the time "
                    f"for {n:.2f} of the tokens" + (", so a cost per step that does not grow with the tokens sets its "
                                                   "time" if t > 2 * n else "") + ".")


def floors(run, kt, pk) -> list[dict]:
    """The floor of the shown variant's prefill and median decode step (common.tables.timeline.floor_row: each kernel's
    minimum bytes over the DRAM read ceiling or its FLOPs over the bf16 ceiling, summed) beside the traced period
    (first kernel to the next step's first): floors.csv and one finding per step, as SGLang 08 states them."""
    rows = []
    for prefill, label in ((True, "prefill"), (False, "decode")):
        got = timeline.pick_step(kt, prefill)
        if got is not None and got[1] is not None:
            rows.append(timeline.floor_row(kt, *got, pk, label))
    if rows:
        run.table("floors", rows)
    for r in rows:
        run.finding(timeline.floor_sentence(r))
    return rows


# ------------------------------------------------------------------ figures, verdicts, headline, story (GPU run and --reanalyse)

@dataclass
class Record:
    """What the report of one run reads: the settings, the ceilings, the LLM's init time, the joined analysis
    (analyse(): kernel tables, layer checks, layer tree, timed steps, prefix, waterfall, ncu windows) and the
    profiler's cost per variant (observer())."""
    s: SimpleNamespace
    pk: dict
    init_s: float
    a: dict
    observer: dict = field(default_factory=dict)


def report(run, x: Record) -> None:
    """Figures, verdicts, headline and story from the joined tables (a GPU run and --reanalyse alike)."""
    s, pk, a, init_s = x.s, x.pk, x.a, x.init_s
    show = "graph" if "graph" in a["kt"] else s.variants[0]
    run.figure("timeline", plots.joined_timeline(a["kt"][show], title=f"mini-SGLang {show} — {pk['gpu']}"))
    run.figure("layer_tree", plots.layer_tree([r for r in a["tree"] if r["variant"] == show], pk))
    run.figure("variants", variants_figure(a["steps"]))
    # ---- verdicts
    judge(run, a, s.variants)
    if a.get("waterfall"):
        judge_waterfall(run, a["waterfall"])
    findings(run, a, show)
    floor_rows = floors(run, a["kt"][show], pk)
    st = a["steps"]
    run.headline(init_s=init_s, **{f"decode_step_ms_{v.replace('-', '_')}": statistics.median(per_generate(st, v, "gpu_ms"))
                                   for v in s.variants}, **x.observer,
                 kernels_per_decode_step=float(a["kt"][show][a["kt"][show]["mode"] == "decode"].groupby("step").size()
                                               .median()),
                 shared_prefix_cached_len=int(a["prefix"]["cached_len"].min()))
    # ---- the story
    run.story(tell(a, s, pk, init_s, s.backend, floor_rows), echo=True)


def read_csv(src: Path, name: str):
    """``name``.csv of a recording, or ``name``.csv.gz (the fixtures gzip the big ones whole); None when neither."""
    import pandas as pd
    for f in (src / f"{name}.csv", src / f"{name}.csv.gz"):
        if f.is_file():
            return pd.read_csv(f)
    return None


def main_reanalyse(args) -> int:
    """--reanalyse DIR: the report again from the joined tables a run recorded (not its traces): the layer checks
    (layer_check.csv holds each traced step's range / sync / graph counts on every layer row), the timed steps, the
    prefix, the waterfall, the ncu windows and the kernel tables of the variants the report reads."""
    from common.base.checks import SetupError
    rec = recording.open(args.reanalyse, __file__, tables=("steps", "prefix"),
                         optional=("waterfall", "ncu_windows", "traced_steps"))
    s = settings(rec.args_like(args))
    t = rec.tables
    for name in ("layer_check", "layer_tree", "class_shares"):      # plain or gzipped whole
        if (t.setdefault(name, read_csv(rec.src, name))) is None:
            raise SetupError(f"--reanalyse {rec.src}: no {name}.csv(.gz) to re-analyse (written by 08_forward_timeline.py)")
    kt = {v: k for v in s.variants if (k := read_csv(rec.src, f"kernels_{v}")) is not None}
    show = "graph" if "graph" in s.variants else s.variants[0]
    if show not in kt:
        raise SetupError(f"--reanalyse {rec.src}: no kernels_{show}.csv(.gz) to re-analyse (the story's and the "
                         "timeline's kernel table; written by 08_forward_timeline.py)")
    lc = t["layer_check"].assign(others=lambda d: d["others"].fillna(""))
    order_cols = ["variant", "step", "mode", "layer", "kernels", "sequence", "matches", "others"]
    range_cols = ["variant", "step", "mode", "layer_ranges", "model_layers", "kernels_in_layer_ranges", "agree",
                  "event_syncs", "graph_launches"]
    a = {"kt": kt, "order": lc[order_cols].to_dict("records"),
         "ranges": lc[range_cols].drop_duplicates(["variant", "step"]).to_dict("records"),
         "tree": t["layer_tree"].to_dict("records"), "shares": [t["class_shares"]],
         "ncu": t["ncu_windows"].to_dict("records") if t["ncu_windows"] is not None else [],
         "steps": t["steps"], "prefix": t["prefix"]}
    if t["waterfall"] is not None:
        a["waterfall"] = {"ttft": waterfall_from_rows(t["waterfall"], "ttft", f"untraced, median of {WATERFALL_REPS} generates"),
                          "decode": waterfall_from_rows(t["waterfall"], "itl",
                                                        f"one decode step, median of {WATERFALL_REPS} generates")}
    head = rec.summary.get("headline") or {}
    if t["traced_steps"] is not None:
        tr = t["traced_steps"]
        obs = observer({"traced": {v: {"rows": g.to_dict("records")} for v, g in tr.groupby("variant", sort=False)}},
                       a["steps"])
    else:                  # recorded before traced_steps.csv: the traced steps' CUDA-event times were in no table
        obs = {k: v for k, v in head.items() if k.startswith("observer_pct_")}
    with recording.run(__file__, args, rec) as run:
        if t["traced_steps"] is None:
            run.note("re-analysis: this recording predates traced_steps.csv; the profiler's cost (observer_pct_*) is "
                     "its own headline's, not recomputed")
        for name in ("steps", "prefix", "layer_check", "layer_tree", "class_shares", "waterfall", "ncu_windows",
                     "traced_steps"):
            if t[name] is not None:
                run.table(name, t[name])
        report(run, Record(s=s, pk=rec.peaks, init_s=float(head.get("init_s", math.nan)), a=a, observer=obs))
    return 0


def installed(name: str, hint: str) -> None:
    """SetupError unless package ``name`` can be found, without importing it."""
    import importlib.util
    if importlib.util.find_spec(name) is None:
        from common.base.checks import SetupError
        raise SetupError(f"Python package '{name}' is not installed. Install it: {hint}")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.reanalyse:
        return main_reanalyse(args)
    if args.ncu_target or args.nsys_target:
        return target(args, settings(args).backend)
    # ---- check: packages, GPU, the model; the LLM first (Engine asserts CUDA is untouched; Run's probe touches it)
    torch = require_module("torch", "pip install -r requirements.txt")
    require_gpu(torch)
    _msgl.require_minisgl("minisgl.llm")
    # installed, not imported: importing flashinfer (or sgl_kernel) initialises CUDA, and mini-SGLang's Engine
    # asserts that CUDA is untouched when it starts (minisgl/engine/engine.py:31; seen on an H200, 2026-11-23)
    installed("flashinfer", "pip install flashinfer-python==0.6.15.post1")
    s = settings(args)
    if s.backend == "fa":
        installed("sgl_kernel", "attention backend 'fa' needs sgl_kernel with FA3; use --backend fi")
    cfg = models.config(args.model)
    print(f"starting mini-SGLang LLM ({args.model}, dummy weights, attention {s.backend}) ...", flush=True)
    fwd = Forward(torch, model_dir(args.model), s.backend, sorted({1, args.batch}))
    with Run(__file__, args, out=args.out) as run:
        pk = ceilings.peaks()
        run.log(f"LLM ready in {fwd.init_s:.1f} s; KV pool {fwd.llm.engine.num_pages:,} tokens; decode graphs for batch "
                f"sizes {fwd.llm.engine.graph_runner.graph_bs_list}; ceilings: "
                f"{ceilings.ceiling_text(pk, 'dram_read_tb_s', short=True)}, bf16 {pk['bf16_tflops']:.0f} TFLOP/s "
                f"({pk.get('source')})")
        # ---- measure: timed (3 repetitions, variants interleaved), the shared prefix, one traced generate per variant
        data = measure(run, fwd, args, s)
        init_s = fwd.init_s
        fwd.close()
        rows = run.optional("counters", counters, run, args, pk) if s.ncu else None
        if args.nsys:
            nsys_tables(run, args)
        # ---- analyse: the joined tables, the Perfetto traces, the figures
        a = analyse(run, data, cfg, pk, rows)
        report(run, Record(s=s, pk=pk, init_s=init_s, a=a, observer=observer(data, a["steps"])))
    return 0


if __name__ == "__main__":
    run_main(main)
