#!/usr/bin/env python3
"""02 · Paged causal prefill attention: TFLOP/s against the tensor-core ceiling, FA2 vs FA3, tiles and splits.

What it measures
    flashinfer.BatchPrefillWithPagedKVCacheWrapper, causal, paged KV (page 16), bf16, with the
    Llama-3.1-8B (32 q / 8 kv heads) and 70B (64 / 8) head layouts, head_dim 128, query length
    128 -> 16k (batch 1, no cached prefix by default), for each backend asked for (fa2; fa3 on sm90).
    Per point: what plan() decided (backend, cta_tile_q, grid, split_kv; fa3 is persistent) and its CPU
    time (common.capture.timing.bench_cpu: median and 95% interval), the median kernel time (common.capture.timing.bench:
    CUPTI kernel time, cold L2), TFLOP/s from the causal FLOP count (common.tables.flops.prefill_flops) and % of
    this GPU's measured bf16 ceiling, arithmetic intensity from the minimum bytes (roofline), and the effective
    bandwidth (those bytes / time: a DRAM rate only where the working set is >= 4x L2, common.capture.timing.rates). The long
    reference (qo 8192) is timed 3 times per backend (reference.csv). A torch-profiler trace of a few
    shapes (3 calls each) shows the kernels each run() launched (split-KV merge, the fill kernel of run()
    without out=). Three shapes are also timed with FlashInfer's own bench_gpu_time (_fi_bench.cross_check).
    --ncu adds Nsight Compute per kernel, caches flushed before each pass as the timing flushed them (occupancy
    with registers/thread, shared memory/CTA, warps/CTA, CTAs/SM and the limiter, tensor pipe, measured DRAM bytes
    as % of the ceiling of their kind, L2 hit, warp stalls, grid; qo 512 profiled 3 times per backend); --nsys puts
    each point's kernels on a timeline.

What the plan expected (hypotheses: H_* below with their ranges and sources; judged on intervals by
common.judge.verdicts: inside -> confirmed, outside -> refuted, across a bound -> inconclusive)
    * FlashAttention-2 with online softmax, 128-token tiles; occupancy ~47% limited by shared memory (judged:
      shared memory alone sets the CTAs per SM), tensor pipe ~35%, HBM ~72% (judged on ncu's measured DRAM
      bytes), stalls led by long_scoreboard; a roofline position near the ridge point;
    * from the source (analysis.md H-08..H-12): on sm90 backend="auto" picks FA3 (persistent grid of one
      CTA per SM, no merge kernel) and FA3 beats FA2; FA2 is tensor-bound with ~12.5% theoretical
      occupancy; a single short request splits KV and merges; run() without out= adds a fill kernel.

Run
    python flashinfer/scripts/02_profile_prefill.py --quick          # ~1 min (warm JIT): qo 512/2k/8k
    python flashinfer/scripts/02_profile_prefill.py                  # full: qo 128 -> 16k
    python flashinfer/scripts/02_profile_prefill.py --quick --ncu    # + per-kernel hardware table
    python flashinfer/scripts/02_profile_prefill.py --quick --nsys   # + each point's kernels on a timeline
    python flashinfer/scripts/02_profile_prefill.py --backend fa2 --batch 8 --prefix 3584 --qo-lens 512
    python flashinfer/scripts/02_profile_prefill.py --reanalyse DIR --out OUT   # no GPU: the analysis again from DIR
    ./flashinfer/scripts/ncu_profile.sh --kernel 'BatchPrefillWithPagedKVCacheKernel|PrefillWithKVCacheKernel' \\
        --set full --count 2 -- python flashinfer/scripts/02_profile_prefill.py --ncu-target --quick
Writes flashinfer/results/02_profile_prefill/: sweep.csv, reference.csv, calls.csv, cross_check.csv,
kernels.csv + kernels_full.csv (--ncu), timeline.csv + timeline.png (--nsys), throughput.png, roofline.png,
trace.json, story.txt, summary.json (and ncu/: the raw ncu CSVs; merge_look.csv reads ncu/merge_full.csv).
--reanalyse DIR reads back the tables, trace.json (the kernels of each traced call) and ncu/merge_full.csv.
"""
from __future__ import annotations

import argparse
import dataclasses
import re
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
from common.base.checks import run_main, SetupError  # noqa: E402
from common.capture import ceilings, ncu, timing  # noqa: E402
from common.capture.models import PRESETS  # noqa: E402
from common.capture.ranges import nvtx_range  # noqa: E402
from common.capture.timing import bench, bench_cpu, RATE_COLUMNS, rates  # noqa: E402
from common.tables import flops, kernels, ncu_pass, trace  # noqa: E402
from common.judge import bounds  # noqa: E402
from common.judge.verdicts import declare, Hypothesis  # noqa: E402
from common.render import plots  # noqa: E402
from common.run import cli, recording  # noqa: E402
from common.run.results import Run  # noqa: E402

# ------------------------------------------------------------------ the sweep, as data
QO_FULL = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
QO_QUICK = (512, 2048, 8192)
MODELS = ("llama-3.1-8b", "llama-3.1-70b")     # head layouts (quick and full alike)
BACKENDS = ("fa2", "fa3", "auto")
NCU_REF = {"batch": 1, "qo_len": 512, "kv_len": 512}       # the plan's "seq 512": ncu REPEATS times per backend
LONG_REF = {"batch": 1, "qo_len": 8192, "kv_len": 8192}    # "long sequences": timed REPEATS times per backend
PROBE = (8, 512, 3584)   # batch, qo, cached prefix: the shape the shared H200 probe timed (traced, cross-checked)
KERNELS = "BatchPrefillWithPagedKVCacheKernel|PrefillWithKVCacheKernel|MergeStates"
PAGE = 16

