#!/usr/bin/env python3
"""04 · Attention through mini-SGLang's backends: which kernels prefill and decode select, and how fast.

What it measures
    The attention backends mini-SGLang offers on this GPU (attention/__init__.py): "fi" (FlashInfer,
    always), "fa" (sgl_kernel FA3/FA4, only when sgl_kernel.flash_attn imports) and "trtllm" (sm100
    only; listed, not exercised). Each is built the way the engine builds it (global Context, a KV
    pool of page size 1, a page table), for the Llama-3.1-8B attention shape (32 query heads, 8 KV
    heads, head_dim 128, bf16). For "fi" the decode side is measured twice: with tensor cores (the
    rule GQA >= 4 turns them on: decode then runs FlashInfer's *prefill* kernel) and without
    (MINISGL_FLASHINFER_USE_TENSOR_CORES=0: the CUDA-core decode kernel).
    --compare  fixed points (prefill 1 x 2048, prefill 8 x 512, decode 32 x 4096, decode 1 x 4096):
               kernels in launch order (torch.profiler: store_kv_cache, the attention kernel(s), a
               merge kernel when KV is split), the CPU plan() time, kernel time, TFLOP/s or TB/s and
               % of the measured peaks; with ncu also occupancy and its limiter, tensor-pipe %, DRAM %
               and the top warp stalls.
    --sweep    decode batch x KV length and prefill length: time, TB/s / TFLOP/s, % of peak.
    Correctness first: every variant's output vs a float32 torch reference (causal, GQA).

What the plan expected (hypotheses; A100 figures restated as shares of the measured peaks)
    * Prefill attention 50-80 TFLOP/s (16-26% of the A100's dense bf16 peak), mixed compute/memory.
    * Decode attention 1.4-1.7 TB/s (70-85% of peak), memory-bound, long-scoreboard stalls first,
      low tensor-core use. Reading fi.py: with tensor cores on, decode runs a prefill kernel; the KV
      bytes are the same either way; plan() runs on the CPU in the first layer of every step, after
      an event synchronize.

Run
    python mini-sglang/scripts/04_profile_attention.py --quick          # ~1 min: 3 compare points, small sweep
    python mini-sglang/scripts/04_profile_attention.py --quick --ncu    # + ncu at the compare points
    python mini-sglang/scripts/04_profile_attention.py --compare        # only the compare part (with ncu)
    python mini-sglang/scripts/04_profile_attention.py --sweep          # only the sweep
    python mini-sglang/scripts/04_profile_attention.py                  # both, with ncu
    ./mini-sglang/scripts/ncu_profile.sh --kernel attention --set full -- \\
        python mini-sglang/scripts/04_profile_attention.py --ncu-target --quick
Writes mini-sglang/results/04_profile_attention/: backends.csv, compare.csv, kernels.csv, sweep.csv,
ncu_kernels.csv (with ncu), roofline.png, decode_sweep.png, trace.json, story.txt, summary.json.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import gpu, ncu, plots, story  # noqa: E402
from common.checks import require_gpu, require_module, run_main  # noqa: E402
from common.ranges import nvtx_range  # noqa: E402
from common.results import Run  # noqa: E402
from common.timing import bench, bench_cpu, rates  # noqa: E402
import _msgl  # noqa: E402

HQ, HKV, HD = 32, 8, 128
COMPARE_FULL = [("prefill", [2048], [2048]), ("prefill", [512] * 8, [512] * 8), ("decode", [1] * 32, [4096] * 32),
                ("decode", [1], [4096])]
COMPARE_QUICK = [("prefill", [2048], [2048]), ("decode", [1] * 32, [4096] * 32), ("decode", [1], [4096])]
SWEEP_DECODE_FULL = [(bs, kv) for bs in (1, 8, 32, 64, 128) for kv in (1024, 4096, 16384)]
SWEEP_DECODE_QUICK = [(1, 1024), (32, 1024)]          # with the compare points: bs 1/32 x kv 1024/4096
SWEEP_PREFILL_FULL = [([q], [q]) for q in (128, 512, 2048, 8192)] + [([512], [4096])]   # last: 512 new on a 3584 prefix
SWEEP_PREFILL_QUICK = [([512], [512])]
KERNELS = "BatchPrefill|BatchDecode|MergeState|Prefill|Decode|flash|Flash|fmha"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="3 compare points, 3 sweep points, no ncu (~1 min)")
    p.add_argument("--compare", action="store_true", help="only the compare part")
    p.add_argument("--sweep", action="store_true", help="only the sweep part")
    p.add_argument("--ncu", action="store_true", help="run the ncu pass also with --quick")
    p.add_argument("--ncu-target", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help="results folder (default mini-sglang/results/04_profile_attention)")
    return p.parse_args(argv)


def label(phase, q, kv):
    return (f"{phase} bs={len(q)} q={q[0]} kv={kv[0]}" if phase == "prefill" else f"decode bs={len(q)} kv={kv[0]}")


class Bench:
    """The engine's attention set-up without the engine: Context, KV pool, page table, backends."""

    def __init__(self, torch, max_bs, max_len, fa_ok):
        from minisgl.attention import create_attention_backend
        from minisgl.core import Context, set_global_ctx
        from minisgl.distributed import set_tp_info
        from minisgl.env import ENV
        from minisgl.kvcache import create_kvcache_pool
        self.torch = torch
        set_tp_info(rank=0, size=1)
        self.ctx = Context(page_size=1)
        set_global_ctx(self.ctx)
        self.cfg = SimpleNamespace(num_qo_heads=HQ, num_kv_heads=HKV, head_dim=HD, num_layers=1)
        self.S = (max_len + 1 + 31) // 32 * 32                     # slots per request row
        dev = torch.device("cuda")
        self.ctx.kv_cache = create_kvcache_pool(model_config=self.cfg, num_pages=max_bs * self.S + 1, page_size=1,
                                                dtype=torch.bfloat16, device=dev)
        self.ctx.kv_cache.k_cache(0).normal_()
        self.ctx.kv_cache.v_cache(0).normal_()
        self.ctx.page_table = torch.zeros((max_bs + 1, self.S), dtype=torch.int32, device=dev)
        self.ctx.page_table[:max_bs] = torch.arange(max_bs * self.S, dtype=torch.int32, device=dev).view(max_bs, self.S)
        ENV.FLASHINFER_USE_TENSOR_CORES.value = None          # "fi" = the engine's own rule (GQA >= 4)
        self.backends = {"fi": create_attention_backend("fi", self.cfg)}
        ENV.FLASHINFER_USE_TENSOR_CORES.value = False
        self.backends["fi tc=off"] = create_attention_backend("fi", self.cfg)
        ENV.FLASHINFER_USE_TENSOR_CORES.value = None
        if fa_ok:
            self.backends["fa"] = create_attention_backend("fa", self.cfg)
        self.ctx.attn_backend = self.backends["fi"]

    def variants(self, phase):
        return [v for v in self.backends if not (phase == "prefill" and v == "fi tc=off")]

    def point(self, variant, phase, q_lens, kv_lens):
        """Run one forward (plan + store + attention) and return the attention-only callable."""
        torch = self.torch
        from minisgl.core import Batch, Req, SamplingParams
        be = self.backends[variant]
        reqs = [Req(input_ids=torch.zeros(kv, dtype=torch.int32), table_idx=i, cached_len=kv - q, output_len=1, uid=i,
                    sampling_params=SamplingParams(), cache_handle=None) for i, (q, kv) in enumerate(zip(q_lens, kv_lens))]
        batch = Batch(reqs=reqs, phase=phase)
        batch.padded_reqs = reqs
        batch.out_loc = torch.cat([self.ctx.page_table[r.table_idx, r.cached_len:r.device_len] for r in reqs])
        be.prepare_metadata(batch)
        n = sum(q_lens)
        q = torch.randn(n, HQ, HD, device="cuda", dtype=torch.bfloat16)
        qkv = torch.randn(n, (HQ + 2 * HKV) * HD, device="cuda", dtype=torch.bfloat16)
        k, v = qkv[:, HQ * HD:(HQ + HKV) * HD], qkv[:, (HQ + HKV) * HD:]
        out = be.forward(q, k, v, 0, batch)
        md, kvp = batch.attn_metadata, self.ctx.kv_cache
        if variant.startswith("fi"):
            kvc = (kvp.k_cache(0).view(-1, 1, HKV, HD), kvp.v_cache(0).view(-1, 1, HKV, HD))
            fn = lambda: md.wrapper.run(q=q, paged_kv_cache=kvc)

            def replan():
                md.initialized = False
                be._initialize_metadata_once(md)
        else:
            from minisgl.attention.fa import _fa_sgl_impl
            fn = lambda: _fa_sgl_impl(q=q, k_cache=kvp.k_cache(0), v_cache=kvp.v_cache(0), page_table=md.page_table,
                                      cache_seqlens=md.cache_seqlens, cu_seqlens_q=md.cu_seqlens_q,
                                      cu_seqlens_k=md.cu_seqlens_k, max_seqlen_q=md.max_seqlen_q,
                                      softmax_scale=be.scale, version=be.version)
            replan = None
        fwd = lambda: be.forward(q, k, v, 0, batch)
        return SimpleNamespace(out=out, q=q, reqs=reqs, fn=fn, replan=replan, forward=fwd, md=md)

    def reference(self, p):
        """float32 causal GQA attention read back from the pool (includes the rows forward stored)."""
        torch = self.torch
        outs, off = [], 0
        for r in p.reqs:
            slots = self.ctx.page_table[r.table_idx, :r.device_len].long()
            K = self.ctx.kv_cache.k_cache(0).view(-1, HKV, HD)[slots].float().repeat_interleave(HQ // HKV, 1)
            V = self.ctx.kv_cache.v_cache(0).view(-1, HKV, HD)[slots].float().repeat_interleave(HQ // HKV, 1)
            qq = p.q[off:off + r.extend_len].float()
            s = torch.einsum("qhd,khd->hqk", qq, K) / HD ** 0.5
            pos = torch.arange(r.cached_len, r.device_len, device="cuda")[:, None]
            s = s.masked_fill(torch.arange(r.device_len, device="cuda")[None, :] > pos, float("-inf"))
            outs.append(torch.einsum("hqk,khd->qhd", s.softmax(-1), V))
            off += r.extend_len
        return torch.cat(outs)


def work(phase, q_lens, kv_lens):
    flops = _msgl.prefill_attn_flops(q_lens, kv_lens, HQ, HD)
    b = (_msgl.decode_attn_bytes(kv_lens, HQ, HKV, HD) if phase == "decode"
         else _msgl.prefill_attn_bytes(q_lens, kv_lens, HQ, HKV, HD))
    return flops, b


def fa_usable():
    try:
        import sgl_kernel.flash_attn  # noqa: F401
        return True, "sgl_kernel.flash_attn imports"
    except Exception as e:
        return False, f"{e.__class__.__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"


def ncu_target(args) -> int:
    import torch
    _msgl.require_minisgl("minisgl.attention")
    pts = COMPARE_QUICK if args.quick else COMPARE_FULL
    fa_ok = fa_usable()[0] and torch.cuda.get_device_properties(0).major >= 9
    b = Bench(torch, max(len(q) for _, q, _ in pts), max(max(kv) for *_, kv in pts), fa_ok)
    calls = []
    for phase, q, kv in pts:
        for var in b.variants(phase):
            p = b.point(var, phase, q, kv)
            p.fn()   # JIT and first touch before the first marker (point -1, dropped)
            calls.append((f"{var} {label(phase, q, kv)}", p))
    torch.cuda.synchronize()
    for name, p in calls:
        if p.replan:      # points of one variant share a FlashInfer wrapper: re-plan for this one
            p.replan()
        ncu.mark()
        with nvtx_range(name):
            p.fn()
    torch.cuda.synchronize()
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    _msgl.require_minisgl("minisgl.attention")
    import torch
    require_gpu(torch)
    fi = require_module("flashinfer", "pip install flashinfer-python==0.6.15.post1")
    if args.ncu_target:
        return ncu_target(args)
    do_cmp, do_sweep = (args.compare or not args.sweep), (args.sweep or not args.compare)
    cmp_pts = COMPARE_QUICK if args.quick else COMPARE_FULL
    dec = SWEEP_DECODE_QUICK if args.quick else SWEEP_DECODE_FULL
    pre = SWEEP_PREFILL_QUICK if args.quick else SWEEP_PREFILL_FULL
    run_ncu = do_cmp and (not args.quick or args.ncu)
    with Run(__file__, args, out=args.out) as run:
        pk = gpu.peaks()
        props = torch.cuda.get_device_properties(0)
        fa_ok, fa_why = fa_usable()
        fa_ok = fa_ok and props.major >= 9
        run.table("backends", [{"backend": "fi", "offered": True, "measured": True, "note": f"flashinfer {fi.__version__}"},
                               {"backend": "fa", "offered": fa_ok, "measured": fa_ok, "note": fa_why},
                               {"backend": "trtllm", "offered": props.major == 10, "measured": False,
                                "note": "sm100 only; needs page size 16/32/64 (not exercised here)"}])
        max_bs = max([len(q) for _, q, _ in cmp_pts] + [bs for bs, _ in dec] + [len(q) for q, _ in pre])
        max_len = max([max(kv) for *_, kv in cmp_pts] + [kv for _, kv in dec] + [max(kv) for _, kv in pre])
        run.log(f"{pk['gpu']}: copy {pk['dram_tb_s']:.2f} TB/s, bf16 {pk['bf16_tflops']:.0f} TFLOP/s (measured); "
                f"KV pool {max_bs} x {max_len} tokens; backends: fi, fi tc=off" + (", fa" if fa_ok else ""))
        b = Bench(torch, max_bs, max_len, fa_ok)

        # ---- correctness first (small ragged batches, every variant)
        for phase, q, kv in (("decode", [1, 1, 1], [100, 300, 257]), ("prefill", [64, 200], [64, 200]),
                             ("prefill", [50], [180])):
            for var in b.variants(phase):
                p, _ = _msgl.first_call(lambda: b.point(var, phase, q, kv), f"{var} {phase} (FlashInfer JIT)")
                ref = b.reference(p)
                err = float((p.out.float().view_as(ref) - ref).norm() / ref.norm())
                run.log(f"correctness {var} {phase} q={q} kv={kv}: rel. error {err:.1e} {'✅' if err < 1e-2 else '❌'}")
                if not err < 1e-2:
                    raise RuntimeError(f"{var} {phase} attention disagrees with the torch reference ({err:.2e})")
        run.log("All results match. Starting benchmarks.")

        def measure(var, phase, q, kv, part):
            p = b.point(var, phase, q, kv)
            with nvtx_range(f"{var} {label(phase, q, kv)}"):
                t = bench(p.fn)
            flops, nbytes = work(phase, q, kv)
            r = rates(t.median_ms, bytes=nbytes, flops=flops, peaks=pk)
            plan = bench_cpu(p.replan, rep_ms=50).median_us if p.replan else None
            return p, {"part": part, "variant": var, "phase": phase, "point": label(phase, q, kv), "batch": len(q),
                       "q_len": q[0], "kv_len": kv[0], "time_us": t.median_us, "spread_pct": t.spread_pct,
                       "plan_cpu_us": plan, "flops": flops, "bytes": nbytes, "tflop_s": r["tflop_s"],
                       "pct_peak_tflops": r["pct_peak_tflops"], "tb_s": r["tb_s"], "pct_peak_dram": r["pct_peak_dram"],
                       "flop_per_byte": r["flop_per_byte"]}

        cmp_rows, sweep_rows, kern_rows, traced = [], [], [], {}
        if do_cmp:
            for phase, q, kv in cmp_pts:
                for var in b.variants(phase):
                    try:
                        p, row = measure(var, phase, q, kv, "compare")
                        cmp_rows.append(row)
                        traced[f"{var} {label(phase, q, kv)}"] = p
                    except Exception as e:
                        run.point_error({"variant": var, "point": label(phase, q, kv)}, e)
                        torch.cuda.empty_cache()
            run.table("compare", cmp_rows)
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for name, p in traced.items():
                    with nvtx_range(name):
                        if p.replan:
                            p.md.initialized = False      # show the lazy plan inside the call, as in a real step
                        p.forward()
                torch.cuda.synchronize()
            path = run.path("trace.json")
            prof.export_chrome_trace(str(path))
            kern_rows = [{k: r[k] for k in ("range", "order", "kind", "short", "grid", "block", "dur_us", "name")}
                         for r in _msgl.launches_by_range(path, "|".join(map(_re_escape, traced)))]
            syncs = dict(_msgl.runtime_calls_in_ranges(path, "|".join(map(_re_escape, traced)), r"^cudaEventSynchronize$"))
            run.table("kernels", kern_rows)
        if do_sweep:
            pts = [("decode", [1] * bs, [kv] * bs) for bs, kv in dec] + [("prefill", q, kv) for q, kv in pre]
            for i, (phase, q, kv) in enumerate(pts, 1):
                run.log(f"[{i}/{len(pts)}] {label(phase, q, kv)}")
                for var in b.variants(phase):
                    try:
                        sweep_rows.append(measure(var, phase, q, kv, "sweep")[1])
                    except Exception as e:
                        run.point_error({"variant": var, "point": label(phase, q, kv)}, e)
                        torch.cuda.empty_cache()
            run.table("sweep", sweep_rows)
        import pandas as pd
        allr = pd.DataFrame(cmp_rows + sweep_rows)
        if len(allr):
            run.figure("roofline", plots.roofline([{"label": f"{r['variant']} {r['point']}", **r} for r in
                                                   allr.drop_duplicates(["variant", "point"]).to_dict("records")], pk,
                                                  title="attention (Llama-3.1-8B heads, bf16)"))
        sd = pd.DataFrame(sweep_rows)
        if len(sd) and (sd["phase"] == "decode").any():
            d = sd[sd["phase"] == "decode"].assign(series=lambda x: x["variant"] + " bs=" + x["batch"].astype(str))
            run.figure("decode_sweep", plots.sweep(d, x="kv_len", y="pct_peak_dram", hue="series", logx=True,
                                                   ylabel="% of measured copy bandwidth", hline=100,
                                                   title=f"decode attention — {pk['gpu']}"))

        kern = None
        if run_ncu:
            run.log("ncu: every compare point and variant once (tensor pipe, occupancy, DRAM, stalls)")
            try:
                res = ncu.profile([sys.executable, str(Path(__file__).resolve()), "--ncu-target"] +
                                  (["--quick"] if args.quick else []), run.dir / "ncu", kernel=ncu.with_marker(KERNELS),
                                  echo=run.log, timeout=900)
                raw = ncu.split_points(res.df)
                raw = raw[raw["point"] >= 0].reset_index(drop=True)
                kern = ncu.summarize(raw, peaks=pk)
                labels = [f"{var} {label(ph, q, kv)}" for ph, q, kv in cmp_pts for var in b.variants(ph)]
                kern["call"] = [labels[p] if p < len(labels) else "?" for p in kern["point"]]
                run.table("ncu_kernels", kern)
            except Exception as e:
                run.note(f"ncu pass skipped: {e.__class__.__name__}: {str(e).splitlines()[0][:200]}")
                kern = None

        # ---- verdicts
        c = pd.DataFrame(cmp_rows)
        names = {}
        for r in kern_rows:
            if r["kind"] == "kernel" and "store_kv_cache" not in r["short"]:
                names.setdefault(r["range"], []).append(r["short"])
        get = lambda var, pt: c[(c["variant"] == var) & (c["point"] == pt)].to_dict("records") if len(c) else []
        d32 = "decode bs=32 kv=4096"
        on, off = get("fi", d32), get("fi tc=off", d32)
        if on and off:
            kon, koff = names.get(f"fi {d32}", []), names.get(f"fi tc=off {d32}", [])
            run.observe("fi decode with tensor cores (GQA >= 4) runs FlashInfer's prefill kernel",
                        f"tc on: {', '.join(kon)}; tc off: {', '.join(koff)}",
                        "confirmed" if any("Prefill" in k for k in kon) and not any("Prefill" in k for k in koff)
                        else "refuted", "kernels.csv")
            run.observe("decode attention reaches 70-85% of peak bandwidth (bs 32 x kv 4096)",
                        f"fi: {on[0]['tb_s']:.2f} TB/s = {on[0]['pct_peak_dram']:.0f}% of measured copy; tc off: "
                        f"{off[0]['pct_peak_dram']:.0f}% (threshold 70%)",
                        "confirmed" if on[0]["pct_peak_dram"] >= 70 else "refuted", "compare.csv")
            run.observe("tensor cores on/off: same KV bytes, different kernel and time",
                        f"{on[0]['bytes']:,} B both; {on[0]['time_us']:.1f} us (on) vs {off[0]['time_us']:.1f} us (off)",
                        "confirmed" if kon != koff else "refuted", "compare.csv")
        pre_rows = allr[allr["phase"] == "prefill"] if len(allr) else allr
        if len(pre_rows):
            best = pre_rows.sort_values("tflop_s").iloc[-1]
            run.observe("prefill attention reaches 16-26% of the dense bf16 peak (A100: 50-80 TFLOP/s)",
                        f"best {best['tflop_s']:.0f} TFLOP/s = {best['pct_peak_tflops']:.0f}% of measured bf16 GEMM "
                        f"({best['variant']} {best['point']}; threshold 16%)",
                        "confirmed" if best["pct_peak_tflops"] >= 16 else "refuted", "compare.csv")
            run.headline(prefill_best_tflop_s=best["tflop_s"], prefill_best_pct_peak=best["pct_peak_tflops"])
        if on:
            run.headline(decode_b32_kv4096_tb_s=on[0]["tb_s"], decode_b32_kv4096_pct_peak=on[0]["pct_peak_dram"],
                         plan_cpu_us_b32=on[0]["plan_cpu_us"])
        if do_cmp and syncs:
            n_sync = sorted(set(v for k, v in syncs.items() if k.startswith("fi")))
            one = get("fi", "decode bs=1 kv=4096")
            run.observe("fi plans lazily inside the first attention call of a step, after one event synchronize",
                        f"cudaEventSynchronize per traced call: {n_sync}; plan() "
                        f"{one[0]['plan_cpu_us']:.0f} us CPU vs {one[0]['time_us']:.1f} us kernel at bs 1" if one else
                        f"cudaEventSynchronize per traced call: {n_sync}",
                        "confirmed" if n_sync == [1] else "inconclusive" if n_sync == [0] else "refuted",
                        "trace.json")
        if kern is not None:
            for call in (f"fi {d32}", f"fi tc=off {d32}", "fi prefill bs=1 q=2048 kv=2048"):
                k = kern[(kern["call"] == call) & ~kern["kernel"].str.contains("Merge")].to_dict("records")
                if not k:
                    continue
                r = max(k, key=lambda x: x["time_us"])
                if "decode" in call:
                    top = (r.get("top_stalls") or "").split(" ")[0]
                    run.observe(f"decode ({call.split(' decode')[0]}): memory-bound, long-scoreboard stalls first, low tensor use",
                                story.kernel_line(r), "confirmed" if top == "long_scoreboard" and r["dram_pct"] > r["sm_pct"]
                                else "refuted", "ncu_kernels.csv")
                else:
                    run.observe("prefill keeps the tensor pipe busy (> 30% of its peak)", story.kernel_line(r),
                                "confirmed" if r["tensor_pct"] > 30 else "refuted", "ncu_kernels.csv")

        # ---- story
        items = [("backends: fi (FlashInfer fa2, page size 1), fi tc=off" + (", fa (sgl_kernel)" if fa_ok else "")
                  + f"; not here: {'' if fa_ok else 'fa (' + fa_why + '), '}trtllm (sm100)", [])]
        for name, p in traced.items():
            row = next((r for r in cmp_rows if f"{r['variant']} {r['point']}" == name), None)
            ks = [r for r in kern_rows if r["range"] == name]
            head = name + (f": attention {row['time_us']:.1f} us" + (f", plan {row['plan_cpu_us']:.0f} us CPU"
                                                                      if row["plan_cpu_us"] else "")
                           + (f" -> {row['tb_s']:.2f} TB/s ({row['pct_peak_dram']:.0f}%)" if row["phase"] == "decode"
                              else f" -> {row['tflop_s']:.0f} TFLOP/s ({row['pct_peak_tflops']:.0f}%)") if row else "")
            items.append((head, [(f"#{r['order']} {r['kind']} {r['short']} grid {r['grid'] or '-'} {r['dur_us']:.1f} us", [])
                                 for r in ks]))
        if kern is not None:
            items.append(("hardware (ncu)", [(f"{r['call']}: {story.kernel_line(r)}", []) for r in kern.to_dict("records")][:8]))
        if len(sd):
            items.append(("sweep", [(f"{r['variant']} {r['point']}: {r['time_us']:.1f} us " +
                                     (f"{r['pct_peak_dram']:.0f}% BW" if r["phase"] == "decode" else f"{r['tflop_s']:.0f} TFLOP/s"),
                                     []) for r in sd.to_dict("records")][:24]))
        run.story(story.tree(f"ATTENTION THROUGH mini-SGLang — {pk['gpu']} (copy {pk['dram_tb_s']:.2f} TB/s, "
                             f"bf16 {pk['bf16_tflops']:.0f} TFLOP/s measured)", items))
        print(run.summary["story"])
    return 0


def _re_escape(s: str) -> str:
    import re
    return "^" + re.escape(s) + "$"


if __name__ == "__main__":
    run_main(main)
