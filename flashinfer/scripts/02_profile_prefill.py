#!/usr/bin/env python3
"""02 · Paged causal prefill attention: TFLOP/s against the tensor-core peak, FA2 vs FA3, tiles and splits.

What it measures
    flashinfer.BatchPrefillWithPagedKVCacheWrapper, causal, paged KV (page 16), bf16, with the
    Llama-3.1-8B (32 q / 8 kv heads) and 70B (64 / 8) head layouts, head_dim 128, query length
    128 -> 16k (batch 1, no cached prefix by default), for each backend asked for (fa2; fa3 on sm90).
    Per point: what plan() decided (backend, cta_tile_q, grid, split_kv; fa3 is persistent), the
    median kernel time (common.timing: CUPTI kernel time, cold L2), TFLOP/s from the causal FLOP
    count and % of this GPU's measured bf16 peak, arithmetic intensity from the minimum bytes
    (roofline). A torch-profiler trace of a few shapes shows the kernels each run() launched
    (split-KV merge, the fill kernel of run() without out=). Three shapes are also timed with
    FlashInfer's own flashinfer.testing.bench_gpu_time (as in 03: _fi.cross_check). With --ncu,
    Nsight Compute adds per kernel: occupancy (achieved, theoretical) and its limiter, tensor-pipe
    activity, DRAM %, top warp stalls, grid, and roofline points from measured DRAM bytes.

What the plan expected (hypotheses, written for an A100; judged by % of measured peak here)
    * FlashAttention-2 with online softmax, 128-token tiles, "TMA producer + tensor-core consumers";
    * occupancy ~47% limited by shared memory, tensor pipe ~35%, HBM ~72%, stalls led by
      long_scoreboard, then barrier and short_scoreboard; a roofline position near the ridge point;
    * from the source (analysis.md H-08..H-12): on sm90 backend="auto" picks FA3 (persistent grid of
      one CTA per SM, no merge kernel) and FA3 beats FA2; FA2 is tensor-bound with ~12.5% theoretical
      occupancy; a single short request splits KV and merges; run() without out= adds a fill kernel.

Run
    python flashinfer/scripts/02_profile_prefill.py --quick          # ~1 min (warm JIT): qo 512/2k/8k
    python flashinfer/scripts/02_profile_prefill.py                  # full: qo 128 -> 16k
    python flashinfer/scripts/02_profile_prefill.py --quick --ncu    # + per-kernel hardware table
    python flashinfer/scripts/02_profile_prefill.py --backend fa2 --batch 8 --prefix 3584 --qo-lens 512
    ./flashinfer/scripts/ncu_profile.sh --kernel 'BatchPrefillWithPagedKVCacheKernel|PrefillWithKVCacheKernel' \\
        --set full --count 2 -- python flashinfer/scripts/02_profile_prefill.py --ncu-target --quick
Writes flashinfer/results/02_profile_prefill/: sweep.csv, calls.csv, cross_check.csv, kernels.csv + kernels_full.csv (--ncu),
throughput.png, roofline.png, trace.json, story.txt, summary.json.
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

QO_FULL = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
QO_QUICK = (512, 2048, 8192)
MODELS = ("llama-3.1-8b", "llama-3.1-70b")
KERNELS = "BatchPrefillWithPagedKVCacheKernel|PrefillWithKVCacheKernel|MergeStates"
PAGE = 16
PROBE = (8, 512, 3584)   # batch, qo, cached prefix: the shape the shared H200 probe timed


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="query lengths 512/2k/8k only (~1 min)")
    p.add_argument("--ncu", action="store_true", help="also profile every point once under ncu")
    p.add_argument("--ncu-target", action="store_true", help=argparse.SUPPRESS)  # run points once, for ncu
    p.add_argument("--out", default=None, help="results folder (default flashinfer/results/02_profile_prefill)")
    p.add_argument("--backend", default="fa2,fa3", help="comma-separated: fa2, fa3 (sm90 only), auto")
    p.add_argument("--models", default=",".join(MODELS), help="model presets (head layouts), comma-separated")
    p.add_argument("--qo-lens", default=None, help="comma-separated query lengths (overrides the preset)")
    p.add_argument("--batch", type=int, default=1, help="requests per call (default 1)")
    p.add_argument("--prefix", type=int, default=0, help="cached tokens before the new ones (default 0)")
    return p.parse_args(argv)


def plan_points(args, backends) -> list[dict]:
    qos = [int(x) for x in args.qo_lens.split(",")] if args.qo_lens else (QO_QUICK if args.quick else QO_FULL)
    return [{"model": m, "backend": be, "batch": args.batch, "qo_len": qo, "kv_len": args.prefix + qo}
            for m in args.models.split(",") for be in backends for qo in qos]


def usable_backends(torch, fi, wanted, log) -> list[str]:
    """fa3 needs sm90a (compute capability 9.x and CUDA >= 12.3): leave it out elsewhere, saying so."""
    from flashinfer.utils import is_sm90a_supported
    sm90 = is_sm90a_supported(torch.device("cuda"))
    out = []
    for be in wanted:
        if be == "fa3" and not sm90:
            log("[skip] backend fa3: this GPU/toolkit is not sm90a (FlashInfer's FA3 kernels are Hopper-only)")
            continue
        if be not in ("fa2", "fa3", "auto"):
            raise SystemExit(f"unknown backend {be!r}: choose from fa2, fa3, auto")
        out.append(be)
    return out


def make_point(torch, w, lay, batch, qo, kv, out_buf=True):
    """Cache, plan and a run() closure for one point; returns (fn, plan_ms, facts, keep-alive)."""
    import time
    cache, kv_indptr, kv_indices, last = _fi.make_paged_kv(torch, [kv] * batch, lay["hkv"], lay["d"], PAGE)
    qo_indptr = torch.arange(batch + 1, device="cuda", dtype=torch.int32) * qo
    args = (qo_indptr, kv_indptr, kv_indices, last, lay["hq"], lay["hkv"], lay["d"], PAGE)
    kw = dict(causal=True, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    w.plan(*args, **kw)  # first: may load/compile the module
    t0 = time.perf_counter()
    w.plan(*args, **kw)
    plan_ms = (time.perf_counter() - t0) * 1e3
    q = torch.randn(batch * qo, lay["hq"], lay["d"], device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    fn = (lambda: w.run(q, cache, out=out)) if out_buf else (lambda: w.run(q, cache))
    return fn, plan_ms, _fi.plan_facts(w), (cache, q, out)


def check_correctness(torch, fi, ws, models, backends, run):
    """Each backend against float32 torch: 3 requests (1, 77, 300 new tokens on 5, 200, 300 KV), scattered pages."""
    qo_lens, kv_lens = [1, 77, 300], [5, 200, 300]
    for model in models:
        lay = _fi.head_layout(model)
        cache, kv_indptr, kv_indices, last = _fi.make_paged_kv(torch, kv_lens, lay["hkv"], lay["d"], PAGE, shuffle=True)
        qo_indptr = torch.tensor([0, 1, 78, 378], device="cuda", dtype=torch.int32)
        q = torch.randn(sum(qo_lens), lay["hq"], lay["d"], device="cuda", dtype=torch.bfloat16)
        for be in backends:
            w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=be)
            w.plan(qo_indptr, kv_indptr, kv_indices, last, lay["hq"], lay["hkv"], lay["d"], PAGE, causal=True,
                   q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
            o = w.run(q, cache)
            errs = []
            for b in range(3):
                s, e = int(qo_indptr[b]), int(qo_indptr[b + 1])
                ref = _fi.ref_attention(torch, q[s:e], *_fi.gather_kv(cache, kv_indptr, kv_indices, last, b), causal=True)
                errs.append(_fi.rel_err(o[s:e], ref))
            good = max(errs) < 2e-2
            run.log(f"correctness {model} {be} (ran {w._backend}): rel.err per request "
                    f"{', '.join(f'{x:.1e}' for x in errs)} {'✅' if good else '❌'}")
            if not good:
                raise RuntimeError(f"prefill ({be}, {model}) disagrees with the torch reference (rel. error >= 2e-2)")
    run.log("All results match. Starting benchmarks.")


def ncu_target(args) -> int:
    """Under ncu: every point once, a marker kernel before each (see common.ncu.split_points)."""
    import torch
    import flashinfer as fi
    backends = usable_backends(torch, fi, args.backend.split(","), print)
    ws = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
    wr = {be: fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=be) for be in backends}
    for p in plan_points(args, backends):
        ncu.mark()  # before the try: a failed point still advances the point index
        try:
            fn, _, _, keep = make_point(torch, wr[p["backend"]], _fi.head_layout(p["model"]), p["batch"], p["qo_len"], p["kv_len"])
            with nvtx_range(f"prefill {p['backend']} b={p['batch']} qo={p['qo_len']} kv={p['kv_len']}"):
                fn()
            torch.cuda.synchronize()
            del keep
        except Exception as e:
            print(f"[ERROR] {p} -> {e.__class__.__name__}: {str(e)[:200]}", file=sys.stderr)
            torch.cuda.empty_cache()
    return 0



def main(argv=None) -> int:
    args = parse_args(argv)
    torch = require_module("torch", "pip install -r requirements.txt")
    require_gpu(torch)
    fi = require_module("flashinfer", "pip install flashinfer-python==0.6.15.post1")
    if args.ncu_target:
        return ncu_target(args)
    import pandas as pd
    with Run(__file__, args, out=args.out) as run:
        pk = gpu.peaks()
        ridge = pk["bf16_tflops"] / pk["dram_tb_s"]
        run.log(f"{pk['gpu']}: measured bf16 {pk['bf16_tflops']:.0f} TFLOP/s, copy {pk['dram_tb_s']:.2f} TB/s "
                f"-> ridge point {ridge:.0f} FLOP/byte")
        backends = usable_backends(torch, fi, args.backend.split(","), run.log)
        points = plan_points(args, backends)
        models = args.models.split(",")
        ws = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
        check_correctness(torch, fi, ws, models, backends, run)

        # ---- what does backend="auto" resolve to here? (plan only)
        lay0 = _fi.head_layout(models[0])
        try:
            wa = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend="auto")
            _fn, _ms, auto_facts, _k = make_point(torch, wa, lay0, 1, 512, 512)
            auto_is = auto_facts.get("backend")
            run.note(f'backend="auto" resolved to {auto_is} (plan_info layout: {auto_facts.get("layout")})')
            del _fn, _k, wa
        except Exception as e:  # e.g. the fa3 module failed to compile: said, and the sweep goes on
            run.point_error({"backend": "auto"}, e)
            auto_is = "error"

        # ---- sweep
        wr = {be: fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=be) for be in backends}
        rows = []
        for i, p in enumerate(points, 1):
            lay = _fi.head_layout(p["model"])
            run.log(f"[{i}/{len(points)}] {p['model']} {p['backend']} batch={p['batch']} qo={p['qo_len']} kv={p['kv_len']}")
            try:
                fn, plan_ms, facts, keep = make_point(torch, wr[p["backend"]], lay, p["batch"], p["qo_len"], p["kv_len"])
                with nvtx_range(f"prefill {p['backend']} b={p['batch']} qo={p['qo_len']} kv={p['kv_len']}"):
                    t = bench(fn)
                qos, kvs = [p["qo_len"]] * p["batch"], [p["kv_len"]] * p["batch"]
                r = rates(t.median_ms, flops=_fi.prefill_flops(qos, kvs, lay["hq"], lay["d"]),
                          bytes=_fi.prefill_bytes(qos, kvs, lay["hq"], lay["hkv"], lay["d"]), peaks=pk)
                rows.append({**p, "ran": facts.get("backend"), "time_us": t.median_us, "spread_pct": t.spread_pct,
                             "plan_ms": plan_ms, "cta_tile_q": facts.get("cta_tile_q"),
                             "grid_x": facts.get("padded_batch_size"), "split_kv": facts.get("split_kv"),
                             "kv_chunk_tokens": facts.get("kv_chunk_tokens"), "flops": r["flops"], "bytes": r["bytes"],
                             "tflop_s": r["tflop_s"], "pct_peak_tflops": r["pct_peak_tflops"],
                             "tb_s": r["tb_s"], "pct_peak_dram": r["pct_peak_dram"], "flop_per_byte": r["flop_per_byte"]})
                del keep, fn
            except Exception as e:  # rejected shape, OOM, failed JIT: recorded, the sweep goes on
                run.point_error(p, e)
                torch.cuda.empty_cache()
        df = pd.DataFrame(rows)
        if df.empty:
            raise RuntimeError("every sweep point failed; see the [ERROR] lines above")
        run.table("sweep", df)
        m0 = df[df["model"] == models[0]]

        # ---- kernels per call from a trace: split+merge at batch 1, none on the probe shape, fill kernel
        shapes = [(be, 1, 512, 0, True) for be in backends] + [(be, *PROBE, True) for be in backends]
        shapes += [(be, *PROBE, False) for be in backends if be == "fa2"][:1]
        calls, facts_of, meta, keep = [], {}, {}, []
        for be, b, qo, pre, out_buf in shapes:
            label = f"prefill {be} b={b} qo={qo} kv={qo + pre}" + ("" if out_buf else " out=None")
            try:
                w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=be)
                fn, _, facts, k = make_point(torch, w, lay0, b, qo, qo + pre, out_buf=out_buf)
                calls.append((label, fn))
                facts_of[label], meta[label] = facts, (be, b, qo, qo + pre, out_buf)
                keep.append((w, k))
            except Exception as e:
                run.point_error({"trace": label}, e)
        tr = _fi.capture_calls(torch, calls, run.path("trace.json"))
        del keep, calls
        torch.cuda.empty_cache()
        cs = _fi.calls_summary(_fi.kernels_in_ranges(trace.read_chrome_trace(tr), r"^prefill "))
        for j, col in enumerate(("backend", "batch", "qo_len", "kv_len", "out_given")):
            cs[col] = [meta.get(l, (None,) * 5)[j] for l in cs["label"]]
        cs["plan_split_kv"] = [facts_of.get(l, {}).get("split_kv") for l in cs["label"]]
        cs["plan_grid_x"] = [facts_of.get(l, {}).get("padded_batch_size") for l in cs["label"]]
        run.table("calls", cs)

        # ---- FlashInfer's own timer on the same callables
        xrows = []
        try:
            bgt = _fi.load_bench_gpu_time(run.log)
            for be, b, qo, pre in [(backends[0], *PROBE)] + [(be, *PROBE) for be in backends[1:2]] + \
                                  [(backends[0], 1, int(m0["qo_len"].max()), 0)]:
                w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=be)
                _, _, _, k = make_point(torch, w, lay0, b, qo, qo + pre)
                cache, q, out = k
                xrows.append({"backend": be, "batch": b, "qo_len": qo, "kv_len": qo + pre, **_fi.cross_check(
                    bgt, lambda q, cache, out, w=w: w.run(q, cache, out=out), (q, cache, out), bench)})
                run.log(f"cross-check {be} b{b} qo{qo}: workbook / bench_gpu_time ({xrows[-1]['reference']}) "
                        f"= {xrows[-1]['ratio']:.3f}")
                del k, cache, q, out
        except Exception as e:
            run.point_error({"cross_check": "bench_gpu_time"}, e)
        if xrows:
            run.table("cross_check", pd.DataFrame(xrows))

        # ---- ncu: every point once, in a child process of this script
        kern = None
        if args.ncu:
            run.log("ncu: profiling every point once (occupancy, tensor pipe, DRAM, stalls)")
            app = [sys.executable, str(Path(__file__).resolve()), "--ncu-target", "--backend", ",".join(backends),
                   "--models", args.models, "--batch", str(args.batch), "--prefix", str(args.prefix)]
            app += (["--quick"] if args.quick else []) + (["--qo-lens", args.qo_lens] if args.qo_lens else [])
            res = ncu.profile(app, run.dir / "ncu", kernel=ncu.with_marker(KERNELS), echo=run.log, timeout=1200)
            kern = ncu.summarize(ncu.split_points(res.df), peaks=pk)
            for col in ("model", "backend", "batch", "qo_len", "kv_len"):
                kern[col] = [points[i][col] if 0 <= i < len(points) else None for i in kern["point"]]
            kern["role"] = ["merge" if "Merge" in k else "attention" for k in kern["kernel"]]
            run.table("kernels_full", kern)
            run.table("kernels", _fi.compact_kernels(kern, ("model", "backend", "batch", "qo_len", "kv_len", "role")))

        # ---- figures
        df["series"] = df["model"].str.replace("llama-3.1-", "") + " " + df["backend"]
        run.figure("throughput", plots.sweep(df, x="qo_len", y="pct_peak_tflops", hue="series", logx=True,
                                             ylabel="% of measured bf16 TFLOP/s", hline=100,
                                             hline_label="measured bf16 GEMM peak",
                                             title=f"Causal paged prefill, batch {args.batch} — {pk['gpu']}"))
        pts = [{"label": f"{r.series} qo{r.qo_len}" if r.qo_len in (512, int(df["qo_len"].max())) else "",
                "flop_per_byte": r.flop_per_byte, "tflop_s": r.tflop_s} for r in df.itertuples()]
        if kern is not None:
            for r in kern[kern["role"] == "attention"].itertuples():
                lay = _fi.head_layout(r.model)
                f = _fi.prefill_flops([r.qo_len] * r.batch, [r.kv_len] * r.batch, lay["hq"], lay["d"])
                mb = (r.dram_read_mb + r.dram_write_mb) * 1e6
                if mb > 0 and r.time_us > 0:
                    pts.append({"label": f"ncu {r.backend} qo{r.qo_len}" if r.qo_len == 512 else "",
                                "flop_per_byte": f / mb, "tflop_s": f / (r.time_us * 1e-6) / 1e12})
        run.figure("roofline", plots.roofline(pts, pk, title="Causal paged prefill (bytes: formula; 'ncu': measured)"))

        # ---- verdicts
        cc = torch.cuda.get_device_capability()
        run.observe('on sm90 (H100/H200) backend="auto" runs FA3, not the FA2 kernel the plan describes',
                    f'auto -> {auto_is} on compute capability {cc[0]}.{cc[1]}',
                    ("confirmed" if auto_is == "fa3" else "refuted") if cc[0] == 9 else "inconclusive", "summary.json notes")
        big = m0[m0["qo_len"] == m0["qo_len"].max()]
        for r in big.to_dict("records"):
            run.headline(**{f"{r['backend']}_qo{r['qo_len']}_tflop_s": r["tflop_s"],
                            f"{r['backend']}_qo{r['qo_len']}_pct_of_measured_peak": r["pct_peak_tflops"]})
        at512 = m0[m0["qo_len"] == 512] if (m0["qo_len"] == 512).any() else m0[m0["qo_len"] == m0["qo_len"].min()]
        if len(at512):
            x = at512.iloc[0]
            cross = m0[m0["backend"] == x["backend"]].sort_values("qo_len")
            right = cross[cross["flop_per_byte"] > ridge]["qo_len"]
            run.observe("prefill (seq 512, 32 heads) sits near the ridge point of the roofline",
                        f"{x['backend']} qo {x['qo_len']}: {x['flop_per_byte']:.0f} FLOP/byte (formula bytes) vs ridge "
                        f"{ridge:.0f}; points right of the ridge from qo {int(right.min()) if len(right) else '-'} on",
                        "confirmed" if 0.5 <= x["flop_per_byte"] / ridge <= 2 else "refuted", "sweep.csv")
        for be in backends:
            b = big[big["backend"] == be]
            if len(b):
                b = b.iloc[0]
                run.observe(f"{be} prefill is tensor-core bound at long sequences (analysis H-08)",
                            f"qo {b['qo_len']}: {b['pct_peak_tflops']:.0f}% of measured bf16 peak vs "
                            f"{b['pct_peak_dram']:.0f}% of copy bandwidth (formula bytes)",
                            "confirmed" if b["pct_peak_tflops"] > b["pct_peak_dram"] else "refuted", "sweep.csv")
        if {"fa2", "fa3"} <= set(backends):
            piv = m0.pivot_table(index="qo_len", columns="backend", values="time_us").dropna()
            ratio = float((piv["fa3"] / piv["fa2"]).median()) if len(piv) else float("nan")
            run.headline(fa3_over_fa2_time_median=ratio)
            run.observe("FA3 beats FA2 on the same shapes (analysis H-11)",
                        f"median time ratio fa3/fa2 {ratio:.2f} over {len(piv)} query lengths",
                        "confirmed" if ratio < 1 else "refuted", "sweep.csv")
        fa2c = cs[cs["backend"] == "fa2"]
        one, probe = _fi.pick(fa2c, batch=1, out_given=True), _fi.pick(fa2c, batch=PROBE[0], out_given=True)
        if one and probe:
            run.observe("a single short request (fa2, qo 512, empty cache) splits the KV and merges; batch 8 does not",
                        f"b1 qo512: split_kv={one['plan_split_kv']}, {one['kernels']}; b8 qo512 kv4096: "
                        f"split_kv={probe['plan_split_kv']}, {probe['kernels']}",
                        "confirmed" if (one["merge_kernel"] and one["plan_split_kv"] and not probe["merge_kernel"])
                        else "refuted", "calls.csv")
        fa3c = cs[cs["backend"] == "fa3"]
        if len(fa3c):
            run.observe("FA3 never launches a merge kernel (persistent scheduler, no split-KV)",
                        "; ".join(f"b{r.batch} qo{r.qo_len}: {r.kernels}" for r in fa3c.itertuples()),
                        "refuted" if fa3c["merge_kernel"].any() else "confirmed", "calls.csv")
        none, given = _fi.pick(fa2c, batch=PROBE[0], out_given=False), probe
        if none and given:
            extra = none["kernels_per_call"] - given["kernels_per_call"]
            run.observe("run() without out= launches an extra fill kernel (torch.zeros) before attention (H-12)",
                        f"out=None: {none['kernels']} ({none['kernels_per_call']:.0f}/call); out given: "
                        f"{given['kernels']} ({given['kernels_per_call']:.0f}/call)",
                        "confirmed" if extra == 1 and none["fill_kernel"] and not given["fill_kernel"] else "refuted",
                        "calls.csv")
        _fi.observe_cross_check(run, xrows, lambda x: f"{x['backend']} b{x['batch']} qo{x['qo_len']}")
        if kern is not None:
            att = kern[(kern["role"] == "attention") & (kern["model"] == models[0])]
            for be in backends:
                a = att[att["backend"] == be]
                if not len(a):
                    continue
                r = _fi.pick(a, qo_len=512) or a.sort_values("qo_len").iloc[-1].to_dict()
                where = f"{be} qo {r['qo_len']}"
                run.observe("occupancy ~47%, limited by shared memory",
                            f"{where}: achieved {r['occupancy_pct']:.0f}%, theoretical {r['theoretical_occupancy_pct']:.1f}%, "
                            f"limit {r['limiter']}", "confirmed" if (35 <= r["occupancy_pct"] <= 60 and "shared_mem"
                                                                    in str(r["limiter"])) else "refuted", "kernels.csv")
                run.observe("tensor pipe ~35% and HBM ~72% of peak",
                            f"{where}: tensor {r['tensor_pct']:.0f}%, DRAM {r['dram_pct']:.0f}% ({ncu.bound(r)})",
                            "confirmed" if (25 <= r["tensor_pct"] <= 45 and 60 <= r["dram_pct"] <= 85) else "refuted",
                            "kernels.csv")
                top = (r.get("top_stalls") or "").split(",")[0].split(" ")[0]
                run.observe("stalls led by long_scoreboard, then barrier, then short_scoreboard",
                            f"{where}: {r['top_stalls'] or 'n/a'}", "confirmed" if top == "long_scoreboard" else
                            ("inconclusive" if not top else "refuted"), "kernels.csv")
                if be == "fa2":
                    run.observe("FA2 theoretical occupancy is ~12.5% (2 CTAs x 4 warps per SM; analysis H-09)",
                                f"{where}: theoretical {r['theoretical_occupancy_pct']:.1f}%",
                                "confirmed" if r["theoretical_occupancy_pct"] <= 20 else "refuted", "kernels.csv")
                if be == "fa3":
                    g = _fi.grid_dims(r.get("grid"))
                    sms = torch.cuda.get_device_properties(0).multi_processor_count
                    run.observe("FA3 launches a persistent grid of one CTA per SM (analysis H-11)",
                                f"{where}: grid {r.get('grid')}, {sms} SMs",
                                "confirmed" if g and g[0] == sms else "refuted", "kernels.csv")

        # ---- the story
        items = [(f'backend="auto" -> {auto_is}', [])]
        for label, f in facts_of.items():
            be, b, qo, kv, out_given = meta[label]
            c = cs[cs["label"] == label]
            s = _fi.pick(m0, backend=be, batch=b, qo_len=qo, kv_len=kv)
            plan = (f"plan(): cta_tile_q {f.get('cta_tile_q')}, grid x {f.get('padded_batch_size')}, split_kv="
                    f"{f.get('split_kv')}" + (f" (chunk {f.get('kv_chunk_tokens')} tokens)" if f.get("split_kv") else "")
                    if "cta_tile_q" in f else "plan(): FA3 persistent schedule (grid = SM count, no split-KV)")
            kids = [(plan, [])]
            if len(c):
                c = c.iloc[0]
                kids.append((f"run(): {c['kernels_per_call']:.0f} kernel(s) per call: {c['kernels']}", []))
            if s:
                kids.append((f"{s['time_us']:.1f} us -> {s['tflop_s']:.0f} TFLOP/s = {s['pct_peak_tflops']:.0f}% of "
                             f"measured bf16 peak, {s['flop_per_byte']:.0f} FLOP/byte", []))
            if kern is not None:
                kk = kern[(kern["backend"] == be) & (kern["qo_len"] == qo) & (kern["kv_len"] == kv) &
                          (kern["batch"] == b) & (kern["model"] == models[0])]
                kids += [(story.kernel_line(r), []) for r in kk.to_dict("records")]
            items.append((f"{be}: batch {b}, {qo} new tokens on {kv} KV" + ("" if out_given else ", out=None"), kids))
        if xrows:
            items.append((_fi.cross_check_line(xrows, lambda x: f"{x['backend']} b{x['batch']} qo{x['qo_len']}"), []))
        run.story(story.tree(f"PREFILL ATTENTION (causal, paged) — {pk['gpu']}, {models[0]} heads ({lay0['hq']} q / "
                             f"{lay0['hkv']} kv, d {lay0['d']}), bf16 (bf16 peak {pk['bf16_tflops']:.0f} TFLOP/s, "
                             f"ridge {ridge:.0f} FLOP/B)", items))
        print(run.summary["story"])
    return 0


if __name__ == "__main__":
    run_main(main)