# ------------------------------------------------------------------ the hypotheses, as data
PLAN = "PLAN.md session 3 / flashinfer/reports/plan.md §02 (A100)"
H = declare(f"""
    auto = auto-is-fa3: on sm90 (H100/H200) backend="auto" runs FA3, not the FA2 kernel the plan describes
        judged on: the backend plan() resolved (deterministic)
        source: analysis.md H-11
    ridge = prefill-near-ridge: prefill (seq 512, 32 heads) sits near the ridge point of the roofline
        judged on: intensity (common.tables.flops FLOPs / minimum bytes) over the ridge of the measured ceilings, batch 1 qo
            512: arithmetic, no timing; near = within a factor 2
        source: {PLAN}: 'near the ridge point'
    tensor = prefill-tensor-bound: prefill is tensor-core bound at long sequences
        judged on: TFLOP/s (common.tables.flops / CUPTI time) as % of the measured bf16 ceiling at qo 8192, {REPEATS}
            repetitions
        confirmed: >= 30%
        source: analysis.md H-08; the plan's tensor pipe ≈ 35% less 5 points as the floor
    fa3_faster = fa3-beats-fa2: FA3 beats FA2 on the same shapes
        judged on: time ratio fa3 / fa2 on every swept query length of the first model
        confirmed: <= 0.95
        source: analysis.md H-11; 'beats' read as >= 5%
    split_b1 = prefill-split-b1: a single short request (fa2, qo 512, empty cache) splits the KV and merges; batch 8
            does not
        judged on: split_kv and merge kernel of each of {REPEATS} traced calls
        source: analysis.md H-10
    fa3_no_merge = fa3-no-merge: FA3 never launches a merge kernel (persistent scheduler, no split-KV)
        judged on: merge kernel in each traced fa3 call
        source: analysis.md H-11
    fill = prefill-fill-kernel: run() without out= launches an extra fill kernel (torch.zeros) before attention
        judged on: kernels per traced call with and without out=
        source: analysis.md H-12
    occ = prefill-occupancy: occupancy ~47%
        judged on: achieved occupancy (ncu), {REPEATS} launches at qo 512
        confirmed: [35, 60]%
        source: {PLAN}: 'occupancy ≈ 47%', read as 35-60%
    smem = prefill-smem-limit: occupancy is limited by shared memory
        judged on: shared memory alone sets the CTAs per SM: its launch__occupancy_limit_shared_mem is below the
            register, warp and block limits (ncu, a launch property; a tie with registers is not 'limited by shared
            memory': raising the shared-memory budget would not add a CTA)
        source: {PLAN}
    pipe = prefill-tensor-pipe: tensor pipe ~35%
        judged on: tensor pipe % (ncu), {REPEATS} launches at qo 512
        confirmed: [25, 45]%
        source: {PLAN}: 'tensor pipe ≈ 35%', read as 25-45%
    hbm = prefill-hbm: HBM ~72% of peak
        judged on: ncu's measured DRAM bytes (read + written) over its kernel time, as % of the measured DRAM ceiling
            of the same kind of traffic (common.tables.kernels dram_pct), {REPEATS} launches at qo 512 with the caches
            flushed before each pass; the formula bytes of qo 512 (~10 MB, far below the L2) give no DRAM rate
        confirmed: [60, 85]%
        source: {PLAN}: 'HBM ≈ 72-75% of peak'
    stall = prefill-long-scoreboard: stalls are led by long_scoreboard (then barrier, short_scoreboard)
        judged on: top warp stall (ncu) of each of {REPEATS} launches at qo 512
        source: {PLAN}
    fa2_theo = fa2-theoretical-occupancy: FA2 theoretical occupancy is ~12.5% (2 CTAs x 4 warps per SM)
        judged on: theoretical occupancy <= 20% (ncu: a launch property)
        source: analysis.md H-09
    fa3_grid = fa3-persistent-grid: FA3 launches a persistent grid of one CTA per SM
        judged on: grid x (ncu) against the SM count
        source: analysis.md H-11
""")


def for_backend(h: Hypothesis, be: str) -> Hypothesis:
    return dataclasses.replace(h, id=f"{h.id}-{be}", claim=f"{be}: {h.claim}")


def parse_args(argv=None):
    p = cli.parser(__file__, __doc__, quick="query lengths 512/2k/8k (~1 min)")
    p.add_argument("--ncu", action="store_true", help="also profile every point once (qo 512 3x) under ncu")
    p.add_argument("--nsys", action="store_true", help="also put each point's kernels on a timeline (Nsight Systems)")
    p.add_argument("--ncu-target", action="store_true", help=argparse.SUPPRESS)  # run points once, for ncu/nsys
    p.add_argument("--ncu-kind", default=None, help=argparse.SUPPRESS)  # --ncu-target: only points of this kind
    p.add_argument("--backend", type=cli.choices_list(*BACKENDS), default=["fa2", "fa3"],
                   help="comma-separated: fa2, fa3 (sm90 only), auto; default fa2,fa3")
    p.add_argument("--models", type=cli.choices_list(*PRESETS), default=None,
                   help="model presets (head layouts), comma-separated (default llama-3.1-8b,llama-3.1-70b)")
    p.add_argument("--qo-lens", type=cli.positive_ints, default=None, help="comma-separated query lengths")
    p.add_argument("--batch", type=cli.positive_int, default=1, help="requests per call (default 1)")
    p.add_argument("--prefix", type=cli.non_negative_int, default=0, help="cached tokens before the new ones")
    recording.add_flag(p)
    return p.parse_args(argv)


