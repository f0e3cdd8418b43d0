#!/usr/bin/env python3
"""03 · Paged decode attention: bandwidth over batch x KV length, how the work is split, CUDA vs tensor cores.

What it measures
    flashinfer.BatchDecodeWithPagedKVCacheWrapper with Llama-3.1 head layouts (8B: 32 q / 8 kv heads;
    70B: 64 / 8; head_dim 128, bf16, page size 16), batch 1 -> 256 x KV length 512 -> 32k, for the
    default CUDA-core kernel and for use_tensor_cores=True. Per point: plan() CPU time (second call),
    what plan() decided (split_kv, KV chunk, grid) read from plan_info, the median kernel time
    (common.timing: CUPTI kernel time, cold L2), TB/s from the bytes decode must read and % of this GPU's
    measured copy bandwidth. A torch-profiler trace of a few shapes counts the kernels each run()
    really launched (attention, plus a merge kernel when the KV was split) and is compared with
    plan_info. Three shapes are also timed with FlashInfer's own flashinfer.testing.bench_gpu_time
    (like for like: its CUPTI timer against the workbook's at the same L2 flush, plus each tool's default;
    see _fi.cross_check). With --ncu, Nsight Compute adds per-kernel DRAM %, tensor pipe,
    occupancy and its limiter, top warp stalls, and roofline points from measured DRAM bytes.

What the plan expected (hypotheses, written for an A100; judged by % of measured peak here)
    * decode is memory-bound: ~80% of peak HBM at batch 32 x KV 4096, far left of the ridge point;
    * the KV is split ("8 chunks of 512 tokens" at batch 32 / KV 4096) and merged with the LSE;
    * occupancy ~75%, tensor pipe ~15%, long_scoreboard ~65% of the stalls;
    * from the source (analysis.md H-03..H-07): a merge kernel runs exactly when plan_info says
      split_kv; splitting stops once batch x kv heads fills the GPU; the merge matters only at small
      batch; the tensor-core variant runs the prefill kernel and is no slower at GQA group 4.

Run
    python flashinfer/scripts/03_profile_decode.py --quick          # ~1 min (warm JIT): 8B, 3 x 3 points
    python flashinfer/scripts/03_profile_decode.py                  # full: 8B + 70B, 6 batches x 7 KV lengths
    python flashinfer/scripts/03_profile_decode.py --quick --ncu    # + per-kernel hardware table (kernels.csv)
    python flashinfer/scripts/03_profile_decode.py --variants cuda --batches 32 --kv-lens 4096   # one point
    ./flashinfer/scripts/ncu_profile.sh --kernel 'BatchDecode|MergeStates' --set full --count 2 -- \\
        python flashinfer/scripts/03_profile_decode.py --ncu-target --quick --variants cuda
Writes flashinfer/results/03_profile_decode/: sweep.csv, calls.csv, plan_calls.csv, cross_check.csv, kernels.csv + kernels_full.csv (--ncu),
bandwidth.png, roofline.png, trace.json, story.txt, summary.json.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _fi  # noqa: E402
from common import gpu, ncu, plots, story, trace  # noqa: E402
from common.checks import require_gpu, require_module, run_main  # noqa: E402
from common.ranges import nvtx_range  # noqa: E402
from common.results import Run  # noqa: E402
from common.timing import bench, rates  # noqa: E402

BATCHES_FULL, KV_FULL = (1, 8, 32, 64, 128, 256), (512, 1024, 2048, 4096, 8192, 16384, 32768)
BATCHES_QUICK, KV_QUICK = (1, 32, 256), (512, 4096, 32768)
TRACE_SHAPES = ((1, 4096), (32, 4096), (256, 4096), (1, 32768))   # (batch, kv): kernels per call
VARIANTS = {"cuda": False, "tc": True}                               # name -> use_tensor_cores
KERNELS = "BatchDecode|BatchPrefillWithPagedKVCacheKernel|MergeStates"
PAGE = 16


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="8B layout, batches 1/32/256 x KV 512/4k/32k (~1 min)")
    p.add_argument("--ncu", action="store_true", help="also profile every point once under ncu")
    p.add_argument("--ncu-target", action="store_true", help=argparse.SUPPRESS)  # run points once, for ncu
    p.add_argument("--out", default=None, help="results folder (default flashinfer/results/03_profile_decode)")
    p.add_argument("--models", default=None, help="model presets, comma-separated "
                   "(default: llama-3.1-8b with --quick, else llama-3.1-8b,llama-3.1-70b)")
    p.add_argument("--variants", default="cuda,tc", help="cuda (CUDA cores, default kernel), tc (use_tensor_cores)")
    p.add_argument("--batches", default=None, help="comma-separated batch sizes (overrides the preset)")
    p.add_argument("--kv-lens", default=None, help="comma-separated KV lengths (overrides the preset)")
    return p.parse_args(argv)


def plan_points(args) -> list[dict]:
    ints = lambda s: [int(x) for x in s.split(",") if x.strip()]
    models = args.models.split(",") if args.models else (["llama-3.1-8b"] if args.quick else
                                                         ["llama-3.1-8b", "llama-3.1-70b"])
    batches = ints(args.batches) if args.batches else (BATCHES_QUICK if args.quick else BATCHES_FULL)
    kvs = ints(args.kv_lens) if args.kv_lens else (KV_QUICK if args.quick else KV_FULL)
    variants = [v for v in args.variants.split(",") if v]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise SystemExit(f"unknown variant(s) {bad}; choose from {list(VARIANTS)}")
    return [{"model": m, "variant": v, "batch": b, "kv_len": kv}
            for m in models for v in variants for b in batches for kv in kvs]


def make_point(torch, fi, ws, w, lay, batch, kv):
    """Cache, plan and a run() closure for one point; returns (fn, plan_ms, facts, keep) where keep
    holds the tensors alive and keep["replan"] repeats the plan() call (for the trace)."""
    import time
    cache, indptr, indices, last = _fi.make_paged_kv(torch, [kv] * batch, lay["hkv"], lay["d"], PAGE)
    kw = dict(q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    replan = lambda: w.plan(indptr, indices, last, lay["hq"], lay["hkv"], lay["d"], PAGE, **kw)
    replan()  # first: may load/compile the module
    t0 = time.perf_counter()
    replan()
    plan_ms = (time.perf_counter() - t0) * 1e3
    q = torch.randn(batch, lay["hq"], lay["d"], device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    return (lambda: w.run(q, cache, out=out)), plan_ms, _fi.plan_facts(w), {"t": (cache, q, out), "replan": replan}


def check_correctness(torch, fi, ws, models, variants, run):
    """Both variants against float32 torch on scattered pages, uneven lengths (1 token to 1037)."""
    kv_lens = [1, 100, 1037]
    worst = 0.0
    for model in models:
        lay = _fi.head_layout(model)
        cache, indptr, indices, last = _fi.make_paged_kv(torch, kv_lens, lay["hkv"], lay["d"], PAGE, shuffle=True)
        q = torch.randn(len(kv_lens), lay["hq"], lay["d"], device="cuda", dtype=torch.bfloat16)
        for v in variants:
            w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=VARIANTS[v])
            w.plan(indptr, indices, last, lay["hq"], lay["hkv"], lay["d"], PAGE,
                   q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
            o = w.run(q, cache)
            errs = [_fi.rel_err(o[b:b + 1], _fi.ref_attention(torch, q[b:b + 1], *_fi.gather_kv(
                cache, indptr, indices, last, b), causal=False)) for b in range(len(kv_lens))]
            worst = max(worst, max(errs))
            good = max(errs) < 2e-2
            run.log(f"correctness {model} {v}: rel.err per request {', '.join(f'{e:.1e}' for e in errs)} "
                    f"{'✅' if good else '❌'}")
            if not good:
                raise RuntimeError(f"decode ({v}, {model}) disagrees with the torch reference (rel. error >= 2e-2)")
    run.log("All results match. Starting benchmarks.")


def ncu_target(args) -> int:
    """Under ncu: every point once, a marker kernel before each (see common.ncu.split_points)."""
    import torch
    import flashinfer as fi
    ws = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
    wr = {v: fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tc) for v, tc in VARIANTS.items()}
    for p in plan_points(args):
        ncu.mark()  # before the try: a failed point still advances the point index
        try:
            fn, _, _, keep = make_point(torch, fi, ws, wr[p["variant"]], _fi.head_layout(p["model"]), p["batch"], p["kv_len"])
            with nvtx_range(f"decode {p['variant']} b={p['batch']} kv={p['kv_len']}"):
                fn()
            torch.cuda.synchronize()
            del keep
        except Exception as e:
            print(f"[ERROR] {p} -> {e.__class__.__name__}: {str(e)[:200]}", file=sys.stderr)
            torch.cuda.empty_cache()
    return 0



def main(argv=None) -> int:
    args = parse_args(argv)
    points = plan_points(args)
    torch = require_module("torch", "pip install -r requirements.txt")
    require_gpu(torch)
    fi = require_module("flashinfer", "pip install flashinfer-python==0.6.15.post1")
    if args.ncu_target:
        return ncu_target(args)
    import pandas as pd
    models = list(dict.fromkeys(p["model"] for p in points))
    variants = list(dict.fromkeys(p["variant"] for p in points))
    with Run(__file__, args, out=args.out) as run:
        pk = gpu.peaks()
        run.log(f"{pk['gpu']}: measured copy {pk['dram_tb_s']:.2f} TB/s, bf16 {pk['bf16_tflops']:.0f} TFLOP/s")
        ws = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")  # float workspace, zeroed once
        check_correctness(torch, fi, ws, models, variants, run)

        # ---- sweep: one wrapper per variant, re-planned for every point (as a server does per step)
        wr = {v: fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=VARIANTS[v]) for v in variants}
        rows = []
        for i, p in enumerate(points, 1):
            lay = _fi.head_layout(p["model"])
            run.log(f"[{i}/{len(points)}] {p['model']} {p['variant']} batch={p['batch']} kv={p['kv_len']}")
            try:
                fn, plan_ms, facts, keep = make_point(torch, fi, ws, wr[p["variant"]], lay, p["batch"], p["kv_len"])
                with nvtx_range(f"decode {p['variant']} b={p['batch']} kv={p['kv_len']}"):
                    t = bench(fn)
                kvs = [p["kv_len"]] * p["batch"]
                r = rates(t.median_ms, bytes=_fi.decode_bytes(kvs, lay["hq"], lay["hkv"], lay["d"]),
                          flops=_fi.decode_flops(kvs, lay["hq"], lay["d"]), peaks=pk)
                chunk = facts.get("kv_chunk_tokens")
                rows.append({**p, "time_us": t.median_us, "spread_pct": t.spread_pct, "plan_ms": plan_ms,
                             "split_kv": facts.get("split_kv"), "kv_chunk_tokens": chunk,
                             "chunks_per_request": -(-p["kv_len"] // chunk) if facts.get("split_kv") and chunk else 1,
                             "grid_x": facts.get("padded_batch_size"), "cta_tile_q": facts.get("cta_tile_q"),
                             "bytes": r["bytes"], "tb_s": r["tb_s"], "pct_peak_dram": r["pct_peak_dram"],
                             "tflop_s": r["tflop_s"], "flop_per_byte": r["flop_per_byte"]})
                del keep, fn
            except Exception as e:  # rejected shape, OOM, failed JIT: recorded, the sweep goes on
                run.point_error(p, e)
                torch.cuda.empty_cache()
        df = pd.DataFrame(rows)
        if df.empty:
            raise RuntimeError("every sweep point failed; see the [ERROR] lines above")
        run.table("sweep", df)
        m0 = df[df["model"] == models[0]]

        # ---- kernels per call, read from a torch-profiler trace (not from the docs)
        lay0 = _fi.head_layout(models[0])
        shapes = [(v, b, kv) for v in variants for b, kv in TRACE_SHAPES]
        calls, facts_of, meta, keep = [], {}, {}, []
        for v, b, kv in shapes:
            try:
                w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=VARIANTS[v])
                fn, _, facts, k = make_point(torch, fi, ws, w, lay0, b, kv)
                label = f"decode {v} b={b} kv={kv}"
                calls.append((label, fn))
                facts_of[label], meta[label] = facts, (v, b, kv)
                keep.append((w, k))
            except Exception as e:
                run.point_error({"trace": f"{v} b={b} kv={kv}"}, e)
        # plan() itself: CPU work and copies, no kernel (one shape per variant, after its run() calls)
        plans = [(f"plan {meta[l][0]} b={meta[l][1]} kv={meta[l][2]}", k["replan"]) for l, (_w, k) in
                 zip(list(meta), keep) if meta[l][1:] == TRACE_SHAPES[1]]
        tr = _fi.capture_calls(torch, calls + plans, run.path("trace.json"))
        traced_plans = bool(plans)
        del keep, calls, plans
        torch.cuda.empty_cache()
        ev = trace.read_chrome_trace(tr)
        cs = _fi.calls_summary(_fi.kernels_in_ranges(ev, r"^decode "))
        ps = _fi.calls_summary(_fi.kernels_in_ranges(ev, r"^plan ")) if traced_plans else None
        for j, col in enumerate(("variant", "batch", "kv_len")):
            cs[col] = [meta.get(l, (None, None, None))[j] for l in cs["label"]]
        cs["plan_split_kv"] = [facts_of.get(l, {}).get("split_kv") for l in cs["label"]]
        cs["plan_kv_chunk_tokens"] = [facts_of.get(l, {}).get("kv_chunk_tokens") for l in cs["label"]]
        cs["plan_grid_x"] = [facts_of.get(l, {}).get("padded_batch_size") for l in cs["label"]]
        run.table("calls", cs)
        if ps is not None:
            run.table("plan_calls", ps)

        # ---- FlashInfer's own timer on the same callables
        xrows = []
        try:
            bgt = _fi.load_bench_gpu_time(run.log)
            big_b, big_kv = int(m0["batch"].max()), int(m0["kv_len"].max())
            for v, b, kv in [("cuda", 32, 4096), ("tc", 32, 4096), ("cuda", big_b, big_kv)]:
                if v not in variants:
                    continue
                w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=VARIANTS[v])
                _, _, _, k = make_point(torch, fi, ws, w, lay0, b, kv)
                cache, q, out = k["t"]
                xrows.append({"variant": v, "batch": b, "kv_len": kv, **_fi.cross_check(
                    bgt, lambda q, cache, out, w=w: w.run(q, cache, out=out), (q, cache, out), bench)})
                run.log(f"cross-check {v} b{b} kv{kv}: workbook / bench_gpu_time ({xrows[-1]['reference']}) "
                        f"= {xrows[-1]['ratio']:.3f}")
                del k, cache, q, out
        except Exception as e:
            run.point_error({"cross_check": "bench_gpu_time"}, e)
        if xrows:
            run.table("cross_check", pd.DataFrame(xrows))

        # ---- ncu: every point once, in a child process of this script
        kern = None
        if args.ncu:
            run.log("ncu: profiling every point once (DRAM, tensor pipe, occupancy, stalls)")
            app = [sys.executable, str(Path(__file__).resolve()), "--ncu-target", "--variants", args.variants]
            app += ["--quick"] if args.quick else []
            app += sum(([f"--{k}", getattr(args, k.replace("-", "_"))] for k in ("models", "batches", "kv-lens")
                        if getattr(args, k.replace("-", "_"))), [])
            res = ncu.profile(app, run.dir / "ncu", kernel=ncu.with_marker(KERNELS), echo=run.log, timeout=1200)
            kern = ncu.summarize(ncu.split_points(res.df), peaks=pk)
            for col in ("model", "variant", "batch", "kv_len"):
                kern[col] = [points[i][col] if 0 <= i < len(points) else None for i in kern["point"]]
            kern["role"] = ["merge" if "Merge" in k else "attention" for k in kern["kernel"]]
            run.table("kernels_full", kern)
            run.table("kernels", _fi.compact_kernels(kern, ("model", "variant", "batch", "kv_len", "role")))

        # ---- figures
        fig = plots.sweep(m0[m0["variant"] == variants[0]], x="kv_len", y="pct_peak_dram", hue="batch", logx=True,
                          ylabel="% of measured copy bandwidth", hline=100, hline_label="measured copy peak",
                          title=f"Decode ({variants[0]}), {models[0]}, bf16 — {pk['gpu']}")
        run.figure("bandwidth", fig)
        pts = [{"label": f"{r.variant} b{r.batch} kv{r.kv_len}" if r.kv_len == 4096 else "",
                "flop_per_byte": r.flop_per_byte, "tflop_s": r.tflop_s} for r in m0.itertuples()]
        if kern is not None:
            for r in kern[(kern["role"] == "attention") & (kern["model"] == models[0])].itertuples():
                kvs = [r.kv_len] * r.batch
                f = _fi.decode_flops(kvs, lay0["hq"], lay0["d"])
                mb = (r.dram_read_mb + r.dram_write_mb) * 1e6
                if mb > 0 and r.time_us > 0:
                    pts.append({"label": f"ncu {r.variant} b{r.batch} kv{r.kv_len}" if r.kv_len == 4096 else "",
                                "flop_per_byte": f / mb, "tflop_s": f / (r.time_us * 1e-6) / 1e12})
        run.figure("roofline", plots.roofline(pts, pk, title="Paged decode (bytes: formula; 'ncu': measured)"))

        # ---- verdicts: the plan's hypotheses against this run
        cu = m0[m0["variant"] == "cuda"]
        ref = _fi.pick(cu, batch=32, kv_len=4096) or (cu.sort_values("pct_peak_dram").iloc[-1].to_dict() if len(cu) else None)
        if ref:
            run.headline(decode_point=f"CUDA cores, batch {ref['batch']}, KV {ref['kv_len']}", decode_us=ref["time_us"],
                         decode_tb_s=ref["tb_s"], decode_pct_of_measured_peak=ref["pct_peak_dram"])
            run.observe("decode is memory-bound at ~80% of peak HBM (batch 32, KV 4096)",
                        f"{ref['pct_peak_dram']:.0f}% of measured copy bandwidth ({ref['tb_s']:.2f} TB/s) "
                        f"at batch {ref['batch']}, KV {ref['kv_len']}; threshold 75%",
                        "confirmed" if ref["pct_peak_dram"] >= 75 else "refuted", "sweep.csv")
            n, c = ref["chunks_per_request"], ref["kv_chunk_tokens"]
            run.observe("the KV is split into 8 chunks of 512 tokens at batch 32 / KV 4096",
                        f"plan_info: split_kv={ref['split_kv']}, chunk {c} tokens -> {n} chunk(s) per request, "
                        f"grid x {ref['grid_x']}", "confirmed" if (ref["split_kv"] and c == 512) else "refuted",
                        "sweep.csv")
        at = cu[cu["kv_len"] == (4096 if (cu["kv_len"] == 4096).any() else cu["kv_len"].max())]
        if len(at) >= 2:
            lo, hi = at.sort_values("batch").iloc[0], at.sort_values("batch").iloc[-1]
            run.observe("splitting stops as the batch fills the GPU: the smallest batch splits, the largest does not",
                        f"KV {lo['kv_len']}: batch {lo['batch']} split_kv={lo['split_kv']} "
                        f"({lo['chunks_per_request']} chunks), batch {hi['batch']} split_kv={hi['split_kv']}",
                        "confirmed" if (lo["split_kv"] and not hi["split_kv"]) else "refuted", "sweep.csv")
        if ps is not None and len(ps):
            run.observe("plan() is CPU work: it launches no kernel, the GPU sees only copies (analysis H-03)",
                        "; ".join(f"{r.label}: {r.kernels_per_call:.0f} kernels, {r.copies_per_call:.0f} copies "
                                  f"({r.copies or '-'})" for r in ps.itertuples()),
                        "confirmed" if (ps["kernels_per_call"] == 0).all() and (ps["copies_per_call"] >= 1).all()
                        else "refuted", "plan_calls.csv")
        agree = [(r.label, r.merge_kernel, r.plan_split_kv) for r in cs.itertuples()]
        bad = [a for a in agree if bool(a[1]) != bool(a[2])]
        run.observe("run() launches the attention kernel plus one merge kernel exactly when plan_info says split_kv",
                    f"{len(agree) - len(bad)}/{len(agree)} traced shapes agree"
                    + (f"; disagree: {', '.join(a[0] for a in bad)}" if bad else ""),
                    "confirmed" if agree and not bad else ("refuted" if bad else "inconclusive"), "calls.csv")
        merges = cs[cs["merge_kernel"]]
        if len(merges):
            big = merges[merges["batch"] >= 32]["merge_share_pct"]
            big_max = float(big.max()) if len(big) else 0.0
            small = merges[(merges["batch"] == merges["batch"].min()) & (merges["kv_len"] == merges["kv_len"].max())]
            s1 = float(small["merge_share_pct"].iloc[0]) if len(small) else 0.0
            run.observe("the merge kernel is a visible share of decode time only at small batch with long KV",
                        "merge share of kernel time: " + ", ".join(f"{r.variant} b{r.batch} kv{r.kv_len} "
                                                                 f"{r.merge_share_pct:.0f}%" for r in merges.itertuples())
                        + " (thresholds: < 10% at batch >= 32, larger at the smallest batch / longest KV)",
                        "confirmed" if big_max < 10 and s1 > big_max else "refuted", "calls.csv")
        else:
            run.observe("the merge kernel is a visible share of decode time only at small batch with long KV",
                        "no traced shape launched a merge kernel", "inconclusive", "calls.csv")
        if {"cuda", "tc"} <= set(variants):
            both = m0.pivot_table(index=["batch", "kv_len"], columns="variant", values="time_us").dropna()
            ratio = float((both["tc"] / both["cuda"]).median()) if len(both) else float("nan")
            tc_names = " ".join(cs[cs["label"].str.contains(" tc ")]["kernels"])
            run.headline(tc_over_cuda_time_median=ratio)
            run.observe("tensor-core decode runs the prefill kernel and is no slower than CUDA cores at GQA group "
                        f"{lay0['group']}", f"kernels: {tc_names[:120] or 'n/a'}; median time ratio tc/cuda "
                        f"{ratio:.2f} over {len(both)} points (threshold 1.05)",
                        "confirmed" if ("BatchPrefillWithPagedKVCacheKernel" in tc_names and ratio <= 1.05)
                        else "refuted", "sweep.csv, calls.csv")
        _fi.observe_cross_check(run, xrows, lambda x: f"{x['variant']} b{x['batch']} kv{x['kv_len']}")
        kr = None
        if kern is not None:
            att = kern[(kern["role"] == "attention") & (kern["variant"] == "cuda") & (kern["model"] == models[0])]
            if len(att):
                kr = (_fi.pick(att, batch=32, kv_len=4096) or att.sort_values("time_us").iloc[-1].to_dict())
                top = (kr.get("top_stalls") or "").split(",")[0].split(" ")[0]
                run.observe("occupancy ~75%, tensor pipe ~15%, long_scoreboard the top stall (~65%)",
                            f"b{kr['batch']} kv{kr['kv_len']}: occupancy {kr['occupancy_pct']:.0f}% "
                            f"(limit {kr['limiter']}), tensor {kr['tensor_pct']:.1f}%, stalls {kr['top_stalls']}",
                            "confirmed" if (60 <= kr["occupancy_pct"] <= 90 and 5 <= kr["tensor_pct"] <= 30
                                            and top == "long_scoreboard") else "refuted", "kernels.csv")
                run.observe("CUDA-core decode uses no tensor cores and is DRAM-bound (analysis H-04)",
                            f"tensor {kr['tensor_pct']:.1f}%, DRAM {kr['dram_pct']:.0f}%, SM {kr['sm_pct']:.0f}% "
                            f"({ncu.bound(kr)})", "confirmed" if (kr["tensor_pct"] < 2 and ncu.bound(kr) ==
                                                                  "memory-bound") else "refuted", "kernels.csv")

        # ---- the story
        items = []
        for label, f in facts_of.items():
            v, b, kv = meta[label]
            c = cs[cs["label"] == label]
            s = _fi.pick(m0, variant=v, batch=b, kv_len=kv)
            kids = [(f"plan(): split_kv={f.get('split_kv')}, chunk {f.get('kv_chunk_tokens')} tokens, grid x "
                     f"{f.get('padded_batch_size')}" + (f", cta_tile_q {f['cta_tile_q']}" if f.get("cta_tile_q") else "")
                     + (f", {s['plan_ms']:.2f} ms CPU" if s else ""), [])]
            if len(c):
                c = c.iloc[0]
                kids.append((f"run(): {c['kernels_per_call']:.0f} kernel(s) per call: {c['kernels']}"
                             + (f" (merge {c['merge_share_pct']:.0f}% of kernel time)" if c["merge_kernel"] else ""), []))
            if s:
                kids.append((f"{s['time_us']:.1f} us -> {s['tb_s']:.2f} TB/s = {s['pct_peak_dram']:.0f}% of measured "
                             f"copy peak", []))
            if kern is not None:
                kk = kern[(kern["variant"] == v) & (kern["batch"] == b) & (kern["kv_len"] == kv) &
                          (kern["model"] == models[0])]
                kids += [(story.kernel_line(r), []) for r in kk.to_dict("records")]
            items.append((f"{'CUDA cores' if v == 'cuda' else 'tensor cores'}, batch {b}, KV {kv}", kids))
        if xrows:
            items.append((_fi.cross_check_line(xrows, lambda x: f"{x['variant']} b{x['batch']} kv{x['kv_len']}"), []))
        run.story(story.tree(f"DECODE ATTENTION — {pk['gpu']}, {models[0]} heads ({lay0['hq']} q / {lay0['hkv']} kv, "
                             f"d {lay0['d']}), bf16, page {PAGE} (copy peak {pk['dram_tb_s']:.2f} TB/s)", items))
        print(run.summary["story"])
    return 0


if __name__ == "__main__":
    run_main(main)
