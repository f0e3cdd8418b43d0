#!/usr/bin/env python3
"""03 · Paged decode attention: bandwidth over batch x KV length, how the work is split, CUDA vs tensor cores.

What it measures
    flashinfer.BatchDecodeWithPagedKVCacheWrapper with Llama-3.1 head layouts (8B: 32 q / 8 kv heads;
    70B: 64 / 8; head_dim 128, bf16, page size 16), batch 1 -> 256 x KV length 512 -> 32k, for the
    default CUDA-core kernel and for use_tensor_cores=True. Per point: plan() CPU time (common.capture.timing.
    bench_cpu over many calls: median and its 95% interval), what plan() decided (split_kv, KV chunk, grid)
    read from plan_info, the median kernel time (common.capture.timing.bench: CUPTI kernel time, cold L2), and the
    effective bandwidth: the bytes decode must move (common.tables.flops.decode_bytes) over that time. Effective bandwidth
    is a DRAM rate only where the working set is at least 4x the L2 (common.capture.timing.rates): there it is also given
    as % of this GPU's measured DRAM read ceiling (decode reads; common.capture.ceilings.peaks), elsewhere not. The plan's
    reference point (CUDA cores, batch 32, KV 4096: 537 MB of KV, 9x a 60 MB L2) is timed 3 times
    (reference.csv) and judged on the interval of the three. A torch-profiler trace of a few shapes (3 calls
    each) counts the kernels each run() really launched (attention, plus a merge kernel when the KV was
    split) next to plan_info. Three shapes are also timed with FlashInfer's own bench_gpu_time (like for
    like: both CUPTI, the same L2 flush; _fi_bench.cross_check). --ncu adds Nsight Compute per kernel, caches flushed
    before each pass as the timing flushed them (measured DRAM bytes and their TB/s as % of the ceiling of their
    kind, L2 hit, tensor pipe, occupancy with registers/thread, shared memory/CTA, warps/CTA, CTAs/SM and the
    limiter, warp stalls; the reference point profiled 3 times); --nsys puts each point's decode kernels on a
    timeline (Nsight Systems; the torch trace where nsys is not usable).

What the plan expected (hypotheses: H_* below, each with its range and where the range comes from;
judged on intervals by common.judge.verdicts: inside -> confirmed, outside -> refuted, across -> inconclusive)
    * decode is memory-bound, ~80% of peak HBM at batch 32 x KV 4096 (judged: effective bandwidth 70-90% of the
      measured DRAM read ceiling, 3 repetitions, valid because the working set is >= 4x L2; the ceiling is named
      in the verdict: it differs between GPUs);
    * the KV is split ("8 chunks of 512 tokens" at batch 32 / KV 4096) and merged with the LSE;
    * occupancy ~75%, tensor pipe ~15%, long_scoreboard ~65% of the stalls (ncu, 3 launches);
    * from the source (analysis.md H-03..H-07): a merge kernel runs exactly when plan_info says split_kv;
      splitting stops once batch x kv heads fills the GPU; the merge matters only at small batch; the
      tensor-core variant runs the prefill kernel and is no slower at GQA group 4; plan() launches no kernel.

Run
    python flashinfer/scripts/03_profile_decode.py --quick          # ~1 min (warm JIT): 8B, 3 x 3 points
    python flashinfer/scripts/03_profile_decode.py                  # full: 8B + 70B, 6 batches x 7 KV lengths
    python flashinfer/scripts/03_profile_decode.py --quick --ncu    # + per-kernel hardware table (kernels.csv)
    python flashinfer/scripts/03_profile_decode.py --quick --nsys   # + the kernels of each point on a timeline
    python flashinfer/scripts/03_profile_decode.py --variants cuda --batches 32 --kv-lens 4096   # one point
    python flashinfer/scripts/03_profile_decode.py --reanalyse DIR --out OUT   # no GPU: the analysis again from DIR
    ./flashinfer/scripts/ncu_profile.sh --kernel 'BatchDecode|MergeStates' --set full --count 2 -- \\
        python flashinfer/scripts/03_profile_decode.py --ncu-target --quick --variants cuda
Writes flashinfer/results/03_profile_decode/: sweep.csv, reference.csv, calls.csv, plan_calls.csv,
cross_check.csv, kernels.csv + kernels_full.csv (--ncu), timeline.csv + timeline.png (--nsys), bandwidth.png
(effective TB/s against the working set, DRAM ceilings and the L2 size drawn), roofline.png, trace.json,
story.txt, summary.json. --reanalyse DIR reads back the tables and trace.json (the kernels of each traced call).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _fi  # noqa: E402
import _fi_bench  # noqa: E402
import _fi_timeline  # noqa: E402
from _fi import REPEATS  # noqa: E402
from common.base import stats, story  # noqa: E402
from common.base.checks import run_main  # noqa: E402
from common.capture import ceilings, timing  # noqa: E402
from common.capture.models import PRESETS  # noqa: E402
from common.capture.ranges import nvtx_range  # noqa: E402
from common.capture.timing import bench, bench_cpu, eff_premise, RATE_COLUMNS, rates  # noqa: E402
from common.tables import flops, kernels, ncu_pass, trace  # noqa: E402
from common.judge import bounds  # noqa: E402
from common.judge.verdicts import declare  # noqa: E402
from common.render import plots  # noqa: E402
from common.run import cli, recording  # noqa: E402
from common.run.results import Run  # noqa: E402

# ------------------------------------------------------------------ the sweep, as data
BATCHES_FULL, KV_FULL = (1, 8, 32, 64, 128, 256), (512, 1024, 2048, 4096, 8192, 16384, 32768)
BATCHES_QUICK, KV_QUICK = (1, 32, 256), (512, 4096, 32768)
MODELS_FULL, MODELS_QUICK = ("llama-3.1-8b", "llama-3.1-70b"), ("llama-3.1-8b",)
VARIANTS = {"cuda": False, "tc": True}                               # name -> use_tensor_cores
REFERENCE = ({"variant": "cuda", "batch": 32, "kv_len": 4096},)      # the plan's point: timed/profiled REPEATS times
TRACE_SHAPES = ((1, 4096), (32, 4096), (256, 4096), (1, 32768))     # (batch, kv): kernels per call, traced
XCHECK = (("cuda", 32, 4096), ("tc", 32, 4096), ("cuda", "max", "max"))   # also timed with bench_gpu_time
KERNELS = "BatchDecode|BatchPrefillWithPagedKVCacheKernel|MergeStates"
PAGE = 16

# ------------------------------------------------------------------ the hypotheses, as data
PLAN = "PLAN.md session 3 / flashinfer/reports/plan.md §03 (A100)"
H = declare(f"""
    bw = decode-bw: decode is memory-bound at ~80% of peak HBM (batch 32, KV 4096)
        judged on: CUDA-core decode effective bandwidth (common.tables.flops bytes / CUPTI time, cold L2) as % of the
            measured DRAM read ceiling, {REPEATS} repetitions; a DRAM rate because its working set (537 MB of KV) is
            >= 4x the L2 (else the verdict is inconclusive: common.capture.timing.eff_premise)
        confirmed: [70, 90]%
        source: {PLAN}: '~80% of peak HBM', read as 70-90%
    split = decode-split: the KV is split into 8 chunks of 512 tokens at batch 32 / KV 4096
        judged on: plan_info split_kv and KV chunk at the reference point (a planner decision: deterministic)
        source: {PLAN}: 'split-K into 8 chunks of 512'; analysis.md (reading the source) predicts 4 x 1024 on 132 SMs
    split_stops = decode-split-stops: splitting stops as the batch fills the GPU: the smallest batch splits, the
            largest does not
        judged on: plan_info split_kv at the smallest and largest swept batch
        source: analysis.md H-05
    plan_cpu = plan-no-kernel: plan() is CPU work: it launches no kernel, the GPU sees only copies
        judged on: kernels and copies of each of the {REPEATS} traced plan() calls
        source: analysis.md H-03
    merge_iff = merge-iff-split: run() launches the attention kernel plus one merge kernel exactly when plan_info says
            split_kv
        judged on: merge kernel seen vs split_kv, each of {REPEATS} calls per traced shape
        source: analysis.md H-03, H-05
    merge_big = merge-small-at-batch-32: the merge kernel is a small share of decode time at batch >= 32
        judged on: merge kernel share of each traced call's kernel time at batch >= 32
        confirmed: <= 10%
        source: analysis.md H-06 ('visible only at small batch with long KV'); 10% read as small
    merge_small = merge-visible-at-batch-1: the merge kernel is a visible share at the smallest batch with the longest
            KV
        judged on: merge share of each traced call at the smallest batch, longest KV
        confirmed: >= 10%
        source: analysis.md H-06; 10% read as visible
    tc_kernel = tc-runs-prefill-kernel: tensor-core decode runs the prefill kernel
        judged on: kernels of each traced tensor-core call
        source: analysis.md H-07
    tc_speed = tc-no-slower: tensor-core decode is no slower than CUDA cores at GQA group 4
        judged on: time ratio tc / cuda on every swept shape of the first model
        confirmed: <= 1.05
        source: analysis.md H-07; 5% read as 'no slower' (about one timing's spread)
    occ = decode-occupancy: occupancy ~75% (batch 32, KV 4096)
        judged on: achieved occupancy (ncu), {REPEATS} launches of the CUDA-core reference point
        confirmed: [60, 90]%
        source: {PLAN}: 'occupancy ≈ 75%', read as 60-90%
    tc_pipe = decode-tensor-pipe: tensor pipe ~15%
        judged on: tensor pipe % (ncu), {REPEATS} launches
        confirmed: [5, 25]%
        source: {PLAN}: 'tensor pipe ≈ 15%', read as 5-25%
    no_tc = cuda-decode-no-tensor: the CUDA-core decode kernel uses no tensor cores
        judged on: tensor pipe % (ncu), {REPEATS} launches
        confirmed: <= 2%
        source: analysis.md H-04: 'sm__pipe_tensor_cycles_active ≈ 0'
    lsb = decode-long-scoreboard: long_scoreboard is ~65% of the warp stalls
        judged on: long_scoreboard share of all stall reasons (ncu), {REPEATS} launches
        confirmed: [55, 75]%
        source: {PLAN}: 'long_scoreboard ≈ 65% of stalls', read as 55-75%
    bound = cuda-decode-dram-bound: CUDA-core decode is DRAM-bound
        judged on: common.judge.bounds.bound() of each of {REPEATS} launches (DRAM %, SM %, top stall and what it means)
        source: analysis.md H-04
""")


def parse_args(argv=None):
    p = cli.parser(__file__, __doc__, quick="8B layout, batches 1/32/256 x KV 512/4k/32k (~1 min)")
    p.add_argument("--ncu", action="store_true", help="also profile every point once (the reference 3x) under ncu")
    p.add_argument("--nsys", action="store_true", help="also put each point's kernels on a timeline (Nsight Systems)")
    p.add_argument("--ncu-target", action="store_true", help=argparse.SUPPRESS)  # run points once, for ncu/nsys
    p.add_argument("--models", type=cli.choices_list(*PRESETS), default=None, help="model presets, comma-separated "
                   "(default: llama-3.1-8b with --quick, else llama-3.1-8b,llama-3.1-70b)")
    p.add_argument("--variants", type=cli.choices_list(*VARIANTS), default=list(VARIANTS),
                   help="cuda (CUDA cores, the default kernel), tc (use_tensor_cores); default both")
    p.add_argument("--batches", type=cli.positive_ints, default=None, help="comma-separated batch sizes")
    p.add_argument("--kv-lens", type=cli.positive_ints, default=None, help="comma-separated KV lengths")
    recording.add_flag(p)
    return p.parse_args(argv)


def plan_points(args) -> list[dict]:
    models = args.models or (MODELS_QUICK if args.quick else MODELS_FULL)
    batches = args.batches or (BATCHES_QUICK if args.quick else BATCHES_FULL)
    kvs = args.kv_lens or (KV_QUICK if args.quick else KV_FULL)
    return [{"model": m, "variant": v, "batch": b, "kv_len": kv}
            for m in models for v in args.variants for b in batches for kv in kvs]


def target_points(args) -> list[dict]:
    """What --ncu-target runs: the sweep, then each reference point (first model) REPEATS times."""
    m0 = (args.models or MODELS_QUICK)[0]
    return _fi.with_repeats(plan_points(args), [{"model": m0, **r} for r in REFERENCE if r["variant"] in args.variants])


def label(p) -> str:
    return f"decode {p['variant']} b={p['batch']} kv={p['kv_len']}" + (
        f" ({p['model']})" if p.get("model", MODELS_QUICK[0]) != MODELS_QUICK[0] else "")


def make_point(x, w, lay, batch, kv):
    """Cache, plan and a run() closure for one point: (fn, plan facts, keep); keep["replan"] repeats plan()."""
    torch = x.torch
    cache, indptr, indices, last = _fi.make_paged_kv(torch, [kv] * batch, lay["hkv"], lay["d"], PAGE)
    kw = dict(q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    replan = lambda: w.plan(indptr, indices, last, lay["hq"], lay["hkv"], lay["d"], PAGE, **kw)  # noqa: E731
    replan()  # first: may load/compile the module
    q = torch.randn(batch, lay["hq"], lay["d"], device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    return (lambda: w.run(q, cache, out=out)), _fi.plan_facts(w), {"t": (cache, q, out), "replan": replan}


def wrapper(x, variant):
    return x.fi.BatchDecodeWithPagedKVCacheWrapper(x.ws, "NHD", use_tensor_cores=VARIANTS[variant])


def check_correctness(run, x):
    """Both variants against float32 torch on scattered pages, uneven lengths (1 token to 1037)."""
    torch, kv_lens = x.torch, [1, 100, 1037]
    for model in x.models:
        lay = _fi.head_layout(model)
        cache, indptr, indices, last = _fi.make_paged_kv(torch, kv_lens, lay["hkv"], lay["d"], PAGE, shuffle=True)
        q = torch.randn(len(kv_lens), lay["hq"], lay["d"], device="cuda", dtype=torch.bfloat16)
        for v in x.variants:
            w = wrapper(x, v)
            w.plan(indptr, indices, last, lay["hq"], lay["hkv"], lay["d"], PAGE,
                   q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
            o = w.run(q, cache)
            errs = [_fi.rel_err(o[b:b + 1], _fi.ref_attention(torch, q[b:b + 1], *_fi.gather_kv(
                cache, indptr, indices, last, b), causal=False)) for b in range(len(kv_lens))]
            good = all(e < 2e-2 for e in errs)   # NaN compares False
            run.log(f"correctness {model} {v}: rel.err per request {', '.join(f'{e:.1e}' for e in errs)} "
                    f"{'✅' if good else '❌'}")
            if not good:
                raise RuntimeError(f"decode ({v}, {model}) disagrees with the torch reference (rel. error >= 2e-2)")
    run.log("All results match. Starting benchmarks.")


def ncu_target(x) -> int:
    """Under ncu / nsys: every target point once, a marker kernel before each (common.tables.kernels.split_points)."""
    wr = {v: wrapper(x, v) for v in VARIANTS}

    def make(p):
        fn, _facts, keep = make_point(x, wr[p["variant"]], _fi.head_layout(p["model"]), p["batch"], p["kv_len"])
        return fn, keep
    return ncu_pass.run_points(x.torch, target_points(x.args), make, label)


def work(p, lay) -> dict:
    """Formula bytes and FLOPs of one decode call (common.tables.flops), its traffic kind (the output row per request is
    the only write: "read") and its working set (every byte is touched once: the formula bytes)."""
    kvs = [p["kv_len"]] * p["batch"]
    nbytes = flops.decode_bytes(kvs, lay["hq"], lay["hkv"], lay["d"])
    out = p["batch"] * lay["hq"] * lay["d"] * 2
    return {"bytes": nbytes, "flops": flops.decode_flops(kvs, lay["hq"], lay["d"]),
            "mix": ceilings.dram_kind(nbytes - out, out), "working_set": nbytes}


def timed(x, p, fn, lay) -> dict:
    """One timing of ``fn`` at point ``p``: CUPTI kernel time, effective TB/s from common.tables.flops (a % of the DRAM read
    ceiling only where the working set is >= 4x L2: common.capture.timing.rates)."""
    with nvtx_range(label(p)):
        t = bench(fn)
    w = work(p, lay)
    r = rates(t.median_ms, bytes=w["bytes"], flops=w["flops"], peaks=x.pk, mix=w["mix"], working_set=w["working_set"])
    return {"time_us": t.median_us, "spread_pct": t.spread_pct, **timing.rate_row(r)}


def sweep(run, x):
    """Every point once (one wrapper per variant, re-planned per point as a server does per step); plan() CPU time
    with bench_cpu (median and the 95% interval of the median over its samples)."""
    wr = {v: wrapper(x, v) for v in x.variants}

    def measure(p):
        lay = _fi.head_layout(p["model"])
        fn, facts, keep = make_point(x, wr[p["variant"]], lay, p["batch"], p["kv_len"])
        plan = stats.interval(bench_cpu(keep["replan"], rep_ms=20).samples_ms)
        chunk = facts.get("kv_chunk_tokens")
        return {**p, **timed(x, p, fn, lay), "plan_us": 1e3 * plan.point, "plan_us_lo": 1e3 * plan.lo,
                "plan_us_hi": 1e3 * plan.hi, "split_kv": facts.get("split_kv"), "kv_chunk_tokens": chunk,
                "chunks_per_request": -(-p["kv_len"] // chunk) if facts.get("split_kv") and chunk else 1,
                "grid_x": facts.get("padded_batch_size"), "cta_tile_q": facts.get("cta_tile_q")}
    return _fi.sweep(run, x.torch, x.points, measure,
                     lambda p: f"{p['model']} {p['variant']} batch={p['batch']} kv={p['kv_len']}")


def reference(run, x):
    """The reference point(s) timed REPEATS times: the values H["bw"] is judged on (reference.csv)."""
    import pandas as pd
    rows = []
    for r in [p for p in target_points(x.args) if p["kind"] == "reference" and p["rep"] == 0]:
        lay = _fi.head_layout(r["model"])
        fn, facts, keep = make_point(x, wrapper(x, r["variant"]), lay, r["batch"], r["kv_len"])
        for i in range(REPEATS):
            rows.append({**r, "rep": i, **timed(x, r, fn, lay), "split_kv": facts.get("split_kv"),
                         "kv_chunk_tokens": facts.get("kv_chunk_tokens"), "grid_x": facts.get("padded_batch_size")})
        del keep, fn
    df = pd.DataFrame(rows, columns=["variant", "batch", "kv_len", "model", "kind", "rep", "time_us", "spread_pct",
                                     *RATE_COLUMNS, "split_kv", "kv_chunk_tokens", "grid_x"])
    run.table("reference", df)
    return df


def _with_meta(df, meta: dict):
    import pandas as pd
    return df.join(pd.DataFrame([meta.get(lab, {}) for lab in df["label"]], index=df.index))


def trace_calls(run, x):
    """Kernels per call, read from a torch-profiler trace (REPEATS calls per traced shape; then REPEATS plan()
    calls per variant), joined with common.tables.trace.kernels_in_ranges: x.rows, x.cs (calls.csv), x.pc, x.ps."""
    calls, plans, meta, keep = [], [], {}, []
    for v in x.variants:
        for b, kv in TRACE_SHAPES:
            lab = label({"variant": v, "batch": b, "kv_len": kv})
            try:
                w = wrapper(x, v)
                fn, facts, k = make_point(x, w, x.lay0, b, kv)
            except Exception as e:  # noqa: BLE001
                run.point_error({"trace": lab}, e)
                continue
            calls.append((lab, fn))
            keep.append((w, k))
            meta[lab] = {"variant": v, "batch": b, "kv_len": kv, "plan_split_kv": facts.get("split_kv"),
                         "plan_kv_chunk_tokens": facts.get("kv_chunk_tokens"),
                         "plan_grid_x": facts.get("padded_batch_size"), "plan_cta_tile_q": facts.get("cta_tile_q")}
            if (b, kv) == TRACE_SHAPES[1]:  # plan() itself: CPU work and copies, no kernel
                plans.append((f"plan {v} b={b} kv={kv}", k["replan"]))
    ev = trace.read_chrome_trace(trace.capture_calls(x.torch, calls + plans, run.path("trace.json"), reps=REPEATS))
    del keep, calls
    x.torch.cuda.empty_cache()
    x.rows = trace.kernels_in_ranges(ev, r"^decode ")
    x.cs, x.pc = _with_meta(_fi.calls_summary(x.rows), meta), _with_meta(_fi.per_call(x.rows), meta)
    run.table("calls", x.cs)
    x.prows = trace.kernels_in_ranges(ev, r"^plan ") if plans else None
    x.ps = _fi.calls_summary(x.prows) if plans else None
    if x.ps is not None:
        run.table("plan_calls", x.ps)


def cross_check(run, x) -> list:
    """FlashInfer's own bench_gpu_time on the same callables (_fi_bench.cross_check_points): cross_check.csv."""
    def points():
        big = (int(x.m0["batch"].max()), int(x.m0["kv_len"].max()))
        for v, b, kv in XCHECK:
            b, kv = big if b == "max" else (b, kv)
            if v not in x.variants:
                continue
            w = wrapper(x, v)
            _, _, k = make_point(x, w, x.lay0, b, kv)
            yield {"variant": v, "batch": b, "kv_len": kv}, f"{v} b{b} kv{kv}", w, k["t"]
            del k
    return _fi_bench.cross_check_points(run, points, bench)


def profile_ncu(run, x):
    """Every target point once under ncu, the reference REPEATS times: kernels.csv (+ kernels_full.csv)."""
    run.log("ncu: every point once, the reference point 3 times (DRAM, tensor pipe, occupancy, stalls)")
    kern = ncu_pass.profile_points(run, __file__, x.child, KERNELS, target_points(x.args), x.pk, timeout=1200)[0]
    kern["role"] = ["merge" if "Merge" in k else "attention" for k in kern["kernel"]]
    run.table("kernels_full", kern)
    run.table("kernels", _fi.compact_kernels(kern, ("kind", "rep", "model", "variant", "batch", "kv_len", "role")))
    return kern


def profile_nsys(run, x):
    """Each point's decode kernels on a timeline: nsys over --ncu-target, else this run's torch trace."""
    tl, src = _fi_timeline.timeline(run, __file__, x.child, target_points(x.args), KERNELS, label, x.rows)
    run.table("timeline", tl)
    if len(tl):
        run.figure("timeline", _fi_timeline.timeline_figure(tl, f"Decode kernels of each point ({src}) — {x.pk['gpu']}"))
    return tl, src


def figures(run, x):
    run.figure("bandwidth", plots.effective(
        x.m0[x.m0["variant"] == x.variants[0]], x.pk, hue="batch", mix="read",
        title=f"Decode ({x.variants[0]}), {x.models[0]}, bf16 — {x.pk['gpu']}"))
    pts = [{"label": f"{r.variant} b{r.batch} kv{r.kv_len}" if r.kv_len == 4096 else "", "series": r.variant,
            "flop_per_byte": r.flop_per_byte, "tflop_s": r.tflop_s} for r in x.m0.itertuples()]
    if x.kern is not None:
        for r in x.kern[(x.kern["role"] == "attention") & (x.kern["model"] == x.models[0])].itertuples():
            f, mb = flops.decode_flops([r.kv_len] * r.batch, x.lay0["hq"], x.lay0["d"]), r.dram_read_mb + r.dram_write_mb
            if mb > 0 and r.ncu_time_us > 0:
                pts.append({"label": "", "series": f"ncu {r.variant} (measured bytes)", "flop_per_byte": f / (mb * 1e6),
                            "tflop_s": f / (r.ncu_time_us * 1e-6) / 1e12})
    run.figure("roofline", plots.roofline(pts, x.pk, title="Paged decode (bytes: common.tables.flops; 'ncu': measured)"))


def judge_timing(run, x):
    """H["bw"] on the reference repetitions, H["tc_speed"] over the swept shapes, the bench_gpu_time cross-check."""
    ref = x.ref[x.ref["variant"] == "cuda"]
    read = timing.dram_ceiling_text(x.pk, "read")
    if len(ref):
        run.headline(decode_point="CUDA cores, batch 32, KV 4096", decode_us=float(ref["time_us"].median()),
                     decode_eff_tb_s=float(ref["eff_tb_s"].median()),
                     decode_eff_pct_of_read_ceiling=float(ref["eff_pct"].median()))
    rows = ref.to_dict("records")
    run.judge(H["bw"], list(ref["eff_pct"]), evidence="reference.csv",
              premise=eff_premise(rows, read) if len(ref) else "the CUDA-core variant was not run (--variants)",
              detail=f"median {timing.eff_text(timing.median_row(rows), x.pk)}; % of {read}" if len(ref) else "")
    if {"cuda", "tc"} <= set(x.variants):
        both = x.m0.pivot_table(index=["batch", "kv_len"], columns="variant", values="time_us").dropna()
        iv = stats.over(both["tc"] / both["cuda"])
        run.headline(tc_over_cuda_time_median=iv.point)
        run.judge(H["tc_speed"], iv, evidence="sweep.csv")
    _fi_bench.judge_cross_check(run, x.xrows, lambda r: f"{r['variant']} b{r['batch']} kv{r['kv_len']}")


def judge_plan_and_calls(run, x):
    """What plan() decided and what run() launched (facts; per-call shares judged on intervals)."""
    ref = _fi.pick(x.ref, variant="cuda", rep=0) if len(x.ref) else None
    run.fact(H["split"], bool(ref and ref["split_kv"] and ref["kv_chunk_tokens"] == 512),
             f"plan_info: split_kv={ref['split_kv']}, chunk {ref['kv_chunk_tokens']} tokens -> "
             f"{-(-4096 // (ref['kv_chunk_tokens'] or 4096))} chunk(s), grid x {ref['grid_x']}" if ref else "not run",
             "reference.csv", premise=True if ref else "the CUDA-core reference point was not run")
    at = x.m0[(x.m0["variant"] == x.variants[0]) & (x.m0["kv_len"] == 4096)].sort_values("batch")
    lo, hi = (at.iloc[0], at.iloc[-1]) if len(at) >= 2 else (None, None)
    run.fact(H["split_stops"], bool(lo is not None and lo["split_kv"] and not hi["split_kv"]),
             f"KV 4096: batch {lo['batch']} split_kv={lo['split_kv']} ({lo['chunks_per_request']} chunks), batch "
             f"{hi['batch']} split_kv={hi['split_kv']}" if lo is not None else "-", "sweep.csv",
             premise=True if lo is not None else "fewer than 2 batch sizes swept at KV 4096")
    if x.ps is not None and len(x.ps):
        run.fact(H["plan_cpu"], [r.kernels == 0 and r.copies >= 1 for r in x.plan_pc.itertuples()],
                 "; ".join(f"{r.label}: {r.kernels_per_call:.0f} kernels, {r.copies_per_call:.0f} copies per call "
                           f"({r.copies or '-'})" for r in x.ps.itertuples()), "plan_calls.csv")
    agree = [(r.merge_us > 0) == bool(r.plan_split_kv) for r in x.pc.itertuples()]
    run.fact(H["merge_iff"], agree, f"{sum(agree)}/{len(agree)} traced calls agree with plan_info" + "".join(
        f"; {r.label}: merge {r.merge_us > 0}, split_kv {r.plan_split_kv}" for r in x.pc.drop_duplicates("label").itertuples()),
        "calls.csv")
    pc = x.pc[x.pc["variant"] == "cuda"] if "cuda" in x.variants else x.pc
    run.judge(H["merge_big"], stats.over(pc[pc["batch"] >= 32]["merge_share_pct"], "traced calls"),
              evidence="calls.csv", digits=2)
    small = pc[(pc["batch"] == pc["batch"].min()) & (pc["kv_len"] == pc["kv_len"].max())]
    run.judge(H["merge_small"], stats.over(small["merge_share_pct"], "traced calls"), evidence="calls.csv", digits=2,
              premise=True if len(small) and small["plan_split_kv"].all() else "plan_info did not split that shape")
    tc = x.cs[x.cs["variant"] == "tc"]
    if len(tc):
        run.fact(H["tc_kernel"], ["BatchPrefillWithPagedKVCacheKernel" in k for k in tc["kernels"]],
                 "; ".join(f"{r.label}: {r.kernels}" for r in tc.itertuples()), "calls.csv")


def judge_ncu(run, x):
    """The plan's hardware figures on the REPEATS ncu launches of the CUDA-core reference point."""
    rows = [r for r in _fi.reference_rows(x.kern, variant="cuda") if r["role"] == "attention"]
    where = f"{len(rows)} launches of CUDA-core b32 kv4096 (kernels.csv, kind=reference)"
    run.judge(H["occ"], [r["occupancy_pct"] for r in rows], evidence=where,
              detail=_fi.occupancy_text(rows[0]) if rows else "")
    run.judge(H["tc_pipe"], [r["tensor_pct"] for r in rows], evidence=where)
    run.judge(H["no_tc"], [r["tensor_pct"] for r in rows], evidence=where)
    run.judge(H["lsb"], [r.get("stall_long_scoreboard_pct") for r in rows], evidence=where,
              detail=f"top stalls {rows[0]['top_stalls']}" if rows else "")
    run.fact(H["bound"], [bounds.bound(r) == "memory-bound" for r in rows] or None,
             "; ".join(dict.fromkeys(f"{bounds.bound_why(r)} ({kernels.COLUMNS['dram_tb_s'].show(r)}, measured by ncu)"
                                     for r in rows)) or "not profiled", where)


def findings(run, x):
    """The sentence the pages state about this run (Run.finding), from the sweep table they show: the tensor-core path
    against the CUDA-core kernel at each batch of KV 4096, faster or slower, and their rates where those are DRAM rates."""
    if not {"cuda", "tc"} <= set(x.variants):
        return
    m = x.m0[x.m0["kv_len"] == 4096]
    parts = []
    for b, g in m.groupby("batch"):
        tc, cu = (g[g["variant"] == v].iloc[0] if (g["variant"] == v).any() else None for v in ("tc", "cuda"))
        if tc is None or cu is None:
            continue
        rate = (f"; {story.fmt(tc['eff_pct'])}% against {story.fmt(cu['eff_pct'])}% of the read ceiling"
                if tc["eff_pct"] == tc["eff_pct"] and cu["eff_pct"] == cu["eff_pct"] else "")
        parts.append(f"batch {b}: {story.fmt(tc['time_us'])} against {story.fmt(cu['time_us'])} us "
                     f"({'faster' if tc['time_us'] < cu['time_us'] else 'slower'}{rate})")
    if parts:
        run.finding("At KV 4096 the tensor-core path (the prefill kernel) against the CUDA-core kernel, kernel time: "
                    + "; ".join(parts) + ".")


def tell(x) -> str:
    """The execution story: per traced shape what plan() decided, what run() launched, time and bandwidth."""
    items = []
    for r in x.cs.itertuples():
        s = _fi.pick(x.m0, variant=r.variant, batch=r.batch, kv_len=r.kv_len)
        kids = [(f"plan(): split_kv={r.plan_split_kv}, chunk {r.plan_kv_chunk_tokens} tokens, grid x {r.plan_grid_x}"
                 + (f", cta_tile_q {int(r.plan_cta_tile_q)}" if (r.plan_cta_tile_q or 0) > 0 else "")
                 + (f", {s['plan_us']:.0f} us CPU [{s['plan_us_lo']:.0f}, {s['plan_us_hi']:.0f}]" if s else ""), []),
                (f"run(): {r.kernels_per_call:.0f} kernel(s) per call: {r.kernels}"
                 + (f" (merge {r.merge_share_pct:.0f}% of kernel time)" if r.merge_kernel else ""), [])]
        if s:
            kids.append((f"{s['time_us']:.1f} us -> {timing.eff_text(s, x.pk)}", []))
        if x.kern is not None:
            kk = x.kern[(x.kern["kind"] == "sweep") & (x.kern["variant"] == r.variant) & (x.kern["batch"] == r.batch)
                        & (x.kern["kv_len"] == r.kv_len) & (x.kern["model"] == x.models[0])]
            kids += [kernels.node(k, head=f"{k['kernel']} (ncu) [{bounds.bound_why(k)}]") for k in kk.to_dict("records")]
        items.append((f"{'CUDA cores' if r.variant == 'cuda' else 'tensor cores'}, batch {r.batch}, KV {r.kv_len}", kids))
    if len(x.ref):
        items.append((f"reference (cuda b32 kv4096, {REPEATS} repetitions): "
                      + "; ".join(timing.eff_text(r, x.pk) for r in x.ref.to_dict("records")), []))
    if x.xrows:
        items.append((_fi_bench.cross_check_line(x.xrows, lambda r: f"{r['variant']} b{r['batch']} kv{r['kv_len']}"), []))
    text = story.tree(f"DECODE ATTENTION — {x.pk['gpu']}, {x.models[0]} heads ({x.lay0['hq']} q / {x.lay0['hkv']} kv, "
                      f"d {x.lay0['d']}), bf16, page {PAGE}; effective bandwidth = formula bytes / time, a % of "
                      f"{timing.dram_ceiling_text(x.pk, 'read', short=True)} only at working sets >= "
                      f"{ceilings.STREAM_FACTOR}x L2 ({x.pk.get('l2_mb')} MB); DRAM rates from ncu's bytes", items)
    if x.tl is not None:
        tl, src = x.tl
        shown = [lab for lab in ("decode cuda b=32 kv=4096", "decode cuda b=1 kv=32768") if lab in set(tl["label"])]
        text += (f"\n\nTIMELINE ({src}): the decode kernels of each point, in launch order\n"
                 + "\n".join(_fi_timeline.timeline_lines(tl)[:24]) + "\n\n" + _fi_timeline.timeline_ascii(tl, shown))
    return text


@dataclass
class Record:
    """What the analysis of one run reads: the plan, the ceilings and what the GPU phase measured (the same a
    --reanalyse reads back from a recording: its tables and trace.json)."""
    args: argparse.Namespace
    pk: dict
    models: list
    variants: list
    df: Any                       # sweep.csv
    ref: Any                      # reference.csv
    cs: Any                       # calls.csv
    pc: Any                       # per traced call: trace.json's kernels joined with calls.csv's plan facts
    ps: Any = None                # plan_calls.csv
    plan_pc: Any = None           # per traced plan() call (trace.json)
    xrows: list = field(default_factory=list)   # cross_check.csv
    kern: Any = None              # kernels_full.csv (--ncu)
    tl: Any = None                # (timeline.csv, its source) (--nsys)

    @property
    def lay0(self) -> dict:
        return _fi.head_layout(self.models[0])

    @property
    def m0(self):
        return self.df[self.df["model"] == self.models[0]]


def analyse(run, x: Record) -> None:
    """Figures, verdicts and story from the measured tables (a GPU run and --reanalyse alike)."""
    figures(run, x)
    # ---- verdicts: the plan's hypotheses against this run
    judge_timing(run, x)
    judge_plan_and_calls(run, x)
    if x.kern is not None:
        judge_ncu(run, x)
    findings(run, x)
    # ---- the story
    run.story(tell(x), echo=True)


def main_reanalyse(args) -> int:
    rec = recording.open(args.reanalyse, __file__, tables=("sweep", "reference", "calls"),
                         optional=("plan_calls", "cross_check", "kernels_full", "timeline"),
                         copy=("trace.json", "trace.json.gz"))
    a = rec.args_like(args)
    ev = _fi.recorded_trace(rec.src, "the kernels of each traced call and plan() call")
    cs, ps, xc = _fi.as_recorded(rec.tables["calls"]), _fi.as_recorded(rec.tables["plan_calls"]), rec.tables["cross_check"]
    x = Record(args=a, pk=rec.peaks, models=list(dict.fromkeys(p["model"] for p in plan_points(a))),
               variants=list(a.variants), df=rec.tables["sweep"], ref=rec.tables["reference"], cs=cs,
               pc=_fi.per_call_from(ev, r"^decode ", cs), ps=ps,
               plan_pc=_fi.per_call(trace.kernels_in_ranges(ev, r"^plan ")) if ps is not None else None,
               xrows=xc.to_dict("records") if xc is not None else [], kern=_fi.as_recorded(rec.tables["kernels_full"]),
               tl=_fi_timeline.recorded_timeline(rec))
    with recording.run(__file__, args, rec) as run:
        if x.tl is not None and len(x.tl[0]):
            run.figure("timeline", _fi_timeline.timeline_figure(x.tl[0], f"Decode kernels of each point ({x.tl[1]}) — "
                                                                f"{x.pk['gpu']}"))
        analyse(run, x)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.reanalyse:
        return main_reanalyse(args)
    torch, fi = _fi.require_stack()
    x = SimpleNamespace(torch=torch, fi=fi, args=args, points=plan_points(args), child=ncu_pass.own_argv(argv),
                        ws=torch.zeros(256 << 20, dtype=torch.uint8, device="cuda"), kern=None, tl=None)
    if args.ncu_target:
        return ncu_target(x)
    x.models = list(dict.fromkeys(p["model"] for p in x.points))
    x.variants, x.lay0 = list(args.variants), _fi.head_layout(x.models[0])
    with Run(__file__, args, out=args.out) as run:
        # ---- check: the ceilings every % divides by; correctness before timing
        x.pk = ceilings.peaks()
        run.log(f"{x.pk['gpu']}: {ceilings.kinds_text(x.pk)}; L2 {x.pk.get('l2_mb')} MB; bf16 {x.pk['bf16_tflops']:.0f} "
                "TFLOP/s")
        check_correctness(run, x)
        # ---- measure
        x.df = sweep(run, x)
        x.m0 = x.df[x.df["model"] == x.models[0]]
        x.ref = reference(run, x)
        trace_calls(run, x)
        x.xrows = cross_check(run, x)
        if args.ncu:
            x.kern = profile_ncu(run, x)
        if args.nsys:
            x.tl = profile_nsys(run, x)
        # ---- analyse: figures, verdicts, story (the same as --reanalyse)
        analyse(run, Record(args=args, pk=x.pk, models=x.models, variants=x.variants, df=x.df, ref=x.ref, cs=x.cs,
                            pc=x.pc, ps=x.ps, plan_pc=_fi.per_call(x.prows) if x.prows is not None else None,
                            xrows=x.xrows, kern=x.kern, tl=x.tl))
    return 0


if __name__ == "__main__":
    run_main(main)