def plan_points(args, backends) -> list[dict]:
    qos = args.qo_lens or (QO_QUICK if args.quick else QO_FULL)
    return [{"model": m, "backend": be, "batch": args.batch, "qo_len": qo, "kv_len": args.prefix + qo}
            for m in (args.models or MODELS) for be in backends for qo in qos]


def target_points(args, backends) -> list[dict]:
    """What --ncu-target runs: the sweep, then qo 512 (first model) REPEATS times per backend; with --ncu-kind K
    only the points of kind K ("sweep" or "reference")."""
    m0 = (args.models or MODELS)[0]
    pts = _fi.with_repeats(plan_points(args, backends), [{"model": m0, "backend": be, **NCU_REF} for be in backends])
    return [p for p in pts if args.ncu_kind in (None, p["kind"])]


def label(p) -> str:
    return f"prefill {p['backend']} b={p['batch']} qo={p['qo_len']} kv={p['kv_len']}" + (
        f" ({p['model']})" if p.get("model", MODELS[0]) != MODELS[0] else "")


def usable_backends(x, log) -> list[str]:
    """fa3 needs sm90a (compute capability 9.x and CUDA >= 12.3): left out elsewhere, saying so."""
    from flashinfer.utils import is_sm90a_supported
    sm90 = is_sm90a_supported(x.torch.device("cuda"))
    if "fa3" in x.args.backend and not sm90:
        log("[skip] backend fa3: this GPU/toolkit is not sm90a (FlashInfer's FA3 kernels are Hopper-only)")
    out = [be for be in x.args.backend if be != "fa3" or sm90]
    if not out:
        raise SetupError("--backend fa3 needs an sm90a GPU (H100/H200) and CUDA >= 12.3; use --backend fa2 here")
    return out


def wrapper(x, be):
    return x.fi.BatchPrefillWithPagedKVCacheWrapper(x.ws, "NHD", backend=be)


def make_point(x, w, lay, batch, qo, kv, out_buf=True):
    """Cache, plan and a run() closure for one point: (fn, plan facts, keep); keep["replan"] repeats plan()."""
    torch = x.torch
    cache, kv_indptr, kv_indices, last = _fi.make_paged_kv(torch, [kv] * batch, lay["hkv"], lay["d"], PAGE)
    qo_indptr = torch.arange(batch + 1, device="cuda", dtype=torch.int32) * qo
    replan = lambda: w.plan(qo_indptr, kv_indptr, kv_indices, last, lay["hq"], lay["hkv"], lay["d"], PAGE,  # noqa: E731
                            causal=True, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    replan()  # first: may load/compile the module
    q = torch.randn(batch * qo, lay["hq"], lay["d"], device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    fn = (lambda: w.run(q, cache, out=out)) if out_buf else (lambda: w.run(q, cache))
    return fn, _fi.plan_facts(w), {"t": (cache, q, out), "replan": replan}


def check_correctness(run, x):
    """Each backend against float32 torch: 3 requests (1, 77, 300 new tokens on 5, 200, 300 KV), scattered pages."""
    torch, qo_lens, kv_lens = x.torch, [1, 77, 300], [5, 200, 300]
    for model in x.models:
        lay = _fi.head_layout(model)
        cache, kv_indptr, kv_indices, last = _fi.make_paged_kv(torch, kv_lens, lay["hkv"], lay["d"], PAGE, shuffle=True)
        qo_indptr = torch.tensor([0, 1, 78, 378], device="cuda", dtype=torch.int32)
        q = torch.randn(sum(qo_lens), lay["hq"], lay["d"], device="cuda", dtype=torch.bfloat16)
        for be in x.backends:
            w = wrapper(x, be)
            w.plan(qo_indptr, kv_indptr, kv_indices, last, lay["hq"], lay["hkv"], lay["d"], PAGE, causal=True,
                   q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
            o = w.run(q, cache)
            errs = [_fi.rel_err(o[int(qo_indptr[b]):int(qo_indptr[b + 1])], _fi.ref_attention(
                torch, q[int(qo_indptr[b]):int(qo_indptr[b + 1])], *_fi.gather_kv(cache, kv_indptr, kv_indices, last, b),
                causal=True)) for b in range(3)]
            good = all(e < 2e-2 for e in errs)   # NaN compares False
            run.log(f"correctness {model} {be} (ran {w._backend}): rel.err per request "
                    f"{', '.join(f'{e:.1e}' for e in errs)} {'✅' if good else '❌'}")
            if not good:
                raise RuntimeError(f"prefill ({be}, {model}) disagrees with the torch reference (rel. error >= 2e-2)")
    run.log("All results match. Starting benchmarks.")


def ncu_target(x) -> int:
    """Under ncu / nsys: every target point once, a marker kernel before each (common.tables.kernels.split_points)."""
    x.backends = usable_backends(x, print)
    wr = {be: wrapper(x, be) for be in x.backends}

    def make(p):
        fn, _facts, keep = make_point(x, wr[p["backend"]], _fi.head_layout(p["model"]), p["batch"], p["qo_len"],
                                      p["kv_len"])
        return fn, keep
    return ncu_pass.run_points(x.torch, target_points(x.args, x.backends), make, label)


def work(p, lay) -> dict:
    """FLOPs and formula bytes of one prefill call (common.tables.flops), the kind of its traffic (O written, Q, K, V read)
    and its working set (every byte touched once: the formula bytes)."""
    qos, kvs = [p["qo_len"]] * p["batch"], [p["kv_len"]] * p["batch"]
    nbytes = flops.prefill_bytes(qos, kvs, lay["hq"], lay["hkv"], lay["d"])
    out = sum(qos) * lay["hq"] * lay["d"] * 2
    return {"flops": flops.prefill_flops(qos, kvs, lay["hq"], lay["d"]), "bytes": nbytes,
            "mix": ceilings.dram_kind(nbytes - out, out), "working_set": nbytes}


def timed(x, p, fn, lay) -> dict:
    """One timing at point ``p``: CUPTI kernel time, TFLOP/s (% of the bf16 ceiling) and effective TB/s from
    common.tables.flops (common.capture.timing.rates)."""
    with nvtx_range(label(p)):
        t = bench(fn)
    w = work(p, lay)
    r = rates(t.median_ms, flops=w["flops"], bytes=w["bytes"], peaks=x.pk, mix=w["mix"], working_set=w["working_set"])
    return {"time_us": t.median_us, "spread_pct": t.spread_pct, **timing.rate_row(r)}


def sweep(run, x):
    """Every point once; plan() CPU time with bench_cpu (median, 95% interval of the median)."""
    wr = {be: wrapper(x, be) for be in x.backends}

    def measure(p):
        lay = _fi.head_layout(p["model"])
        fn, facts, keep = make_point(x, wr[p["backend"]], lay, p["batch"], p["qo_len"], p["kv_len"])
        plan = stats.interval(bench_cpu(keep["replan"], rep_ms=20).samples_ms)
        return {**p, "ran": facts.get("backend"), **timed(x, p, fn, lay), "plan_us": 1e3 * plan.point,
                "plan_us_lo": 1e3 * plan.lo, "plan_us_hi": 1e3 * plan.hi, "cta_tile_q": facts.get("cta_tile_q"),
                "grid_x": facts.get("padded_batch_size"), "split_kv": facts.get("split_kv"),
                "kv_chunk_tokens": facts.get("kv_chunk_tokens")}
    return _fi.sweep(run, x.torch, x.points, measure,
                     lambda p: f"{p['model']} {p['backend']} batch={p['batch']} qo={p['qo_len']} kv={p['kv_len']}")


def reference(run, x):
    """qo 8192 per backend (first model) timed REPEATS times: what H["tensor"] is judged on (reference.csv)."""
    import pandas as pd
    rows = []
    for be in x.backends:
        p = {"model": x.models[0], "backend": be, **LONG_REF}
        try:
            fn, _facts, keep = make_point(x, wrapper(x, be), x.lay0, p["batch"], p["qo_len"], p["kv_len"])
            rows += [{**p, "rep": i, **timed(x, p, fn, x.lay0)} for i in range(REPEATS)]
            del keep, fn
        except Exception as e:  # noqa: BLE001
            run.point_error({"reference": label(p)}, e)
    df = pd.DataFrame(rows, columns=["model", "backend", "batch", "qo_len", "kv_len", "rep", "time_us", "spread_pct",
                                     *RATE_COLUMNS])
    run.table("reference", df)
    return df


def auto_backend(run, x) -> str:
    """What backend="auto" resolves to here (plan only)."""
    try:
        _fn, facts, _k = make_point(x, wrapper(x, "auto"), x.lay0, 1, 512, 512)
        run.note(f'backend="auto" resolved to {facts.get("backend")} (plan_info layout: {facts.get("layout")})')
        return str(facts.get("backend"))
    except Exception as e:  # noqa: BLE001 - e.g. the fa3 module failed to compile: said, the run goes on
        run.point_error({"backend": "auto"}, e)
        return "error"


def trace_calls(run, x):
    """Kernels per call from a torch-profiler trace (REPEATS calls per shape), joined with
    common.tables.trace.kernels_in_ranges: split+merge at batch 1, none on the probe shape, the fill kernel."""
    import pandas as pd
    shapes = [(be, 1, 512, 0, True) for be in x.backends] + [(be, *PROBE, True) for be in x.backends]
    shapes += [(be, *PROBE, False) for be in x.backends if be == "fa2"][:1]
    calls, meta, keep = [], {}, []
    for be, b, qo, pre, out_buf in shapes:
        lab = label({"backend": be, "batch": b, "qo_len": qo, "kv_len": qo + pre}) + ("" if out_buf else " out=None")
        try:
            w = wrapper(x, be)
            fn, facts, k = make_point(x, w, x.lay0, b, qo, qo + pre, out_buf=out_buf)
        except Exception as e:  # noqa: BLE001
            run.point_error({"trace": lab}, e)
            continue
        calls.append((lab, fn))
        keep.append((w, k))
        meta[lab] = {"backend": be, "batch": b, "qo_len": qo, "kv_len": qo + pre, "out_given": out_buf,
                     "plan_split_kv": facts.get("split_kv"), "plan_grid_x": facts.get("padded_batch_size"),
                     "plan_cta_tile_q": facts.get("cta_tile_q"), "plan_kv_chunk_tokens": facts.get("kv_chunk_tokens")}
    ev = trace.read_chrome_trace(trace.capture_calls(x.torch, calls, run.path("trace.json"), reps=REPEATS))
    del keep, calls
    x.torch.cuda.empty_cache()
    x.rows = trace.kernels_in_ranges(ev, r"^prefill ")
    meta_of = lambda df: df.join(pd.DataFrame([meta.get(lab, {}) for lab in df["label"]], index=df.index))  # noqa: E731
    x.cs, x.pc = meta_of(_fi.calls_summary(x.rows)), meta_of(_fi.per_call(x.rows))
    run.table("calls", x.cs)


def cross_check(run, x) -> list:
    """FlashInfer's own bench_gpu_time on the same callables (_fi_bench.cross_check_points): cross_check.csv."""
    def points():
        longest = int(x.m0["qo_len"].max())
        for be, b, qo, pre in [(x.backends[0], *PROBE)] + [(be, *PROBE) for be in x.backends[1:2]] + \
                              [(x.backends[0], 1, longest, 0)]:
            w = wrapper(x, be)
            _, _, k = make_point(x, w, x.lay0, b, qo, qo + pre)
            yield {"backend": be, "batch": b, "qo_len": qo, "kv_len": qo + pre}, f"{be} b{b} qo{qo}", w, k["t"]
            del k
    return _fi_bench.cross_check_points(run, points, bench)


def profile_ncu(run, x):
    """Every target point once under ncu, qo 512 REPEATS times per backend: kernels.csv (+ kernels_full.csv)."""
    run.log("ncu: every point once, qo 512 three times per backend (occupancy, tensor pipe, DRAM, stalls)")
    kern = ncu_pass.profile_points(run, __file__, x.child, KERNELS, target_points(x.args, x.backends), x.pk,
                                   timeout=1200)[0]
    kern["role"] = ["merge" if "Merge" in k else "attention" for k in kern["kernel"]]
    run.table("kernels_full", kern)
    run.table("kernels", _fi.compact_kernels(kern, ("kind", "rep", "model", "backend", "batch", "qo_len", "kv_len",
                                                    "role")))
    return kern


def look_at_merge(run, x) -> list[str]:
    """A closer look at the merge kernel FA2 adds at batch 1 (issue 21.4): the first merge launch of the reference
    points (fa2 b1 qo512) under ncu --set full (merge_full.csv), read by common.judge.bounds.look: how the launch fills the
    GPU, how busy the issue slots are, its pipes, instructions per DRAM byte and the stalls with what they mean.
    Optional: a failure is one note and the run goes on."""
    from common.tables import kernels as kt
    if "fa2" not in x.backends:
        return []
    run.log("ncu --set full: the first merge launch of fa2 b1 qo512 (a closer look)")
    try:
        res = ncu.profile(ncu_pass.target_cmd(__file__, ["--ncu-kind", "reference", *x.child]), run.dir / "ncu",
                          name="merge_full", kernel="MergeState", launch_count=1, section_set="full", metrics=None,
                          cache_control="all", echo=run.log, timeout=600)
        raw = res.df.iloc[0].to_dict()
        row = kt.joined(kernels.summarize(res.df, peaks=x.pk), x.pk).iloc[0].to_dict()
    except Exception as e:  # noqa: BLE001 - the closer look is optional
        run.note(f"the merge kernel's closer look did not run ({e.__class__.__name__}: {str(e).splitlines()[0][:160]})")
        return []
    run.table("merge_look", kernels.summarize(res.df, peaks=x.pk))
    return look_lines(raw, row)


def look_lines(raw: dict, row: dict) -> list[str]:
    """The closer look's story lines: the merge launch's summary (``row``: common.tables.kernels.joined of its summarize()
    row, merge_look.csv) and what common.judge.bounds.look reads in its --set full metrics (``raw``: ncu/merge_full.csv)."""
    return [f"{row['kernel']}: {row['ncu_time_us']:.1f} us under ncu (caches flushed), {bounds.bound_why(row)}",
            *bounds.look(raw, row)]


def profile_nsys(run, x):
    """Each point's prefill kernels on a timeline: nsys over --ncu-target, else this run's torch trace."""
    tl, src = _fi_timeline.timeline(run, __file__, x.child, target_points(x.args, x.backends), KERNELS, label, x.rows)
    run.table("timeline", tl)
    if len(tl):
        run.figure("timeline", _fi_timeline.timeline_figure(tl, f"Prefill kernels of each point ({src}) — {x.pk['gpu']}"))
    return tl, src


def figures(run, x):
    df = x.df.assign(series=x.df["model"].str.replace("llama-3.1-", "") + " " + x.df["backend"])
    run.figure("throughput", plots.sweep(df, x="qo_len", y="pct_bf16_ceiling", hue="series", logx=True,
                                         of=ceilings.ceiling_text(x.pk, "bf16_tflops"),
                                         title=f"Causal paged prefill, batch {x.args.batch} — {x.pk['gpu']}"))
    pts = [{"label": f"{r.series} qo{r.qo_len}" if r.qo_len in (512, int(df["qo_len"].max())) else "",
            "series": r.series, "flop_per_byte": r.flop_per_byte, "tflop_s": r.tflop_s} for r in df.itertuples()]
    if x.kern is not None:
        for r in x.kern[(x.kern["role"] == "attention") & (x.kern["kind"] == "sweep")].itertuples():
            lay = _fi.head_layout(r.model)
            f = flops.prefill_flops([r.qo_len] * r.batch, [r.kv_len] * r.batch, lay["hq"], lay["d"])
            mb = r.dram_read_mb + r.dram_write_mb
            if mb > 0 and r.ncu_time_us > 0:
                pts.append({"label": "", "series": f"ncu {r.backend} (measured bytes)", "flop_per_byte": f / (mb * 1e6),
                            "tflop_s": f / (r.ncu_time_us * 1e-6) / 1e12})
    run.figure("roofline", plots.roofline(pts, x.pk, title="Causal paged prefill (bytes: common.tables.flops; 'ncu': measured)"))


def judge_timing(run, x):
    """auto -> FA3, the ridge (arithmetic), tensor-bound at qo 8192 (REPEATS timings), FA3 vs FA2 over shapes."""
    cc = x.cc
    run.fact(H["auto"], x.auto == "fa3", f"auto -> {x.auto} on compute capability {cc[0]}.{cc[1]}", "summary.json notes",
             premise=True if cc[0] == 9 else f"compute capability {cc[0]}.{cc[1]} is not sm90")
    lay, ridge = x.lay0, x.pk["bf16_tflops"] / x.pk["dram_tb_s"]
    ai = flops.intensity(flops.prefill_flops([512], [512], lay["hq"], lay["d"]),
                         flops.prefill_bytes([512], [512], lay["hq"], lay["hkv"], lay["d"]))
    run.fact(H["ridge"], 0.5 <= ai / ridge <= 2, f"qo 512: {ai:.0f} FLOP/byte vs ridge {ridge:.0f} "
             f"({ceilings.ceiling_text(x.pk, 'bf16_tflops')} / {ceilings.ceiling_text(x.pk)}): {ai / ridge:.2f}x", "sweep.csv")
    for be in x.backends:
        ref = x.ref[x.ref["backend"] == be]
        if len(ref):
            run.headline(**{f"{be}_qo8192_tflop_s": float(ref["tflop_s"].median()),
                            f"{be}_qo8192_pct_of_bf16_ceiling": float(ref["pct_bf16_ceiling"].median())})
        run.judge(for_backend(H["tensor"], be), list(ref["pct_bf16_ceiling"]), evidence="reference.csv",
                  detail=f"of {ceilings.ceiling_text(x.pk, 'bf16_tflops')}; "
                         f"{timing.eff_text(timing.median_row(ref.to_dict('records')), x.pk)}" if len(ref) else "")
    if {"fa2", "fa3"} <= set(x.backends):
        piv = x.m0.pivot_table(index="qo_len", columns="backend", values="time_us").dropna()
        iv = stats.over(piv["fa3"] / piv["fa2"], "query lengths")
        run.headline(fa3_over_fa2_time_median=iv.point)
        run.judge(H["fa3_faster"], iv, evidence="sweep.csv")
    _fi_bench.judge_cross_check(run, x.xrows, lambda r: f"{r['backend']} b{r['batch']} qo{r['qo_len']}")


def judge_calls(run, x):
    """Split + merge at batch 1, none at batch 8, none ever for FA3, the fill kernel without out=."""
    pc = x.pc[x.pc["backend"] == "fa2"]
    given = pc["out_given"].astype(bool)
    one, probe = pc[(pc["batch"] == 1) & given], pc[(pc["batch"] == PROBE[0]) & given]
    if len(one) and len(probe):
        run.fact(H["split_b1"], [bool(r.plan_split_kv) and r.merge_us > 0 for r in one.itertuples()] +
                 [not r.plan_split_kv and r.merge_us == 0 for r in probe.itertuples()],
                 f"b1 qo512: split_kv={one['plan_split_kv'].iloc[0]}, {_fi.pick(x.cs, label=one['label'].iloc[0])['kernels']}"
                 f"; b8 qo512 kv4096: split_kv={probe['plan_split_kv'].iloc[0]}, "
                 f"{_fi.pick(x.cs, label=probe['label'].iloc[0])['kernels']}", "calls.csv")
    fa3 = x.pc[x.pc["backend"] == "fa3"]
    if len(fa3):
        run.fact(H["fa3_no_merge"], [m == 0 for m in fa3["merge_us"]], "; ".join(
            f"{r.label}: {r.kernels}" for r in x.cs[x.cs["backend"] == "fa3"].itertuples()), "calls.csv")
    none = pc[(pc["batch"] == PROBE[0]) & ~given]
    if len(none) and len(probe):
        n, g = _fi.pick(x.cs, label=none["label"].iloc[0]), _fi.pick(x.cs, label=probe["label"].iloc[0])
        run.fact(H["fill"], [bool(f) for f in none["fill_kernel"]] + [not f for f in probe["fill_kernel"]] +
                 [k - probe["kernels"].median() == 1 for k in none["kernels"]],
                 f"out=None: {n['kernels']} ({n['kernels_per_call']:.0f}/call); out given: {g['kernels']} "
                 f"({g['kernels_per_call']:.0f}/call)", "calls.csv")


def smem_alone(r: dict) -> bool:
    """Shared memory alone sets the CTAs per SM of a launch (common.tables.kernels' limiter, from launch__occupancy_limit_*):
    'shared_mem (2 CTAs/SM)' is, a tie such as 'registers+shared_mem (2 CTAs/SM)' is not."""
    return str(r.get("limiter") or "").split(" ")[0] == "shared_mem"


def judge_ncu(run, x):
    """The plan's hardware figures on the REPEATS ncu launches of qo 512 per backend."""
    sms = x.sms
    for be in x.backends:
        rows = [r for r in _fi.reference_rows(x.kern, backend=be) if r["role"] == "attention"]
        where, h = f"{len(rows)} launches of {be} b1 qo512 (kernels.csv, kind=reference)", lambda hh: for_backend(hh, be)
        run.judge(h(H["occ"]), [r["occupancy_pct"] for r in rows], evidence=where,
                  detail=_fi.occupancy_text(rows[0]) if rows else "")
        run.fact(h(H["smem"]), [smem_alone(r) for r in rows] or None,
                 f"limiter {rows[0]['limiter']}; {_fi.occupancy_text(rows[0])}" if rows else "limiter n/a", where)
        run.judge(h(H["pipe"]), [r["tensor_pct"] for r in rows], evidence=where, detail="; ".join(
            dict.fromkeys(bounds.bound_why(r) for r in rows)))
        run.judge(h(H["hbm"]), [r.get("dram_pct") for r in rows], evidence=where, detail="; ".join(
            dict.fromkeys(f"{kernels.COLUMNS['dram_tb_s'].show(r)}, {kernels.COLUMNS['l2_hit_pct'].show(r)}" for r in rows))
            + (f"; of {ceilings.ceiling_text(x.pk, ceilings.DRAM_KEYS[rows[0]['dram_kind']])}" if rows else ""))
        run.fact(h(H["stall"]), [bounds.top_stall(r) == "long_scoreboard" for r in rows] or None,
                 "; ".join(dict.fromkeys(f"{r['top_stalls']}" for r in rows)) or "n/a", where)
        if be == "fa2":
            run.fact(H["fa2_theo"], [r["theoretical_occupancy_pct"] <= 20 for r in rows] or None,
                     f"theoretical {rows[0]['theoretical_occupancy_pct']:.1f}%" if rows else "n/a", where)
        if be == "fa3":
            run.fact(H["fa3_grid"], [(_fi.grid_dims(r.get("grid")) or (0,))[0] == sms for r in rows] or None,
                     f"grid {rows[0].get('grid') if rows else 'n/a'}, {sms} SMs", where)


def findings(run, x):
    """The sentence the pages state about this run (Run.finding), from the figures the story prints: the merge kernel a
    split short prefill adds against the attention kernel it merges (ncu time of the first split FA2 call shown)."""
    if x.kern is None:
        return
    split = x.cs[(x.cs["backend"] == "fa2") & x.cs["plan_split_kv"].astype(bool) & x.cs["out_given"].astype(bool)]
    for r in split.itertuples():
        k = x.kern[(x.kern["kind"] == "sweep") & (x.kern["backend"] == "fa2") & (x.kern["batch"] == r.batch)
                   & (x.kern["qo_len"] == r.qo_len) & (x.kern["kv_len"] == r.kv_len) & (x.kern["model"] == x.models[0])]
        att, mrg = (k[k["role"] == role]["ncu_time_us"].median() for role in ("attention", "merge"))
        if att == att and mrg == mrg:
            run.finding(f"FA2 at batch {r.batch}, {r.qo_len} new tokens on {r.kv_len} KV splits the KV: its merge kernel "
                        f"takes {story.fmt(mrg)} us of ncu time, {'longer than' if mrg > att else 'less than'} the "
                        f"{story.fmt(att)} us of the attention kernel it merges.")
            return


def tell(x) -> str:
    """The execution story: per traced shape what plan() decided, what run() launched, time and TFLOP/s."""
    items = [(f'backend="auto" -> {x.auto}', [])]
    for r in x.cs.itertuples():
        s = _fi.pick(x.m0, backend=r.backend, batch=r.batch, qo_len=r.qo_len, kv_len=r.kv_len)
        plan = (f"plan(): cta_tile_q {r.plan_cta_tile_q:.0f}, grid x {r.plan_grid_x}, split_kv={r.plan_split_kv}"
                + (f" (chunk {r.plan_kv_chunk_tokens} tokens)" if r.plan_split_kv else "")
                if (r.plan_cta_tile_q or 0) > 0 else "plan(): FA3 persistent schedule (grid = SM count, no split-KV)")
        kids = [(plan + (f", {s['plan_us']:.0f} us CPU [{s['plan_us_lo']:.0f}, {s['plan_us_hi']:.0f}]" if s else ""), []),
                (f"run(): {r.kernels_per_call:.0f} kernel(s) per call: {r.kernels}", [])]
        if s:
            kids.append((f"{s['time_us']:.1f} us -> {s['tflop_s']:.0f} TFLOP/s = {s['pct_bf16_ceiling']:.0f}% of the "
                         f"bf16 ceiling, {s['flop_per_byte']:.0f} FLOP/byte; {timing.eff_text(s, x.pk)}", []))
        if x.kern is not None:
            kk = x.kern[(x.kern["kind"] == "sweep") & (x.kern["backend"] == r.backend) & (x.kern["qo_len"] == r.qo_len)
                        & (x.kern["kv_len"] == r.kv_len) & (x.kern["batch"] == r.batch) & (x.kern["model"] == x.models[0])]
            kids += [kernels.node(k, head=f"{k['kernel']} (ncu) [{bounds.bound_why(k)}]") for k in kk.to_dict("records")]
        items.append((f"{r.backend}: batch {r.batch}, {r.qo_len} new tokens on {r.kv_len} KV"
                      + ("" if r.out_given else ", out=None"), kids))
    for be, g in x.ref.groupby("backend", sort=False):
        items.append((f"{be} qo 8192 ({REPEATS} repetitions): " + ", ".join(f"{v:.0f}%" for v in g["pct_bf16_ceiling"])
                      + " of the bf16 ceiling", []))
    if x.xrows:
        items.append((_fi_bench.cross_check_line(x.xrows, lambda r: f"{r['backend']} b{r['batch']} qo{r['qo_len']}"), []))
    lay, ridge = x.lay0, x.pk["bf16_tflops"] / x.pk["dram_tb_s"]
    text = story.tree(f"PREFILL ATTENTION (causal, paged) — {x.pk['gpu']}, {x.models[0]} heads ({lay['hq']} q / "
                      f"{lay['hkv']} kv, d {lay['d']}), bf16; % of {ceilings.ceiling_text(x.pk, 'bf16_tflops')}, ridge "
                      f"{ridge:.0f} FLOP/B", items)
    if x.look:
        text += ("\n\nTHE MERGE KERNEL, A CLOSER LOOK (ncu --set full, fa2 b1 qo512): what a small reduction spends its "
                 "time on\n" + "\n".join(f"  {line}" for line in x.look))
    if x.tl is not None:
        tl, src = x.tl
        text += (f"\n\nTIMELINE ({src}): the prefill kernels of each point, in launch order\n"
                 + "\n".join(_fi_timeline.timeline_lines(tl)[:24]))
    return text


@dataclass
class Record:
    """What the analysis of one run reads: the plan, the ceilings and the GPU's facts, and what the GPU phase measured
    (the same a --reanalyse reads back from a recording: its tables, trace.json and ncu/merge_full.csv)."""
    args: argparse.Namespace
    pk: dict
    cc: tuple                     # compute capability
    sms: int                      # SM count
    backends: list
    models: list
    auto: str                     # what backend="auto" resolved to (the run's note)
    df: Any                       # sweep.csv
    ref: Any                      # reference.csv
    cs: Any                       # calls.csv
    pc: Any                       # per traced call: trace.json's kernels joined with calls.csv's plan facts
    xrows: list = field(default_factory=list)   # cross_check.csv
    kern: Any = None              # kernels_full.csv (--ncu)
    look: list = field(default_factory=list)    # merge_look.csv + ncu/merge_full.csv (--ncu)
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
    judge_calls(run, x)
    if x.kern is not None:
        judge_ncu(run, x)
    findings(run, x)
    # ---- the story
    run.story(tell(x), echo=True)


def main_reanalyse(args) -> int:
    rec = recording.open(args.reanalyse, __file__, tables=("sweep", "reference", "calls"),
                         optional=("cross_check", "kernels_full", "merge_look", "timeline"),
                         copy=("trace.json", "trace.json.gz"))
    a = rec.args_like(args)
    cc, sms = _fi.device_of(rec.summary)
    models = list(dict.fromkeys(p["model"] for p in plan_points(a, a.backend)))
    auto = next((m.group(1) for n in rec.summary.get("notes", [])
                 for m in [re.match(r'backend="auto" resolved to (\S+)', n)] if m), "error")
    cs, look = _fi.as_recorded(rec.tables["calls"]), []
    if rec.tables["merge_look"] is not None:   # the closer look: its summary row and its --set full metrics
        look = look_lines(_fi.recorded_ncu_row(rec.src, "merge_full.csv"),
                          kernels.joined(_fi.as_recorded(rec.tables["merge_look"]), rec.peaks).iloc[0].to_dict())
    xc = rec.tables["cross_check"]
    x = Record(args=a, pk=rec.peaks, cc=cc, sms=sms, backends=[be for be in a.backend if be != "fa3" or cc[0] == 9],
               models=models, auto=auto, df=rec.tables["sweep"], ref=rec.tables["reference"], cs=cs,
               pc=_fi.per_call_from(_fi.recorded_trace(rec.src, "the kernels of each traced call"), r"^prefill ", cs),
               xrows=xc.to_dict("records") if xc is not None else [], kern=_fi.as_recorded(rec.tables["kernels_full"]), look=look,
               tl=_fi_timeline.recorded_timeline(rec))
    with recording.run(__file__, args, rec) as run:
        if x.tl is not None and len(x.tl[0]):
            run.figure("timeline", _fi_timeline.timeline_figure(x.tl[0], f"Prefill kernels of each point ({x.tl[1]}) — "
                                                                f"{x.pk['gpu']}"))
        analyse(run, x)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.reanalyse:
        return main_reanalyse(args)
    torch, fi = _fi.require_stack()
    x = SimpleNamespace(torch=torch, fi=fi, args=args, child=ncu_pass.own_argv(argv), kern=None, tl=None, look=[],
                        ws=torch.zeros(256 << 20, dtype=torch.uint8, device="cuda"))
    if args.ncu_target:
        return ncu_target(x)
    with Run(__file__, args, out=args.out) as run:
        # ---- check: the ceilings every % divides by; correctness before timing
        x.pk = ceilings.peaks()
        run.log(f"{x.pk['gpu']}: % of {ceilings.ceiling_text(x.pk, 'bf16_tflops')}; ridge "
                f"{x.pk['bf16_tflops'] / x.pk['dram_tb_s']:.0f} FLOP/byte")
        x.backends = usable_backends(x, run.log)
        x.points = plan_points(args, x.backends)
        x.models = list(dict.fromkeys(p["model"] for p in x.points))
        x.lay0 = _fi.head_layout(x.models[0])
        check_correctness(run, x)
        # ---- measure
        x.auto = auto_backend(run, x)
        x.df = sweep(run, x)
        x.m0 = x.df[x.df["model"] == x.models[0]]
        x.ref = reference(run, x)
        trace_calls(run, x)
        x.xrows = cross_check(run, x)
        if args.ncu:
            x.kern = profile_ncu(run, x)
            x.look = look_at_merge(run, x)
        if args.nsys:
            x.tl = profile_nsys(run, x)
        # ---- analyse: figures, verdicts, story (the same as --reanalyse)
        analyse(run, Record(args=args, pk=x.pk, cc=tuple(torch.cuda.get_device_capability()),
                            sms=torch.cuda.get_device_properties(0).multi_processor_count, backends=x.backends,
                            models=x.models, auto=x.auto, df=x.df, ref=x.ref, cs=x.cs, pc=x.pc, xrows=x.xrows,
                            kern=x.kern, look=x.look, tl=x.tl))
    return 0


if __name__ == "__main__":
    run_main(main)
